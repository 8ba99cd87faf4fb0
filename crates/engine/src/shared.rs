//! What every handle shares (configuration, the state behind its one mutex,
//! the expiry task's wake-up) and the expiry task itself.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::{Config, Limits};
use super::state::State;
use super::tenants::{Access, DEFAULT_TENANT, Tenancy, TenantId, TenantSpec, Tenants};
use super::tokens::{self, Redacted, TokenDigest};
use super::types::Rejection;

/// What every handle shares: immutable configuration, the state and the
/// expiry task's wake-up.
pub(crate) struct Shared {
    pub(crate) limits: Limits,
    pub(crate) min_daemon_version: u32,
    /// The tokens and their tenants, replaced whole by a reload (a call
    /// sees the old set or the new one, never a mix).
    access: RwLock<Arc<Access>>,
    /// What a restart starts from (rule "leadership").
    config: Config,
    state: Mutex<State>,
    wake: Notify,
}

impl Shared {
    /// The shared part of a new engine, with its expiry task spawned (so
    /// this must run inside a tokio runtime).
    pub(crate) fn start(config: &Config) -> Arc<Shared> {
        let (tenants, access) = match &config.tenancy {
            Some(tenancy) => {
                let mut tenants = Tenants::new(&[]);
                let access = access_for(config, tenancy, &mut tenants);
                (tenants, access)
            }
            None => {
                let default = TenantSpec {
                    name: DEFAULT_TENANT.to_owned(),
                    weight: 1.0,
                    max_share: None,
                    token_digests: Redacted(Vec::new()),
                };
                let tenants = Tenants::new(&[default]);
                let access = Access::from_flags(
                    config.user_tokens.clone(),
                    TenantId(0),
                    config.servant_tokens.clone(),
                );
                (tenants, access)
            }
        };
        let shared = Arc::new(Shared {
            limits: config.limits.clone(),
            min_daemon_version: config.min_daemon_version,
            access: RwLock::new(Arc::new(access)),
            config: config.clone(),
            state: Mutex::new(State::new(config, tenants, Instant::now())),
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

    /// The tokens and tenants in force now.
    pub(crate) fn access(&self) -> Arc<Access> {
        self.access
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Rule "reload": makes `tenancy` the tokens and tenants in force, the
    /// tenants' weights and caps under the state lock and the tokens at
    /// the same moment, so no call sees a token without its tenant.
    pub(crate) fn set_tenancy(&self, tenancy: &Tenancy) {
        let mut st = self.lock();
        let access = access_for(&self.config, tenancy, &mut st.tenants);
        *self.access.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(access);
    }

    /// Rule "order of checks": the token comes first in every call. Returns
    /// the digest, which identifies the caller as a grant's owner, and the
    /// caller's tenant.
    pub(crate) fn check_user(&self, token: &str) -> Result<(TokenDigest, TenantId), Rejection> {
        let presented = tokens::digest(token);
        match self.access().tenant_of(&presented) {
            Some(tenant) => Ok((presented, tenant)),
            None => Err(Rejection::AccessDenied),
        }
    }
}

/// The access `tenancy` gives, its tenants configured in `tenants`.
fn access_for(config: &Config, tenancy: &Tenancy, tenants: &mut Tenants) -> Access {
    let ids = tenants.configure(&tenancy.tenants);
    let servants = tenancy
        .servant_tokens
        .clone()
        .unwrap_or_else(|| config.servant_tokens.clone());
    Access::from_specs(&tenancy.tenants, &ids, servants)
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
