//! Inspection snapshot (read by the dashboard and metrics) and the cached
//! running-task list (read by `GetRunningTasks`).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::state::State;
use super::types::{NotAcceptingReason, RunningTask, ServantPriority};

/// A point-in-time copy of the engine for people and metrics. Plain data: the
/// dashboard and metrics convert it themselves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Time since `Scheduler::new`.
    pub uptime: Duration,
    /// Live servants, in registration order.
    pub servants: Vec<ServantView>,
    /// Grants (live, zombie, adopted), oldest first.
    pub grants: Vec<GrantView>,
    /// Environments, sorted by digest.
    pub environments: Vec<EnvironmentView>,
    /// Requesting machines (holding or waiting for grants, or seen
    /// recently), sorted by IP.
    pub requesters: Vec<RequesterView>,
    /// Sums over the cluster.
    pub totals: ClusterTotals,
    /// Event counters since start.
    pub counters: Counters,
    /// Time until the next serving-daemon token rollout.
    pub serving_daemon_tokens_rollout_in: Duration,
}

/// One servant as the reference's inspection dump showed it, plus queue sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServantView {
    /// Peer IP + reported port; the servant's identity.
    pub observed_location: SocketAddr,
    /// What the servant reported (differs when behind NAT).
    pub reported_location: SocketAddr,
    /// Daemon version.
    pub version: u32,
    /// Dedicated or user machine.
    pub priority: ServantPriority,
    /// Compiler digests offered, sorted.
    pub environments: Vec<String>,
    /// Capacity after the admission rules (0 when not accepting).
    pub max_tasks: u32,
    /// Effective reason for not accepting: not verified, NAT, reported, or
    /// the memory floor (shown as `PoorMachine`).
    pub not_accepting_reason: Option<NotAcceptingReason>,
    /// Processors (after the old-daemon rule).
    pub num_processors: u32,
    /// Load average reported.
    pub current_load: u32,
    /// `min(capacity, processors - foreign load)`, 0 under the memory floor.
    pub capacity_available: u32,
    /// Total memory in bytes (0 = not reported).
    pub total_memory: u64,
    /// Available memory in bytes.
    pub memory_available: u64,
    /// Grants counted against it (live + zombie).
    pub running: u32,
    /// Zombie grants among `running`.
    pub zombies: u32,
    /// Grants ever made there (adoptions included).
    pub ever_assigned: u64,
    /// Tasks in its last report.
    pub reported_running_tasks: usize,
    /// Requests queued for environments this servant offers.
    pub waiters: usize,
    /// Time since it registered.
    pub discovered_ago: Duration,
    /// Time until it expires without another heartbeat.
    pub expires_in: Duration,
    /// It sent `next_heartbeat_in = 0`.
    pub leaving: bool,
}

/// One grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantView {
    /// Grant id.
    pub id: u64,
    /// Requester IP; `None` if adopted after a restart.
    pub requester: Option<IpAddr>,
    /// Observed location of its servant.
    pub servant: SocketAddr,
    /// Compiler digest; `None` if adopted.
    pub environment: Option<String>,
    /// Time since it was granted (or adopted).
    pub age: Duration,
    /// Time until the lease ends (zero for zombies).
    pub lease_left: Duration,
    /// Answers a prefetch request.
    pub prefetch: bool,
    /// Lease ended; still counted until the servant stops reporting it.
    pub zombie: bool,
    /// Adopted from a servant's report during the adoption window.
    pub adopted: bool,
}

/// One environment across the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentView {
    /// Compiler digest.
    pub digest: String,
    /// Live servants offering it.
    pub servants: usize,
    /// Sum of `capacity_available` of those servants (u64: a sum over
    /// servants of u32 values cannot overflow it).
    pub capacity_available: u64,
    /// Sum of grants counted against those servants.
    pub running: u64,
    /// Requests queued for it.
    pub waiters: usize,
}

/// One requesting machine (a delegate's IP), for the Requesters view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequesterView {
    /// Its IP as the scheduler sees it.
    pub ip: IpAddr,
    /// Grants it owns now (live and zombie).
    pub grants_held: u64,
    /// Its calls waiting for quota now.
    pub waiting: u64,
    /// Grants made to it since start.
    pub grants_total: u64,
    /// Its renewals and frees of grants it does not own, refused since start.
    pub refused_total: u64,
}

/// Cluster-wide sums (the reference dump's totals, plus queue and grant counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClusterTotals {
    /// Live servants.
    pub servants_up: usize,
    /// Servants with `max_tasks > 0`.
    pub servants_accepting: usize,
    /// Sum of `max_tasks`.
    pub capacity: u64,
    /// Free slots: sum of `max(capacity_available - running, 0)`.
    pub capacity_available: u64,
    /// Sum of `max_tasks - capacity_available` (load, memory).
    pub capacity_unavailable: u64,
    /// Grants counted against servants (live + zombie).
    pub running: u64,
    /// Zombie grants.
    pub zombies: u64,
    /// Queued requests.
    pub waiters: usize,
    /// Grants known (same as `running`, counted from the grant table).
    pub grants: usize,
}

/// Events since start, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Grants made.
    pub grants_issued: u64,
    /// Successful renewals.
    pub renewals: u64,
    /// Grants released by `free` (or by a cancelled waiter).
    pub frees: u64,
    /// Leases that ended (grant became a zombie).
    pub leases_expired: u64,
    /// Zombies forgotten after their servant stopped reporting them.
    pub zombies_reaped: u64,
    /// Unknown running tasks adopted during the adoption window.
    pub adoptions: u64,
    /// Adopted grants that ended because their servant stopped listing them.
    pub adoptions_ended: u64,
    /// Renewals inside the adoption window of ids no servant had reported
    /// yet, answered true and remembered.
    pub early_renewals: u64,
    /// Renewals refused because the grant belongs to another requester.
    pub renewals_refused: u64,
    /// Frees skipped because the grant belongs to another requester.
    pub frees_refused: u64,
    /// Servants removed after expiry or leaving.
    pub servants_expired: u64,
    /// Requests answered `NoQuotaAvailable`.
    pub no_quota: u64,
}

/// The running-task list, or what it is built from.
pub(crate) enum RunningParts {
    /// Still current.
    Cached(Arc<[RunningTask]>),
    /// Per-servant lists to flatten outside the lock; cache the result only
    /// if `version` is still current then.
    Stale {
        version: u64,
        parts: Vec<Arc<[RunningTask]>>,
    },
}

impl State {
    /// Cluster totals: one pass over the servants, nothing allocated, so the
    /// once-a-second history sampler and metrics scrapes hold the lock for
    /// microseconds, not for a whole snapshot.
    pub(crate) fn totals(&self) -> ClusterTotals {
        let mut totals = ClusterTotals {
            grants: self.grants.len(),
            waiters: self.waiter_count,
            ..ClusterTotals::default()
        };
        for s in self.servants.values() {
            let available = s.capacity_available();
            let running = s.granted();
            totals.servants_up += 1;
            totals.servants_accepting += usize::from(s.max_tasks > 0);
            totals.capacity += u64::from(s.max_tasks);
            totals.capacity_available += u64::from(available.saturating_sub(running));
            totals.capacity_unavailable += u64::from(s.max_tasks.saturating_sub(available));
            totals.running += u64::from(running);
            totals.zombies += s.zombies.len() as u64;
        }
        totals
    }

    /// Builds the snapshot. O(cluster): for people, not hot paths.
    pub(crate) fn snapshot(&mut self, now: Instant) -> Snapshot {
        let mut keys: Vec<_> = self.servants.keys().copied().collect();
        keys.sort_unstable();
        let totals = self.totals();
        let mut servants = Vec::with_capacity(keys.len());
        for key in keys {
            let s = &self.servants[&key];
            let available = s.capacity_available();
            let running = s.granted();
            let waiters = s
                .envs
                .iter()
                .filter_map(|l| self.envs.get(l.id))
                .map(|e| e.waiters.len())
                .sum();
            servants.push(ServantView {
                observed_location: s.observed,
                reported_location: s.reported,
                version: s.version,
                priority: s.priority,
                environments: s.envs.iter().map(|l| l.name.to_string()).collect(),
                max_tasks: s.max_tasks,
                not_accepting_reason: s.effective_reason(),
                num_processors: s.num_processors,
                current_load: s.current_load,
                capacity_available: available,
                total_memory: s.total_memory,
                memory_available: s.memory_available,
                running,
                zombies: u32::try_from(s.zombies.len()).unwrap_or(u32::MAX),
                ever_assigned: s.ever_assigned,
                reported_running_tasks: s.reported_tasks.len(),
                waiters,
                discovered_ago: now.saturating_duration_since(s.discovered_at),
                expires_in: s.expires_at.saturating_duration_since(now),
                leaving: s.leaving,
            });
        }

        let mut grants: Vec<GrantView> = self
            .grants
            .iter()
            .map(|(id, g)| GrantView {
                id,
                requester: g.owner.map(|o| o.ip),
                servant: g.servant_addr,
                environment: g.environment.as_deref().map(str::to_owned),
                age: now.saturating_duration_since(g.granted_at),
                lease_left: if g.zombie {
                    Duration::ZERO
                } else {
                    g.lease_until.saturating_duration_since(now)
                },
                prefetch: g.prefetch,
                zombie: g.zombie,
                adopted: g.adopted,
            })
            .collect();
        grants.sort_unstable_by(|a, b| b.age.cmp(&a.age).then(a.id.cmp(&b.id)));

        let mut environments: Vec<EnvironmentView> = self
            .envs
            .iter()
            .map(|e| EnvironmentView {
                digest: e.name.to_string(),
                servants: e.offering,
                capacity_available: 0,
                running: 0,
                waiters: e.waiters.len(),
            })
            .collect();
        environments.sort_unstable_by(|a, b| a.digest.cmp(&b.digest));
        for s in self.servants.values() {
            for link in &s.envs {
                if let Ok(i) = environments.binary_search_by(|e| e.digest.as_str().cmp(&link.name))
                {
                    let e = &mut environments[i];
                    e.capacity_available += u64::from(s.capacity_available());
                    e.running += u64::from(s.granted());
                }
            }
        }

        let mut requesters: Vec<RequesterView> = self
            .requesters
            .iter()
            .map(|(&ip, r)| RequesterView {
                ip,
                grants_held: r.held,
                waiting: r.waiting as u64,
                grants_total: r.grants_total,
                refused_total: r.refused_total,
            })
            .collect();
        requesters.sort_unstable_by_key(|r| r.ip);

        Snapshot {
            uptime: now.saturating_duration_since(self.start),
            servants,
            grants,
            environments,
            requesters,
            totals,
            counters: self.counters,
            serving_daemon_tokens_rollout_in: self.tokens.rollout_in(now),
        }
    }

    /// The cached running-task list if it is current or younger than
    /// `running_tasks_refresh`; else the per-servant lists (registration
    /// order) to flatten outside the lock, and the version they belong to.
    pub(crate) fn running_tasks_parts(&self, now: Instant) -> RunningParts {
        if let Some((version, built_at, cached)) = &self.running_cache
            && (*version == self.running_version
                || now.saturating_duration_since(*built_at) < self.running_tasks_refresh)
        {
            return RunningParts::Cached(cached.clone());
        }
        let mut keys: Vec<_> = self.servants.keys().copied().collect();
        keys.sort_unstable();
        let parts = keys
            .iter()
            .map(|k| self.servants[k].reported_tasks.clone())
            .filter(|p| !p.is_empty())
            .collect();
        RunningParts::Stale {
            version: self.running_version,
            parts,
        }
    }
}
