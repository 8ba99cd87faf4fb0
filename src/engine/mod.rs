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
//! - `grants`: ids, leases, renew, free (by their owner only), zombies.
//! - `adoption`: the window after start in which running tasks are adopted.
//! - `requesters`: requesting machines: owners, last served, figures.
//! - `waiters`: queues fair between machines, timeouts, cancellation.
//! - `tokens`: token sets (the flag's splitting rule), constant-time checks,
//!   [`Redacted`], the serving-daemon token ring.
//! - `snapshot`: inspection data and the running-task list.
//! - `state`: the state behind the lock and the expiry sweep.

use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

mod adoption;
mod grants;
mod placement;
mod requesters;
mod servants;
mod snapshot;
mod state;
pub(crate) mod tokens;
mod types;
mod waiters;

#[cfg(test)]
mod tests;

pub use snapshot::{
    ClusterTotals, Counters, EnvironmentView, GrantView, RequesterView, ServantView, Snapshot,
};
pub use tokens::{Redacted, TokenSet};
pub use types::{
    Grant, GrantRequest, Heartbeat, HeartbeatReply, NotAcceptingReason, Rejection, ReportedTask,
    RunningTask, ServantPriority,
};

use requesters::Owner;
use snapshot::RunningParts;
use state::State;
use tokens::TokenDigest;
use waiters::{Admission, WaitGuard};

/// Engine configuration, fixed for the life of a [`Scheduler`].
///
/// Token sets: see [`TokenSet`] (literal entries; an empty entry is the
/// empty token; only [`TokenSet::anyone`] lets anyone in). `Debug` prints no
/// token and no secret (they are [`Redacted`]).
#[derive(Clone, Debug)]
pub struct Config {
    /// Tokens of delegates (`--acceptable_user_tokens`); needed by every call
    /// except `Heartbeat`, which also takes them (servant then not verified).
    pub user_tokens: TokenSet,
    /// Tokens of servants (`--acceptable_servant_tokens`).
    pub servant_tokens: TokenSet,
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
    pub serving_daemon_token_secret: Option<Redacted<Vec<u8>>>,
    /// After start, running tasks that verified servants not behind NAT
    /// report under grant ids this instance never issued are adopted instead
    /// of killed (default 15 s, a little longer than a 10 s heartbeat
    /// expiry, so every live servant reports once). See `adoption`.
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
            user_tokens: TokenSet::default(),
            servant_tokens: TokenSet::default(),
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

/// Bounds on what one request, one client or the whole state may hold, so
/// no client can make a call cost more than a known amount. Exceeding a
/// request bound is `InvalidArgument`, except where noted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest `next_heartbeat_in` (30 s; the reference rejects > 30000 ms).
    pub max_next_heartbeat: Duration,
    /// Longest `wait` of `WaitForStartingTask` (10 s).
    pub max_wait: Duration,
    /// Longest lease / keep-alive interval (30 s).
    pub max_keep_alive: Duration,
    /// Most grants one request gets, immediate + prefetch (1024). A request
    /// asking for more is capped, never refused (a delegate running
    /// `make -j1100` asks for 1100).
    pub max_grants_per_request: u32,
    /// Most ids in one keep-alive or free request (65536).
    pub max_ids_per_request: usize,
    /// Most environments one heartbeat may list (1024).
    pub max_environments_per_servant: usize,
    /// Most running tasks one heartbeat may list (8192; a servant runs at
    /// most about as many tasks as it has processors).
    pub max_running_tasks_per_servant: usize,
    /// Most running tasks all servants' last reports may hold together
    /// (1 Mi); a heartbeat that would pass it is refused.
    pub max_reported_tasks: usize,
    /// Longest compiler or task digest, in characters (256; yadcc's are 64 hex
    /// characters).
    pub max_digest_chars: usize,
    /// Most queued requests at once; beyond, `NoQuotaAvailable` at once (100000).
    pub max_waiters: usize,
    /// Most queued requests of one requesting machine (IP); beyond,
    /// `NoQuotaAvailable` at once (64; a delegate keeps one long poll per
    /// compiler).
    pub max_waiters_per_machine: usize,
    /// Requesting machines remembered for the Requesters view; beyond, idle
    /// ones are forgotten (65536).
    pub max_requesters: usize,
    /// Ids this instance issued that were freed or expired during the
    /// adoption window, remembered so as never to adopt them (1 Mi); beyond,
    /// the window closes early. Only the engine's own grants count here.
    pub max_adoption_retired_ids: usize,
    /// Ids nobody had reported yet that were freed during the adoption
    /// window, remembered so as never to adopt them (1 Mi); beyond, further
    /// such frees are not remembered (the window stays open: any user-token
    /// holder can free made-up ids).
    pub max_adoption_early_frees: usize,
    /// Renewals during the adoption window of ids no servant reported yet
    /// that it remembers, in total (1 Mi, like `max_reported_tasks`: no more
    /// can be reported); beyond, such renewals answer false.
    pub max_adoption_early_renewals: usize,
    /// The same, per renewing machine (IP) (8192: far more grants than one
    /// delegate holds), so one machine cannot use up the total.
    pub max_adoption_early_renewals_per_machine: usize,
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
            max_running_tasks_per_servant: 8192,
            max_reported_tasks: 1 << 20,
            max_digest_chars: 256,
            max_waiters: 100_000,
            max_waiters_per_machine: 64,
            max_requesters: 65536,
            max_adoption_retired_ids: 1 << 20,
            max_adoption_early_frees: 1 << 20,
            max_adoption_early_renewals: 1 << 20,
            max_adoption_early_renewals_per_machine: 8192,
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

    /// Rule "order of checks": the token comes first in every call. Returns
    /// the digest, which identifies the caller as a grant's owner.
    fn check_user(&self, token: &str) -> Result<TokenDigest, Rejection> {
        let presented = tokens::digest(token);
        if self.user_tokens.accepts(&presented) {
            Ok(presented)
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

/// Rule "limits": a digest longer than `max_digest_chars` is
/// `InvalidArgument` naming the wire field. Counted in characters, as JSON
/// Schema's `maxLength` counts, so the OpenAPI document can state the limit.
fn check_digest(field: &str, digest: &str, limit: usize) -> Result<(), Rejection> {
    // At most 4 bytes a character: only long strings need counting.
    if digest.len() > limit && digest.chars().count() > limit {
        Err(Rejection::InvalidArgument(format!(
            "{field} is {} characters long, more than the {limit} character limit",
            digest.chars().count()
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
            user_tokens: config.user_tokens.clone(),
            servant_tokens: config.servant_tokens.clone(),
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
    /// Rule "order of checks": token (user or servant), version, `location`,
    /// `next_heartbeat_in`, then the report's bounds (list sizes, digest
    /// lengths, the cluster's total of reported tasks).
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
        let reported = servants::parse_location(&hb.location)?;
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
        let limit = sh.limits.max_digest_chars;
        for env in &hb.environments {
            check_digest("env_descs.compiler_digest", env, limit)?;
        }
        for task in &hb.running_tasks {
            check_digest("running_tasks.task_digest", &task.task_digest, limit)?;
        }
        sh.with_state(|st, now| st.heartbeat(hb, reported, verified, now))
    }

    /// `GetConfig`: the active serving-daemon token (the middle of the three).
    pub fn get_config(&self, token: &str) -> Result<String, Rejection> {
        let sh = self.shared();
        sh.check_user(token)?;
        Ok(sh.with_state(|st, now| st.tokens.current(now)[1].clone()))
    }

    /// `WaitForStartingTask`: up to `immediate` then `prefetch` grants. Only the
    /// first grant may wait (up to `wait`, fairly between machines); the rest
    /// come from capacity free right now. Cancel-safe: dropping the future
    /// leaves the queue and releases anything already handed to it.
    ///
    /// Rule "no upper bound on immediate_reqs": more than
    /// `max_grants_per_request` is capped to it (immediate first), never refused.
    pub async fn wait_for_starting_task(
        &self,
        mut req: GrantRequest,
    ) -> Result<Vec<Grant>, Rejection> {
        let sh = self.shared();
        let presented = sh.check_user(&req.token)?;
        check_duration("milliseconds_to_wait", req.wait, sh.limits.max_wait)?;
        if let Some(left) = req.answer_within {
            req.wait = req.wait.min(left);
        }
        check_duration("next_keep_alive_in_ms", req.lease, sh.limits.max_keep_alive)?;
        if req.environment.is_empty() {
            return Err(Rejection::InvalidArgument(
                "env_desc.compiler_digest is empty".to_owned(),
            ));
        }
        check_digest(
            "env_desc.compiler_digest",
            &req.environment,
            sh.limits.max_digest_chars,
        )?;
        let limit = sh.limits.max_grants_per_request;
        let total = req.immediate.saturating_add(req.prefetch).min(limit);
        if total == 0 {
            return Err(Rejection::InvalidArgument(
                "immediate_reqs + prefetch_reqs is 0; ask for at least one grant".to_owned(),
            ));
        }
        let immediate = req.immediate.min(total);
        let owner = Owner::new(req.requester_ip, &presented);
        match sh.with_state(|st, now| st.admit(&req, owner, immediate, total, now))? {
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
    /// (lease = now + `lease`), false if unknown, a zombie, or not received
    /// by this caller (same token, same `requester` IP; see `grants`).
    pub fn keep_alive(
        &self,
        token: &str,
        requester: IpAddr,
        grant_ids: &[u64],
        lease: Duration,
    ) -> Result<Vec<bool>, Rejection> {
        let sh = self.shared();
        let caller = Owner::new(requester, &sh.check_user(token)?);
        check_duration("next_keep_alive_in_ms", lease, sh.limits.max_keep_alive)?;
        check_count(
            "task_grant_ids",
            grant_ids.len(),
            sh.limits.max_ids_per_request,
        )?;
        Ok(sh.with_state(|st, now| {
            grant_ids
                .iter()
                .map(|&id| st.renew(id, caller, lease, now))
                .collect()
        }))
    }

    /// `FreeTask`: releases every known id this caller received (unknown ids
    /// and other callers' grants are skipped, never stopping early) and
    /// serves waiting requests at once.
    pub fn free(&self, token: &str, requester: IpAddr, grant_ids: &[u64]) -> Result<(), Rejection> {
        let sh = self.shared();
        let caller = Owner::new(requester, &sh.check_user(token)?);
        check_count(
            "task_grant_ids",
            grant_ids.len(),
            sh.limits.max_ids_per_request,
        )?;
        sh.with_state(|st, now| st.free_ids(grant_ids, caller, now));
        Ok(())
    }

    /// `GetRunningTasks`: the tasks verified servants not behind NAT reported
    /// under grants live there, with the servant's observed location. Cached; rebuilt (outside the lock) only after a
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
