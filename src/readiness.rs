//! Whether this scheduler takes calls: the one readiness that `GET /readyz`
//! and the gRPC health service (`grpc.health.v1.Health`) report, and that
//! the edge flips when a shutdown begins. Anything else that makes the
//! scheduler not ready (a hot standby, say) adds its reason here, and both
//! reports follow.

use std::sync::Arc;

use tokio::sync::watch;

/// Why the scheduler is not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReady {
    /// A shutdown began: connections drain, nothing new should come. Final.
    ShuttingDown,
    /// A hot standby: another instance is the elected leader (`crate::ha`).
    Standby,
}

impl NotReady {
    /// Whether the scheduler never becomes ready again (so watchers may stop
    /// watching, rather than holding their connection through the drain).
    pub fn is_final(self) -> bool {
        match self {
            NotReady::ShuttingDown => true,
            NotReady::Standby => false,
        }
    }

    /// For people: what `/readyz` says.
    pub fn describe(self) -> &'static str {
        match self {
            NotReady::ShuttingDown => "shutting down",
            NotReady::Standby => "standby",
        }
    }
}

/// The scheduler's readiness now, and a way to wait for it to change.
/// Cheap to clone: every clone is the same readiness.
#[derive(Debug, Clone)]
pub struct Readiness(Arc<watch::Sender<Result<(), NotReady>>>);

impl Default for Readiness {
    fn default() -> Self {
        Self::new()
    }
}

impl Readiness {
    /// Ready.
    pub fn new() -> Self {
        Self(Arc::new(watch::Sender::new(Ok(()))))
    }

    /// Ready, or why not.
    pub fn current(&self) -> Result<(), NotReady> {
        *self.0.borrow()
    }

    /// A receiver that sees every later change.
    pub fn subscribe(&self) -> watch::Receiver<Result<(), NotReady>> {
        self.0.subscribe()
    }

    /// No longer ready, for `reason`. A final reason stays, whatever comes
    /// after it.
    pub fn set_not_ready(&self, reason: NotReady) {
        self.0.send_if_modified(|now| match *now {
            Err(held) if held.is_final() || held == reason => false,
            _ => {
                *now = Err(reason);
                true
            }
        });
    }

    /// Ready again, if `reason` (not a final one) is what held it.
    pub fn clear(&self, reason: NotReady) {
        self.0.send_if_modified(|now| match *now {
            Err(held) if held == reason && !held.is_final() => {
                *now = Ok(());
                true
            }
            _ => false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_shutdown_is_seen_by_every_subscriber_and_stays() {
        let readiness = Readiness::new();
        assert_eq!(readiness.current(), Ok(()));
        let mut watcher = readiness.subscribe();
        let clone = readiness.clone();
        clone.set_not_ready(NotReady::ShuttingDown);
        watcher.changed().await.unwrap();
        assert_eq!(*watcher.borrow_and_update(), Err(NotReady::ShuttingDown));
        assert_eq!(readiness.current(), Err(NotReady::ShuttingDown));
        // Saying it again is no change.
        readiness.set_not_ready(NotReady::ShuttingDown);
        assert!(!watcher.has_changed().unwrap());
    }

    #[test]
    fn a_standby_becomes_ready_on_winning_but_a_shutdown_stays() {
        let readiness = Readiness::new();
        readiness.set_not_ready(NotReady::Standby);
        assert_eq!(readiness.current(), Err(NotReady::Standby));
        readiness.clear(NotReady::ShuttingDown);
        assert_eq!(
            readiness.current(),
            Err(NotReady::Standby),
            "not what held it"
        );
        readiness.clear(NotReady::Standby);
        assert_eq!(readiness.current(), Ok(()));
        readiness.set_not_ready(NotReady::ShuttingDown);
        readiness.set_not_ready(NotReady::Standby);
        readiness.clear(NotReady::Standby);
        assert_eq!(readiness.current(), Err(NotReady::ShuttingDown));
    }
}
