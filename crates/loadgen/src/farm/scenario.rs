//! The farm's machines and the developers' builds, all drawn from one seed
//! before the run: the same seed gives the same servants, the same owner's
//! work on them and the same builds (when each starts, its files' CPU time,
//! its `-j`), whichever scheduler places them. docs/farm.md lists every
//! parameter.

use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::SmallRng, seq::IndexedRandom};

/// Which owner's work the user machines carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mix {
    /// A third of the servants are user machines whose owners work in
    /// bursts (1 to all processors, seconds to minutes).
    Bursty,
    /// The same third carry a constant load for the whole run: the reported
    /// 15 s average is then exact for the owner's part.
    Steady,
}

/// How fast the servants' processors are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Speeds {
    /// Every processor runs at the reference core's speed.
    Same,
    /// Each servant's processors run at 0.5 to 1.5 times the reference
    /// core's speed (uniform, mean 1): a farm bought over several hardware
    /// generations.
    Mixed,
}

/// Range of a servant's processor speed with [`Speeds::Mixed`].
const MIXED_SPEEDS: (f64, f64) = (0.5, 1.5);

/// Every third servant is a user machine (the rest dedicated).
const USER_MACHINE_EVERY: usize = 3;
/// Processors of a dedicated servant; its `--max_remote_tasks` is all of them.
const DEDICATED_PROCESSORS: [u32; 3] = [8, 16, 32];
/// Processors of a user machine; it lends half of them (`--max_remote_tasks`).
const USER_PROCESSORS: [u32; 3] = [4, 8, 16];
/// Mean gap between two bursts of an owner's work (exponential).
const BURST_GAP_MEAN_S: f64 = 60.0;
/// A burst lasts from 5 s to 3 minutes (log-uniform).
const BURST_SECONDS: (f64, f64) = (5.0, 180.0);
/// Files per build (log-uniform).
const BUILD_FILES: (f64, f64) = (50.0, 2000.0);
/// `make -jJ` of a build (log-uniform).
const BUILD_PARALLEL: (f64, f64) = (32.0, 512.0);
/// A compile's CPU time: lognormal, median 2 s of one core.
const COMPILE_MEDIAN_S: f64 = 2.0;
const COMPILE_SIGMA: f64 = 0.75;
/// Shortest and longest compile (the lognormal's tails cut).
const COMPILE_BOUNDS_S: (f64, f64) = (0.05, 120.0);

/// A period of the owner's work on a user machine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Burst {
    pub(crate) start: Duration,
    pub(crate) end: Duration,
    pub(crate) processes: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct ServantPlan {
    pub(crate) processors: u32,
    /// Its processors' speed against the reference core that compiles'
    /// CPU times are given in: a compile of 2 s takes 2 / speed s alone.
    pub(crate) speed: f64,
    pub(crate) max_tasks: u32,
    pub(crate) dedicated: bool,
    /// The owner's work, in order, not overlapping.
    pub(crate) bursts: Vec<Burst>,
}

#[derive(Debug, Clone)]
pub(crate) struct BuildPlan {
    pub(crate) developer: usize,
    pub(crate) start: Duration,
    pub(crate) parallel: u32,
    /// CPU-seconds of each file.
    pub(crate) compiles: Vec<f64>,
}

#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) servants: Vec<ServantPlan>,
    pub(crate) developers: usize,
    /// Every build, by start.
    pub(crate) builds: Vec<BuildPlan>,
}

/// What to draw.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) servants: usize,
    pub(crate) developers: usize,
    /// Builds start during this long.
    pub(crate) duration: Duration,
    pub(crate) seed: u64,
    pub(crate) mix: Mix,
    /// Mean gap between two build starts of one developer (exponential).
    pub(crate) build_gap: Duration,
    pub(crate) speeds: Speeds,
}

/// A stream of its own for each machine and developer, so one more servant
/// does not change every other draw.
fn stream(seed: u64, kind: u64, index: usize) -> SmallRng {
    let mixed = seed
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(kind.wrapping_mul(0xbf58_476d_1ce4_e5b9))
        .wrapping_add(index as u64);
    SmallRng::seed_from_u64(mixed)
}

fn log_uniform(rng: &mut SmallRng, (low, high): (f64, f64)) -> f64 {
    (rng.random_range(low.ln()..=high.ln())).exp()
}

fn exponential(rng: &mut SmallRng, mean: f64) -> f64 {
    -(1.0 - rng.random::<f64>()).ln() * mean
}

/// Lognormal with median `median` (Box-Muller for the normal).
fn lognormal(rng: &mut SmallRng, median: f64, sigma: f64) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
    median * (sigma * normal).exp()
}

/// The servant's processor speed, from a stream of its own: the other
/// draws of a seed are the same whatever `--speeds`.
fn speed(shape: &Shape, index: usize) -> f64 {
    match shape.speeds {
        Speeds::Same => 1.0,
        Speeds::Mixed => stream(shape.seed, 3, index).random_range(MIXED_SPEEDS.0..=MIXED_SPEEDS.1),
    }
}

fn servant(shape: &Shape, index: usize, horizon: Duration) -> ServantPlan {
    let mut rng = stream(shape.seed, 1, index);
    let speed = speed(shape, index);
    let user = index % USER_MACHINE_EVERY == USER_MACHINE_EVERY - 1;
    if !user {
        let processors = *DEDICATED_PROCESSORS.choose(&mut rng).unwrap_or(&16);
        return ServantPlan {
            processors,
            speed,
            max_tasks: processors,
            dedicated: true,
            bursts: Vec::new(),
        };
    }
    let processors = *USER_PROCESSORS.choose(&mut rng).unwrap_or(&8);
    let mut bursts = Vec::new();
    match shape.mix {
        Mix::Steady => bursts.push(Burst {
            start: Duration::ZERO,
            end: horizon,
            processes: rng.random_range(0..=processors / 2),
        }),
        Mix::Bursty => {
            let mut at = exponential(&mut rng, BURST_GAP_MEAN_S / 2.0);
            while at < horizon.as_secs_f64() {
                let length = log_uniform(&mut rng, BURST_SECONDS);
                bursts.push(Burst {
                    start: Duration::from_secs_f64(at),
                    end: Duration::from_secs_f64(at + length),
                    processes: rng.random_range(1..=processors),
                });
                at += length + exponential(&mut rng, BURST_GAP_MEAN_S);
            }
        }
    }
    ServantPlan {
        processors,
        speed,
        max_tasks: (processors / 2).max(1),
        dedicated: false,
        bursts,
    }
}

fn builds_of(shape: &Shape, developer: usize) -> Vec<BuildPlan> {
    let mut rng = stream(shape.seed, 2, developer);
    let gap = shape.build_gap.as_secs_f64();
    let mut builds = Vec::new();
    // The first start anywhere in the first gap: developers did not all
    // arrive at once.
    let mut at = rng.random_range(0.0..gap.max(1e-3));
    while at < shape.duration.as_secs_f64() {
        let files = log_uniform(&mut rng, BUILD_FILES).round() as usize;
        let parallel = log_uniform(&mut rng, BUILD_PARALLEL).round() as u32;
        let compiles = (0..files)
            .map(|_| {
                lognormal(&mut rng, COMPILE_MEDIAN_S, COMPILE_SIGMA)
                    .clamp(COMPILE_BOUNDS_S.0, COMPILE_BOUNDS_S.1)
            })
            .collect();
        builds.push(BuildPlan {
            developer,
            start: Duration::from_secs_f64(at),
            parallel,
            compiles,
        });
        at += exponential(&mut rng, gap);
    }
    builds
}

impl Scenario {
    /// The farm for `shape`; the owner's work is drawn until `horizon` (the
    /// whole run, the drain after the last build start included).
    pub(crate) fn draw(shape: &Shape, horizon: Duration) -> Scenario {
        let servants = (0..shape.servants)
            .map(|index| servant(shape, index, horizon))
            .collect();
        let mut builds: Vec<BuildPlan> = (0..shape.developers)
            .flat_map(|developer| builds_of(shape, developer))
            .collect();
        builds.sort_by_key(|build| build.start);
        Scenario {
            servants,
            developers: shape.developers,
            builds,
        }
    }

    /// Runnable processes of the owner on `servant` at `at`, moving
    /// `cursor` (the first burst not yet over) on.
    pub(crate) fn foreign_at(&self, servant: usize, cursor: &mut usize, at: Duration) -> u32 {
        let bursts = &self.servants[servant].bursts;
        while *cursor < bursts.len() && bursts[*cursor].end <= at {
            *cursor += 1;
        }
        match bursts.get(*cursor) {
            Some(burst) if burst.start <= at => burst.processes,
            _ => 0,
        }
    }

    /// Compile CPU-seconds of every build.
    pub(crate) fn work(&self) -> f64 {
        self.builds.iter().flat_map(|build| &build.compiles).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(mix: Mix) -> Shape {
        Shape {
            servants: 30,
            developers: 10,
            duration: Duration::from_secs(600),
            seed: 7,
            mix,
            build_gap: Duration::from_secs(90),
            speeds: Speeds::Same,
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_farm() {
        let horizon = Duration::from_secs(700);
        let one = Scenario::draw(&shape(Mix::Bursty), horizon);
        let two = Scenario::draw(&shape(Mix::Bursty), horizon);
        assert_eq!(one.builds.len(), two.builds.len());
        assert_eq!(one.work(), two.work());
        let other = Scenario::draw(
            &Shape {
                seed: 8,
                ..shape(Mix::Bursty)
            },
            horizon,
        );
        assert_ne!(one.work(), other.work());
    }

    #[test]
    fn a_third_are_user_machines_with_their_owners_work() {
        let horizon = Duration::from_secs(700);
        let farm = Scenario::draw(&shape(Mix::Bursty), horizon);
        let users: Vec<_> = farm.servants.iter().filter(|s| !s.dedicated).collect();
        assert_eq!(users.len(), 10);
        assert!(users.iter().all(|s| !s.bursts.is_empty()));
        for s in &users {
            for pair in s.bursts.windows(2) {
                assert!(pair[0].end <= pair[1].start);
            }
            assert!(
                s.bursts
                    .iter()
                    .all(|b| (1..=s.processors).contains(&b.processes))
            );
        }
        let mut cursor = 0;
        let burst = users[0].bursts[0];
        let index = farm.servants.iter().position(|s| !s.dedicated).unwrap();
        assert_eq!(
            farm.foreign_at(index, &mut cursor, burst.start),
            burst.processes
        );
        assert_eq!(farm.foreign_at(index, &mut cursor, burst.end), 0);
    }

    #[test]
    fn mixed_speeds_change_the_speeds_alone() {
        let horizon = Duration::from_secs(700);
        let same = Scenario::draw(&shape(Mix::Bursty), horizon);
        let mixed = Scenario::draw(
            &Shape {
                speeds: Speeds::Mixed,
                ..shape(Mix::Bursty)
            },
            horizon,
        );
        assert!(same.servants.iter().all(|s| s.speed == 1.0));
        let speeds: Vec<f64> = mixed.servants.iter().map(|s| s.speed).collect();
        assert!(speeds.iter().all(|s| (0.5..=1.5).contains(s)), "{speeds:?}");
        let spread = speeds.iter().copied().fold(f64::NAN, f64::max)
            - speeds.iter().copied().fold(f64::NAN, f64::min);
        assert!(spread > 0.5, "30 servants spread over {spread} only");
        assert_eq!(same.work(), mixed.work());
        for (a, b) in same.servants.iter().zip(&mixed.servants) {
            assert_eq!(
                (a.processors, a.max_tasks, a.bursts.len()),
                (b.processors, b.max_tasks, b.bursts.len())
            );
        }
    }

    #[test]
    fn compiles_have_a_two_second_median() {
        let farm = Scenario::draw(&shape(Mix::Steady), Duration::from_secs(700));
        let mut cpu: Vec<f64> = farm
            .builds
            .iter()
            .flat_map(|b| b.compiles.clone())
            .collect();
        cpu.sort_by(f64::total_cmp);
        let median = cpu[cpu.len() / 2];
        assert!((1.8..2.2).contains(&median), "median {median}");
    }
}
