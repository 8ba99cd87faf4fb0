//! Rule "own load": the average number of this scheduler's grants on one
//! servant over the last [`OWN_LOAD_WINDOW`], the window the stock daemon
//! averages its busy processors over (`--cpu_load_average_seconds`, 15 s).
//! Subtracting it from the reported load, rather than the grants held at
//! the moment, gives the owner's work alone: right after a burst of
//! compiles ends, the reported average still counts them for up to 15 s.
//!
//! Fixed memory per servant: the grant-seconds of each whole second of the
//! window (relative to when the servant was first seen), the second being
//! filled, and the count since the last change.

use std::time::Duration;

use tokio::time::Instant;

/// The stock daemon's load-average window.
pub(crate) const OWN_LOAD_WINDOW: Duration = Duration::from_secs(15);
const WINDOW_SECONDS: usize = OWN_LOAD_WINDOW.as_secs() as usize;

#[derive(Debug, Clone)]
pub(crate) struct OwnLoad {
    origin: Instant,
    /// Grant-seconds of the whole seconds before `second`, newest last, at
    /// most [`WINDOW_SECONDS`] of them.
    seconds: [f64; WINDOW_SECONDS],
    /// How many of `seconds` are filled (fewer right after the start).
    filled: usize,
    /// The second being filled (since `origin`) and its grant-seconds so far.
    second: u64,
    partial: f64,
    /// Grants held since `since`.
    count: u32,
    since: Instant,
}

impl OwnLoad {
    pub(crate) fn new(now: Instant) -> OwnLoad {
        OwnLoad {
            origin: now,
            seconds: [0.0; WINDOW_SECONDS],
            filled: 0,
            second: 0,
            partial: 0.0,
            count: 0,
            since: now,
        }
    }

    /// The grants held changed to `count` at `now`.
    pub(crate) fn set(&mut self, count: u32, now: Instant) {
        self.catch_up(now);
        self.count = count;
    }

    /// Accounts the grants held from `since` to `now`.
    fn catch_up(&mut self, now: Instant) {
        let now = now.max(self.since);
        let target = now.duration_since(self.origin).as_secs();
        // More than a window of whole seconds at one count: the window holds
        // that count alone.
        if target > self.second + WINDOW_SECONDS as u64 + 1 {
            self.seconds = [f64::from(self.count); WINDOW_SECONDS];
            self.filled = WINDOW_SECONDS;
            self.second = target;
            let second_start = self.origin + Duration::from_secs(target);
            self.partial = f64::from(self.count) * now.duration_since(second_start).as_secs_f64();
            self.since = now;
            return;
        }
        let mut at = self.since;
        while self.second < target {
            let second_end = self.origin + Duration::from_secs(self.second + 1);
            self.partial += f64::from(self.count) * second_end.duration_since(at).as_secs_f64();
            self.seconds.rotate_left(1);
            self.seconds[WINDOW_SECONDS - 1] = std::mem::take(&mut self.partial);
            self.filled = (self.filled + 1).min(WINDOW_SECONDS);
            self.second += 1;
            at = second_end;
        }
        self.partial += f64::from(self.count) * now.duration_since(at).as_secs_f64();
        self.since = now;
    }

    /// The average grants held over the window ending at `now` (or since
    /// the servant was first seen, if that is shorter).
    pub(crate) fn average(&mut self, now: Instant) -> f64 {
        self.catch_up(now);
        let whole = &self.seconds[WINDOW_SECONDS - self.filled..];
        let second_start = self.origin + Duration::from_secs(self.second);
        let part = self.since.duration_since(second_start).as_secs_f64();
        let covered = whole.len() as f64 + part;
        if covered <= 0.0 {
            return f64::from(self.count);
        }
        (whole.iter().sum::<f64>() + self.partial) / covered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn close(value: f64, expected: f64) -> bool {
        (value - expected).abs() < 0.05
    }

    #[tokio::test(start_paused = true)]
    async fn the_average_follows_the_grants_over_the_window() {
        let mut own = OwnLoad::new(Instant::now());
        own.set(8, Instant::now());
        advance(Duration::from_secs(20)).await;
        assert!(close(own.average(Instant::now()), 8.0));
        // All freed: the average decays over the next 15 s, as the daemon's does.
        own.set(0, Instant::now());
        advance(Duration::from_millis(7500)).await;
        let half = own.average(Instant::now());
        assert!((3.5..4.5).contains(&half), "{half}");
        advance(Duration::from_secs(8)).await;
        assert!(close(own.average(Instant::now()), 0.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_servant_averages_over_the_time_it_was_seen() {
        let mut own = OwnLoad::new(Instant::now());
        advance(Duration::from_secs(2)).await;
        own.set(4, Instant::now());
        advance(Duration::from_secs(2)).await;
        // Two seconds at 0, two at 4.
        assert!(close(own.average(Instant::now()), 2.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_quiet_time_leaves_the_count_alone_in_the_window() {
        let mut own = OwnLoad::new(Instant::now());
        own.set(3, Instant::now());
        advance(Duration::from_secs(3600)).await;
        assert!(close(own.average(Instant::now()), 3.0));
        own.set(1, Instant::now());
        advance(Duration::from_secs(15)).await;
        assert!(close(own.average(Instant::now()), 1.0));
    }
}
