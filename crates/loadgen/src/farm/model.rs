//! The farm as it runs: the servants ([`Machine`]), the owner's work on
//! them as the scenario says, and the builds: each starts at its time with
//! `min(J, N)` compiles waiting for a slot, and each compile that ends lets
//! the next file of its build wait. Whoever places (the live run through a
//! scheduler, or the ideal placement) takes waiting compiles and starts them
//! on a servant; the model measures the rest.

use std::{collections::VecDeque, time::Duration};

use tokio::time::Instant;

use super::{machine::Machine, scenario::Scenario};

/// A compile: the build it belongs to and its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compile {
    pub(crate) build: usize,
    pub(crate) file: u32,
}

/// A compile that ended: the grant to give back and whose it was.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ended {
    pub(crate) grant: u64,
    pub(crate) developer: usize,
}

#[derive(Debug, Clone, Default)]
struct BuildProgress {
    started: bool,
    submitted: u32,
    finished: u32,
    end: Option<Instant>,
}

/// The farm's outcome (`ideal` or live): builds and how long they took.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub(crate) builds: usize,
    pub(crate) unfinished: usize,
    /// Each build's time, an unfinished one counted until the end.
    pub(crate) build_seconds: Vec<f64>,
    pub(crate) compile_waits: Vec<f64>,
    pub(crate) utilisation: f64,
    pub(crate) idle_while_waiting_slot_s: f64,
    pub(crate) killed: u64,
    pub(crate) elapsed_s: f64,
}

#[derive(Debug)]
pub(crate) struct Farm {
    pub(crate) origin: Instant,
    pub(crate) scenario: Scenario,
    pub(crate) machines: Vec<Machine<Compile>>,
    burst_cursor: Vec<usize>,
    progress: Vec<BuildProgress>,
    next_build: usize,
    /// Per developer, compiles waiting for a slot, oldest first, with since when.
    waiting: Vec<VecDeque<(Compile, Instant)>>,
    compile_waits: Vec<f64>,
    idle_while_waiting: f64,
    killed: u64,
    last: Instant,
}

impl Farm {
    /// Builds start `origin` + their start.
    pub(crate) fn new(scenario: Scenario, origin: Instant) -> Farm {
        let machines = scenario
            .servants
            .iter()
            .map(|plan| Machine::new(plan.processors, plan.speed, plan.max_tasks, origin))
            .collect();
        Farm {
            origin,
            burst_cursor: vec![0; scenario.servants.len()],
            progress: vec![BuildProgress::default(); scenario.builds.len()],
            next_build: 0,
            waiting: vec![VecDeque::new(); scenario.developers],
            compile_waits: Vec::new(),
            idle_while_waiting: 0.0,
            killed: 0,
            last: origin,
            machines,
            scenario,
        }
    }

    fn submit(&mut self, build: usize, since: Instant) {
        let plan = &self.scenario.builds[build];
        let progress = &mut self.progress[build];
        let file = progress.submitted;
        if file as usize >= plan.compiles.len() {
            return;
        }
        progress.submitted += 1;
        self.waiting[plan.developer].push_back((Compile { build, file }, since));
    }

    /// Runs the farm to `now`; returns the compiles that ended.
    pub(crate) fn advance(&mut self, now: Instant) -> Vec<Ended> {
        let from = self.last;
        if now <= from {
            return Vec::new();
        }
        self.last = now;
        let offset = from.saturating_duration_since(self.origin);
        for (servant, machine) in self.machines.iter_mut().enumerate() {
            let cursor = &mut self.burst_cursor[servant];
            machine.foreign = self.scenario.foreign_at(servant, cursor, offset);
        }
        let waiting: usize = self.waiting.iter().map(VecDeque::len).sum();
        if waiting > 0 {
            let free: usize = self.machines.iter().map(|m| m.free_slots() as usize).sum();
            let step = now.duration_since(from).as_secs_f64();
            self.idle_while_waiting += free.min(waiting) as f64 * step;
        }
        let mut ended = Vec::new();
        for servant in 0..self.machines.len() {
            for (task, at) in self.machines[servant].advance(from, now) {
                let build = task.compile.build;
                self.progress[build].finished += 1;
                let plan = &self.scenario.builds[build];
                if self.progress[build].finished as usize == plan.compiles.len() {
                    self.progress[build].end = Some(at);
                }
                ended.push(Ended {
                    grant: task.grant,
                    developer: plan.developer,
                });
                self.submit(build, at);
            }
        }
        while let Some(plan) = self.scenario.builds.get(self.next_build) {
            let start = self.origin + plan.start;
            if start > now {
                break;
            }
            let build = self.next_build;
            self.next_build += 1;
            self.progress[build].started = true;
            let first = plan.parallel.min(plan.compiles.len() as u32);
            for _ in 0..first {
                self.submit(build, start);
            }
        }
        ended
    }

    pub(crate) fn waiting(&self, developer: usize) -> usize {
        self.waiting[developer].len()
    }

    pub(crate) fn oldest_waiting(&self, developer: usize) -> Option<Instant> {
        self.waiting[developer].front().map(|(_, since)| *since)
    }

    /// Starts the developer's oldest waiting compile on `servant` under
    /// `grant`; false if none waits.
    pub(crate) fn start(
        &mut self,
        developer: usize,
        servant: usize,
        grant: u64,
        now: Instant,
    ) -> bool {
        let Some((compile, since)) = self.waiting[developer].pop_front() else {
            return false;
        };
        self.compile_waits
            .push(now.saturating_duration_since(since).as_secs_f64());
        let cpu = self.scenario.builds[compile.build].compiles[compile.file as usize];
        self.machines[servant].start(grant, compile, cpu);
        true
    }

    /// The servant killed the task under `grant`: its compile waits again
    /// from the start (a compiler wrapper retries).
    pub(crate) fn kill(&mut self, servant: usize, grant: u64, now: Instant) -> bool {
        let Some(task) = self.machines[servant].kill(grant) else {
            return false;
        };
        self.killed += 1;
        let developer = self.scenario.builds[task.compile.build].developer;
        self.waiting[developer].push_front((task.compile, now));
        true
    }

    /// Every build started and finished.
    pub(crate) fn done(&self) -> bool {
        self.next_build == self.scenario.builds.len()
            && self.progress.iter().all(|progress| progress.end.is_some())
    }

    pub(crate) fn outcome(&self, end: Instant) -> Outcome {
        let elapsed = end.saturating_duration_since(self.origin);
        let mut build_seconds = Vec::new();
        let mut unfinished = 0;
        for (plan, progress) in self.scenario.builds.iter().zip(&self.progress) {
            if !progress.started {
                continue;
            }
            let start = self.origin + plan.start;
            let finish = progress.end.unwrap_or_else(|| {
                unfinished += 1;
                end
            });
            build_seconds.push(finish.saturating_duration_since(start).as_secs_f64());
        }
        let offered: f64 = self
            .machines
            .iter()
            .map(|m| f64::from(m.processors.min(m.max_tasks)) * m.core_speed)
            .sum::<f64>()
            * elapsed.as_secs_f64();
        let done: f64 = self.machines.iter().map(|m| m.compile_cpu_done).sum();
        Outcome {
            builds: build_seconds.len(),
            unfinished,
            build_seconds,
            compile_waits: self.compile_waits.clone(),
            utilisation: if offered > 0.0 { done / offered } else { 0.0 },
            idle_while_waiting_slot_s: self.idle_while_waiting,
            killed: self.killed,
            elapsed_s: elapsed.as_secs_f64(),
        }
    }
}

/// The `q` quantile (nearest rank) of `values`; 0 for none.
pub(crate) fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Between two placements of the ideal run.
pub(crate) const IDEAL_STEP: Duration = Duration::from_millis(50);

/// The same builds under an ideal scheduler: it knows every processor's
/// true state and speed, answers at once and places each waiting compile
/// (oldest first across developers) on the fastest servant with an idle
/// processor, of those the one with the most, only where a processor is
/// idle and within `max_tasks`. Virtual time: no scheduler, no sockets;
/// `limit` bounds the run after the origin.
pub(crate) fn ideal(scenario: Scenario, limit: Duration) -> Outcome {
    let origin = Instant::now();
    let mut farm = Farm::new(scenario, origin);
    let mut now = origin;
    let mut grant = 0u64;
    while !farm.done() && now < origin + limit {
        now += IDEAL_STEP;
        farm.advance(now);
        loop {
            let oldest = (0..farm.scenario.developers)
                .filter_map(|developer| Some((farm.oldest_waiting(developer)?, developer)))
                .min();
            let Some((_, developer)) = oldest else {
                break;
            };
            let best = (0..farm.machines.len())
                .map(|servant| {
                    let machine = &farm.machines[servant];
                    (machine.core_speed, machine.free_slots(), servant)
                })
                .filter(|(_, free, _)| *free > 0)
                .max_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(b.2.cmp(&a.2)));
            let Some((_, _, servant)) = best else {
                break;
            };
            grant += 1;
            farm.start(developer, servant, grant, now);
        }
    }
    farm.outcome(now)
}

#[cfg(test)]
mod tests {
    use super::super::scenario::{BuildPlan, ServantPlan};
    use super::*;

    fn tiny(servants: u32, parallel: u32, files: usize) -> Scenario {
        Scenario {
            servants: vec![
                ServantPlan {
                    processors: servants,
                    speed: 1.0,
                    max_tasks: servants,
                    dedicated: true,
                    bursts: Vec::new(),
                };
                1
            ],
            developers: 1,
            builds: vec![BuildPlan {
                developer: 0,
                start: Duration::ZERO,
                parallel,
                compiles: vec![1.0; files],
            }],
        }
    }

    #[test]
    fn a_build_under_the_ideal_scheduler_takes_its_work_over_its_processors() {
        // 8 one-second files, 4 processors, -j8: two waves of 1 s.
        let outcome = ideal(tiny(4, 8, 8), Duration::from_secs(60));
        assert_eq!(outcome.builds, 1);
        assert_eq!(outcome.unfinished, 0);
        let took = outcome.build_seconds[0];
        assert!((2.0..2.2).contains(&took), "took {took}");
        // The second wave waited for the first.
        assert!(quantile(&outcome.compile_waits, 1.0) >= 1.0);
    }

    #[test]
    fn the_ideal_scheduler_takes_the_fastest_idle_processor_first() {
        let mut farm = tiny(4, 1, 3);
        let slow = farm.servants[0].clone();
        farm.servants.push(ServantPlan { speed: 2.0, ..slow });
        // -j1, one-second files: each runs alone on the fast servant.
        let outcome = ideal(farm, Duration::from_secs(60));
        let took = outcome.build_seconds[0];
        assert!((1.5..1.8).contains(&took), "took {took}");
    }

    #[test]
    fn parallelism_limits_a_build() {
        // -j1: one file after the other on an otherwise idle farm.
        let outcome = ideal(tiny(4, 1, 3), Duration::from_secs(60));
        let took = outcome.build_seconds[0];
        assert!((3.0..3.3).contains(&took), "took {took}");
        assert!(outcome.utilisation < 0.3);
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.95), 95.0);
        assert_eq!(quantile(&values, 0.5), 50.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
