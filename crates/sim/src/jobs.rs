//! A delegate's compilations, from arrival to `FreeTask`: each takes a
//! prefetched grant of its compiler or waits for the compiler's
//! `WaitForStartingTask` loop (one call at a time, asking for the jobs
//! waiting now plus a prefetch, again at once after no quota, 100 ms after an
//! error), runs on the granted servant for its duration (or until the
//! servant kills it), and is freed. Jobs arrive as the workload says: a
//! Poisson stream, builds of many files now and then, or a steady number
//! under way.

use std::{
    collections::{HashMap, VecDeque},
    ops::RangeInclusive,
    sync::atomic::Ordering::Relaxed,
    time::Duration,
};

use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::time::Instant;

use super::{
    behaviour::{DelegateBehaviour, Workload},
    effects::{Effects, Request},
    shard::Event,
};
use yadcc_pb as pb;

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
    waiting: VecDeque<Duration>,
    pub(crate) spares: Vec<(Grant, Instant)>,
    /// Its `WaitForStartingTask` is out (or waits to be retried).
    asking: bool,
}

/// A build under way: `remaining` files not started, `in_flight` compiling
/// (or waiting for a grant), at most `parallel` at once, all with one compiler.
#[derive(Debug, Clone, Copy)]
struct Build {
    lane: usize,
    remaining: u32,
    in_flight: u32,
    parallel: u32,
}

/// How a lane's `WaitForStartingTask` ended.
#[derive(Debug)]
pub(crate) enum LongPoll {
    Granted(Vec<pb::StartingTaskGrant>),
    /// The cluster was busy for the whole wait.
    NoQuota,
    Failed,
}

/// Between a failed `WaitForStartingTask` and the next (the daemon's 100 ms).
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(100);

/// Largest `immediate_reqs` a delegate asks for at once.
const MOST_IMMEDIATE: usize = 1000;

pub(crate) fn random_duration(rng: &mut SmallRng, range: &RangeInclusive<Duration>) -> Duration {
    if range.start() >= range.end() {
        return *range.start();
    }
    rng.random_range(range.clone())
}

/// A task digest: 32 random hex digits.
fn task_digest(rng: &mut impl Rng) -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits: u128 = rng.random();
    std::array::from_fn(|index| HEX[((bits >> (4 * (31 - index))) & 0xf) as usize])
}

/// One delegate's compilations.
#[derive(Debug)]
pub(crate) struct Jobs {
    pub(crate) rng: SmallRng,
    pub(crate) lanes: Vec<Lane>,
    /// Compilations running now: grant id to the servant running it.
    pub(crate) running: HashMap<u64, usize>,
    /// Compilations waiting for a grant or running (at most `max_jobs`).
    count: usize,
    build: Option<Build>,
    next_arrival: Instant,
}

impl Jobs {
    pub(crate) fn new(lanes: usize) -> Jobs {
        Jobs {
            rng: SmallRng::from_rng(&mut rand::rng()),
            lanes: (0..lanes).map(|_| Lane::default()).collect(),
            running: HashMap::new(),
            count: 0,
            build: None,
            next_arrival: Instant::now(),
        }
    }

    /// The workload's first jobs, or when they come.
    pub(crate) fn start(&mut self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        match &behaviour.workload {
            Workload::Rate { jobs_per_second } if *jobs_per_second > 0.0 => {
                self.next_arrival = fx.now;
                self.next_arrival(*jobs_per_second, fx);
            }
            Workload::Rate { .. } => {}
            Workload::Builds { idle, .. } => {
                let at = fx.now + random_duration(&mut self.rng, idle);
                fx.after(at, Event::BuildStart(fx.machine));
            }
            Workload::Steady { running } => {
                for _ in 0..*running {
                    let lane = self.rng.random_range(0..self.lanes.len());
                    let whole = random_duration(&mut self.rng, &behaviour.task_duration);
                    // Part-way through: what is left of a job already running.
                    let left = whole.mul_f64(self.rng.random_range(0.0..=1.0));
                    self.submit(lane, left, fx);
                }
            }
        }
    }

    /// Sets the stream's next arrival: exponential gaps make it Poisson.
    fn next_arrival(&mut self, jobs_per_second: f64, fx: &Effects<'_>) {
        let gap = -(1.0 - self.rng.random::<f64>()).ln() / jobs_per_second;
        self.next_arrival += Duration::from_secs_f64(gap.min(60.0));
        fx.after(self.next_arrival, Event::Arrival(fx.machine));
    }

    /// A compilation of the stream arrives.
    pub(crate) fn arrival(&mut self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        let Workload::Rate { jobs_per_second } = behaviour.workload else {
            return;
        };
        self.next_arrival(jobs_per_second, fx);
        if self.count >= behaviour.max_jobs {
            fx.events.jobs_shed.fetch_add(1, Relaxed);
            return;
        }
        let lane = self.rng.random_range(0..self.lanes.len());
        let duration = random_duration(&mut self.rng, &behaviour.task_duration);
        self.submit(lane, duration, fx);
    }

    /// An idle developer starts a build.
    pub(crate) fn build_start(&mut self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        let Workload::Builds {
            files, parallelism, ..
        } = &behaviour.workload
        else {
            return;
        };
        self.build = Some(Build {
            lane: self.rng.random_range(0..self.lanes.len()),
            remaining: self.rng.random_range(files.clone()),
            in_flight: 0,
            parallel: self.rng.random_range(parallelism.clone()).max(1),
        });
        self.launch_build(behaviour, fx);
    }

    /// Starts the build's next files, as many as its parallelism allows; when
    /// it is done, the developer is idle again.
    fn launch_build(&mut self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        while let Some(build) = self.build
            && build.in_flight < build.parallel
            && build.remaining > 0
        {
            if self.count >= behaviour.max_jobs {
                // Too much queued: the rest of the build is given up.
                self.build = Some(Build {
                    remaining: 0,
                    ..build
                });
                break;
            }
            self.build = Some(Build {
                remaining: build.remaining - 1,
                in_flight: build.in_flight + 1,
                ..build
            });
            let duration = random_duration(&mut self.rng, &behaviour.task_duration);
            self.submit(build.lane, duration, fx);
        }
        if let Some(build) = self.build
            && build.in_flight == 0
            && build.remaining == 0
            && let Workload::Builds { idle, .. } = &behaviour.workload
        {
            self.build = None;
            let at = fx.now + random_duration(&mut self.rng, idle);
            fx.after(at, Event::BuildStart(fx.machine));
        }
    }

    /// A compilation needs a grant: a prefetched one of its compiler, else
    /// it waits and the compiler's loop asks (unless it is asking already).
    fn submit(&mut self, lane: usize, duration: Duration, fx: &mut Effects<'_>) {
        self.count += 1;
        if let Some((grant, _)) = self.lanes[lane].spares.pop() {
            self.run(grant, duration, fx);
            return;
        }
        let queue = &mut self.lanes[lane];
        queue.waiting.push_back(duration);
        if !queue.asking {
            queue.asking = true;
            let immediate = queue.waiting.len().min(MOST_IMMEDIATE) as u32;
            fx.request(Request::Ask { lane, immediate });
        }
    }

    /// Starts a compilation on its granted servant. One naming a servant
    /// this simulator does not run is freed at once and counted.
    fn run(&mut self, grant: Grant, duration: Duration, fx: &mut Effects<'_>) {
        let Some(servant) = grant.servant else {
            fx.events.unknown_servants.fetch_add(1, Relaxed);
            fx.request(Request::Free(vec![grant.id]));
            self.count = self.count.saturating_sub(1);
            return;
        };
        self.running.insert(grant.id, servant);
        let digest = task_digest(&mut self.rng);
        fx.registry.start(servant, grant.id, digest, fx.machine);
        fx.events.tasks_started.fetch_add(1, Relaxed);
        let done = Event::JobDone {
            machine: fx.machine,
            grant: grant.id,
        };
        fx.after(fx.now + duration, done);
    }

    /// The compilation under `grant` finished: the servant stops reporting
    /// it before the grant is freed, so a heartbeat in between never lists a
    /// freed grant.
    pub(crate) fn done(&mut self, grant: u64, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        // Gone already if its servant killed it.
        let Some(servant) = self.running.remove(&grant) else {
            return;
        };
        fx.registry.finish(servant, grant);
        fx.request(Request::Free(vec![grant]));
        fx.events.tasks_completed.fetch_add(1, Relaxed);
        self.ended(behaviour, fx);
    }

    /// A servant killed the task under `grant` (its id came back expired).
    pub(crate) fn killed(
        &mut self,
        grant: u64,
        behaviour: &DelegateBehaviour,
        fx: &mut Effects<'_>,
    ) {
        if self.running.remove(&grant).is_some() {
            fx.request(Request::Free(vec![grant]));
            self.ended(behaviour, fx);
        }
    }

    /// A compilation is over, whatever ended it: the workload goes on.
    fn ended(&mut self, behaviour: &DelegateBehaviour, fx: &mut Effects<'_>) {
        self.count = self.count.saturating_sub(1);
        if fx.stopping {
            return;
        }
        match behaviour.workload {
            Workload::Rate { .. } => {}
            Workload::Builds { .. } => {
                if let Some(build) = &mut self.build {
                    build.in_flight = build.in_flight.saturating_sub(1);
                }
                self.launch_build(behaviour, fx);
            }
            Workload::Steady { .. } => {
                let lane = self.rng.random_range(0..self.lanes.len());
                let duration = random_duration(&mut self.rng, &behaviour.task_duration);
                self.submit(lane, duration, fx);
            }
        }
    }

    /// The lane's `WaitForStartingTask` ended: grants go to the waiting jobs
    /// in order, the rest are kept as prefetched; the loop asks again while
    /// jobs wait (at once after no quota, 100 ms after an error). A stopping
    /// delegate gives every new grant back at once.
    pub(crate) fn long_poll_ended(&mut self, lane: usize, ended: LongPoll, fx: &mut Effects<'_>) {
        let retry = match ended {
            LongPoll::Granted(grants) => {
                let events = fx.events;
                events
                    .grants_received
                    .fetch_add(grants.len() as u64, Relaxed);
                if fx.stopping {
                    let ids = grants.iter().map(|grant| grant.task_grant_id).collect();
                    fx.request(Request::Free(ids));
                } else {
                    for granted in grants {
                        let grant = Grant {
                            id: granted.task_grant_id,
                            servant: fx.registry.servant_at(&granted.servant_location),
                        };
                        match self.lanes[lane].waiting.pop_front() {
                            Some(duration) => self.run(grant, duration, fx),
                            None => self.lanes[lane].spares.push((grant, fx.now)),
                        }
                    }
                }
                false
            }
            LongPoll::NoQuota => false,
            LongPoll::Failed => true,
        };
        let queue = &mut self.lanes[lane];
        if fx.stopping || queue.waiting.is_empty() {
            queue.asking = false;
        } else if retry {
            let event = Event::LaneRetry {
                machine: fx.machine,
                lane,
            };
            fx.after(fx.now + RETRY_AFTER_ERROR, event);
        } else {
            let immediate = queue.waiting.len().min(MOST_IMMEDIATE) as u32;
            fx.request(Request::Ask { lane, immediate });
        }
    }

    /// The lane's loop after an error's pause: asks if jobs still wait.
    pub(crate) fn retry(&mut self, lane: usize, fx: &mut Effects<'_>) {
        let queue = &mut self.lanes[lane];
        queue.asking = !queue.waiting.is_empty() && !fx.stopping;
        if queue.asking {
            let immediate = queue.waiting.len().min(MOST_IMMEDIATE) as u32;
            fx.request(Request::Ask { lane, immediate });
        }
    }

    /// Prefetched grants older than `life`, taken.
    pub(crate) fn stale_spares(&mut self, life: Duration, now: Instant) -> Vec<u64> {
        let mut stale = Vec::new();
        for lane in &mut self.lanes {
            lane.spares.retain(|(grant, at)| {
                let keep = now.duration_since(*at) < life;
                if !keep {
                    stale.push(grant.id);
                }
                keep
            });
        }
        stale
    }

    /// Every grant held, taken (the daemon gives them back on shutdown).
    pub(crate) fn take_grants(&mut self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.running.drain().map(|(id, _)| id).collect();
        for lane in &mut self.lanes {
            ids.extend(lane.spares.drain(..).map(|(grant, _)| grant.id));
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{registry::Registry, shard::Shard, stats::Events};

    /// The calls asked for, as text.
    fn requested(fx: Effects<'_>) -> Vec<String> {
        let requests = fx.into_requests();
        requests
            .iter()
            .map(|request| format!("{request:?}"))
            .collect()
    }

    #[test]
    fn task_digests_are_32_hex_digits() {
        let mut rng = SmallRng::seed_from_u64(3);
        let digest = task_digest(&mut rng);
        assert!(digest.iter().all(u8::is_ascii_hexdigit), "{digest:?}");
        assert_ne!(digest, task_digest(&mut rng));
    }

    /// Jobs wait for the lane's one long poll, take its grants in order,
    /// keep the rest as prefetched, run on their servants, and are freed
    /// when done; the loop asks again only while jobs wait.
    #[tokio::test(start_paused = true)]
    async fn jobs_wait_for_grants_run_and_are_freed() {
        let registry = Registry::new(["127.1.0.1:8335".parse().unwrap()]);
        let (events, timers) = (Events::default(), Shard::default());
        let behaviour = DelegateBehaviour::new(
            "t",
            Workload::Rate {
                jobs_per_second: 1.0,
            },
        );
        let mut jobs = Jobs::new(1);
        let mut fx = Effects::new(3, false, &registry, &events, &timers);
        jobs.submit(0, Duration::from_secs(2), &mut fx);
        jobs.submit(0, Duration::from_secs(3), &mut fx);
        let asked = requested(fx);
        assert_eq!(
            asked,
            ["Ask { lane: 0, immediate: 1 }"],
            "one call at a time"
        );

        let grant = |id: u64| pb::StartingTaskGrant {
            task_grant_id: id,
            servant_location: "127.1.0.1:8335".into(),
        };
        let mut fx = Effects::new(3, false, &registry, &events, &timers);
        jobs.long_poll_ended(0, LongPoll::Granted(vec![grant(10)]), &mut fx);
        let asked = requested(fx);
        assert_eq!(
            asked,
            ["Ask { lane: 0, immediate: 1 }"],
            "one job still waits"
        );
        assert_eq!(registry.running(), 1);

        let mut fx = Effects::new(3, false, &registry, &events, &timers);
        let granted = LongPoll::Granted(vec![grant(11), grant(12)]);
        jobs.long_poll_ended(0, granted, &mut fx);
        assert!(
            fx.into_requests().is_empty(),
            "nothing waits: the loop rests"
        );
        assert_eq!(registry.running(), 2);
        assert_eq!(jobs.lanes[0].spares.len(), 1, "the prefetch is kept");

        let mut fx = Effects::new(3, false, &registry, &events, &timers);
        jobs.done(10, &behaviour, &mut fx);
        jobs.done(10, &behaviour, &mut fx);
        let requests = requested(fx);
        assert_eq!(requests, ["Free([10])"], "freed once");
        assert_eq!(registry.running(), 1);
        assert_eq!(events.tasks_completed.load(Relaxed), 1);
        let mut held = jobs.take_grants();
        held.sort_unstable();
        assert_eq!(held, [11, 12]);
    }
}
