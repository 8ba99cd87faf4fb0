//! The delegate role of a simulated daemon: the part on a developer's
//! machine that submits compilations.
//!
//! As the reference daemon: `GetConfig` every 10 s; running tasks renewed
//! with `KeepTaskAlive` every second (`next_keep_alive_in_ms = 10000`, all in
//! one call); prefetched grants treated as expiring 5 s early and freed if
//! unused by then; `GetRunningTasks` every second. A periodic call still
//! unanswered when the next falls due skips that turn. Per compiler digest
//! one `WaitForStartingTask` loop (`milliseconds_to_wait = 5000`,
//! `next_keep_alive_in_ms = 15000`, `prefetch_reqs = 1`) serves the jobs
//! (`jobs`). Each change happens under the role's lock and asks for its
//! calls through [`Effects`].

use std::{
    sync::{Mutex, atomic::Ordering::Relaxed},
    time::Duration,
};

use rand::Rng;
use tokio::time::Instant;

pub use super::behaviour::{DelegateBehaviour, Workload};
use super::{
    client::lock,
    effects::{Effects, Request},
    jobs::{Jobs, LongPoll},
    shard::Event,
};

/// Moves `next` one period on; if that is already past (an overloaded
/// machine), the turn is skipped rather than made up in a burst.
fn advance(next: &mut Instant, period: Duration, now: Instant) -> Instant {
    *next += period;
    if *next < now {
        *next = now + period;
    }
    *next
}

#[derive(Debug)]
struct DelegateState {
    jobs: Jobs,
    /// Which periodic call is out and unanswered.
    renewing: bool,
    configuring: bool,
    listing: bool,
    /// When each falls due next.
    next_renew: Instant,
    next_config: Instant,
    next_list: Instant,
}

/// The delegate role of one machine.
#[derive(Debug)]
pub(crate) struct Delegate {
    /// The compiler digest of each lane.
    pub(crate) environments: Vec<String>,
    state: Mutex<DelegateState>,
}

impl Delegate {
    pub(crate) fn new(environments: Vec<String>) -> Delegate {
        let now = Instant::now();
        Delegate {
            state: Mutex::new(DelegateState {
                jobs: Jobs::new(environments.len()),
                renewing: false,
                configuring: false,
                listing: false,
                next_renew: now,
                next_config: now,
                next_list: now,
            }),
            environments,
        }
    }

    /// Starts the periodic calls, each at a random phase (real daemons were
    /// not started in the same instant), and the workload.
    pub(crate) fn start(&self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        if self.environments.is_empty() {
            return;
        }
        let mut state = lock(&self.state);
        let state = &mut *state;
        let machine = fx.machine;
        let mut phase = |period: Duration| state.jobs.rng.random_range(Duration::ZERO..=period);
        state.next_config = fx.now + phase(behaviour.config_interval);
        state.next_renew = fx.now + phase(behaviour.renew_interval) + behaviour.renew_interval;
        if let Some(interval) = behaviour.running_tasks_interval {
            state.next_list = fx.now + phase(interval);
            fx.after(state.next_list, Event::RunningTasks(machine));
        }
        fx.after(state.next_config, Event::Config(machine));
        fx.after(state.next_renew, Event::Renew(machine));
        state.jobs.start(behaviour, fx);
    }

    /// Renews the running grants (one `KeepTaskAlive`) and frees prefetched
    /// grants not used in time.
    pub(crate) fn renew(&self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        let mut state = lock(&self.state);
        let next = advance(&mut state.next_renew, behaviour.renew_interval, fx.now);
        fx.after(next, Event::Renew(fx.machine));
        if !state.renewing && !state.jobs.running.is_empty() {
            state.renewing = true;
            let ids = state.jobs.running.keys().copied().collect();
            fx.request(Request::Renew(ids));
        }
        let stale = state.jobs.stale_spares(behaviour.spare_life(), fx.now);
        if !stale.is_empty() {
            let events = fx.events;
            events.spares_expired.fetch_add(stale.len() as u64, Relaxed);
            fx.request(Request::Free(stale));
        }
    }

    /// `KeepTaskAlive` of `ids` answered (`statuses`) or failed (`None`):
    /// a renewal refused for a task still running is counted.
    pub(crate) fn renewed(&self, ids: &[u64], statuses: Option<&[bool]>, fx: &Effects<'_>) {
        let mut state = lock(&self.state);
        state.renewing = false;
        let Some(statuses) = statuses else {
            return;
        };
        let refused = ids
            .iter()
            .zip(statuses.iter().chain(std::iter::repeat(&false)))
            .filter(|(id, renewed)| !**renewed && state.jobs.running.contains_key(id))
            .count();
        drop(state);
        let events = fx.events;
        events.renewals_refused.fetch_add(refused as u64, Relaxed);
    }

    /// `GetConfig` fell due.
    pub(crate) fn get_config(&self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        let mut state = lock(&self.state);
        let next = advance(&mut state.next_config, behaviour.config_interval, fx.now);
        fx.after(next, Event::Config(fx.machine));
        if !std::mem::replace(&mut state.configuring, true) {
            fx.request(Request::GetConfig);
        }
    }

    pub(crate) fn configured(&self) {
        lock(&self.state).configuring = false;
    }

    /// `GetRunningTasks` fell due.
    pub(crate) fn list_tasks(&self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        let Some(period) = behaviour.running_tasks_interval else {
            return;
        };
        let mut state = lock(&self.state);
        let next = advance(&mut state.next_list, period, fx.now);
        fx.after(next, Event::RunningTasks(fx.machine));
        if !std::mem::replace(&mut state.listing, true) {
            fx.request(Request::ListTasks);
        }
    }

    pub(crate) fn listed(&self) {
        lock(&self.state).listing = false;
    }

    /// A compilation of the stream arrives.
    pub(crate) fn arrival(&self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        lock(&self.state).jobs.arrival(behaviour, fx);
    }

    /// An idle developer starts a build.
    pub(crate) fn build_start(&self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        lock(&self.state).jobs.build_start(behaviour, fx);
    }

    /// The compilation under `grant` finished.
    pub(crate) fn job_done(&self, grant: u64, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        lock(&self.state).jobs.done(grant, behaviour, fx);
    }

    /// A servant killed the task under `grant`.
    pub(crate) fn task_killed(
        &self,
        grant: u64,
        behaviour: &DelegateBehaviour,
        fx: &mut Effects<'_>,
    ) {
        lock(&self.state).jobs.killed(grant, behaviour, fx);
    }

    /// The lane's `WaitForStartingTask` ended.
    pub(crate) fn long_poll_ended(&self, lane: usize, ended: LongPoll, fx: &mut Effects<'_>) {
        lock(&self.state).jobs.long_poll_ended(lane, ended, fx);
    }

    /// The lane's loop tries again after an error.
    pub(crate) fn lane_retry(&self, lane: usize, fx: &mut Effects<'_>) {
        lock(&self.state).jobs.retry(lane, fx);
    }

    /// Every grant it holds, taken (the daemon gives them back on shutdown).
    pub(crate) fn take_grants(&self) -> Vec<u64> {
        lock(&self.state).jobs.take_grants()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_turn_is_skipped_not_made_up() {
        let start = Instant::now();
        let period = Duration::from_secs(1);
        let mut next = start;
        assert_eq!(advance(&mut next, period, start), start + period);
        let late = start + Duration::from_millis(3500);
        assert_eq!(advance(&mut next, period, late), late + period);
    }
}
