//! The scheduling engine: servants, grants, waiters, tokens and expiry.
//!
//! No HTTP and no protobuf here: the service layer converts wire messages to
//! the domain types of this module and maps [`Rejection`] to the seed's
//! `Status`. [`Scheduler`] is a cheap-to-clone handle over one
//! `std::sync::Mutex<State>` (the mini-redis `db.rs` pattern); the lock is
//! never held across an `.await`, and every hot path (heartbeat, grant, renew,
//! free) costs O(items in the request x log n), not O(cluster).
//!
//! Module map. The owners come first: each keeps one index family
//! consistent behind private fields and imports nothing that holds it. The
//! rules that change several owners together are `impl State` blocks in the
//! files after `state`. Every `use` points up this list: no import cycles
//! (the list is checked against the `mod` lines by `tests/it/rules.rs`).
//! - `tokens`: token sets (the flag's splitting rule), constant-time checks,
//!   [`Redacted`], the serving-daemon token ring (owner: `TokenRing`).
//! - `types`: requests, replies, [`Rejection`], internal ids, `later`.
//! - `config`: [`Config`] and [`Limits`].
//! - `views`: what the engine shows of itself ([`Snapshot`], [`Counters`]).
//! - `requesters`: requesters: owners (address and token), turns (a
//!   daemon's connection, or an address), figures per address (owner:
//!   `Requesters`).
//! - `adoption`: what the window after start remembers (`AdoptionWindow`,
//!   held by `Grants`).
//! - `tenants`: tenants (owner: `Tenants`: weights, caps, virtual times,
//!   figures) and the token directory a reload swaps whole (`Access`).
//! - `wait_queues`: per-environment queues fair between tenants, then
//!   between requesters, and `WaitQueues`, the only writer of a queue, with
//!   the waiter caps.
//! - `envs`: per-environment indexes (owner: `Envs`): servants with a free
//!   slot in placement order, accepting versions, the queue; `Effects`, the
//!   follow-up work a change of them asks for.
//! - `own_load`: rule "own load": the 15 s average of the grants on a
//!   servant (owner: `OwnLoad`).
//! - `speed`: rule "observed speed": how soon a servant's grants come back.
//! - `ejection`: rule "broken servants": which returned grants failed, and
//!   a servant's ejections (`Outlier`, `FarmHold`).
//! - `servants`: the servant registry with its address index, expiries,
//!   reports and running-task list (owner: `Servants`); the capacity rule.
//! - `grants`: the grant table with lease deadlines, adoption memory and
//!   grant counters (owner: `Grants`).
//! - `fence`: until when this instance may grant ([`GrantFence`]; always,
//!   unless it is one of two elected on etcd).
//! - `cordons`: the locations operators took out of rotation (owner:
//!   `Cordons`; [`Cordon`], [`CordonView`]).
//! - `state`: the owners behind the lock, deadlines and the expiry sweep.
//! - `shared`: the lock, the user-token check, the expiry task.
//! - `lifecycle`: the placement rule, the one grant creation
//!   (`create_grant`), the one grant removal (`remove_grant`), renew, free
//!   (by their owner only), zombies.
//! - `heartbeat`: location and admission rules, applying a heartbeat
//!   (reports, adoption, reaping), removing a servant.
//! - `hosts`: the addresses live servants heartbeat from, read by the edge
//!   without the lock (its reserve of the body budget).
//! - `waiters`: admission of `WaitForStartingTask`, the fair serving pass,
//!   timeouts, cancellation, shutdown.
//! - `cordoning`: a cordon applied to the servants it covers, and the
//!   cordons as people see them.
//! - `snapshot`: totals, counters and the inspection snapshot.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

mod adoption;
mod config;
mod cordoning;
mod cordons;
mod ejection;
mod envs;
mod fence;
mod grants;
mod heartbeat;
mod hosts;
mod lifecycle;
mod own_load;
mod requesters;
mod servants;
mod shared;
mod snapshot;
mod speed;
mod state;
mod tenants;
pub(crate) mod tokens;
mod types;
mod views;
mod wait_queues;
mod waiters;

#[cfg(test)]
mod tests;

pub use config::{Config, Limits};
pub use cordons::{Cordon, CordonState, CordonView};
pub use ejection::{BrokenGrant, OutlierState};
pub use fence::GrantFence;
pub use hosts::ServantHosts;
pub use state::SERVANTS_SETTLE;
pub use tenants::{
    DEFAULT_TENANT, MAX_TENANT_WEIGHT, MIN_TENANT_WEIGHT, Tenancy, TenantSpec, WAIT_BUCKETS,
};
pub use tokens::{Redacted, TokenDigest, TokenSet};

/// SHA-256 of a user or servant token: what a tenants file's
/// `user_token_sha256` lists.
pub fn token_digest(token: &str) -> TokenDigest {
    tokens::digest(token)
}
pub use types::{
    Grant, GrantRequest, Heartbeat, HeartbeatReply, NotAcceptingReason, Rejection, ReportedTask,
    RequesterId, RunningTask, ServantPriority,
};
pub use views::{
    ClusterTotals, Counters, EjectionEvent, EnvironmentView, GrantView, OutlierView, RequesterView,
    ServantView, Snapshot, TenantView,
};

use requesters::Owner;
use shared::Shared;
use waiters::{Admission, WaitCaller, WaitGuard};

/// Stops the expiry task when the last [`Scheduler`] clone is dropped.
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.stop();
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

/// Rule "location", for a location an operator names (as the servant
/// reports it); an IPv4-mapped IPv6 address is the IPv4 one.
pub fn check_location(location: &str) -> Result<SocketAddr, Rejection> {
    let parsed = heartbeat::parse_location(location)?;
    Ok(SocketAddr::new(parsed.ip().to_canonical(), parsed.port()))
}

/// Grant ids renewed or freed under one hold of the engine's lock: about a
/// tenth of a millisecond of work (rule "ids in slices").
pub const ID_SLICE: usize = 1024;

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

impl Scheduler {
    /// Must be called inside a tokio runtime: spawns the one expiry task. The task stops when the last handle is dropped.
    pub fn new(config: Config) -> Scheduler {
        Scheduler {
            handle: Arc::new(Handle {
                shared: Shared::start(&config),
            }),
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
        let access = sh.access();
        let verified = access.servant_tokens.accepts(&presented);
        let user = access.tenant_of(&presented).is_some();
        drop(access);
        if !(verified | user) {
            return Err(Rejection::AccessDenied);
        }
        if hb.version < sh.min_daemon_version {
            return Err(Rejection::VersionTooOld {
                version: hb.version,
                minimum: sh.min_daemon_version,
            });
        }
        let reported = heartbeat::parse_location(&hb.location)?;
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
    /// first grant may wait (up to `wait`, fairly between requesters); the rest
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
        let (presented, tenant) = sh.check_user(&req.token)?;
        check_duration("milliseconds_to_wait", req.wait, sh.limits.max_wait)?;
        if let Some(left) = req.answer_within {
            req.wait = req.wait.min(left);
        }
        check_duration("next_keep_alive_in_ms", req.lease, sh.limits.max_keep_alive)?;
        // An empty digest is no argument error: no servant offers it, so it
        // is answered as any environment nobody offers (see `admit`).
        check_digest(
            "env_desc.compiler_digest",
            &req.environment,
            sh.limits.max_digest_chars,
        )?;
        let limit = sh.limits.max_grants_per_request;
        let total = req.immediate.saturating_add(req.prefetch).min(limit);
        let immediate = req.immediate.min(total);
        let owner = Owner::new(req.requester_ip, &presented);
        let requester = RequesterId::of(&req);
        let caller = WaitCaller {
            owner,
            requester,
            tenant,
        };
        match sh.with_state(|st, now| st.admit(&req, caller, immediate, total, now))? {
            Admission::Granted(grants) => Ok(grants),
            Admission::Queued {
                env,
                seq,
                rx,
                deadline,
            } => {
                WaitGuard::new(sh.clone(), env, seq, rx)
                    .wait(deadline)
                    .await
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
        let caller = self.renewer(token, requester, grant_ids.len(), lease)?;
        Ok(self.shared().with_state(|st, now| {
            grant_ids
                .iter()
                .map(|&id| st.renew(id, caller, lease, now))
                .collect()
        }))
    }

    /// [`Scheduler::keep_alive`] as the RPC runs it, by rule
    /// "ids in slices": at most [`ID_SLICE`] ids under one hold of the lock, and
    /// the task yields between slices, so a delegate renewing 65,536 grants
    /// (or twenty doing so at once) delays everyone else's calls by a slice,
    /// never by the whole batch. Each id is renewed as of its own slice.
    pub async fn keep_alive_in_slices(
        &self,
        token: &str,
        requester: IpAddr,
        grant_ids: &[u64],
        lease: Duration,
    ) -> Result<Vec<bool>, Rejection> {
        let caller = self.renewer(token, requester, grant_ids.len(), lease)?;
        let sh = self.shared();
        let mut statuses = Vec::with_capacity(grant_ids.len());
        for (index, slice) in grant_ids.chunks(ID_SLICE).enumerate() {
            if index > 0 {
                tokio::task::yield_now().await;
            }
            sh.with_state(|st, now| {
                statuses.extend(slice.iter().map(|&id| st.renew(id, caller, lease, now)));
            });
        }
        Ok(statuses)
    }

    /// The checks of a renewal of `count` ids, in order: the caller's
    /// token, the lease, the count.
    fn renewer(
        &self,
        token: &str,
        requester: IpAddr,
        count: usize,
        lease: Duration,
    ) -> Result<Owner, Rejection> {
        let sh = self.shared();
        let caller = Owner::new(requester, &sh.check_user(token)?.0);
        check_duration("next_keep_alive_in_ms", lease, sh.limits.max_keep_alive)?;
        check_count("task_grant_ids", count, sh.limits.max_ids_per_request)?;
        Ok(caller)
    }

    /// `FreeTask`: releases every known id this caller received (unknown ids
    /// and other callers' grants are skipped, never stopping early) and
    /// serves waiting requests at once.
    pub fn free(&self, token: &str, requester: IpAddr, grant_ids: &[u64]) -> Result<(), Rejection> {
        let caller = self.freer(token, requester, grant_ids.len())?;
        self.shared()
            .with_state(|st, now| st.free_ids(grant_ids, caller, now));
        Ok(())
    }

    /// [`Scheduler::free`] as the RPC runs it, by rule "ids in slices": a
    /// delegate freeing 65,536 ids delays everyone else's calls by a slice.
    /// Each slice's freed slots serve waiting requests at once.
    pub async fn free_in_slices(
        &self,
        token: &str,
        requester: IpAddr,
        grant_ids: &[u64],
    ) -> Result<(), Rejection> {
        let caller = self.freer(token, requester, grant_ids.len())?;
        let sh = self.shared();
        for (index, slice) in grant_ids.chunks(ID_SLICE).enumerate() {
            if index > 0 {
                tokio::task::yield_now().await;
            }
            sh.with_state(|st, now| st.free_ids(slice, caller, now));
        }
        Ok(())
    }

    /// The checks of a release of `count` ids, in order: the caller's
    /// token, the count.
    fn freer(&self, token: &str, requester: IpAddr, count: usize) -> Result<Owner, Rejection> {
        let sh = self.shared();
        let caller = Owner::new(requester, &sh.check_user(token)?.0);
        check_count("task_grant_ids", count, sh.limits.max_ids_per_request)?;
        Ok(caller)
    }

    /// `GetRunningTasks`: the tasks verified servants not behind NAT reported
    /// under grants live there, with the servant's observed location.
    pub fn running_tasks(&self) -> Arc<[RunningTask]> {
        self.running_tasks_with_version().1
    }

    /// [`Scheduler::running_tasks`] and the version of the list
    /// ([`Scheduler::running_tasks_version`]), which callers are shown from
    /// now on. Built outside the lock.
    pub fn running_tasks_with_version(&self) -> (u64, Arc<[RunningTask]>) {
        let (version, parts) = self
            .shared()
            .with_state(|st, now| st.servants.running_tasks_parts(now));
        let flat = parts.iter().flat_map(|p| p.iter().cloned()).collect();
        (version, flat)
    }

    /// The version of the `GetRunningTasks` list callers are shown now. It
    /// changes only when a heartbeat or an expiry changed the list, and at
    /// most once per `running_tasks_refresh`: whoever keeps an answer built
    /// from the list rebuilds it when this changes, and only then.
    pub fn running_tasks_version(&self) -> u64 {
        self.shared()
            .with_state(|st, now| st.servants.running_tasks_version(now))
    }

    /// Cluster totals and event counters, cheap enough to read every second.
    pub fn totals(&self) -> (ClusterTotals, Counters) {
        self.shared()
            .with_state(|st, _| (st.totals(), st.counters()))
    }

    /// Each requesting machine's figures, sorted by IP: O(machines), without
    /// the rest of a snapshot, for the dashboard's once-a-second grant rates.
    pub fn requesters(&self) -> Vec<RequesterView> {
        self.shared().with_state(|st, _| st.requesters.views())
    }

    /// Every tenant's standing and figures, configured ones first:
    /// O(tenants), for metrics, the dashboard and `/api/v1/tenants`.
    pub fn tenants(&self) -> Vec<TenantView> {
        self.shared().with_state(|st, _| {
            let slots = st.grants.len() as u64 + st.servants.free_slots();
            st.tenants.views(slots)
        })
    }

    /// Rule "reload": the tenants and tokens of `tenancy` from now on
    /// (checked by whoever read it). A removed token's next call is
    /// refused; its grants end as they would; its waiting calls stay queued
    /// under their tenant.
    pub fn set_tenancy(&self, tenancy: &Tenancy) {
        self.shared().set_tenancy(tenancy);
    }

    /// Inspection data for the dashboard (O(cluster); not for hot paths).
    pub fn snapshot(&self) -> Snapshot {
        self.shared().with_state(|st, now| st.snapshot(now))
    }

    /// The addresses live servants heartbeat from, for the edge's budget of
    /// buffered bodies; follows every change (and a restart).
    pub fn servant_hosts(&self) -> ServantHosts {
        self.shared().with_state(|st, _| st.servants.hosts.clone())
    }

    /// Graceful shutdown: every queued waiter is answered now (with the grants it has, else NoQuotaAvailable),
    /// later waits do not block. Idempotent.
    pub fn shutdown(&self) {
        self.shared().with_state(|st, _| st.shutdown());
    }

    /// Rule "leadership": starts over as a restarted scheduler does, for an
    /// instance that just won the election: every record dropped (a queued
    /// waiter is answered first), the adoption window open from now, the
    /// serving-daemon tokens from the configured secret. What the
    /// instance held as an earlier leader is stale: the other one granted since.
    pub fn restart(&self) {
        self.shared().restart();
    }

    /// Rule "cordon": the location and reason of a cordon or drain, checked
    /// (rule "location", the reason's length and characters, the number of
    /// cordons) before anything is saved or changed.
    pub fn check_cordon(&self, location: &str, reason: &str) -> Result<SocketAddr, Rejection> {
        let sh = self.shared();
        let location = check_location(location)?;
        let limit = sh.limits.max_cordon_reason_chars;
        if reason.len() > limit && reason.chars().count() > limit {
            return Err(Rejection::InvalidArgument(format!(
                "reason is {} characters long, more than the {limit} character limit",
                reason.chars().count()
            )));
        }
        if !yadcc_text::grammar::is_one_line(reason) {
            return Err(Rejection::InvalidArgument(
                "reason must be one line without control characters".to_owned(),
            ));
        }
        let most = sh.limits.max_cordons;
        let full =
            sh.with_state(|st, _| st.cordons.get(location).is_none() && st.cordons.len() >= most);
        if full {
            return Err(Rejection::InvalidArgument(format!(
                "{most} locations are cordoned already, the limit: uncordon some first"
            )));
        }
        Ok(location)
    }

    /// Rule "cordon": no new grant goes to the servants at `location` (now
    /// or when they register); their tasks go on. Replaces what was set
    /// there. Check it first ([`Scheduler::check_cordon`]).
    pub fn cordon(&self, location: SocketAddr, cordon: Cordon) -> CordonView {
        self.shared().with_state(|st, now| {
            st.cordon(location, cordon, now);
            st.cordon_views()
                .into_iter()
                .find(|view| view.location == location)
                .expect("the cordon just set")
        })
    }

    /// Puts the servants at `location` back into rotation; false if it was
    /// not cordoned.
    pub fn uncordon(&self, location: SocketAddr) -> bool {
        self.shared()
            .with_state(|st, now| st.uncordon(location, now))
    }

    /// Every cordon, with the tasks still running under it, by location.
    pub fn cordons(&self) -> Vec<CordonView> {
        self.shared().with_state(|st, _| st.cordon_views())
    }

    /// Replaces every cordon with `entries` (a saved state, read when this
    /// instance starts or starts to lead).
    pub fn replace_cordons(&self, entries: Vec<(SocketAddr, Cordon)>) {
        self.shared()
            .with_state(|st, now| st.replace_cordons(entries, now));
    }

    /// Rule "taking over": the grant fence just opened (this instance won
    /// the election); calls queued while it was closed are served now
    /// rather than at the next heartbeat, and those whose environment no
    /// servant has offered meanwhile are answered as at admission.
    pub fn serve_waiters(&self) {
        self.shared().with_state(|st, now| st.serve_all(now));
    }
}
