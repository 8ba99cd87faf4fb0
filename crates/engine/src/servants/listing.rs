//! What the servant registry shows (the views, the running-task list) and
//! what it learns from returned grants (rules "observed speed" and "broken
//! servants"), apart from the records' upkeep in the parent module.

use std::sync::Arc;

use tokio::time::Instant;

use super::super::envs::Envs;
use super::super::types::RunningTask;
use super::super::views::{EjectionEvent, OutlierView, ServantView};
use super::{Returned, Servant, Servants, Verdict, ejection_cap};

/// Ejections kept for the audit, newest last.
pub(crate) const MAX_RECENT_EJECTIONS: usize = 64;

impl Servant {
    /// What people see of it; `waiters` is the number of requests queued for
    /// its environments.
    pub(super) fn view(&self, waiters: usize, now: Instant) -> ServantView {
        ServantView {
            observed_location: self.observed,
            reported_location: self.reported,
            version: self.version,
            priority: self.priority,
            environments: self.envs.iter().map(|l| l.name().to_string()).collect(),
            max_tasks: self.max_tasks,
            not_accepting_reason: self.effective_reason(),
            num_processors: self.num_processors,
            current_load: self.current_load,
            capacity_available: self.capacity_available(),
            total_memory: self.total_memory,
            memory_available: self.memory_available,
            running: self.granted(),
            zombies: u32::try_from(self.zombies.len()).unwrap_or(u32::MAX),
            ever_assigned: self.ever_assigned,
            reported_running_tasks: self.reported_tasks.len(),
            waiters,
            discovered_ago: now.saturating_duration_since(self.discovered_at),
            expires_in: self.expires_at.saturating_duration_since(now),
            leaving: self.leaving,
            cordon: None,
            speed_class: self.speed_class,
            typical_grant: self.speed.typical(now),
            outlier: OutlierView::new(&self.outlier, now),
        }
    }
}

impl Servants {
    /// Rules "observed speed" and "broken servants": a grant given back
    /// live. One that ran times the servant (the speed rule learns from
    /// nothing else, or a broken servant would rank first) and clears its
    /// record; a broken one counts towards an ejection, which the share cap
    /// may hold back (then the servant stays in rotation, and the next
    /// broken grant asks again).
    pub(super) fn learn(&mut self, key: super::ServantKey, returned: Returned) {
        let Returned { held, listed, at } = returned;
        let verdict = self.farm_hold.judge(held, listed, at);
        let cap = ejection_cap(self.by_key.len());
        let (eject_broken, place_by_speed) = (self.eject_broken, self.place_by_speed);
        let ejected_now = self.ejected_now;
        let Some(s) = self.by_key.get_mut(&key) else {
            return;
        };
        match verdict {
            Verdict::Ran => {
                if place_by_speed {
                    s.speed.record(held, at);
                    s.speed_class = s.speed.class(at);
                }
                s.outlier.ran(at);
            }
            Verdict::Broken(evidence) => {
                self.broken_grants += 1;
                if !s.outlier.broken() || !eject_broken {
                    return;
                }
                if ejected_now >= cap {
                    self.ejections_capped += 1;
                    return;
                }
                s.outlier.eject(evidence, at);
                self.ejected_now += 1;
                self.ejections += 1;
                if self.recent_ejections.len() == MAX_RECENT_EJECTIONS {
                    self.recent_ejections.pop_front();
                }
                self.recent_ejections.push_back((
                    at,
                    EjectionEvent {
                        ago: std::time::Duration::ZERO,
                        servant: s.observed,
                        reported: s.reported,
                        ejections: s.outlier.ejections(),
                        evidence,
                    },
                ));
            }
        }
    }

    /// Servants ejected now.
    pub(crate) fn ejected_now(&self) -> usize {
        self.ejected_now
    }

    /// The latest ejections, oldest first, as of `now`.
    pub(crate) fn recent_ejections(&self, now: Instant) -> Vec<EjectionEvent> {
        self.recent_ejections
            .iter()
            .map(|&(at, event)| EjectionEvent {
                ago: now.saturating_duration_since(at),
                ..event
            })
            .collect()
    }

    /// Every servant as people see it, in registration order.
    pub(crate) fn views(&self, envs: &Envs, now: Instant) -> Vec<ServantView> {
        let mut keys: Vec<_> = self.by_key.keys().copied().collect();
        keys.sort_unstable();
        keys.iter()
            .map(|key| {
                let s = &self.by_key[key];
                let waiters = s
                    .envs
                    .iter()
                    .filter_map(|l| envs.get(l.id()))
                    .map(|e| e.queue().len())
                    .sum();
                s.view(waiters, now)
            })
            .collect()
    }

    /// The version of the running-task list callers are shown now: the one
    /// last handed out while it is current or younger than
    /// `running_tasks_refresh`, else the current one. Every daemon polls the
    /// list about once a second while, in a large cluster, some heartbeat
    /// changes it almost every millisecond: a new version at most once per
    /// interval bounds the cost of rebuilding it whatever the number of
    /// callers.
    pub(crate) fn running_tasks_version(&mut self, now: Instant) -> u64 {
        match self.running_shown {
            Some((shown, since))
                if shown == self.running_version
                    || now.saturating_duration_since(since) < self.running_tasks_refresh =>
            {
                shown
            }
            _ => {
                self.running_shown = Some((self.running_version, now));
                self.running_version
            }
        }
    }

    /// The per-servant lists (registration order) to flatten outside the
    /// lock, and their version, which callers are shown from now on.
    pub(crate) fn running_tasks_parts(&mut self, now: Instant) -> (u64, Vec<Arc<[RunningTask]>>) {
        let mut keys: Vec<_> = self.by_key.keys().copied().collect();
        keys.sort_unstable();
        let parts = keys
            .iter()
            .map(|k| self.by_key[k].reported_tasks.clone())
            .filter(|p| !p.is_empty())
            .collect();
        self.running_shown = Some((self.running_version, now));
        (self.running_version, parts)
    }
}
