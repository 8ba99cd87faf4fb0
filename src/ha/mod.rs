//! A hot standby: two (or more) schedulers elect a leader on etcd and only
//! the leader serves; the others take over within seconds when it dies.
//!
//! The election is etcd's own (its `v3election` service: `Campaign`,
//! `Leader`, `Observe`, `Resign`, on a lease kept alive with `LeaseGrant`
//! and `LeaseKeepAlive`); nothing here decides who leads. What this module
//! adds is what a scheduler must do about it ([`election`]):
//!
//! - on winning, start as a restarted scheduler does
//!   ([`crate::engine::Scheduler::restart`]: adoption window open from now,
//!   serving-daemon tokens from the shared secret), then serve;
//! - fencing: grant only while the lease certainly runs. Each renewal moves
//!   the engine's [`GrantFence`] to the time the lease could expire at the
//!   earliest (sent + TTL, less a margin); the engine checks it on every
//!   placement, so a leader that cannot renew, or was paused past its lease,
//!   stops granting before etcd can let another instance win;
//! - on losing, stop serving at once.
//!
//! The rest of the server sees [`Leadership`] only: whether this instance
//! serves now (the call core refuses RPCs otherwise), a way to run a daemon
//! connection only while it leads (the listener closes them on losing, so
//! daemons reconnect through the load balancer), the role and the leader's
//! name for `/readyz`, the dashboard and the metrics ([`HaStats`]); and it
//! sets the server's one [`Readiness`] (what `/readyz` and the gRPC health
//! service report): not ready while standing by. Without
//! `--ha_etcd_endpoints` it is [`Leadership::solo`]: always serving, no
//! clock read, no task.

pub mod election;
mod etcd;

use std::{
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use prometheus_client::metrics::{
    counter::Counter,
    histogram::{Histogram, exponential_buckets},
};
use tokio::{sync::watch, time::Instant};

use crate::{
    engine::GrantFence,
    readiness::{NotReady, Readiness},
};

/// Default `--ha_election_name`: the etcd election (a key prefix) both
/// instances campaign in.
pub const DEFAULT_ELECTION_NAME: &str = "yadcc-scheduler";
/// Default `--ha_lease_ttl`.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(3);
/// The shortest lease etcd keeps as asked (its minimum is 1.5 x its
/// election timeout, 1.5 s by default; a shorter one is raised anyway).
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);

/// What `--ha_*` configure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaSettings {
    /// etcd's client URLs (`http://host:2379`), tried in turn.
    pub endpoints: Vec<String>,
    /// The election's name (a key prefix in etcd).
    pub election_name: String,
    /// The lease's time to live, whole seconds: how long a dead leader
    /// holds the election at most.
    pub lease_ttl: Duration,
    /// What this instance proclaims when it leads, shown by the others
    /// ("standby, leader is X").
    pub instance: String,
}

/// What an instance listening on `local` proclaims when it leads: the
/// address daemons' operators know it by (the host's name when it listens
/// on every interface).
pub fn instance_name(local: std::net::SocketAddr) -> String {
    if local.ip().is_unspecified() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|name| name.trim().to_owned())
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        format!("{host}:{}", local.port())
    } else {
        local.to_string()
    }
}

/// This instance's part in the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// Serves: the only scheduler, or the elected one.
    Leader,
    /// Does not serve; `leader` is the elected instance's name, if known.
    Standby { leader: Option<String> },
}

impl Role {
    pub fn is_leader(&self) -> bool {
        matches!(self, Role::Leader)
    }

    /// For people: `/readyz`, the dashboard, refused calls.
    pub fn describe(&self) -> String {
        match self {
            Role::Leader => "leader".to_owned(),
            Role::Standby { leader: Some(name) } => format!("standby, leader is {name}"),
            Role::Standby { leader: None } => "standby, no leader elected".to_owned(),
        }
    }
}

/// What the election did, for the metrics.
#[derive(Debug)]
pub struct HaStats {
    /// Times this instance won the election.
    pub elections_won: Counter,
    /// From sending a lease renewal to etcd's answer.
    pub renew_latency: Histogram,
    /// When this instance last became leader or stopped being one (or started).
    changed_at: Mutex<Instant>,
}

impl HaStats {
    fn new() -> Self {
        HaStats {
            elections_won: Counter::default(),
            // 1 ms .. ~4 s: a loopback etcd answers in a millisecond, one
            // that cannot reach its quorum not before the TTL.
            renew_latency: Histogram::new(exponential_buckets(0.001, 2.0, 13)),
            changed_at: Mutex::new(Instant::now()),
        }
    }

    /// Time since the last change of role.
    pub fn since_change(&self) -> Duration {
        self.changed_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }
}

/// Whether this instance serves. Cheap to clone; every clone is the same.
#[derive(Debug, Clone)]
pub struct Leadership(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    fence: GrantFence,
    role: watch::Sender<Role>,
    /// The one readiness (`/readyz`, gRPC health): not ready while standing by.
    readiness: Readiness,
    /// None for [`Leadership::solo`].
    stats: Option<HaStats>,
}

impl Leadership {
    /// The only scheduler: leads for good.
    pub fn solo() -> Self {
        Leadership(Arc::new(Inner {
            fence: GrantFence::open(),
            role: watch::Sender::new(Role::Leader),
            readiness: Readiness::new(),
            stats: None,
        }))
    }

    /// One of several, a standby until [`election`] says otherwise; `fence`
    /// is the engine's ([`crate::engine::Config::grant_fence`]), closed.
    pub fn elected(fence: GrantFence) -> Self {
        fence.close();
        let readiness = Readiness::new();
        readiness.set_not_ready(NotReady::Standby);
        Leadership(Arc::new(Inner {
            fence,
            role: watch::Sender::new(Role::Standby { leader: None }),
            readiness,
            stats: Some(HaStats::new()),
        }))
    }

    /// Whether calls are served now: the fence's deadline, so it is right
    /// the moment the lease could have run out, before the election task
    /// has run (after a pause, say).
    pub fn is_serving(&self) -> bool {
        self.0.fence.allows(Instant::now())
    }

    /// Why calls are not served now (None: they are).
    pub fn refusal(&self) -> Option<String> {
        if self.is_serving() {
            return None;
        }
        let role = self.role();
        // The fence closed before the election task noticed.
        let role = if role.is_leader() {
            Role::Standby { leader: None }
        } else {
            role
        };
        Some(role.describe())
    }

    /// The role as the election last set it.
    pub fn role(&self) -> Role {
        self.0.role.borrow().clone()
    }

    /// The role as people should see it: standby once the fence is closed,
    /// even before the election task noticed.
    pub fn current(&self) -> Role {
        match self.role() {
            Role::Leader if !self.is_serving() => Role::Standby { leader: None },
            role => role,
        }
    }

    /// The server's one readiness, which the election sets: ready while
    /// leading (and not shutting down).
    pub fn readiness(&self) -> &Readiness {
        &self.0.readiness
    }

    /// Sees every later change of role.
    pub fn subscribe(&self) -> watch::Receiver<Role> {
        self.0.role.subscribe()
    }

    /// The election's figures; None without an election.
    pub fn stats(&self) -> Option<&HaStats> {
        self.0.stats.as_ref()
    }

    /// Runs `work` (a daemon connection) until it ends or this instance
    /// stops leading, whichever is first: a standby holds no daemon
    /// connection, so their clients reconnect through the load balancer.
    pub async fn while_leading(&self, work: impl Future<Output = ()>) {
        if self.0.stats.is_none() {
            return work.await;
        }
        let mut role = self.subscribe();
        tokio::select! {
            () = work => {}
            _ = role.wait_for(|role| !role.is_leader()) => {}
        }
    }

    /// Leads until the fence's `deadline` (see [`election`]).
    fn lead(&self, deadline: Instant) {
        self.0.fence.open_until(deadline);
        self.set_role(Role::Leader);
        if let Some(stats) = &self.0.stats {
            stats.elections_won.inc();
        }
    }

    /// The lease runs at least until `deadline`.
    fn extend(&self, deadline: Instant) {
        if self.role().is_leader() {
            self.0.fence.open_until(deadline);
        }
    }

    /// Stops granting at once, then says so.
    fn stand_by(&self, leader: Option<String>) {
        self.0.fence.close();
        self.set_role(Role::Standby { leader });
    }

    fn set_role(&self, role: Role) {
        let changed = self.0.role.send_if_modified(|now| {
            let change = now.is_leader() != role.is_leader();
            let modified = *now != role;
            *now = role;
            if change && let Some(stats) = &self.0.stats {
                *stats
                    .changed_at
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Instant::now();
            }
            modified
        });
        if self.role().is_leader() {
            self.0.readiness.clear(NotReady::Standby);
        } else {
            self.0.readiness.set_not_ready(NotReady::Standby);
        }
        if changed {
            tracing::info!(target: election::LOG, "now {}", self.role().describe());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_solo_scheduler_always_serves() {
        let solo = Leadership::solo();
        assert!(solo.is_serving());
        assert_eq!(solo.refusal(), None);
        assert!(solo.stats().is_none());
        let mut ran = false;
        solo.while_leading(async { ran = true }).await;
        assert!(ran);
    }

    #[tokio::test(start_paused = true)]
    async fn an_elected_instance_serves_only_while_its_lease_certainly_runs() {
        let fence = GrantFence::closed();
        let leadership = Leadership::elected(fence);
        assert!(!leadership.is_serving());
        assert_eq!(
            leadership.refusal().as_deref(),
            Some("standby, no leader elected")
        );
        assert_eq!(leadership.readiness().current(), Err(NotReady::Standby));
        leadership.lead(Instant::now() + Duration::from_secs(2));
        assert!(leadership.is_serving());
        assert_eq!(leadership.readiness().current(), Ok(()));
        assert_eq!(leadership.stats().unwrap().elections_won.get(), 1);
        // Paused past the deadline: not serving, before anyone noticed.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(leadership.role().is_leader());
        assert!(!leadership.is_serving());
        assert_eq!(leadership.current(), Role::Standby { leader: None });
        leadership.stand_by(Some("b:8336".to_owned()));
        assert_eq!(leadership.readiness().current(), Err(NotReady::Standby));
        assert_eq!(
            leadership.refusal().as_deref(),
            Some("standby, leader is b:8336")
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_daemon_connection_ends_when_leadership_is_lost() {
        let leadership = Leadership::elected(GrantFence::closed());
        leadership.lead(Instant::now() + Duration::from_secs(60));
        let held = {
            let leadership = leadership.clone();
            tokio::spawn(async move {
                leadership.while_leading(std::future::pending::<()>()).await;
            })
        };
        tokio::task::yield_now().await;
        assert!(!held.is_finished());
        leadership.stand_by(None);
        tokio::time::timeout(Duration::from_secs(1), held)
            .await
            .expect("closed at once")
            .unwrap();
    }
}
