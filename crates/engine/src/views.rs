//! What the engine shows of itself: the inspection snapshot (read by the
//! dashboard and metrics), its totals and its event counters. Plain data.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::time::Instant;

use super::cordons::CordonView;
use super::ejection::{BrokenGrant, Outlier, OutlierState};
use super::types::{NotAcceptingReason, ServantPriority};

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
    /// Cordoned locations (registered or not), by location.
    pub cordons: Vec<CordonView>,
    /// Sums over the cluster.
    pub totals: ClusterTotals,
    /// Event counters since start.
    pub counters: Counters,
    /// Time until the next serving-daemon token rollout.
    pub serving_daemon_tokens_rollout_in: Duration,
    /// The latest ejections of broken servants, oldest first.
    pub ejections: Vec<EjectionEvent>,
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
    /// `min(capacity, processors - foreign load)`; under the memory floor
    /// `running` (no free slot), as the original computes it.
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
    /// The cordon that covers it, if an operator took it out of rotation.
    pub cordon: Option<CordonView>,
    /// Its place within its tier by rule "observed speed" as of its last
    /// report or free: 0 unknown (tried first), then 1 for the soonest
    /// grants back up to 63; always 0 with the rule off.
    pub speed_class: u8,
    /// The typical time its immediate grants were held before their owner
    /// freed them (rule "observed speed"); `None` while too few came back
    /// recently, or with the rule off.
    pub typical_grant: Option<Duration>,
    /// Rule "broken servants": in rotation, ejected or on trial, and why.
    pub outlier: OutlierView,
}

/// Where a servant stands by rule "broken servants".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutlierView {
    /// Time left of its ejection, if it is ejected.
    pub ejected_for: Option<Duration>,
    /// Back after an ejection, taking one grant at a time.
    pub on_trial: bool,
    /// Ejections that count towards the next one's length.
    pub ejections: u32,
    /// The evidence of its latest ejection.
    pub last_evidence: Option<BrokenGrant>,
}

impl OutlierView {
    pub(crate) fn new(outlier: &Outlier, now: Instant) -> OutlierView {
        OutlierView {
            ejected_for: match outlier.state() {
                OutlierState::Ejected { until } => Some(until.saturating_duration_since(now)),
                _ => None,
            },
            on_trial: outlier.on_trial(),
            ejections: outlier.ejections(),
            last_evidence: outlier.last_evidence(),
        }
    }

    /// The state's name, as the dashboard and `ListServantStates` spell it.
    pub fn state(&self) -> &'static str {
        match (self.ejected_for, self.on_trial) {
            (Some(_), _) => "ejected",
            (None, true) => "on_trial",
            (None, false) => "in_rotation",
        }
    }
}

/// One ejection (rule "broken servants"), for the audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EjectionEvent {
    /// How long ago.
    pub ago: Duration,
    /// Observed and reported locations of the servant.
    pub servant: SocketAddr,
    pub reported: SocketAddr,
    /// Its ejections counting towards this one's length.
    pub ejections: u32,
    pub evidence: BrokenGrant,
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

/// One requesting machine (a delegate's IP, or an office behind it), for
/// the Requesters view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequesterView {
    /// Its IP as the scheduler sees it.
    pub ip: IpAddr,
    /// Grants it owns now (live and zombie).
    pub grants_held: u64,
    /// Its calls waiting for quota now.
    pub waiting: u64,
    /// Requesters of this address with calls waiting now: daemon
    /// connections (many behind a NAT address), or the address itself.
    pub waiting_requesters: u64,
    /// Its calls refused at once since start because a waiter cap was
    /// reached (its requester's, or the total): a cap biting.
    pub wait_cap_refusals: u64,
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
    /// Servants with `max_tasks > 0` that no operator cordoned.
    pub servants_accepting: usize,
    /// Live servants an operator cordoned (or is draining).
    pub servants_cordoned: usize,
    /// Sum of `max_tasks`.
    pub capacity: u64,
    /// Free slots: sum of `max(capacity_available - running, 0)`.
    pub capacity_available: u64,
    /// Sum of `max(max_tasks - max(capacity_available, running), 0)`: slots
    /// taken by load, low memory or a cordon. `running + capacity_available
    /// + capacity_unavailable = capacity + running_over_capacity`.
    pub capacity_unavailable: u64,
    /// Sum of `max(running - max_tasks, 0)`: grants beyond the slots their
    /// servant offers now (it lowered its capacity after the grant).
    pub running_over_capacity: u64,
    /// Grants counted against servants (live + zombie).
    pub running: u64,
    /// Zombie grants.
    pub zombies: u64,
    /// Queued requests.
    pub waiters: usize,
    /// Grants known (same as `running`, counted from the grant table).
    pub grants: usize,
    /// Servants ejected now (rule "broken servants").
    pub servants_ejected: usize,
}

/// Events since start, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Immediate grants given back broken (rule "broken servants").
    pub broken_grants: u64,
    /// Servants ejected (rule "broken servants").
    pub ejections: u64,
    /// Ejections the share cap held back.
    pub ejections_capped: u64,
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
    /// Of those, requests refused at once because `max_waiters` calls were
    /// queued in all.
    pub wait_refused_total_cap: u64,
    /// Of those, requests refused at once because their requester had
    /// `max_waiters_per_requester` calls queued.
    pub wait_refused_requester_cap: u64,
}

/// One tenant's standing: its configuration and what it holds and waits for
/// now, with its figures since start (the Tenants view, `/api/v1/tenants`,
/// and the `tenant` label of the metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct TenantView {
    pub name: String,
    /// False for a tenant a reload removed that still waits or holds.
    pub configured: bool,
    pub weight: f64,
    /// Its weight over the configured tenants' sum: its share when every
    /// tenant waits.
    pub weight_share: f64,
    pub max_share: Option<f64>,
    /// Its calls queued now.
    pub waiting: u64,
    /// Grants it holds now (live and zombie).
    pub held: u64,
    /// The farm's slots now (held and free), the same for every tenant.
    pub slots: u64,
    /// Grants made to it since start.
    pub grants_total: u64,
    /// How long its granted calls waited: counts per bucket of
    /// [`super::WAIT_BUCKETS`], the last one above them all.
    pub wait_buckets: Vec<u64>,
    pub wait_sum: Duration,
}
