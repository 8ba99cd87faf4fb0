//! Reading the whole engine: cluster totals, event counters and the
//! inspection snapshot (for the dashboard and metrics; the types are in
//! `views`).

use tokio::time::Instant;

use super::state::State;
use super::views::{ClusterTotals, Counters, EnvironmentView, Snapshot};

impl State {
    /// Cluster totals: one pass over the servants, nothing allocated, so the
    /// once-a-second history sampler and metrics scrapes hold the lock for
    /// microseconds, not for a whole snapshot.
    pub(crate) fn totals(&self) -> ClusterTotals {
        let mut totals = ClusterTotals {
            grants: self.grants.len(),
            waiters: self.waiters.count(),
            ..ClusterTotals::default()
        };
        for s in self.servants.iter() {
            let running = s.granted();
            // Rules "cordon", "broken servants": a cordoned or ejected
            // servant's free slots take no task.
            let available = if s.is_cordoned() || s.is_ejected() {
                running.min(s.capacity_available())
            } else {
                s.capacity_available()
            };
            totals.servants_up += 1;
            // A cordoned servant takes no task, whatever it reports: the
            // cards, the table and /metrics all count it out of rotation.
            totals.servants_accepting += usize::from(s.max_tasks() > 0 && !s.is_cordoned());
            totals.servants_cordoned += usize::from(s.is_cordoned());
            totals.capacity += u64::from(s.max_tasks());
            totals.capacity_available += u64::from(available.saturating_sub(running));
            // Slots neither free nor running, so that running + available +
            // unavailable is the capacity; grants beyond a servant's slots
            // (it lowered its capacity, or runs zombies) are counted apart.
            totals.capacity_unavailable +=
                u64::from(s.max_tasks().saturating_sub(available.max(running)));
            totals.running_over_capacity += u64::from(running.saturating_sub(s.max_tasks()));
            totals.running += u64::from(running);
            totals.zombies += s.zombie_count() as u64;
        }
        totals.servants_ejected = self.servants.ejected_now();
        totals
    }

    /// Event counters since start, each kept by the owner of its events.
    pub(crate) fn counters(&self) -> Counters {
        let (wait_refused_total_cap, wait_refused_requester_cap) = self.waiters.refused_at_caps();
        Counters {
            servants_expired: self.servants.expired(),
            broken_grants: self.servants.broken_grants,
            ejections: self.servants.ejections,
            ejections_capped: self.servants.ejections_capped,
            no_quota: self.waiters.no_quota(),
            wait_refused_total_cap,
            wait_refused_requester_cap,
            ..self.grants.counters()
        }
    }

    /// Builds the snapshot. O(cluster): for people, not hot paths.
    pub(crate) fn snapshot(&mut self, now: Instant) -> Snapshot {
        let mut environments: Vec<EnvironmentView> = self
            .envs
            .iter()
            .map(|e| EnvironmentView {
                digest: e.name().to_string(),
                servants: e.offering(),
                capacity_available: 0,
                running: 0,
                waiters: e.queue().len(),
            })
            .collect();
        environments.sort_unstable_by(|a, b| a.digest.cmp(&b.digest));
        for s in self.servants.iter() {
            for link in s.environments() {
                if let Ok(i) = environments.binary_search_by(|e| e.digest.as_str().cmp(link.name()))
                {
                    let e = &mut environments[i];
                    e.capacity_available += u64::from(s.capacity_available());
                    e.running += u64::from(s.granted());
                }
            }
        }

        let cordons = self.cordon_views();
        let mut servants = self.servants.views(&self.envs, now);
        if !cordons.is_empty() {
            for view in &mut servants {
                let covering = self
                    .cordons
                    .covering(view.reported_location, view.observed_location);
                view.cordon = covering.and_then(|location| {
                    cordons
                        .iter()
                        .find(|cordon| cordon.location == location)
                        .cloned()
                });
            }
        }
        Snapshot {
            uptime: now.saturating_duration_since(self.start),
            servants,
            cordons,
            grants: self.grants.views(now),
            environments,
            requesters: self.requesters.views(),
            totals: self.totals(),
            counters: self.counters(),
            serving_daemon_tokens_rollout_in: self.tokens.rollout_in(now),
            ejections: self.servants.recent_ejections(now),
        }
    }
}
