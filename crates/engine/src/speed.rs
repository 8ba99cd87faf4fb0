//! Rule "observed speed": how fast a servant turns a grant around, learnt
//! from the grants its requesters give back. A compile's CPU time varies
//! by a factor of ten from file to file but not with the servant it lands
//! on, so over enough grants the servants' typical times differ by their
//! speed (and their load): the mean of the logarithm of the time held is
//! `mean(ln work) - ln speed`, robust against the long tail of big files.
//!
//! Only immediate grants freed by their owner while live count: a prefetch
//! grant may wait in the daemon for a compile, an adopted one started
//! before it was seen, a zombie's time is its lease's. Old samples fade
//! (half-life [`HALF_LIFE`]); a servant with too little recent evidence
//! is unknown and placed as the fastest (class 0), so a new servant, or
//! one whose speed may have changed since it was last used, is tried
//! rather than left out for good.
//!
//! Fixed memory per servant: a weighted sum and its weight.

use std::time::Duration;

use tokio::time::Instant;

/// Evidence loses half its weight in this long.
pub(crate) const HALF_LIFE: Duration = Duration::from_secs(60);
/// A servant is known once this much weight of samples (after fading) is
/// left: about 8 grants' worth. With compiles spread as a lognormal of
/// sigma 0.75 (the farm model's), the log-mean of 8 is off by 0.27 (30 %)
/// at one standard deviation: a servant of another hardware generation
/// already stands out, and the fading keeps measuring it.
const MIN_WEIGHT: f64 = 8.0;
/// Width of a class in `ln` milliseconds: grants a quarter longer on
/// average fall one class later. Coarse enough that servants of one speed
/// mostly share a class (and are then ordered by utilisation), fine enough
/// that a generation of hardware apart is a class or more.
const CLASS_WIDTH: f64 = 0.223_143_551_314_209_76; // ln(1.25)
/// Classes 1..=MAX_CLASS order known servants; 0 is the unknown.
pub(crate) const MAX_CLASS: u8 = 63;

/// What one servant's freed grants tell of its speed.
#[derive(Debug, Clone)]
pub(crate) struct ObservedSpeed {
    /// Faded count of samples, and faded sum of their `ln` milliseconds.
    weight: f64,
    sum_ln_ms: f64,
    /// When the two were last faded.
    at: Instant,
}

impl ObservedSpeed {
    pub(crate) fn new(now: Instant) -> ObservedSpeed {
        ObservedSpeed {
            weight: 0.0,
            sum_ln_ms: 0.0,
            at: now,
        }
    }

    /// What is left at `now` of one unit of evidence kept at `self.at`.
    fn fading(&self, now: Instant) -> f64 {
        let halvings =
            now.saturating_duration_since(self.at).as_secs_f64() / HALF_LIFE.as_secs_f64();
        (-halvings).exp2()
    }

    /// Fades the evidence to `now` (never backwards).
    fn fade(&mut self, now: Instant) {
        if now <= self.at {
            return;
        }
        let factor = self.fading(now);
        self.weight *= factor;
        self.sum_ln_ms *= factor;
        self.at = now;
    }

    /// A grant held for `held`, given back at `now`.
    pub(crate) fn record(&mut self, held: Duration, now: Instant) {
        self.fade(now);
        // Below a millisecond is a call that did no work: as a millisecond.
        let ms = (held.as_secs_f64() * 1000.0).max(1.0);
        self.weight += 1.0;
        self.sum_ln_ms += ms.ln();
    }

    /// The mean `ln` milliseconds at `now`, if enough evidence is left.
    /// Fading scales the sum and the weight alike, so only the weight's
    /// fading matters here.
    fn mean_ln_ms(&self, now: Instant) -> Option<f64> {
        (self.weight * self.fading(now) >= MIN_WEIGHT).then(|| self.sum_ln_ms / self.weight)
    }

    /// The servant's class at `now`: 0 while unknown, else 1 for the
    /// quickest turnarounds up to [`MAX_CLASS`] for the slowest.
    pub(crate) fn class(&mut self, now: Instant) -> u8 {
        self.fade(now);
        let Some(mean) = self.mean_ln_ms(now) else {
            return 0;
        };
        let class = 1.0 + (mean / CLASS_WIDTH).floor();
        class.clamp(1.0, f64::from(MAX_CLASS)) as u8
    }

    /// The typical time its immediate grants were held (the geometric mean
    /// of the recent ones), if it is known: what the class is made of, for
    /// people.
    pub(crate) fn typical(&self, now: Instant) -> Option<Duration> {
        let ms = self.mean_ln_ms(now)?.exp();
        Some(Duration::from_secs_f64((ms / 1000.0).min(86_400.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn record_many(speed: &mut ObservedSpeed, held_ms: &[u64]) {
        for &ms in held_ms {
            speed.record(Duration::from_millis(ms), Instant::now());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_until_enough_grants_came_back() {
        let mut speed = ObservedSpeed::new(Instant::now());
        assert_eq!(speed.class(Instant::now()), 0);
        record_many(&mut speed, &[2000; 7]);
        assert_eq!(speed.class(Instant::now()), 0, "7 grants are not enough");
        record_many(&mut speed, &[2000]);
        assert_ne!(speed.class(Instant::now()), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_servant_twice_as_fast_is_three_classes_ahead() {
        let now = Instant::now();
        let (mut fast, mut slow) = (ObservedSpeed::new(now), ObservedSpeed::new(now));
        // The same spread of compiles, one servant taking half the time.
        let work = [300, 900, 1500, 2000, 2500, 4000, 8000, 20_000, 1200, 700];
        record_many(&mut slow, &work);
        record_many(&mut fast, &work.map(|ms| ms / 2));
        let (f, s) = (fast.class(now), slow.class(now));
        // ln 2 / ln 1.25 = 3.1 classes.
        assert!((3..=4).contains(&(s - f)), "fast {f}, slow {s}");
        assert!(f >= 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_typical_time_is_the_geometric_mean() {
        let mut speed = ObservedSpeed::new(Instant::now());
        record_many(&mut speed, &[500, 2000, 500, 2000, 500, 2000, 500, 2000]);
        let typical = speed.typical(Instant::now()).expect("known").as_secs_f64();
        assert!((typical - 1.0).abs() < 1e-9, "{typical}");
        assert_eq!(
            ObservedSpeed::new(Instant::now()).typical(Instant::now()),
            None
        );
    }

    #[tokio::test(start_paused = true)]
    async fn evidence_fades_until_the_servant_is_tried_again() {
        let mut speed = ObservedSpeed::new(Instant::now());
        record_many(&mut speed, &[5000; 32]);
        assert_ne!(speed.class(Instant::now()), 0);
        // 32 halved twice is 8: still known; a third time, unknown.
        advance(HALF_LIFE * 2 - Duration::from_secs(1)).await;
        assert_ne!(speed.class(Instant::now()), 0);
        advance(HALF_LIFE).await;
        assert_eq!(speed.class(Instant::now()), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn extreme_times_stay_within_the_classes() {
        let mut speed = ObservedSpeed::new(Instant::now());
        record_many(&mut speed, &[0; 8]);
        assert_eq!(speed.class(Instant::now()), 1);
        let mut speed = ObservedSpeed::new(Instant::now());
        record_many(&mut speed, &[u64::MAX / 4; 8]);
        assert_eq!(speed.class(Instant::now()), MAX_CLASS);
    }
}
