//! `farm` (benchmark P7): the farm's outcome. A model of a compile farm
//! (servants with processors and their owners' work, developers starting
//! builds; docs/farm.md) runs against the scheduler in real time, and the
//! same builds run under an ideal placement computed here; one JSON line
//! gives the build times of both.
//!
//! - `scenario`: the machines and builds, drawn from the seed.
//! - `machine`: one servant: processor sharing, the stock daemon's 15 s load average.
//! - `model`: the farm running, its measures, and the ideal placement.
//! - `live`: the stock daemons' calls against a scheduler.
//! - `link`: how those calls reach it: a socket, or with `--in-process`
//!   this scheduler's service in the same process, in virtual time.

mod link;
mod live;
mod machine;
mod model;
mod scenario;

use std::{net::SocketAddr, time::Duration};

use clap::{Args, ValueEnum};
use serde_json::json;
use tokio::time::Instant;
use yadcc_sim::Wire;

use crate::{
    Cli,
    report::{emit, round3},
};
use model::{Farm, Outcome, quantile};
use scenario::{Mix, Scenario, Shape, Speeds};

#[derive(Debug, Args)]
pub(crate) struct FarmArgs {
    /// Servants of the farm (a third of them user machines).
    #[arg(long, default_value_t = 200)]
    servants: usize,
    /// Developers starting builds.
    #[arg(long, default_value_t = 100)]
    developers: usize,
    /// Seconds during which builds start (real seconds: the scheduler runs
    /// in real time); the run then lasts until they end, at most --drain
    /// seconds more.
    #[arg(long, default_value_t = 600)]
    duration: u64,
    /// Seed of every draw: the same seed, the same farm and builds.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The owners' work on the user machines: bursty or steady.
    #[arg(long, value_enum, default_value_t = Mix::Bursty)]
    mix: Mix,
    /// The servants' processor speeds: all the same, or mixed (0.5 to 1.5
    /// times the reference core's, as in a farm of several hardware
    /// generations).
    #[arg(long, value_enum, default_value_t = Speeds::Same)]
    speeds: Speeds,
    /// Mean seconds between two build starts of one developer (exponential).
    #[arg(long, default_value_t = 90.0)]
    build_gap: f64,
    /// Longest the run goes on after --duration for builds to end; a build
    /// unfinished then counts its time so far.
    #[arg(long, default_value_t = 300)]
    drain: u64,
    /// Seconds the servants heartbeat before the first build.
    #[arg(long, default_value_t = 3)]
    warmup: u64,
    /// Only the ideal placement: no scheduler is called.
    #[arg(long)]
    ideal_only: bool,
    /// No sockets: this scheduler's service and engine run in this process
    /// under tokio's paused clock (virtual time: no lag, a run of minutes in
    /// seconds, the same figures on any machine); --scheduler is not used.
    #[arg(long)]
    in_process: bool,
    /// With --in-process: the engine's --foreign_load_from_own_average.
    #[arg(long, requires = "in_process")]
    foreign_load_from_own_average: bool,
    /// With --in-process: the engine's --place_by_observed_speed.
    #[arg(long, requires = "in_process")]
    place_by_observed_speed: bool,
}

/// Longest --duration plus --drain (a day).
const MOST_SECONDS: u64 = 86_400;

fn outcome_json(prefix: &str, outcome: &Outcome) -> serde_json::Map<String, serde_json::Value> {
    let mut fields = serde_json::Map::new();
    let mut put = |name: &str, value: serde_json::Value| {
        fields.insert(format!("{prefix}{name}"), value);
    };
    put(
        "build_p50_s",
        json!(round3(quantile(&outcome.build_seconds, 0.5))),
    );
    put(
        "build_p95_s",
        json!(round3(quantile(&outcome.build_seconds, 0.95))),
    );
    put(
        "compile_wait_p95_s",
        json!(round3(quantile(&outcome.compile_waits, 0.95))),
    );
    put("utilisation", json!(round3(outcome.utilisation)));
    put(
        "idle_while_waiting_slot_s",
        json!(round3(outcome.idle_while_waiting_slot_s)),
    );
    put("unfinished", json!(outcome.unfinished));
    fields
}

pub(crate) async fn run(
    cli: &Cli,
    args: &FarmArgs,
    target: SocketAddr,
    protocol: Wire,
) -> Result<u64, String> {
    if args.servants == 0 || args.developers == 0 {
        return Err("farm: --servants and --developers must be at least 1".into());
    }
    if args.servants > 64_000 || args.developers > 64_000 {
        return Err("farm: at most 64,000 servants and 64,000 developers".into());
    }
    if args.duration == 0 || args.duration + args.drain > MOST_SECONDS {
        return Err(format!(
            "farm: --duration must be at least 1 and --duration + --drain at most {MOST_SECONDS}"
        ));
    }
    if !(args.build_gap.is_finite() && args.build_gap >= 1.0) {
        return Err("farm: --build-gap must be at least 1 second".into());
    }
    let shape = Shape {
        servants: args.servants,
        developers: args.developers,
        duration: Duration::from_secs(args.duration),
        seed: args.seed,
        mix: args.mix,
        build_gap: Duration::from_secs_f64(args.build_gap),
        speeds: args.speeds,
    };
    let limit = Duration::from_secs(args.duration + args.drain);
    let scenario = Scenario::draw(&shape, limit);
    let planned = scenario.builds.len();
    let ideal = model::ideal(scenario.clone(), limit);
    let mut line = serde_json::Map::new();
    line.insert("bench".into(), json!("farm"));
    line.insert("mix".into(), json!(spelling(args.mix)));
    line.insert("speeds".into(), json!(spelling(args.speeds)));
    line.insert("seed".into(), json!(args.seed));
    line.insert("servants".into(), json!(args.servants));
    line.insert("developers".into(), json!(args.developers));
    line.insert("duration_s".into(), json!(args.duration));
    line.insert("builds".into(), json!(planned));
    line.insert("compile_cpu_s".into(), json!(round3(scenario.work())));
    let mut failures = 0;
    if !args.ideal_only {
        let warmup = Duration::from_secs(args.warmup);
        let live::Run {
            outcome,
            stats,
            tick_lags_ms,
        } = if args.in_process {
            line.insert("in_process".into(), json!(true));
            let (user, servant) = (cli.user_token.clone(), cli.servant_token.clone());
            let rules = Rules {
                own_load: args.foreign_load_from_own_average,
                observed_speed: args.place_by_observed_speed,
            };
            tokio::task::spawn_blocking(move || {
                in_process::run(&user, &servant, rules, scenario, warmup, limit)
            })
            .await
            .map_err(|error| format!("farm --in-process: {error}"))??
        } else {
            let target = live::Target {
                address: target,
                protocol,
                user_token: cli.user_token.clone(),
                servant_token: cli.servant_token.clone(),
            };
            let links = live::Links::sockets(&target, args.servants, args.developers);
            let farm = Farm::new(scenario, Instant::now() + warmup);
            live::run(links, farm, limit).await?
        };
        line.extend(outcome_json("", &outcome));
        line.insert("builds".into(), json!(outcome.builds));
        line.insert("killed".into(), json!(outcome.killed));
        line.insert("elapsed_s".into(), json!(round3(outcome.elapsed_s)));
        line.insert(
            "tick_lag_p99_ms".into(),
            json!(round3(quantile(&tick_lags_ms, 0.99))),
        );
        line.insert(
            "tick_lag_max_ms".into(),
            json!(round3(quantile(&tick_lags_ms, 1.0))),
        );
        failures = stats.total_errors();
        line.insert("errors".into(), json!(failures));
        eprintln!(
            "farm: {} builds, p50 {:.1} s, p95 {:.1} s (ideal p95 {:.1} s), utilisation {:.3}, {} errors",
            outcome.builds,
            quantile(&outcome.build_seconds, 0.5),
            quantile(&outcome.build_seconds, 0.95),
            quantile(&ideal.build_seconds, 0.95),
            outcome.utilisation,
            failures,
        );
    }
    line.extend(outcome_json("ideal_", &ideal));
    emit(cli, serde_json::Value::Object(line));
    Ok(failures)
}

/// How `value` is written on the command line, so the JSON line names the
/// farm as the flag that asked for it.
fn spelling(value: impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|possible| possible.get_name().to_owned())
        .unwrap_or_default()
}

/// The engine's placement rules an in-process run turns on.
#[derive(Debug, Clone, Copy)]
struct Rules {
    own_load: bool,
    observed_speed: bool,
}

/// The farm against this scheduler's engine in virtual time (`--in-process`).
mod in_process {
    use std::time::Duration;

    use tokio::time::Instant;
    use yadcc_engine::{self as engine, Scheduler, TokenSet};
    use yadcc_scheduler::service::SchedulerService;

    use super::{Rules, live, model::Farm, scenario::Scenario};

    /// Runs on a runtime of its own, one thread, its clock paused: time
    /// moves only when every task waits, straight to the next timer.
    pub(super) fn run(
        user_token: &str,
        servant_token: &str,
        rules: Rules,
        scenario: Scenario,
        warmup: Duration,
        limit: Duration,
    ) -> Result<live::Run, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .map_err(|error| format!("farm --in-process: no runtime: {error}"))?;
        runtime.block_on(async {
            let engine = Scheduler::new(engine::Config {
                user_tokens: TokenSet::new([user_token]),
                servant_tokens: TokenSet::new([servant_token]),
                foreign_load_from_own_average: rules.own_load,
                place_by_observed_speed: rules.observed_speed,
                ..engine::Config::default()
            });
            let service = SchedulerService::new(engine);
            let links = live::Links::in_process(
                &service,
                user_token,
                servant_token,
                scenario.servants.len(),
                scenario.developers,
            );
            let farm = Farm::new(scenario, Instant::now() + warmup);
            live::run(links, farm, limit).await
        })
    }
}
