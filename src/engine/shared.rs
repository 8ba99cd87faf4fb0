//! What every handle shares (configuration, the state behind its one mutex,
//! the expiry task's wake-up) and the expiry task itself.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::{Config, Limits};
use super::state::State;
use super::tokens::{self, TokenDigest, TokenSet};
use super::types::Rejection;

/// What every handle shares: immutable configuration, the state and the
/// expiry task's wake-up.
pub(crate) struct Shared {
    pub(crate) limits: Limits,
    pub(crate) min_daemon_version: u32,
    pub(crate) user_tokens: TokenSet,
    pub(crate) servant_tokens: TokenSet,
    /// What a restart starts from (rule "leadership").
    config: Config,
    state: Mutex<State>,
    wake: Notify,
}

impl Shared {
    /// The shared part of a new engine, with its expiry task spawned (so
    /// this must run inside a tokio runtime).
    pub(crate) fn start(config: &Config) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            limits: config.limits.clone(),
            min_daemon_version: config.min_daemon_version,
            user_tokens: config.user_tokens.clone(),
            servant_tokens: config.servant_tokens.clone(),
            config: config.clone(),
            state: Mutex::new(State::new(config, Instant::now())),
            wake: Notify::new(),
        });
        tokio::spawn(run_expiry(shared.clone()));
        shared
    }

    /// Ends the expiry task (the last handle is gone).
    pub(crate) fn stop(&self) {
        self.lock().stop();
        self.wake.notify_one();
    }

    /// Rule "leadership": a fresh state, as a restarted instance has; the
    /// old one is dropped outside the lock.
    pub(crate) fn restart(&self) {
        let old = self.lock().restart(&self.config, Instant::now());
        drop(old);
        self.wake.notify_one();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` under the lock with the engine clock's `now`, then wakes the
    /// expiry task if `f` created an earlier deadline.
    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        let mut st = self.lock();
        let now = Instant::now();
        let result = f(&mut st, now);
        let wake = st.take_wake_expiry();
        drop(st);
        if wake {
            self.wake.notify_one();
        }
        result
    }

    /// Rule "order of checks": the token comes first in every call. Returns
    /// the digest, which identifies the caller as a grant's owner.
    pub(crate) fn check_user(&self, token: &str) -> Result<TokenDigest, Rejection> {
        let presented = tokens::digest(token);
        if self.user_tokens.accepts(&presented) {
            Ok(presented)
        } else {
            Err(Rejection::AccessDenied)
        }
    }
}

/// The one background task: sleeps until the earliest servant expiry or
/// lease end (or until woken because an earlier one appeared), then sweeps.
async fn run_expiry(shared: Arc<Shared>) {
    loop {
        let next = {
            let mut st = shared.lock();
            if st.is_stopped() {
                return;
            }
            st.expire(Instant::now());
            st.take_wake_expiry();
            st.next_deadline()
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = shared.wake.notified() => {}
                }
            }
            None => shared.wake.notified().await,
        }
    }
}
