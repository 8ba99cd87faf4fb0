//! Whether a connection has proved itself: completed a call with a valid
//! token. Strangers (connections that never did) are the first evicted near
//! the connection cap and buffer request bytes only within their own
//! allowance and the strangers' share of the global budget; a connection
//! that proved itself keeps its standing for its life.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

/// One connection's standing, shared by everything that serves it (its
/// budget, its calls, the listener's table). Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Proof {
    proved: Arc<AtomicBool>,
}

impl Proof {
    /// A connection that has proved nothing yet.
    pub fn stranger() -> Self {
        Self::default()
    }

    /// A connection trusted from the start (a request served without a
    /// connection of its own, or a test).
    pub fn proved() -> Self {
        let proof = Self::default();
        proof.mark();
        proof
    }

    /// A call on the connection completed with a valid token.
    pub fn mark(&self) {
        if !self.is_proved() {
            self.proved.store(true, Ordering::Release);
        }
    }

    pub fn is_proved(&self) -> bool {
        self.proved.load(Ordering::Acquire)
    }
}
