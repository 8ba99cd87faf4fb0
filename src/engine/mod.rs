//! The scheduling engine: servants, grants, waiters, tokens and expiry.
//!
//! No HTTP and no protobuf here: the service layer converts wire messages to
//! the domain types of this module and maps [`Rejection`] to the seed's
//! `Status`. [`Scheduler`] is a cheap-to-clone handle over one
//! `std::sync::Mutex<State>` (the mini-redis `db.rs` pattern); the lock is
//! never held across an `.await`, and every hot path (heartbeat, grant, renew,
//! free) costs O(items in the request x log n), not O(cluster).
//!
//! Module map:
//! - `types`: requests, replies and [`Rejection`].
//! - `servants`: registry, admission and capacity rules, running-task reports.
//! - `placement`: per-environment ordered indexes and the placement rule.
//! - `grants`: ids, leases, renew, free, zombies.
//! - `waiters`: fair FIFO queues, timeouts, cancellation.
//! - `tokens`: constant-time token sets and the serving-daemon token ring.
//! - `snapshot`: inspection data and the running-task list.
//! - `state`: the state behind the lock and the expiry sweep.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

mod grants;
mod placement;
mod servants;
mod snapshot;
mod state;
pub(crate) mod tokens;
mod types;
mod waiters;

#[cfg(test)]
mod tests;

pub use snapshot::{ClusterTotals, Counters, EnvironmentView, GrantView, ServantView, Snapshot};
pub use types::{
    Grant, GrantRequest, Heartbeat, HeartbeatReply, NotAcceptingReason, Rejection, ReportedTask,
    RunningTask, ServantPriority,
};

use snapshot::RunningParts;
use state::State;
use tokens::TokenSet;
use waiters::{Admission, WaitGuard};

/// Engine configuration, fixed for the life of a [`Scheduler`].
///
/// Token lists: an empty list accepts nobody; an entry `""` accepts anyone
/// (the service should warn loudly about that, as the reference does).
/// `Debug` prints token counts, never token values or the secret.
#[derive(Clone)]
pub struct Config {
    /// Tokens of delegates (`--acceptable_user_tokens`); needed by every call
    /// except `Heartbeat`, which also takes them (servant then not verified).
    pub user_tokens: Vec<String>,
    /// Tokens of servants (`--acceptable_servant_tokens`).
    pub servant_tokens: Vec<String>,
    /// Heartbeats from older daemons are rejected with `VersionTooOld`.
    pub min_daemon_version: u32,
    /// No new task goes to a servant reporting total memory and less than
    /// this much available (default 10 GiB).
    pub servant_min_memory_for_accepting_new_task: u64,
    /// Lifetime of one serving-daemon token epoch (default 3600 s).
    pub serving_daemon_token_rollout_interval: Duration,
    /// If set, the serving-daemon token ring is derived from this secret and the wall-clock epoch
    /// (epoch = unix_seconds / interval; token_k = hex(first 16 bytes of SHA-256(secret || k as u64 LE)))
    /// so tokens survive a scheduler restart. If None, a random 32-byte secret is drawn at start (same code path).
    pub serving_daemon_token_secret: Option<Vec<u8>>,
    /// After start, running tasks that servants report under unknown grant ids
    /// are adopted instead of killed (default 15 s, a little longer than a
    /// 10 s heartbeat expiry, so every live servant reports once).
    pub adoption_window: Duration,
    /// Lease given to adopted tasks (default 15 s); their owner renews them as usual.
    pub adopted_lease: Duration,
    /// How far `running_tasks()` may lag the heartbeats (default 1 s). Every
    /// daemon polls it about once a second while some heartbeat changes it
    /// almost every millisecond in a large cluster: rebuilding at most once
    /// per interval bounds its cost whatever the number of callers.
    pub running_tasks_refresh: Duration,
    /// Size limits on requests.
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            user_tokens: Vec::new(),
            servant_tokens: Vec::new(),
            min_daemon_version: 0,
            servant_min_memory_for_accepting_new_task: 10 << 30,
            serving_daemon_token_rollout_interval: Duration::from_secs(3600),
            serving_daemon_token_secret: None,
            adoption_window: Duration::from_secs(15),
            adopted_lease: Duration::from_secs(15),
            running_tasks_refresh: Duration::from_secs(1),
            limits: Limits::default(),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field(
                "user_tokens",
                &format_args!("<{} redacted>", self.user_tokens.len()),
            )
            .field(
                "servant_tokens",
                &format_args!("<{} redacted>", self.servant_tokens.len()),
            )
            .field("min_daemon_version", &self.min_daemon_version)
            .field(
                "servant_min_memory_for_accepting_new_task",
                &self.servant_min_memory_for_accepting_new_task,
            )
            .field(
                "serving_daemon_token_rollout_interval",
                &self.serving_daemon_token_rollout_interval,
            )
            .field(
                "serving_daemon_token_secret",
                &self
                    .serving_daemon_token_secret
                    .as_ref()
                    .map(|_| "<redacted>"),
            )
            .field("adoption_window", &self.adoption_window)
            .field("adopted_lease", &self.adopted_lease)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Bounds on what one request may ask, so no client can make a call cost
/// more than a known amount. Exceeding one is `InvalidArgument`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest `next_heartbeat_in` (30 s; the reference rejects > 30000 ms).
    pub max_next_heartbeat: Duration,
    /// Longest `wait` of `WaitForStartingTask` (10 s).
    pub max_wait: Duration,
    /// Longest lease / keep-alive interval (30 s).
    pub max_keep_alive: Duration,
    /// Most grants one request may ask for, immediate + prefetch (1024).
    pub max_grants_per_request: u32,
    /// Most ids in one keep-alive or free request (65536).
    pub max_ids_per_request: usize,
    /// Most environments one heartbeat may list (1024).
    pub max_environments_per_servant: usize,
    /// Most running tasks one heartbeat may list (65536).
    pub max_running_tasks_per_servant: usize,
    /// Most queued requests at once; beyond, `NoQuotaAvailable` at once (100000).
    pub max_waiters: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_next_heartbeat: Duration::from_secs(30),
            max_wait: Duration::from_secs(10),
            max_keep_alive: Duration::from_secs(30),
            max_grants_per_request: 1024,
            max_ids_per_request: 65536,
            max_environments_per_servant: 1024,
            max_running_tasks_per_servant: 65536,
            max_waiters: 100_000,
        }
    }
}

/// What every handle shares: immutable configuration, the state and the
/// expiry task's wake-up.
pub(crate) struct Shared {
    limits: Limits,
    min_daemon_version: u32,
    user_tokens: TokenSet,
    servant_tokens: TokenSet,
    state: Mutex<State>,
    wake: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` under the lock with the engine clock's `now`, then wakes the
    /// expiry task if `f` created an earlier deadline.
    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        let mut st = self.lock();
        let now = Instant::now();
        let result = f(&mut st, now);
        let wake = std::mem::take(&mut st.wake_expiry);
        drop(st);
        if wake {
            self.wake.notify_one();
        }
        result
    }

    fn check_user(&self, token: &str) -> Result<(), Rejection> {
        if self.user_tokens.accepts(&tokens::digest(token)) {
            Ok(())
        } else {
            Err(Rejection::AccessDenied)
        }
    }
}

/// Stops the expiry task when the last [`Scheduler`] clone is dropped.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.lock().stopped = true;
        self.shared.wake.notify_one();
    }
}

/// The engine handle. Cheap to clone; all clones share one state.
#[derive(Clone)]
pub struct Scheduler {
    handle: Arc<Handle>,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler").finish_non_exhaustive()
    }
}

/// Rule "limits": a duration field over its limit is `InvalidArgument` naming
/// the wire field and the limit.
fn check_duration(field: &str, value: Duration, limit: Duration) -> Result<(), Rejection> {
    if value > limit {
        Err(Rejection::InvalidArgument(format!(
            "{field} {} exceeds the {} ms limit",
            value.as_millis(),
            limit.as_millis()
        )))
    } else {
        Ok(())
    }
}

/// Rule "limits": a list over its limit is `InvalidArgument` naming the wire
/// field and the limit.
fn check_count(field: &str, count: usize, limit: usize) -> Result<(), Rejection> {
    if count > limit {
        Err(Rejection::InvalidArgument(format!(
            "{field} has {count} entries, more than the {limit} limit"
        )))
    } else {
        Ok(())
    }
}

/// The one background task: sleeps until the earliest servant expiry or
/// lease end (or until woken because an earlier one appeared), then sweeps.
async fn run_expiry(shared: Arc<Shared>) {
    loop {
        let next = {
            let mut st = shared.lock();
            if st.stopped {
                return;
            }
            st.expire(Instant::now());
            st.wake_expiry = false;
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

impl Scheduler {
    /// Must be called inside a tokio runtime: spawns the one expiry task. The task stops when the last handle is dropped.
    pub fn new(config: Config) -> Scheduler {
        let now = Instant::now();
        let state = State::new(&config, now);
        let shared = Arc::new(Shared {
            limits: config.limits.clone(),
            min_daemon_version: config.min_daemon_version,
            user_tokens: TokenSet::new(&config.user_tokens),
            servant_tokens: TokenSet::new(&config.servant_tokens),
            state: Mutex::new(state),
            wake: Notify::new(),
        });
        tokio::spawn(run_expiry(shared.clone()));
        Scheduler {
            handle: Arc::new(Handle { shared }),
        }
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// `Heartbeat`: registers or refreshes a servant and tells it which grant
    /// ids to kill and which serving-daemon tokens to accept.
    ///
    /// Checked in order: token (user or servant), version, `next_heartbeat_in`,
    /// list sizes.
    pub fn heartbeat(&self, hb: Heartbeat) -> Result<HeartbeatReply, Rejection> {
        let sh = self.shared();
        let presented = tokens::digest(&hb.token);
        let verified = sh.servant_tokens.accepts(&presented);
        let user = sh.user_tokens.accepts(&presented);
        if !(verified | user) {
            return Err(Rejection::AccessDenied);
        }
        if hb.version < sh.min_daemon_version {
            return Err(Rejection::VersionTooOld {
                version: hb.version,
                minimum: sh.min_daemon_version,
            });
        }
        check_duration(
            "next_heartbeat_in_ms",
            hb.next_heartbeat_in,
            sh.limits.max_next_heartbeat,
        )?;
        check_count(
            "env_descs",
            hb.environments.len(),
            sh.limits.max_environments_per_servant,
        )?;
        check_count(
            "running_tasks",
            hb.running_tasks.len(),
            sh.limits.max_running_tasks_per_servant,
        )?;
        Ok(sh.with_state(|st, now| st.heartbeat(hb, verified, now)))
    }

    /// `GetConfig`: the active serving-daemon token (the middle of the three).
    pub fn get_config(&self, token: &str) -> Result<String, Rejection> {
        let sh = self.shared();
        sh.check_user(token)?;
        Ok(sh.with_state(|st, now| st.tokens.current(now)[1].clone()))
    }

    /// `WaitForStartingTask`: up to `immediate` then `prefetch` grants. Only the
    /// first grant may wait (up to `wait`, in fair arrival order); the rest come
    /// from capacity free right now. Cancel-safe: dropping the future leaves
    /// the queue and releases anything already handed to it.
    pub async fn wait_for_starting_task(&self, req: GrantRequest) -> Result<Vec<Grant>, Rejection> {
        let sh = self.shared();
        sh.check_user(&req.token)?;
        check_duration("milliseconds_to_wait", req.wait, sh.limits.max_wait)?;
        check_duration("next_keep_alive_in_ms", req.lease, sh.limits.max_keep_alive)?;
        if req.environment.is_empty() {
            return Err(Rejection::InvalidArgument(
                "env_desc.compiler_digest is empty".to_owned(),
            ));
        }
        let total = u64::from(req.immediate) + u64::from(req.prefetch);
        if total == 0 {
            return Err(Rejection::InvalidArgument(
                "immediate_reqs + prefetch_reqs is 0; ask for at least one grant".to_owned(),
            ));
        }
        let limit = sh.limits.max_grants_per_request;
        if total > u64::from(limit) {
            return Err(Rejection::InvalidArgument(format!(
                "immediate_reqs + prefetch_reqs is {total}, more than the {limit} limit"
            )));
        }
        let total = u32::try_from(total).unwrap_or(limit);
        match sh.with_state(|st, now| st.admit(&req, total, now))? {
            Admission::Granted(grants) => Ok(grants),
            Admission::Queued {
                env,
                seq,
                rx,
                deadline,
            } => {
                let guard = WaitGuard {
                    shared: sh.clone(),
                    env,
                    seq,
                    rx: Some(rx),
                };
                guard.wait(deadline).await
            }
        }
    }

    /// `KeepTaskAlive`: one status per id, in order: true if renewed
    /// (lease = now + `lease`), false if unknown or a zombie.
    pub fn keep_alive(
        &self,
        token: &str,
        grant_ids: &[u64],
        lease: Duration,
    ) -> Result<Vec<bool>, Rejection> {
        let sh = self.shared();
        sh.check_user(token)?;
        check_duration("next_keep_alive_in_ms", lease, sh.limits.max_keep_alive)?;
        check_count(
            "task_grant_ids",
            grant_ids.len(),
            sh.limits.max_ids_per_request,
        )?;
        Ok(sh.with_state(|st, now| {
            grant_ids
                .iter()
                .map(|&id| st.renew(id, lease, now))
                .collect()
        }))
    }

    /// `FreeTask`: releases every known id (unknown ids are skipped, never
    /// stopping early) and serves waiting requests at once.
    pub fn free(&self, token: &str, grant_ids: &[u64]) -> Result<(), Rejection> {
        let sh = self.shared();
        sh.check_user(token)?;
        check_count(
            "task_grant_ids",
            grant_ids.len(),
            sh.limits.max_ids_per_request,
        )?;
        sh.with_state(|st, now| st.free_ids(grant_ids, now));
        Ok(())
    }

    /// `GetRunningTasks`: every task servants reported, with the servant's
    /// observed location. Cached; rebuilt (outside the lock) only after a
    /// heartbeat or expiry changed it.
    pub fn running_tasks(&self) -> Arc<[RunningTask]> {
        let sh = self.shared();
        let (version, parts) = match sh.with_state(|st, now| st.running_tasks_parts(now)) {
            RunningParts::Cached(cached) => return cached,
            RunningParts::Stale { version, parts } => (version, parts),
        };
        let flat: Arc<[RunningTask]> = parts.iter().flat_map(|p| p.iter().cloned()).collect();
        sh.with_state(|st, now| {
            // A newer list may have been cached meanwhile; never replace it
            // with an older one.
            if st
                .running_cache
                .as_ref()
                .is_none_or(|(cached, _, _)| *cached <= version)
            {
                st.running_cache = Some((version, now, flat.clone()));
            }
        });
        flat
    }

    /// Cluster totals and event counters, cheap enough to read every second.
    pub fn totals(&self) -> (ClusterTotals, Counters) {
        self.shared().with_state(|st, _| (st.totals(), st.counters))
    }

    /// Inspection data for the dashboard (O(cluster); not for hot paths).
    pub fn snapshot(&self) -> Snapshot {
        self.shared().with_state(|st, now| st.snapshot(now))
    }

    /// Graceful shutdown: every queued waiter is answered now (with the grants it has, else NoQuotaAvailable),
    /// later waits do not block. Idempotent.
    pub fn shutdown(&self) {
        self.shared().with_state(|st, _| st.shutdown());
    }

    /// True once [`Scheduler::shutdown`] ran, so readiness probes can report
    /// "not ready" while the server drains.
    pub fn is_shutting_down(&self) -> bool {
        self.shared().with_state(|st, _| st.shutting_down)
    }
}
