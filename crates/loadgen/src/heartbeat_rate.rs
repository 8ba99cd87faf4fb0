//! `heartbeat-rate` (P1): Heartbeat as fast as possible per protocol.

mod driver;

use std::{net::SocketAddr, time::Duration};

use clap::Args;
use serde_json::{Value, json};
use yadcc_sim::{Wire, stats::millis};

use self::driver::{HeartbeatRateConfig, Target};
use crate::{
    Cli,
    report::{emit, round3, row_json},
};

#[derive(Debug, Args)]
pub(crate) struct HeartbeatRateArgs {
    /// Connections, each one simulated servant.
    #[arg(long, default_value_t = 64)]
    connections: usize,

    /// Requests in flight per connection: written back to back, their
    /// answers read before the next window (1: one at a time).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pipeline: u16,

    /// Measured seconds per target per round (at most 25).
    #[arg(long, default_value_t = 5)]
    duration: u64,

    /// Unmeasured seconds before each measured phase.
    #[arg(long, default_value_t = 1)]
    warmup: u64,

    /// Times the targets are run in turn.
    #[arg(long, default_value_t = 2)]
    rounds: usize,

    /// Comma-separated: flare, http+pb, json, protobuf (binary over plain
    /// HTTP, the JSON target's route and server path), bare (needs a
    /// scheduler built with `--features bench-route`, run with
    /// --bench_bare_route).
    #[arg(
        long,
        default_value = "flare,http+pb,json,protobuf,bare",
        value_delimiter = ','
    )]
    targets: Vec<String>,

    /// Environments in each heartbeat.
    #[arg(long, default_value_t = 5)]
    environments: usize,

    /// Running tasks in each heartbeat (each under a real grant).
    #[arg(long, default_value_t = 16)]
    tasks: usize,
}

/// Runs `heartbeat-rate`; returns the number of failed calls.
pub(crate) async fn run(
    cli: &Cli,
    args: &HeartbeatRateArgs,
    target: SocketAddr,
    protocol: Wire,
) -> Result<u64, String> {
    let targets = args
        .targets
        .iter()
        .map(|name| {
            Target::parse(name).ok_or_else(|| {
                format!("unknown target {name:?}; use flare, http+pb, json, protobuf or bare")
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let config = HeartbeatRateConfig {
        target,
        user_token: cli.user_token.clone(),
        servant_token: cli.servant_token.clone(),
        connections: args.connections,
        pipeline: usize::from(args.pipeline),
        duration: Duration::from_secs(args.duration),
        warmup: Duration::from_secs(args.warmup),
        rounds: args.rounds,
        targets,
        environments: args.environments,
        tasks_per_servant: args.tasks,
        scheduler_pid: cli.scheduler_pid,
        setup_protocol: protocol,
    };
    eprintln!(
        "heartbeat-rate: {} connections, {} request(s) in flight on each, {} round(s) of {} s per target (after {} s warm-up), set up over {protocol}, against {target}",
        args.connections, args.pipeline, args.rounds, args.duration, args.warmup
    );
    let results = driver::run(&config, |line| eprintln!("  {line}")).await?;
    eprintln!();
    eprintln!(
        "{:<18} {:>9} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>7}",
        "target",
        "req bytes",
        "ok",
        "req/s",
        "p50 ms",
        "p99 ms",
        "p999 ms",
        "vs bare",
        "server us",
        "client us",
        "errors"
    );
    let find = |wanted: Target| results.iter().find(|result| result.target == wanted);
    let bare = find(Target::Bare);
    let http_pb = find(Target::HeartbeatHttpPb);
    let protobuf = find(Target::HeartbeatProtobuf);
    let micros = |cpu: Option<Duration>| cpu.map(|cpu| round3(cpu.as_secs_f64() * 1e6));
    let mut failures = 0;
    for result in &results {
        let row = result.row();
        failures += row.error_count();
        let versus = |other: Option<&driver::TargetResult>| {
            other
                .filter(|other| other.ok > 0)
                .map(|other| round3(result.per_second() / other.per_second()))
        };
        // Requests per server CPU-second relative to another target: the
        // ratio a scheduler alone on its machine would see.
        let cpu_versus = |other: Option<&driver::TargetResult>| {
            let mine = result.scheduler_cpu_per_request()?;
            let theirs = other?.scheduler_cpu_per_request()?;
            Some(round3(theirs.as_secs_f64() / mine.as_secs_f64().max(1e-12)))
        };
        eprintln!(
            "{:<18} {:>9} {:>10} {:>10.0} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>7} {:?}",
            row.name,
            result.request_bytes,
            row.ok,
            row.per_second,
            millis(row.p50),
            millis(row.p99),
            millis(row.p999),
            versus(bare).map_or_else(|| "-".to_owned(), |ratio| format!("{ratio:.2}x")),
            micros(result.scheduler_cpu_per_request())
                .map_or_else(|| "-".to_owned(), |us| format!("{us:.1}")),
            micros(result.client_cpu_per_request())
                .map_or_else(|| "-".to_owned(), |us| format!("{us:.1}")),
            row.error_count(),
            row.errors
        );
        let mut line = row_json(&row);
        if let Value::Object(fields) = &mut line {
            fields.insert("bench".into(), json!("heartbeat-rate"));
            fields.insert("target".into(), json!(result.target.name()));
            fields.insert("connections".into(), json!(args.connections));
            fields.insert("pipeline".into(), json!(args.pipeline));
            fields.insert("request_bytes".into(), json!(result.request_bytes));
            fields.insert("vs_bare".into(), json!(versus(bare)));
            fields.insert("vs_http_pb".into(), json!(versus(http_pb)));
            fields.insert("cpu_vs_bare".into(), json!(cpu_versus(bare)));
            fields.insert("cpu_vs_http_pb".into(), json!(cpu_versus(http_pb)));
            fields.insert("cpu_vs_protobuf".into(), json!(cpu_versus(protobuf)));
            fields.insert(
                "vs_protobuf_median_of_rounds".into(),
                json!(protobuf.and_then(|other| result.median_round_ratio(other).map(round3))),
            );
            fields.insert("round_rates".into(), json!(result.round_rates));
            fields.insert(
                "scheduler_cpu_us_per_request".into(),
                json!(micros(result.scheduler_cpu_per_request())),
            );
            fields.insert(
                "loadgen_cpu_us_per_request".into(),
                json!(micros(result.client_cpu_per_request())),
            );
        }
        emit(cli, line);
    }
    if let (Some(json), Some(protobuf)) = (find(Target::HeartbeatJson), protobuf)
        && let Some(ratio) = json.median_round_ratio(protobuf)
    {
        eprintln!(
            "heartbeat-json vs heartbeat-protobuf (same route): {ratio:.2}x by rate \
             (median of {} rounds)",
            json.round_rates.len().min(protobuf.round_rates.len())
        );
    }
    Ok(failures)
}
