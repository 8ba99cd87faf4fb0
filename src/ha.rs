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
//! - on losing, stop serving at once;
//! - taking over: the load balancer sends daemons to a standby only when no
//!   instance is ready (`scripts/deploy/haproxy.cfg`'s backup servers), and
//!   for the seconds until the dead leader's lease runs out nobody can
//!   grant. A standby that daemons reach, and whose elected leader does not
//!   answer its `/readyz` ([`probe`]), serves them as a restarted scheduler
//!   in its adoption window that may not grant yet: heartbeats, renewals,
//!   frees, the token and the task list are answered, and
//!   `WaitForStartingTask` waits for the fence (an unknown environment too:
//!   its servants may not have reported yet), if it campaigns with a lease
//!   of its own (one cut off from etcd cannot win, and would hold the
//!   daemons from the instance that will). When it wins, it keeps what
//!   it learnt and grants at once; when the leader answers again, it closes
//!   those connections, as any standby does. So daemons see only the calls
//!   in flight on the dead leader fail, not every call of the failover.
//!
//! The rest of the server sees [`Leadership`] only: whether this instance
//! serves now (the call core refuses RPCs otherwise), whether a daemon
//! connection is served and until when (the listener closes them when this
//! instance stops leading or taking over, so daemons reconnect through the
//! load balancer), the role and the leader's name for `/readyz`, the
//! dashboard and the metrics ([`HaStats`]); and it sets the server's one
//! [`Readiness`] (what `/readyz` and the gRPC health service report): not
//! ready unless leading. Without `--ha_etcd_endpoints` it is
//! [`Leadership::solo`]: always serving, no clock read, no task.

mod connection;
pub mod election;
mod etcd;
pub mod failsafe;
mod failsafe_peers;
pub mod probe;
pub mod saved_state;

use std::{
    future::Future,
    sync::{
        Arc, Mutex, OnceLock, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use prometheus_client::metrics::{
    counter::Counter,
    histogram::{Histogram, exponential_buckets},
};
use tokio::{sync::watch, time::Instant};

pub use saved_state::SavedStateKeeper;

use crate::{
    engine::{GrantFence, Scheduler},
    readiness::{NotReady, Readiness},
};
use saved_state::LeaderTerm;

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
    /// `--ha_resign_unchecked_after`: a leader whose readiness nobody asked
    /// for this long resigns; None never.
    pub resign_unchecked_after: Option<Duration>,
    /// What this instance proclaims when it leads, shown by the others
    /// ("standby, leader is X").
    pub instance: String,
    /// How etcd is reached: TLS files and etcd's authentication.
    pub access: EtcdAccess,
    /// `--ha_failsafe_secret_file`: keys the calls between instances that
    /// keep a leader granting while etcd does not answer ([`failsafe`]);
    /// None: no failsafe, a leader steps down within its lease.
    pub failsafe_secret: Option<crate::engine::Redacted<Vec<u8>>>,
}

/// `--ha_etcd_ca_file`, `--ha_etcd_cert_file`/`--ha_etcd_key_file` and
/// `--ha_etcd_user`/`--ha_etcd_password_file`: how the endpoints are
/// reached (the files are read again on every connection).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// The CA (PEM) etcd's server certificates chain to; needed by
    /// `https://` endpoints.
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate chain and its key (PEM), for an etcd that runs
    /// `--client-cert-auth`.
    pub client_identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// etcd's user authentication; None calls without a token.
    pub credentials: Option<EtcdCredentials>,
}

/// An etcd user and its password (read from `--ha_etcd_password_file`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdCredentials {
    pub user: String,
    pub password: crate::engine::Redacted<String>,
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
    /// Does not lead; `leader` is the elected instance's name, if known.
    /// `taking_over`: daemons reached this instance while that leader did
    /// not answer, and are served without grants until it leads or the
    /// leader answers again.
    Standby {
        leader: Option<String>,
        taking_over: bool,
    },
}

impl Role {
    pub fn is_leader(&self) -> bool {
        matches!(self, Role::Leader)
    }

    /// A standby with no leader known, not taking over.
    pub fn standby() -> Role {
        Role::Standby {
            leader: None,
            taking_over: false,
        }
    }

    /// A standby serving daemons whose leader does not answer.
    pub fn is_taking_over(&self) -> bool {
        matches!(
            self,
            Role::Standby {
                taking_over: true,
                ..
            }
        )
    }

    /// Whether daemon connections are served: leading or taking over.
    pub fn serves_daemons(&self) -> bool {
        self.is_leader() || self.is_taking_over()
    }

    /// For people: `/readyz`, the dashboard, refused calls.
    pub fn describe(&self) -> String {
        match self {
            Role::Leader => "leader".to_owned(),
            Role::Standby {
                leader: Some(name),
                taking_over: false,
            } => format!("standby, leader is {name}"),
            Role::Standby {
                leader: None,
                taking_over: false,
            } => "standby, no leader elected".to_owned(),
            Role::Standby {
                leader: Some(name),
                taking_over: true,
            } => format!("standby taking over, leader {name} does not answer"),
            Role::Standby {
                leader: None,
                taking_over: true,
            } => "standby taking over, no leader elected".to_owned(),
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
    /// Restarted when a takeover begins, or on a win without one; None
    /// for [`Leadership::solo`].
    engine: Option<Scheduler>,
    /// One probe of the leader at a time; what it found, and when.
    probed: tokio::sync::Mutex<Option<(Instant, bool)>>,
    /// When a balancer last asked `/readyz` (or this instance began to
    /// lead): a leader no balancer reaches may resign
    /// ([`HaSettings::resign_unchecked_after`]).
    checked_at: Mutex<Instant>,
    /// Whether this instance holds a lease and campaigns with it: only
    /// then may it win, so only then does it take daemons over (one cut
    /// off from etcd would hold them from the instance that will lead).
    campaigning: AtomicBool,
    fence: GrantFence,
    role: watch::Sender<Role>,
    /// Moves on every change that ends the daemon connections held (from
    /// leading or taking over to neither), so none misses one that a new
    /// takeover follows at once.
    closings: watch::Sender<u64>,
    /// The one readiness (`/readyz`, gRPC health): not ready while standing by.
    readiness: Readiness,
    /// None for [`Leadership::solo`].
    stats: Option<HaStats>,
    /// Restores the saved state on every win ([`saved_state`]).
    keeper: OnceLock<Arc<dyn SavedStateKeeper>>,
    /// While leading: how to write the saved state.
    term: Mutex<Option<LeaderTerm>>,
    /// With `--ha_failsafe_secret_file`, once the election starts.
    failsafe: OnceLock<Arc<failsafe_peers::FailsafeState>>,
    /// When etcd last answered a renewal: an instance etcd answers denies a
    /// failsafe question (it may win once the lease runs out).
    etcd_answered_at: Mutex<Option<Instant>>,
    /// Won the election, waiting out a failsafe confirmation's hold: it
    /// leads on etcd, so it denies as a leader does.
    won_waiting: AtomicBool,
}

impl Leadership {
    /// The only scheduler: leads for good.
    pub fn solo() -> Self {
        Leadership(Arc::new(Inner {
            engine: None,
            probed: tokio::sync::Mutex::new(None),
            checked_at: Mutex::new(Instant::now()),
            campaigning: AtomicBool::new(false),
            fence: GrantFence::open(),
            role: watch::Sender::new(Role::Leader),
            closings: watch::Sender::new(0),
            readiness: Readiness::new(),
            stats: None,
            keeper: OnceLock::new(),
            term: Mutex::new(None),
            failsafe: OnceLock::new(),
            etcd_answered_at: Mutex::new(None),
            won_waiting: AtomicBool::new(false),
        }))
    }

    /// One of several, a standby until [`election`] says otherwise; `fence`
    /// is `engine`'s ([`crate::engine::Config::grant_fence`]), closed.
    pub fn elected(engine: Scheduler, fence: GrantFence) -> Self {
        fence.close();
        let readiness = Readiness::new();
        readiness.set_not_ready(NotReady::Standby);
        Leadership(Arc::new(Inner {
            engine: Some(engine),
            probed: tokio::sync::Mutex::new(None),
            checked_at: Mutex::new(Instant::now()),
            campaigning: AtomicBool::new(false),
            fence,
            role: watch::Sender::new(Role::standby()),
            closings: watch::Sender::new(0),
            readiness,
            stats: Some(HaStats::new()),
            keeper: OnceLock::new(),
            term: Mutex::new(None),
            failsafe: OnceLock::new(),
            etcd_answered_at: Mutex::new(None),
            won_waiting: AtomicBool::new(false),
        }))
    }

    /// Whether calls are served now: the fence's deadline, so it is right
    /// the moment the lease could have run out, before the election task
    /// has run (after a pause, say).
    pub fn is_serving(&self) -> bool {
        self.0.fence.allows(Instant::now())
    }

    /// Why calls are not served now (None: they are, by the leader or by a
    /// standby taking over, whose fence keeps it from granting).
    pub fn refusal(&self) -> Option<String> {
        if self.is_serving() {
            return None;
        }
        match self.role() {
            role if role.is_taking_over() => None,
            // The fence closed before the election task noticed.
            Role::Leader => Some(Role::standby().describe()),
            role => Some(role.describe()),
        }
    }

    /// The role as the election last set it.
    pub fn role(&self) -> Role {
        self.0.role.borrow().clone()
    }

    /// The role as people should see it: standby once the fence is closed,
    /// even before the election task noticed.
    pub fn current(&self) -> Role {
        match self.role() {
            Role::Leader if !self.is_serving() => Role::standby(),
            role => role,
        }
    }

    /// The server's one readiness, which the election sets: ready while
    /// leading (and not shutting down).
    pub fn readiness(&self) -> &Readiness {
        &self.0.readiness
    }

    /// Who restores the saved state each time this instance starts to lead
    /// (once, before the election starts).
    pub fn keep_saved_state(&self, keeper: Arc<dyn SavedStateKeeper>) {
        let _ = self.0.keeper.set(keeper);
    }

    fn keeper(&self) -> Option<&Arc<dyn SavedStateKeeper>> {
        self.0.keeper.get()
    }

    /// Writes the saved state to etcd, if this instance still leads the
    /// election when etcd applies it ([`saved_state::write`]).
    pub async fn save_state(&self, value: Vec<u8>) -> Result<(), String> {
        let term = self
            .0
            .term
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match term {
            Some(term) => saved_state::write(term, value).await,
            None => Err("this instance does not lead the election".to_owned()),
        }
    }

    fn set_term(&self, term: Option<LeaderTerm>) {
        *self.0.term.lock().unwrap_or_else(PoisonError::into_inner) = term;
    }

    /// The election's figures; None without an election.
    pub fn stats(&self) -> Option<&HaStats> {
        self.0.stats.as_ref()
    }

    /// Whether a daemon connection that just reached this instance is
    /// served: yes while leading; a standby takes over when the leader it
    /// knows of does not answer its `/readyz` (or none is known), and
    /// otherwise closes it, so the daemon reconnects through the balancer.
    pub async fn admits_daemons(&self) -> bool {
        if self.is_serving() {
            return true;
        }
        let leader = match self.role() {
            Role::Leader => return false,
            role if role.is_taking_over() => return true,
            Role::Standby { leader, .. } => leader,
        };
        if !self.is_campaigning() || self.leader_answers(leader.as_deref()).await {
            return false;
        }
        self.take_over();
        self.role().serves_daemons()
    }

    /// Whether `leader` answers its `/readyz`, asked at most once per
    /// [`probe::PROBE_TIMEOUT`]: a burst of reconnecting daemons probes once.
    async fn leader_answers(&self, leader: Option<&str>) -> bool {
        let Some(leader) = leader else {
            return false;
        };
        let mut probed = self.0.probed.lock().await;
        if let Some((at, ready)) = *probed
            && at.elapsed() < probe::PROBE_TIMEOUT
        {
            return ready;
        }
        let ready = probe::is_ready(leader).await;
        *probed = Some((Instant::now(), ready));
        ready
    }

    /// Starts taking over, once: a fresh engine (adoption window open from
    /// now), and a watch that ends the takeover when the leader answers.
    fn take_over(&self) {
        let Some(engine) = &self.0.engine else {
            return;
        };
        // Under the role's lock: no connection is served from the stale
        // state, and a win cannot slip in between.
        if self.switch_takeover(true, || engine.restart()) {
            tokio::spawn(self.clone().end_takeover_when_the_leader_answers());
        }
    }

    /// Turns taking over on or off, if it is not so already (a leader
    /// never is); `on_switch` runs under the role's lock when it does.
    fn switch_takeover(&self, on: bool, on_switch: impl FnOnce()) -> bool {
        let mut switched = false;
        self.update_role(|now| match now {
            Role::Standby {
                leader,
                taking_over,
            } if *taking_over != on => {
                on_switch();
                switched = true;
                Role::Standby {
                    leader: leader.clone(),
                    taking_over: on,
                }
            }
            other => other.clone(),
        });
        switched
    }

    async fn end_takeover_when_the_leader_answers(self) {
        loop {
            tokio::time::sleep(probe::PROBE_TIMEOUT).await;
            let leader = match self.role() {
                Role::Standby {
                    taking_over: true,
                    leader,
                } => leader,
                // Won (the takeover became leadership), or already ended.
                _ => return,
            };
            // Cut off from etcd, it cannot win: the daemons go elsewhere.
            if !self.is_campaigning() || self.leader_answers(leader.as_deref()).await {
                self.switch_takeover(false, || {});
                return;
            }
        }
    }

    /// Runs `work` (a daemon connection) until it ends or this instance
    /// neither leads nor takes over any more, whichever is first: a standby
    /// holds no daemon connection of its own accord, so their clients
    /// reconnect through the load balancer.
    pub async fn while_serving_daemons(&self, work: impl Future<Output = ()>) {
        if self.0.stats.is_none() {
            return work.await;
        }
        let mut closings = self.0.closings.subscribe();
        // Admitted a moment ago; the change may have come in between.
        if !self.role().serves_daemons() {
            return;
        }
        tokio::select! {
            () = work => {}
            _ = closings.changed() => {}
        }
    }

    /// Leads until the fence's `deadline` (see [`election`]): after a
    /// takeover with what it learnt, otherwise as a restarted scheduler;
    /// calls that waited for the fence are served at once.
    fn lead(&self, deadline: Instant) {
        let mut took_over = false;
        // Under the role's lock, so no takeover begins in between.
        self.update_role(|now| {
            took_over = now.is_taking_over();
            if !took_over && let Some(engine) = &self.0.engine {
                engine.restart();
            }
            self.0.fence.open_until(deadline);
            Role::Leader
        });
        // The balancer's checks are counted from the win.
        self.readiness_checked();
        if let Some(engine) = &self.0.engine {
            engine.serve_waiters();
        }
        if let Some(stats) = &self.0.stats {
            stats.elections_won.inc();
        }
        if took_over {
            tracing::info!(target: election::LOG, "took over: kept what daemons reported meanwhile");
        }
    }

    /// Answers failsafe questions from now on ([`failsafe`]).
    fn enable_failsafe(&self, state: Arc<failsafe_peers::FailsafeState>) {
        let _ = self.0.failsafe.set(state);
    }

    fn failsafe(&self) -> Option<&Arc<failsafe_peers::FailsafeState>> {
        self.0.failsafe.get()
    }

    /// etcd answered a renewal of this instance's lease.
    fn etcd_answered(&self) {
        *self
            .0
            .etcd_answered_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// The answer to a leader's failsafe question (`POST /ha/failsafe`):
    /// None without `--ha_failsafe_secret_file`, else the answer's body or
    /// why the question was refused.
    pub fn failsafe_answer(&self, body: &str) -> Option<Result<String, String>> {
        let state = self.failsafe()?;
        let leads = self.role().is_leader() || self.0.won_waiting.load(Ordering::Acquire);
        let etcd_answers = self
            .0
            .etcd_answered_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < state.etcd_recent);
        Some(state.answer(body, leads, etcd_answers))
    }

    /// A balancer asked whether this instance is ready (`/readyz`).
    pub fn readiness_checked(&self) {
        *self
            .0
            .checked_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// Since a balancer last asked `/readyz`, or this instance began to lead.
    fn unchecked_for(&self) -> Duration {
        self.0
            .checked_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }

    /// Whether this instance campaigns with a lease of its own now.
    fn is_campaigning(&self) -> bool {
        self.0.campaigning.load(Ordering::Acquire)
    }

    /// The election holds a lease and campaigns with it (true), or its
    /// term ended (false).
    fn set_campaigning(&self, campaigning: bool) {
        self.0.campaigning.store(campaigning, Ordering::Release);
    }

    /// The lease runs at least until `deadline`.
    fn extend(&self, deadline: Instant) {
        if self.role().is_leader() {
            self.0.fence.open_until(deadline);
        }
    }

    /// Stops granting at once, then says so. A takeover goes on (it ends
    /// when the leader answers); a leader that steps down takes none, and
    /// answers the calls it held at once: its state is stale from now on
    /// (the next win or takeover restarts it anyway), and the call core
    /// answers them "not served here" (code 11), as any call of a standby.
    fn stand_by(&self, leader: Option<String>) {
        self.0.fence.close();
        self.set_term(None);
        self.update_role(|now| {
            if now.is_leader()
                && let Some(engine) = &self.0.engine
            {
                engine.restart();
            }
            Role::Standby {
                leader,
                taking_over: now.is_taking_over(),
            }
        });
    }

    /// Replaces the role with what `next` makes of it, atomically.
    fn update_role(&self, next: impl FnOnce(&Role) -> Role) {
        let mut closing = false;
        let changed = self.0.role.send_if_modified(|now| {
            let role = next(now);
            closing = now.serves_daemons() && !role.serves_daemons();
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
        if closing {
            self.0.closings.send_modify(|n| *n += 1);
        }
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
mod tests;
