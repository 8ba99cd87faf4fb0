//! The engine's state behind the one mutex: one owner per index family
//! (`servants`, `grants`, `envs::Envs`, `wait_queues::WaitQueues`, `requesters`,
//! `tokens`), plus what ties them together: deadlines for the expiry task,
//! the expiry sweep, and the follow-up work of an index change.

use tokio::time::Instant;

use super::config::Config;
use super::cordons::Cordons;
use super::envs::{Effects, Envs};
use super::fence::GrantFence;
use super::grants::Grants;
use super::requesters::Requesters;
use super::servants::Servants;
use super::tenants::Tenants;
use super::tokens::TokenRing;
use super::wait_queues::WaitQueues;

/// Everything mutable, guarded by `Shared`'s mutex (a `std::sync::Mutex`
/// that is never held across an `.await`). Each field is an owner that keeps
/// its own index consistent; the `impl State` blocks in the other files are
/// the rules that change several of them together.
pub(crate) struct State {
    pub(super) start: Instant,
    /// Servant records, by key and address, with expiries and reports.
    pub(super) servants: Servants,
    /// Grant records, lease deadlines, the adoption window, grant counters.
    pub(super) grants: Grants,
    /// Per-environment indexes (free servants, versions, queues).
    pub(super) envs: Envs,
    /// Call numbers and the count of queued calls across the queues.
    pub(super) waiters: WaitQueues,
    /// Requesters: ownership figures per address, turns and waiting calls
    /// per requester.
    pub(super) requesters: Requesters,
    /// Tenants: weights, caps, virtual times and figures.
    pub(super) tenants: Tenants,
    pub(super) tokens: TokenRing,
    /// Checked by every placement (rule "fencing").
    pub(super) fence: GrantFence,
    /// Locations operators took out of rotation (rule "cordon").
    pub(super) cordons: Cordons,
    pub(super) shutting_down: bool,
    /// Set when the last `Scheduler` handle is dropped: the expiry task ends.
    stopped: bool,
    /// Set when a deadline earlier than the expiry task's next wake-up appears.
    wake_expiry: bool,
    /// Rule "taking over", after a restart: until then an environment
    /// nobody offered yet may be one whose servants have not reported here.
    pub(super) settling_until: Option<Instant>,
}

/// After a restart (a win, a takeover), how long a call for an environment
/// no servant reported yet waits for one: two heartbeats of the stock
/// daemons (they beat every second), so a new leader does not answer
/// "environment not available" to the first calls of a farm that has not
/// reported to it yet.
pub const SERVANTS_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

impl State {
    pub(crate) fn new(config: &Config, tenants: Tenants, now: Instant) -> Self {
        let limits = &config.limits;
        State {
            start: now,
            servants: Servants::new(
                limits.max_reported_tasks,
                config.servant_min_memory_for_accepting_new_task,
                config.running_tasks_refresh,
                config.foreign_load_from_own_average,
                config.place_by_observed_speed,
                config.eject_broken_servants,
                now,
            ),
            grants: Grants::new(config, now),
            envs: Envs::default(),
            waiters: WaitQueues::new(limits.max_waiters, limits.max_waiters_per_requester),
            requesters: Requesters::new(limits.max_requesters),
            tenants,
            tokens: TokenRing::new(
                config.serving_daemon_token_secret.clone().map(|s| s.0),
                config.serving_daemon_token_rollout_interval,
                now,
            ),
            fence: config.grant_fence.clone(),
            cordons: Cordons::default(),
            shutting_down: false,
            stopped: false,
            wake_expiry: false,
            settling_until: None,
        }
    }

    /// Rule "leadership": the state a restarted instance would start with,
    /// replacing this one, which is answered and returned (drop it outside
    /// the lock). Call numbers keep counting, so a wait guard of the old
    /// state never matches a call of the new one. The cordons stay: they
    /// are the operators', not what daemons told this instance (a new
    /// leader replaces them with the saved ones).
    pub(crate) fn restart(&mut self, config: &Config, now: Instant) -> State {
        let mut fresh = State::new(config, self.tenants.restarted(), now);
        fresh.waiters.continue_after(&self.waiters);
        fresh.cordons = std::mem::take(&mut self.cordons);
        fresh.servants.hosts = self.servants.hosts.emptied();
        fresh.shutting_down = self.shutting_down;
        fresh.stopped = self.stopped;
        fresh.wake_expiry = true;
        fresh.settling_until = Some(now + SERVANTS_SETTLE);
        let mut old = std::mem::replace(self, fresh);
        old.shutdown();
        old
    }

    /// The last handle is gone: the expiry task ends at its next wake-up.
    pub(crate) fn stop(&mut self) {
        self.stopped = true;
    }

    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Whether a call created a deadline the expiry task may sleep past;
    /// clears the flag.
    pub(crate) fn take_wake_expiry(&mut self) -> bool {
        std::mem::take(&mut self.wake_expiry)
    }

    /// The earliest servant expiry, lease end or end of the adoption
    /// window, for the expiry task.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let s = self.servants.next_deadline();
        let g = self.grants.next_deadline();
        [s, g, self.settling_until].into_iter().flatten().min()
    }

    /// Records that a deadline `at` was just added; wakes the expiry task only
    /// if it is now the earliest one (so the task may be sleeping past it).
    pub(crate) fn note_deadline(&mut self, at: Instant) {
        if self.next_deadline().is_none_or(|next| at <= next) {
            self.wake_expiry = true;
        }
    }

    /// Rule "expiry": servants past their expiry are removed with everything
    /// on them, then grants past their lease become zombies.
    pub(crate) fn expire(&mut self, now: Instant) {
        self.grants.close_adoption_if_over(now);
        let mut fx = Effects::default();
        while let Some(key) = self.servants.first_expired(now) {
            self.remove_servant(key, &mut fx);
        }
        while let Some(id) = self.grants.pop_expired(now) {
            self.zombify(id);
        }
        self.apply(fx, now);
        if self.settling_until.is_some_and(|until| until <= now) {
            self.settling_until = None;
            // Those still unoffered are answered as at admission.
            self.serve_all(now);
        }
    }

    /// Whether a restart was so recent that its servants may not all have
    /// reported yet.
    pub(super) fn settling(&self, now: Instant) -> bool {
        self.settling_until.is_some_and(|until| now < until)
    }

    /// Finishes an index change: fails requests whose environment vanished,
    /// serves queued requests that new capacity can satisfy, drops unused
    /// environment slots.
    pub(crate) fn apply(&mut self, mut fx: Effects, now: Instant) {
        if !fx.lost.is_empty() {
            fx.lost.sort_unstable();
            fx.lost.dedup();
            for id in fx.lost {
                self.fail_unavailable(id);
            }
        }
        if !fx.serve.is_empty() {
            self.serve(fx.serve, now);
        }
        for id in fx.left {
            self.envs.drop_if_unused(id);
        }
    }
}
