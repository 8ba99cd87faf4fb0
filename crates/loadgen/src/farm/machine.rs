//! One compile servant of the farm model: its processors, its owner's work
//! (the foreign load), the compile tasks it runs under processor sharing,
//! and the load it reports as the stock daemon does (the average number of
//! busy processors over the last 15 s, its own tasks included).

use std::time::Duration;

use tokio::time::Instant;

/// The stock daemon's `--cpu_load_average_seconds`.
pub(crate) const LOAD_AVERAGE_WINDOW: Duration = Duration::from_secs(15);

/// The average number of busy processors over the last
/// [`LOAD_AVERAGE_WINDOW`], kept as the daemon reads `/proc/stat`: the busy
/// time of each whole second, the window being the last 15 whole seconds
/// (fewer right after the start).
#[derive(Debug, Clone)]
pub(crate) struct LoadAverage {
    origin: Instant,
    /// Busy processor-seconds of each of the last whole seconds, oldest first.
    seconds: std::collections::VecDeque<f64>,
    /// The second being filled: its index since `origin` and busy time so far.
    current: u64,
    current_busy: f64,
}

impl LoadAverage {
    pub(crate) fn new(origin: Instant) -> LoadAverage {
        LoadAverage {
            origin,
            seconds: std::collections::VecDeque::new(),
            current: 0,
            current_busy: 0.0,
        }
    }

    /// `busy` processors from `from` to `to` (no more than a few seconds apart).
    pub(crate) fn record(&mut self, from: Instant, to: Instant, busy: f64) {
        let mut at = from.max(self.origin);
        while at < to {
            let second = at.duration_since(self.origin).as_secs();
            self.roll_to(second);
            let second_end = self.origin + Duration::from_secs(second + 1);
            let until = second_end.min(to);
            self.current_busy += busy * until.duration_since(at).as_secs_f64();
            at = until;
        }
    }

    fn roll_to(&mut self, second: u64) {
        let window = LOAD_AVERAGE_WINDOW.as_secs() as usize;
        while self.current < second {
            self.seconds
                .push_back(std::mem::take(&mut self.current_busy));
            if self.seconds.len() > window {
                self.seconds.pop_front();
            }
            self.current += 1;
        }
    }

    /// What the daemon reports at `now`: the mean over the whole seconds of
    /// the window, rounded to the nearest processor.
    pub(crate) fn current_load(&mut self, now: Instant) -> u32 {
        self.roll_to(now.duration_since(self.origin).as_secs());
        if self.seconds.is_empty() {
            return self.current_busy.round() as u32;
        }
        let sum: f64 = self.seconds.iter().sum();
        (sum / self.seconds.len() as f64).round() as u32
    }
}

/// A compile task on a servant: its grant and the CPU time (of the
/// reference core) it still needs.
#[derive(Debug, Clone)]
pub(crate) struct Task<C> {
    pub(crate) grant: u64,
    pub(crate) compile: C,
    pub(crate) cpu_left: f64,
}

/// One servant: `processors` shared equally by its owner's processes and
/// the compile tasks (processor sharing: with more runnable processes than
/// processors each runs at `processors / runnable` of a core), each core
/// doing `core_speed` reference CPU-seconds a second.
#[derive(Debug, Clone)]
pub(crate) struct Machine<C> {
    pub(crate) processors: u32,
    pub(crate) core_speed: f64,
    /// Its `--max_remote_tasks`, reported as `capacity`.
    pub(crate) max_tasks: u32,
    /// Runnable processes of the owner now.
    pub(crate) foreign: u32,
    pub(crate) tasks: Vec<Task<C>>,
    pub(crate) load: LoadAverage,
    /// Compile CPU-seconds (of the reference core) done here (for the
    /// utilisation).
    pub(crate) compile_cpu_done: f64,
}

impl<C: Clone> Machine<C> {
    pub(crate) fn new(
        processors: u32,
        core_speed: f64,
        max_tasks: u32,
        origin: Instant,
    ) -> Machine<C> {
        Machine {
            processors,
            core_speed,
            max_tasks,
            foreign: 0,
            tasks: Vec::new(),
            load: LoadAverage::new(origin),
            compile_cpu_done: 0.0,
        }
    }

    /// Reference CPU-seconds a second each runnable process gets now: its
    /// share of a core times the core's speed.
    pub(crate) fn rate(&self) -> f64 {
        let runnable = self.foreign as usize + self.tasks.len();
        let share = if runnable <= self.processors as usize {
            1.0
        } else {
            f64::from(self.processors) / runnable as f64
        };
        share * self.core_speed
    }

    /// Processors busy now.
    pub(crate) fn busy(&self) -> f64 {
        (self.foreign as f64 + self.tasks.len() as f64).min(f64::from(self.processors))
    }

    /// Processors truly idle now, and so the tasks it could take without
    /// slowing anything, within its `max_tasks`.
    pub(crate) fn free_slots(&self) -> u32 {
        let used = self.foreign + self.tasks.len() as u32;
        let by_processors = self.processors.saturating_sub(used);
        by_processors.min(self.max_tasks.saturating_sub(self.tasks.len() as u32))
    }

    pub(crate) fn start(&mut self, grant: u64, compile: C, cpu: f64) {
        self.tasks.push(Task {
            grant,
            compile,
            cpu_left: cpu,
        });
    }

    /// Runs from `from` to `to` with the foreign load as it is; returns the
    /// tasks that finished, each with when it finished.
    pub(crate) fn advance(&mut self, from: Instant, to: Instant) -> Vec<(Task<C>, Instant)> {
        if to <= from {
            return Vec::new();
        }
        let mut finished = Vec::new();
        let mut at = from;
        // Each finished task speeds up the rest: step from one end to the next.
        while at < to {
            let rate = self.rate();
            let left = to.duration_since(at).as_secs_f64();
            let soonest = self
                .tasks
                .iter()
                .map(|task| task.cpu_left / rate)
                .fold(f64::INFINITY, f64::min);
            let step = soonest.min(left);
            let step_end = if step >= left {
                to
            } else {
                at + Duration::from_secs_f64(step)
            };
            self.load.record(at, step_end, self.busy());
            for task in &mut self.tasks {
                task.cpu_left -= rate * step;
            }
            self.compile_cpu_done += rate * step * self.tasks.len() as f64;
            let mut index = 0;
            while index < self.tasks.len() {
                if self.tasks[index].cpu_left <= 1e-9 {
                    finished.push((self.tasks.swap_remove(index), step_end));
                } else {
                    index += 1;
                }
            }
            at = step_end;
        }
        finished
    }

    /// Removes the task under `grant` (the servant killed it).
    pub(crate) fn kill(&mut self, grant: u64) -> Option<Task<C>> {
        let index = self.tasks.iter().position(|task| task.grant == grant)?;
        Some(self.tasks.swap_remove(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn secs(value: f64) -> Duration {
        Duration::from_secs_f64(value)
    }

    #[tokio::test(start_paused = true)]
    async fn oversubscribed_tasks_share_the_processors() {
        let origin = Instant::now();
        let mut machine: Machine<u32> = Machine::new(2, 1.0, 8, origin);
        machine.foreign = 1;
        // Three tasks and one foreign process on two processors: each runs at
        // half speed, so 1 s of CPU takes 2 s.
        for grant in 1..=3 {
            machine.start(grant, grant as u32, 1.0);
        }
        advance(secs(1.0)).await;
        assert!(machine.advance(origin, Instant::now()).is_empty());
        assert!((machine.tasks[0].cpu_left - 0.5).abs() < 1e-9);
        advance(secs(1.5)).await;
        let finished = machine.advance(origin + secs(1.0), Instant::now());
        assert_eq!(finished.len(), 3);
        for (_, at) in &finished {
            let took = at.duration_since(origin).as_secs_f64();
            assert!((took - 2.0).abs() < 1e-6, "finished after {took} s");
        }
        assert!((machine.compile_cpu_done - 3.0).abs() < 1e-6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_faster_core_does_more_work_a_second() {
        let origin = Instant::now();
        let mut machine: Machine<u32> = Machine::new(2, 1.5, 2, origin);
        machine.foreign = 1;
        // Two tasks and one foreign process on two cores of 1.5: each gets
        // 2/3 of a core, 1 reference CPU-second a second.
        machine.start(1, 1, 3.0);
        machine.start(2, 2, 3.0);
        advance(secs(10.0)).await;
        let finished = machine.advance(origin, Instant::now());
        assert_eq!(finished.len(), 2);
        for (_, at) in &finished {
            let took = at.duration_since(origin).as_secs_f64();
            assert!((took - 3.0).abs() < 1e-6, "finished after {took} s");
        }
        assert!((machine.compile_cpu_done - 6.0).abs() < 1e-6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_task_speeds_up_the_others() {
        let origin = Instant::now();
        let mut machine: Machine<u32> = Machine::new(1, 1.0, 4, origin);
        machine.start(1, 1, 0.5);
        machine.start(2, 2, 1.0);
        advance(secs(10.0)).await;
        let finished = machine.advance(origin, Instant::now());
        let at = |grant: u64| {
            let (_, at) = finished
                .iter()
                .find(|(task, _)| task.grant == grant)
                .unwrap();
            at.duration_since(origin).as_secs_f64()
        };
        // Both at half speed until the first ends at 1 s, the second then
        // alone: 0.5 s of CPU left at full speed.
        assert!((at(1) - 1.0).abs() < 1e-6);
        assert!((at(2) - 1.5).abs() < 1e-6);
    }

    #[tokio::test(start_paused = true)]
    async fn the_reported_load_is_the_busy_processors_of_the_last_15_seconds() {
        let origin = Instant::now();
        let mut machine: Machine<u32> = Machine::new(8, 1.0, 8, origin);
        // 30 s with 4 tasks' worth of foreign work, then idle.
        machine.foreign = 4;
        advance(secs(30.0)).await;
        machine.advance(origin, Instant::now());
        assert_eq!(machine.load.current_load(Instant::now()), 4);
        machine.foreign = 0;
        let idle_from = Instant::now();
        advance(secs(7.5)).await;
        machine.advance(idle_from, Instant::now());
        // Half the window idle: 7 whole seconds of 15 idle, 8 at 4.
        assert_eq!(machine.load.current_load(Instant::now()), 2);
        let later = Instant::now();
        advance(secs(8.0)).await;
        machine.advance(later, Instant::now());
        // The burst is out of the window 15 s after it ended.
        assert_eq!(machine.load.current_load(Instant::now()), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_reported_load_counts_its_own_tasks_and_caps_at_the_processors() {
        let origin = Instant::now();
        let mut machine: Machine<u32> = Machine::new(4, 1.0, 8, origin);
        machine.foreign = 2;
        for grant in 1..=6 {
            machine.start(grant, 0, 100.0);
        }
        advance(secs(20.0)).await;
        machine.advance(origin, Instant::now());
        assert_eq!(machine.load.current_load(Instant::now()), 4);
        assert_eq!(machine.free_slots(), 0);
        machine.foreign = 0;
        machine.tasks.truncate(1);
        assert_eq!(machine.free_slots(), 3);
    }
}
