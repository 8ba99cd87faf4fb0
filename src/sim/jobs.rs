//! A delegate's compilations, from arrival to `FreeTask`: each takes a
//! prefetched grant of its compiler or waits for the compiler's
//! `WaitForStartingTask` loop, runs on the granted servant for its duration
//! (or until the servant kills it), and is freed. Jobs arrive as the
//! workload says: a Poisson stream, builds of many files now and then, or a
//! steady number under way.
//!
//! State changes happen under the delegate's lock and return [`Action`]s,
//! the calls they ask for, which are sent once the lock is released.

use std::sync::{Arc, atomic::Ordering::Relaxed};

use bytes::Bytes;
use prost::Message;
use rand::Rng;
use tokio::time::Instant;

use super::{
    client::{CallError, Reply, lock, settle},
    daemons::Daemons,
    delegate::{DelegateState, Grant, Workload, random_duration},
    servant::DAEMON_VERSION,
    shard::Event,
};
use crate::pb::{self, Method};

/// A call a delegate's state change asks for.
#[derive(Debug)]
pub(crate) enum Action {
    /// The lane's `WaitForStartingTask`, for `immediate` waiting jobs.
    Ask {
        lane: usize,
        immediate: u32,
    },
    Free(Vec<u64>),
}

/// A build under way: `remaining` files not started, `in_flight` compiling
/// (or waiting for a grant), at most `parallel` at once, all with one compiler.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Build {
    lane: usize,
    remaining: u32,
    in_flight: u32,
    parallel: u32,
}

/// Between a failed `WaitForStartingTask` and the next (the daemon's 100 ms).
const RETRY_AFTER_ERROR: std::time::Duration = std::time::Duration::from_millis(100);

/// Largest `immediate_reqs` a delegate asks for at once.
const MOST_IMMEDIATE: usize = 1000;

/// A task digest: 32 random hex digits.
fn task_digest(rng: &mut impl Rng) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits: u128 = rng.random();
    std::array::from_fn(|index| HEX[((bits >> (4 * (31 - index))) & 0xf) as usize])
}

impl Daemons {
    /// The workload's first jobs, or when they come.
    pub(crate) fn start_workload(
        self: &Arc<Self>,
        machine: usize,
        state: &mut DelegateState,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        let behaviour = &self.delegate_behaviour;
        match &behaviour.workload {
            Workload::Rate { jobs_per_second } if *jobs_per_second > 0.0 => {
                state.next_arrival = now;
                self.next_arrival(machine, state, *jobs_per_second);
            }
            Workload::Rate { .. } => {}
            Workload::Builds { idle, .. } => {
                let at = now + random_duration(&mut state.rng, idle);
                self.after(machine, at, Event::BuildStart(machine));
            }
            Workload::Steady { running } => {
                for _ in 0..*running {
                    let lane = state.rng.random_range(0..state.lanes.len());
                    let whole = random_duration(&mut state.rng, &behaviour.task_duration);
                    // Part-way through: what is left of a job already running.
                    let left = whole.mul_f64(state.rng.random_range(0.0..=1.0));
                    self.submit_job(machine, state, lane, left, now, actions);
                }
            }
        }
    }

    /// Sets the stream's next arrival: exponential gaps make it Poisson.
    fn next_arrival(&self, machine: usize, state: &mut DelegateState, jobs_per_second: f64) {
        let gap = -(1.0 - state.rng.random::<f64>()).ln() / jobs_per_second;
        state.next_arrival += std::time::Duration::from_secs_f64(gap.min(60.0));
        self.after(machine, state.next_arrival, Event::Arrival(machine));
    }

    /// A compilation of the stream arrives.
    pub(crate) fn arrival(self: &Arc<Self>, machine: usize, now: Instant) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let behaviour = &self.delegate_behaviour;
        let Workload::Rate { jobs_per_second } = behaviour.workload else {
            return;
        };
        let mut actions = Vec::new();
        {
            let mut state = lock(&delegate.state);
            let state = &mut *state;
            self.next_arrival(machine, state, jobs_per_second);
            if state.jobs >= behaviour.max_jobs {
                self.stats.events.jobs_shed.fetch_add(1, Relaxed);
                return;
            }
            let lane = state.rng.random_range(0..state.lanes.len());
            let duration = random_duration(&mut state.rng, &behaviour.task_duration);
            self.submit_job(machine, state, lane, duration, now, &mut actions);
        }
        self.act(machine, actions);
    }

    /// An idle developer starts a build.
    pub(crate) fn build_start(self: &Arc<Self>, machine: usize, now: Instant) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let Workload::Builds {
            files, parallelism, ..
        } = &self.delegate_behaviour.workload
        else {
            return;
        };
        let mut actions = Vec::new();
        {
            let mut state = lock(&delegate.state);
            let state = &mut *state;
            state.build = Some(Build {
                lane: state.rng.random_range(0..state.lanes.len()),
                remaining: state.rng.random_range(files.clone()),
                in_flight: 0,
                parallel: state.rng.random_range(parallelism.clone()).max(1),
            });
            self.launch_build(machine, state, now, &mut actions);
        }
        self.act(machine, actions);
    }

    /// Starts the build's next files, as many as its parallelism allows; when
    /// it is done, the developer is idle again.
    fn launch_build(
        self: &Arc<Self>,
        machine: usize,
        state: &mut DelegateState,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        let behaviour = &self.delegate_behaviour;
        while let Some(build) = state.build
            && build.in_flight < build.parallel
            && build.remaining > 0
        {
            if state.jobs >= behaviour.max_jobs {
                // Too much queued: the rest of the build is given up.
                state.build = Some(Build {
                    remaining: 0,
                    ..build
                });
                break;
            }
            state.build = Some(Build {
                remaining: build.remaining - 1,
                in_flight: build.in_flight + 1,
                ..build
            });
            let duration = random_duration(&mut state.rng, &behaviour.task_duration);
            self.submit_job(machine, state, build.lane, duration, now, actions);
        }
        if let Some(build) = state.build
            && build.in_flight == 0
            && build.remaining == 0
            && let Workload::Builds { idle, .. } = &behaviour.workload
        {
            state.build = None;
            let at = now + random_duration(&mut state.rng, idle);
            self.after(machine, at, Event::BuildStart(machine));
        }
    }

    /// A compilation needs a grant: a prefetched one of its compiler, else
    /// it waits and the compiler's loop asks (unless it is asking already).
    fn submit_job(
        self: &Arc<Self>,
        machine: usize,
        state: &mut DelegateState,
        lane: usize,
        duration: std::time::Duration,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        state.jobs += 1;
        if let Some((grant, _)) = state.lanes[lane].spares.pop() {
            self.run_job(machine, state, grant, duration, now, actions);
            return;
        }
        let queue = &mut state.lanes[lane];
        queue.waiting.push_back(duration);
        if !queue.asking {
            queue.asking = true;
            let immediate = queue.waiting.len().min(MOST_IMMEDIATE) as u32;
            actions.push(Action::Ask { lane, immediate });
        }
    }

    /// Starts a compilation on its granted servant.
    fn run_job(
        self: &Arc<Self>,
        machine: usize,
        state: &mut DelegateState,
        grant: Grant,
        duration: std::time::Duration,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        let events = &self.stats.events;
        let Some(servant) = grant.servant else {
            events.unknown_servants.fetch_add(1, Relaxed);
            actions.push(Action::Free(vec![grant.id]));
            self.job_ended(machine, state, now, actions);
            return;
        };
        state.running.insert(grant.id, servant);
        let digest = task_digest(&mut state.rng);
        self.registry.start(servant, grant.id, digest, machine);
        events.tasks_started.fetch_add(1, Relaxed);
        let done = Event::JobDone {
            machine,
            grant: grant.id,
        };
        self.after(machine, now + duration, done);
    }

    /// The compilation under `grant` finished: the servant stops reporting
    /// it before the grant is freed, so a heartbeat in between never lists a
    /// freed grant.
    pub(crate) fn job_done(self: &Arc<Self>, machine: usize, grant: u64, now: Instant) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let mut actions = Vec::new();
        {
            let mut state = lock(&delegate.state);
            // Gone already if its servant killed it.
            let Some(servant) = state.running.remove(&grant) else {
                return;
            };
            self.registry.finish(servant, grant);
            actions.push(Action::Free(vec![grant]));
            self.stats.events.tasks_completed.fetch_add(1, Relaxed);
            self.job_ended(machine, &mut state, now, &mut actions);
        }
        self.act(machine, actions);
    }

    /// A servant killed the task under `grant` (its id came back expired).
    pub(crate) fn task_killed(self: &Arc<Self>, machine: usize, grant: u64) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let mut actions = Vec::new();
        {
            let mut state = lock(&delegate.state);
            if state.running.remove(&grant).is_none() {
                return;
            }
            actions.push(Action::Free(vec![grant]));
            self.job_ended(machine, &mut state, Instant::now(), &mut actions);
        }
        self.act(machine, actions);
    }

    /// A compilation is over, whatever ended it: the workload goes on.
    fn job_ended(
        self: &Arc<Self>,
        machine: usize,
        state: &mut DelegateState,
        now: Instant,
        actions: &mut Vec<Action>,
    ) {
        state.jobs = state.jobs.saturating_sub(1);
        if self.is_stopping() {
            return;
        }
        let behaviour = &self.delegate_behaviour;
        match behaviour.workload {
            Workload::Rate { .. } => {}
            Workload::Builds { .. } => {
                if let Some(build) = &mut state.build {
                    build.in_flight = build.in_flight.saturating_sub(1);
                }
                self.launch_build(machine, state, now, actions);
            }
            Workload::Steady { .. } => {
                let lane = state.rng.random_range(0..state.lanes.len());
                let duration = random_duration(&mut state.rng, &behaviour.task_duration);
                self.submit_job(machine, state, lane, duration, now, actions);
            }
        }
    }

    /// The lane's `WaitForStartingTask`: grants for the jobs waiting now,
    /// plus a prefetch.
    pub(crate) fn ask(self: &Arc<Self>, machine: usize, lane: usize, immediate: u32) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let behaviour = &self.delegate_behaviour;
        let request = pb::WaitForStartingTaskRequest {
            token: behaviour.token.clone(),
            milliseconds_to_wait: behaviour.wait_ms,
            env_desc: Some(pb::EnvironmentDesc {
                compiler_digest: delegate.environments[lane].clone(),
            }),
            immediate_reqs: immediate,
            prefetch_reqs: behaviour.prefetch,
            next_keep_alive_in_ms: behaviour.grant_lease_ms,
            min_version: DAEMON_VERSION,
        };
        self.long_polls.fetch_add(1, Relaxed);
        let payload = Bytes::from(request.encode_to_vec());
        self.send(
            machine,
            Method::WaitForStartingTask,
            payload,
            move |daemons, machine, result| daemons.granted(machine, lane, result),
        );
    }

    /// The lane's `WaitForStartingTask` answered: grants go to the waiting
    /// jobs in order, the rest are kept as prefetched; the loop asks again
    /// while jobs wait (at once after no quota, 100 ms after an error).
    fn granted(self: &Arc<Self>, machine: usize, lane: usize, result: Result<Reply, CallError>) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let rpc = Method::WaitForStartingTask;
        let reply = settle::<pb::WaitForStartingTaskResponse>(&self.stats, rpc, result);
        let now = Instant::now();
        let stopping = self.is_stopping();
        let mut actions = Vec::new();
        {
            let mut state = lock(&delegate.state);
            let state = &mut *state;
            let retry = match reply {
                Ok(reply) => {
                    let events = &self.stats.events;
                    events
                        .grants_received
                        .fetch_add(reply.grants.len() as u64, Relaxed);
                    if stopping {
                        // Given back at once: nothing will run on them.
                        let ids = reply.grants.iter().map(|g| g.task_grant_id).collect();
                        actions.push(Action::Free(ids));
                    }
                    for granted in reply.grants.iter().filter(|_| !stopping) {
                        let grant = Grant {
                            id: granted.task_grant_id,
                            servant: self.registry.servant_at(&granted.servant_location),
                        };
                        match state.lanes[lane].waiting.pop_front() {
                            Some(duration) => {
                                self.run_job(machine, state, grant, duration, now, &mut actions);
                            }
                            None => state.lanes[lane].spares.push((grant, now)),
                        }
                    }
                    false
                }
                // The cluster was busy for the whole wait: ask again at once.
                Err(error) if error.is_no_quota() => false,
                Err(_) => true,
            };
            let queue = &mut state.lanes[lane];
            if stopping || queue.waiting.is_empty() {
                queue.asking = false;
            } else if retry {
                let at = now + RETRY_AFTER_ERROR;
                self.after(machine, at, Event::LaneRetry { machine, lane });
            } else {
                let immediate = queue.waiting.len().min(MOST_IMMEDIATE) as u32;
                actions.push(Action::Ask { lane, immediate });
            }
        }
        self.act(machine, actions);
        self.long_polls.fetch_sub(1, Relaxed);
    }

    /// The lane's loop after an error's pause: asks if jobs still wait.
    pub(crate) fn lane_retry(self: &Arc<Self>, machine: usize, lane: usize) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let ask = {
            let mut state = lock(&delegate.state);
            let queue = &mut state.lanes[lane];
            queue.asking = !queue.waiting.is_empty();
            queue
                .asking
                .then(|| queue.waiting.len().min(MOST_IMMEDIATE) as u32)
        };
        if let Some(immediate) = ask {
            self.ask(machine, lane, immediate);
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::{SeedableRng, rngs::SmallRng};

    use super::*;

    #[test]
    fn task_digests_are_32_hex_digits() {
        let mut rng = SmallRng::seed_from_u64(3);
        let digest = task_digest(&mut rng);
        assert!(digest.iter().all(u8::is_ascii_hexdigit), "{digest:?}");
        assert_ne!(digest, task_digest(&mut rng));
    }
}
