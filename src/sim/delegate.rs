//! The delegate role of a simulated daemon: the part on a developer's
//! machine that submits compilations.
//!
//! As the reference daemon: `GetConfig` every 10 s; per compiler digest one
//! loop calling `WaitForStartingTask` (`milliseconds_to_wait = 5000`,
//! `next_keep_alive_in_ms = 15000`, `immediate_reqs` = jobs waiting now,
//! `prefetch_reqs = 1`), one call at a time, retrying 100 ms after a failure
//! and at once after `STATUS_NO_QUOTA_AVAILABLE`; prefetched grants are
//! treated as expiring 5 s early and freed if unused by then; running tasks
//! are renewed with `KeepTaskAlive` every second (`next_keep_alive_in_ms =
//! 10000`, all in one call); each task is freed with `FreeTask` when done;
//! `GetRunningTasks` every second. A periodic call still unanswered when the
//! next falls due skips that turn. A job "compiles" on its servant (through
//! the in-process [`Registry`](super::Registry)) for a random time.
//!
//! The role is a state machine driven by the cluster's timers
//! ([`super::shard`]) and by the answers, which run on the connections'
//! readers; the job lifecycle is in [`super::jobs`].

use std::{
    collections::{HashMap, VecDeque},
    ops::RangeInclusive,
    sync::{Arc, Mutex, atomic::Ordering::Relaxed},
    time::Duration,
};

use bytes::Bytes;
use prost::Message;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::time::Instant;

use super::{
    client::{CallError, Reply, lock, record_failure, record_reply, settle},
    daemons::Daemons,
    jobs::{Action, Build},
    shard::Event,
};
use crate::pb::{self, Method};

/// Where jobs come from.
#[derive(Debug, Clone)]
pub enum Workload {
    /// A steady stream: jobs arrive at random (Poisson) at this rate, per delegate.
    Rate { jobs_per_second: f64 },
    /// A developer building now and then: idle, then a build of `files`
    /// compilations with `parallelism` at once (`make -jN`).
    Builds {
        idle: RangeInclusive<Duration>,
        files: RangeInclusive<u32>,
        parallelism: RangeInclusive<u32>,
    },
    /// A delegate that always has `running` compilations under way: each
    /// one done is replaced at once (the first ones are part-way through, so
    /// completions are spread out from the start).
    Steady { running: u32 },
}

/// How delegates behave. Defaults are the reference daemon's. Its `Debug`
/// redacts the token.
#[derive(Clone)]
pub struct DelegateBehaviour {
    pub token: String,
    pub workload: Workload,
    /// How long one compilation runs on its servant.
    pub task_duration: RangeInclusive<Duration>,
    /// `milliseconds_to_wait` (5000).
    pub wait_ms: u32,
    /// `next_keep_alive_in_ms` of `WaitForStartingTask` (15000).
    pub grant_lease_ms: u32,
    /// `prefetch_reqs` (1).
    pub prefetch: u32,
    /// Between `KeepTaskAlive` calls (1 s).
    pub renew_interval: Duration,
    /// `next_keep_alive_in_ms` of `KeepTaskAlive` (10000).
    pub renew_lease_ms: u32,
    /// Between `GetConfig` calls (10 s).
    pub config_interval: Duration,
    /// Between `GetRunningTasks` calls (1 s); `None`: never.
    pub running_tasks_interval: Option<Duration>,
    /// Jobs queued or running per delegate beyond which new ones are shed
    /// (so an overloaded scheduler does not grow the simulator's memory).
    pub max_jobs: usize,
}

impl std::fmt::Debug for DelegateBehaviour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegateBehaviour")
            .field("token", &format_args!("<redacted>"))
            .field("workload", &self.workload)
            .field("task_duration", &self.task_duration)
            .field("wait_ms", &self.wait_ms)
            .field("grant_lease_ms", &self.grant_lease_ms)
            .field("prefetch", &self.prefetch)
            .field("renew_interval", &self.renew_interval)
            .field("renew_lease_ms", &self.renew_lease_ms)
            .field("config_interval", &self.config_interval)
            .field("running_tasks_interval", &self.running_tasks_interval)
            .field("max_jobs", &self.max_jobs)
            .finish()
    }
}

impl DelegateBehaviour {
    pub fn new(token: impl Into<String>, workload: Workload) -> DelegateBehaviour {
        DelegateBehaviour {
            token: token.into(),
            workload,
            task_duration: Duration::from_secs(2)..=Duration::from_secs(10),
            wait_ms: 5000,
            grant_lease_ms: 15_000,
            prefetch: 1,
            renew_interval: Duration::from_secs(1),
            renew_lease_ms: 10_000,
            config_interval: Duration::from_secs(10),
            running_tasks_interval: Some(Duration::from_secs(1)),
            max_jobs: 2000,
        }
    }

    /// Prefetched grants count as expired this much before their lease ends.
    const EARLY_EXPIRY_MS: u32 = 5000;

    /// How long a prefetched grant is kept for a job.
    pub(crate) fn spare_life(&self) -> Duration {
        let life = self.grant_lease_ms.saturating_sub(Self::EARLY_EXPIRY_MS);
        Duration::from_millis(u64::from(life))
    }
}

/// A grant as a delegate holds it: the servant it names, if simulated here.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub(crate) id: u64,
    pub(crate) servant: Option<usize>,
}

/// A compiler digest the delegate compiles with: jobs (their durations)
/// waiting for a grant, and prefetched grants waiting for a job.
#[derive(Debug, Default)]
pub(crate) struct Lane {
    pub(crate) waiting: VecDeque<Duration>,
    pub(crate) spares: Vec<(Grant, Instant)>,
    /// Its `WaitForStartingTask` is out (or waits to be retried).
    pub(crate) asking: bool,
}

#[derive(Debug)]
pub(crate) struct DelegateState {
    pub(crate) rng: SmallRng,
    pub(crate) lanes: Vec<Lane>,
    /// Compilations running now: grant id to the servant running it.
    pub(crate) running: HashMap<u64, usize>,
    /// Compilations waiting for a grant or running (at most `max_jobs`).
    pub(crate) jobs: usize,
    pub(crate) build: Option<Build>,
    renewing: bool,
    configuring: bool,
    listing: bool,
    next_renew: Instant,
    next_config: Instant,
    next_list: Instant,
    pub(crate) next_arrival: Instant,
}

/// The delegate role of one machine.
#[derive(Debug)]
pub(crate) struct Delegate {
    /// The compiler digests of its lanes.
    pub(crate) environments: Vec<String>,
    pub(crate) state: Mutex<DelegateState>,
}

/// Where in its period a periodic call of this machine falls.
pub(crate) fn random_phase(rng: &mut SmallRng, period: Duration) -> Duration {
    rng.random_range(Duration::ZERO..=period)
}

pub(crate) fn random_duration(rng: &mut SmallRng, range: &RangeInclusive<Duration>) -> Duration {
    if range.start() >= range.end() {
        return *range.start();
    }
    rng.random_range(range.clone())
}

/// Moves `next` one period on; if that is already past (an overloaded
/// machine), the turn is skipped rather than made up in a burst.
fn advance(next: &mut Instant, period: Duration, now: Instant) -> Instant {
    *next += period;
    if *next < now {
        *next = now + period;
    }
    *next
}

impl Delegate {
    pub(crate) fn new(environments: Vec<String>) -> Delegate {
        let now = Instant::now();
        Delegate {
            state: Mutex::new(DelegateState {
                rng: SmallRng::from_rng(&mut rand::rng()),
                lanes: environments.iter().map(|_| Lane::default()).collect(),
                running: HashMap::new(),
                jobs: 0,
                build: None,
                renewing: false,
                configuring: false,
                listing: false,
                next_renew: now,
                next_config: now,
                next_list: now,
                next_arrival: now,
            }),
            environments,
        }
    }

    /// Every grant it holds, taken (the daemon gives them back on shutdown).
    pub(crate) fn take_grants(&self) -> Vec<u64> {
        let mut state = lock(&self.state);
        let mut ids: Vec<u64> = state.running.drain().map(|(id, _)| id).collect();
        for lane in &mut state.lanes {
            ids.extend(lane.spares.drain(..).map(|(grant, _)| grant.id));
        }
        ids
    }
}

impl Daemons {
    /// Starts machine `machine`'s delegate: its periodic calls, each at a
    /// random phase (real daemons were not started in the same instant), and
    /// its workload.
    pub(crate) fn start_delegate(self: &Arc<Self>, machine: usize, now: Instant) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        if delegate.environments.is_empty() {
            return;
        }
        let behaviour = &self.delegate_behaviour;
        let mut actions = Vec::new();
        {
            let mut state = lock(&delegate.state);
            let state = &mut *state;
            state.next_config = now + random_phase(&mut state.rng, behaviour.config_interval);
            self.after(machine, state.next_config, Event::Config(machine));
            let renew = behaviour.renew_interval;
            state.next_renew = now + random_phase(&mut state.rng, renew) + renew;
            self.after(machine, state.next_renew, Event::Renew(machine));
            if let Some(interval) = behaviour.running_tasks_interval {
                state.next_list = now + random_phase(&mut state.rng, interval);
                self.after(machine, state.next_list, Event::RunningTasks(machine));
            }
            self.start_workload(machine, state, now, &mut actions);
        }
        self.act(machine, actions);
    }

    /// Renews the running grants (one `KeepTaskAlive`) and frees prefetched
    /// grants not used in time.
    pub(crate) fn renew(self: &Arc<Self>, machine: usize, now: Instant) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let behaviour = &self.delegate_behaviour;
        let spare_life = behaviour.spare_life();
        let (renewing, expired) = {
            let mut state = lock(&delegate.state);
            let next = advance(&mut state.next_renew, behaviour.renew_interval, now);
            self.after(machine, next, Event::Renew(machine));
            let renewing = (!state.renewing && !state.running.is_empty()).then(|| {
                state.renewing = true;
                state.running.keys().copied().collect::<Vec<u64>>()
            });
            let mut expired = Vec::new();
            for lane in &mut state.lanes {
                lane.spares.retain(|(grant, at)| {
                    let keep = now.duration_since(*at) < spare_life;
                    if !keep {
                        expired.push(grant.id);
                    }
                    keep
                });
            }
            (renewing, expired)
        };
        if let Some(ids) = renewing {
            let request = pb::KeepTaskAliveRequest {
                token: behaviour.token.clone(),
                task_grant_ids: ids.clone(),
                next_keep_alive_in_ms: behaviour.renew_lease_ms,
            };
            let payload = Bytes::from(request.encode_to_vec());
            self.send(
                machine,
                Method::KeepTaskAlive,
                payload,
                move |daemons, machine, result| {
                    daemons.renewed(machine, &ids, result);
                },
            );
        }
        if !expired.is_empty() {
            let events = &self.stats.events;
            events
                .spares_expired
                .fetch_add(expired.len() as u64, Relaxed);
            self.free(machine, expired);
        }
    }

    fn renewed(self: &Arc<Self>, machine: usize, ids: &[u64], result: Result<Reply, CallError>) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let reply = settle::<pb::KeepTaskAliveResponse>(&self.stats, Method::KeepTaskAlive, result);
        let mut state = lock(&delegate.state);
        state.renewing = false;
        if let Ok(reply) = reply {
            let refused = ids
                .iter()
                .zip(reply.statuses.iter().chain(std::iter::repeat(&false)))
                .filter(|(id, renewed)| !**renewed && state.running.contains_key(id))
                .count();
            drop(state);
            let events = &self.stats.events;
            events.renewals_refused.fetch_add(refused as u64, Relaxed);
        }
    }

    /// `GetConfig`, every 10 s.
    pub(crate) fn get_config(self: &Arc<Self>, machine: usize, now: Instant) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        {
            let mut state = lock(&delegate.state);
            let period = self.delegate_behaviour.config_interval;
            let next = advance(&mut state.next_config, period, now);
            self.after(machine, next, Event::Config(machine));
            if std::mem::replace(&mut state.configuring, true) {
                return;
            }
        }
        let payload = self.config_request.clone();
        self.send(
            machine,
            Method::GetConfig,
            payload,
            |daemons, machine, result| {
                let _ = settle::<pb::GetConfigResponse>(&daemons.stats, Method::GetConfig, result);
                if let Some(delegate) = &daemons.machines[machine].delegate {
                    lock(&delegate.state).configuring = false;
                }
            },
        );
    }

    /// `GetRunningTasks`, every second. Each distinct list is decoded whole
    /// once ([`super::daemons::TaskLists`]).
    pub(crate) fn list_running_tasks(self: &Arc<Self>, machine: usize, now: Instant) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let Some(period) = self.delegate_behaviour.running_tasks_interval else {
            return;
        };
        {
            let mut state = lock(&delegate.state);
            let next = advance(&mut state.next_list, period, now);
            self.after(machine, next, Event::RunningTasks(machine));
            if std::mem::replace(&mut state.listing, true) {
                return;
            }
        }
        let payload = Bytes::new();
        self.send(
            machine,
            Method::GetRunningTasks,
            payload,
            |daemons, machine, result| {
                let rpc = Method::GetRunningTasks;
                let checked =
                    result.and_then(|reply| Ok((daemons.task_lists.check(&reply)?, reply)));
                match checked {
                    Ok((list, reply)) => {
                        record_reply(&daemons.stats, rpc, &reply, list.message_bytes);
                        let largest = &daemons.stats.events.largest_task_list;
                        largest.fetch_max(list.tasks as u64, Relaxed);
                    }
                    Err(error) => record_failure(&daemons.stats, rpc, &error),
                }
                if let Some(delegate) = &daemons.machines[machine].delegate {
                    lock(&delegate.state).listing = false;
                }
            },
        );
    }

    /// Carries out what a change of a delegate's state asks for, once its
    /// lock is released.
    pub(crate) fn act(self: &Arc<Self>, machine: usize, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Ask { lane, immediate } => self.ask(machine, lane, immediate),
                Action::Free(ids) => self.free(machine, ids),
            }
        }
    }

    /// `FreeTask`; errors are recorded and otherwise ignored, as the daemon does.
    pub(crate) fn free(self: &Arc<Self>, machine: usize, ids: Vec<u64>) {
        let request = pb::FreeTaskRequest {
            token: self.delegate_behaviour.token.clone(),
            task_grant_ids: ids,
        };
        self.frees.fetch_add(1, Relaxed);
        let payload = Bytes::from(request.encode_to_vec());
        self.send(machine, Method::FreeTask, payload, |daemons, _, result| {
            let _ = settle::<pb::FreeTaskResponse>(&daemons.stats, Method::FreeTask, result);
            daemons.frees.fetch_sub(1, Relaxed);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaviour_debug_redacts_the_token() {
        let delegate = DelegateBehaviour::new(
            "user-secret",
            Workload::Rate {
                jobs_per_second: 1.0,
            },
        );
        let printed = format!("{delegate:?}");
        assert!(!printed.contains("-secret"), "{printed}");
        assert!(printed.contains("token: <redacted>"), "{printed}");
    }

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
