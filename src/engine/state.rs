//! The engine's state behind the one mutex, plus the plumbing shared by the
//! other modules: deadlines, effects of index changes, counters.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Config;
use super::adoption::{AdoptionBounds, AdoptionWindow};
use super::grants::GrantTable;
use super::placement::{Effects, Envs};
use super::requesters::Requesters;
use super::servants::{Servant, ServantKey};
use super::snapshot::Counters;
use super::tokens::TokenRing;
use super::types::RunningTask;

/// `now + d`, saturating far in the future instead of overflowing (limits
/// are configurable, so a duration may be huge).
pub(crate) fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400))
}

/// Everything mutable, guarded by `Shared::state` (a `std::sync::Mutex` that
/// is never held across an `.await`).
pub(crate) struct State {
    pub start: Instant,
    /// What the adoption window after start remembers.
    pub adoption: AdoptionWindow,
    pub adopted_lease: Duration,
    pub min_memory: u64,
    pub max_waiters: usize,
    pub max_waiters_per_machine: usize,
    /// Bound on the sum of all servants' reported running tasks.
    pub max_reported_tasks: usize,
    /// Sum of the lengths of the servants' last reports (as sent).
    pub reported_total: usize,

    pub servants: HashMap<ServantKey, Servant>,
    pub by_addr: HashMap<SocketAddr, ServantKey>,
    pub next_servant_key: ServantKey,
    pub servant_deadlines: BTreeSet<(Instant, ServantKey)>,

    pub envs: Envs,

    pub grants: GrantTable,
    /// Lease ends of live (non-zombie) grants.
    pub grant_deadlines: BTreeSet<(Instant, u64)>,

    pub next_waiter_seq: u64,
    pub waiter_count: usize,
    /// Requesting machines: ownership figures, last served, waiting.
    pub requesters: Requesters,

    pub tokens: TokenRing,
    pub counters: Counters,

    /// Bumped whenever any servant's reported running tasks change.
    pub running_version: u64,
    /// The last flattened list: its version and when it was built.
    pub running_cache: Option<(u64, Instant, Arc<[RunningTask]>)>,
    pub running_tasks_refresh: Duration,

    pub shutting_down: bool,
    /// Set when the last `Scheduler` handle is dropped: the expiry task ends.
    pub stopped: bool,
    /// Set when a deadline earlier than the expiry task's next wake-up appears.
    pub wake_expiry: bool,
}

impl State {
    pub(crate) fn new(config: &Config, now: Instant) -> Self {
        State {
            start: now,
            adoption: AdoptionWindow::new(
                later(now, config.adoption_window),
                now,
                AdoptionBounds {
                    max_retired: config.limits.max_adoption_retired_ids,
                    max_freed_early: config.limits.max_adoption_early_frees,
                    max_pending: config.limits.max_adoption_early_renewals,
                    max_pending_per_machine: config.limits.max_adoption_early_renewals_per_machine,
                },
            ),
            adopted_lease: config.adopted_lease,
            min_memory: config.servant_min_memory_for_accepting_new_task,
            max_waiters: config.limits.max_waiters,
            max_waiters_per_machine: config.limits.max_waiters_per_machine,
            max_reported_tasks: config.limits.max_reported_tasks,
            reported_total: 0,
            servants: HashMap::new(),
            by_addr: HashMap::new(),
            next_servant_key: 1,
            servant_deadlines: BTreeSet::new(),
            envs: Envs::default(),
            grants: GrantTable::new(),
            grant_deadlines: BTreeSet::new(),
            next_waiter_seq: 1,
            waiter_count: 0,
            requesters: Requesters::new(config.limits.max_requesters),
            tokens: TokenRing::new(
                config.serving_daemon_token_secret.clone().map(|s| s.0),
                config.serving_daemon_token_rollout_interval,
                now,
            ),
            counters: Counters::default(),
            running_version: 0,
            running_cache: None,
            running_tasks_refresh: config.running_tasks_refresh,
            shutting_down: false,
            stopped: false,
            wake_expiry: false,
        }
    }

    /// The earliest servant expiry, lease end or end of the adoption
    /// window, for the expiry task.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let s = self.servant_deadlines.first().map(|d| d.0);
        let g = self.grant_deadlines.first().map(|d| d.0);
        [s, g, self.adoption.deadline()].into_iter().flatten().min()
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
        // Frees the window's memory once it is over.
        self.adoption.is_open(now);
        let mut fx = Effects::default();
        while let Some(&(at, key)) = self.servant_deadlines.first() {
            if at > now {
                break;
            }
            self.remove_servant(key, &mut fx);
        }
        while let Some(&(at, id)) = self.grant_deadlines.first() {
            if at > now {
                break;
            }
            self.grant_deadlines.pop_first();
            self.zombify(id);
        }
        self.apply(fx, now);
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
