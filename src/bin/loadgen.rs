//! `yadcc-loadgen`: drives a scheduler with simulated daemons over real
//! sockets, speaking `flare://` (the daemons' default), `http+pb` or JSON,
//! and reports per RPC throughput, latency percentiles and errors.
//!
//! - `heartbeat-rate` (benchmark P1): Heartbeat as fast as possible over N
//!   connections, over flare, http+pb and JSON, against the bare route (the
//!   scheduler must be built with `--features bench-route` and run with
//!   `--bench_bare_route` for `bare`).
//! - `grant-cycles` (benchmark P3): servants heartbeating every second and
//!   delegates acquiring, renewing and freeing grants at a chosen rate.
//! - `daemon-mix` (benchmark P5): the real daemon mix, every machine servant
//!   and delegate, `GetRunningTasks` every second.
//!
//! The modes' earlier names (`hammer`, `cluster`, `mix`) still work.
//!
//! A person reads the report on stderr; each run also prints one JSON object
//! per line on stdout for scripts (`scripts/bench.sh` plots them).

use std::{
    collections::BTreeMap,
    net::{SocketAddr, ToSocketAddrs},
    process::ExitCode,
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use clap::{Args, Parser, Subcommand};

// Thousands of simulated daemons allocate and free small buffers and
// messages all the time; glibc's malloc cost the load generator about 40 %
// of its CPU (BENCHMARKS.md, P5).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use serde_json::{Value, json};
use yadcc_scheduler::sim::{
    self, Cluster, ClusterConfig, Protocol, Workload,
    heartbeat_rate::{self, HeartbeatRateConfig, Target},
    process::{self, ProcessSample},
    stats::{Report, Row, millis, quantile_of},
};

/// Load generator for the yadcc scheduler: simulated daemons (servant and
/// delegate in one) speaking flare (default), http+pb or JSON, each machine
/// from its own 127.x.y.z address with at most two connections.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// Scheduler: HOST:PORT, flare://HOST:PORT, http+pb://HOST:PORT or
    /// http://HOST:PORT (the scheme picks the protocol unless --protocol is given).
    #[arg(long, global = true, default_value = "127.0.0.1:8336")]
    scheduler: String,

    /// Wire protocol of the simulated daemons: flare, http+pb or json.
    #[arg(long, global = true)]
    protocol: Option<Protocol>,

    /// User token (what delegates present). Default: the demo's.
    #[arg(long, global = true, default_value = sim::DEMO_USER_TOKEN)]
    user_token: String,

    /// Servant token (what servants present). Default: the demo's.
    #[arg(long, global = true, default_value = sim::DEMO_SERVANT_TOKEN)]
    servant_token: String,

    /// PID of the scheduler (same host): report its CPU use and peak RSS (VmHWM).
    #[arg(long, global = true)]
    scheduler_pid: Option<u32>,

    /// Exit with status 1 if any call failed (or, for `grant-cycles` and `daemon-mix`,
    /// any task was killed or refused a renewal).
    #[arg(long, global = true)]
    fail_on_errors: bool,

    /// Threads running the simulated daemons (1: one thread, no hand-over
    /// between threads).
    #[arg(long, global = true, default_value_t = 2)]
    threads: usize,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Servants plus delegates at a steady grant rate (benchmark P3).
    #[command(alias = "cluster")]
    GrantCycles(ClusterArgs),
    /// The real daemon mix: every machine servant and delegate (benchmark P5).
    #[command(alias = "mix")]
    DaemonMix(MixArgs),
    /// Heartbeat as fast as possible per protocol (benchmark P1).
    #[command(alias = "hammer")]
    HeartbeatRate(HeartbeatRateArgs),
}

/// What `grant-cycles` and `daemon-mix` share.
#[derive(Debug, Args)]
struct RunArgs {
    /// Measured seconds.
    #[arg(long, default_value_t = 30)]
    duration: u64,

    /// Seconds run before measuring (after every servant registered).
    #[arg(long, default_value_t = 5)]
    warmup: u64,

    /// Shortest compilation, in milliseconds (at least a renewal interval, so
    /// every cycle renews).
    #[arg(long, default_value_t = 1200)]
    task_min_ms: u64,

    /// Longest compilation, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    task_max_ms: u64,

    /// `prefetch_reqs` of each WaitForStartingTask.
    #[arg(long, default_value_t = 1)]
    prefetch: u32,

    /// Distinct compilers in the cluster.
    #[arg(long, default_value_t = 8)]
    environments: usize,

    /// Seconds between progress lines (0: none).
    #[arg(long, default_value_t = 10)]
    progress_every: u64,

    /// Seed for the machines' shapes.
    #[arg(long)]
    seed: Option<u64>,
}

#[derive(Debug, Args)]
struct ClusterArgs {
    /// Simulated servants (machines 0..N), each heartbeating once a second.
    #[arg(long, default_value_t = 100)]
    servants: usize,

    /// Machines that also compile (machines 0..N; delegate role).
    #[arg(long, default_value_t = 10)]
    delegates: usize,

    /// Grant cycles (acquire, renew, free) started per second, over all delegates.
    #[arg(long, default_value_t = 100.0)]
    cycles_per_second: f64,

    /// Between a delegate's GetRunningTasks calls, in milliseconds (0: never).
    #[arg(long, default_value_t = 1000)]
    running_tasks_interval_ms: u64,

    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Args)]
struct MixArgs {
    /// Machines, each servant and delegate, calling Heartbeat and
    /// GetRunningTasks every second and GetConfig every 10 s.
    #[arg(long, default_value_t = 100)]
    machines: usize,

    /// Compilations each machine starts per second (Poisson).
    #[arg(long, default_value_t = 0.2)]
    jobs_per_machine: f64,

    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Args)]
struct HeartbeatRateArgs {
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

    /// Comma-separated: flare, http+pb, json, bare (needs a scheduler built
    /// with `--features bench-route`, run with --bench_bare_route).
    #[arg(long, default_value = "flare,http+pb,json,bare", value_delimiter = ',')]
    targets: Vec<String>,

    /// Environments in each heartbeat.
    #[arg(long, default_value_t = 5)]
    environments: usize,

    /// Running tasks in each heartbeat (each under a real grant).
    #[arg(long, default_value_t = 16)]
    tasks: usize,
}

/// The scheduler's address, and the protocol its URI names, if any.
fn resolve(text: &str) -> Result<(SocketAddr, Option<Protocol>), String> {
    let text = text.trim();
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, text),
    };
    let protocol = match scheme {
        None => None,
        Some("flare") => Some(Protocol::Flare),
        Some("http+pb" | "http") => Some(Protocol::HttpPb),
        Some(other) => return Err(format!("--scheduler: unknown scheme {other:?}")),
    };
    let address = rest
        .trim_end_matches('/')
        .to_socket_addrs()
        .map_err(|error| format!("--scheduler {text:?}: {error}"))?
        .next()
        .ok_or_else(|| format!("--scheduler {text:?} resolves to nothing"))?;
    Ok((address, protocol))
}

/// CPU-seconds per second between two samples, and the later sample's memory.
fn cpu_json(before: Option<ProcessSample>, after: Option<ProcessSample>, wall: Duration) -> Value {
    let (Some(before), Some(after)) = (before, after) else {
        return Value::Null;
    };
    let used = after.cpu.saturating_sub(before.cpu);
    json!({
        "cpu_seconds_per_second": round3(used.as_secs_f64() / wall.as_secs_f64().max(1e-9)),
        "rss_mib": round3(after.rss_kib as f64 / 1024.0),
        "peak_rss_mib": round3(after.peak_rss_kib as f64 / 1024.0),
    })
}

fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

fn ms(duration: Duration) -> f64 {
    round3(duration.as_secs_f64() * 1e3)
}

fn row_json(row: &Row) -> Value {
    json!({
        "ok": row.ok,
        "per_second": round3(row.per_second),
        "p50_ms": ms(row.p50),
        "p99_ms": ms(row.p99),
        "p999_ms": ms(row.p999),
        "max_ms": ms(row.max),
        "no_quota": row.no_quota,
        "errors": row.error_count(),
        "error_kinds": row.errors,
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = if cli.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cli.threads)
            .enable_all()
            .build()
    };
    match runtime {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(error) => {
            eprintln!("yadcc-loadgen: cannot start the runtime: {error}");
            ExitCode::from(2)
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    let (target, named) = match resolve(&cli.scheduler) {
        Ok(resolved) => resolved,
        Err(message) => {
            eprintln!("yadcc-loadgen: {message}");
            return ExitCode::from(2);
        }
    };
    let protocol = cli.protocol.or(named).unwrap_or_default();
    let outcome = match &cli.command {
        Command::GrantCycles(args) => run_grant_cycles(&cli, args, target, protocol).await,
        Command::DaemonMix(args) => run_daemon_mix(&cli, args, target, protocol).await,
        Command::HeartbeatRate(args) => run_heartbeat_rate(&cli, args, target, protocol).await,
    };
    match outcome {
        Ok(failures) if failures > 0 && cli.fail_on_errors => {
            eprintln!("yadcc-loadgen: {failures} errors");
            ExitCode::FAILURE
        }
        Ok(_) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("yadcc-loadgen: {message}");
            ExitCode::from(2)
        }
    }
}

/// Applies the options `grant-cycles` and `daemon-mix` share.
fn apply(config: &mut ClusterConfig, run: &RunArgs, protocol: Protocol) {
    config.protocol = protocol;
    config.environments = run.environments;
    config.seed = run.seed;
    config.delegate.prefetch = run.prefetch;
    config.delegate.task_duration = Duration::from_millis(run.task_min_ms)
        ..=Duration::from_millis(run.task_max_ms.max(run.task_min_ms));
}

/// Runs `grant-cycles`; returns the number of failures.
async fn run_grant_cycles(
    cli: &Cli,
    args: &ClusterArgs,
    target: SocketAddr,
    protocol: Protocol,
) -> Result<u64, String> {
    if args.delegates == 0 && args.cycles_per_second > 0.0 {
        return Err("--cycles-per-second needs at least one delegate".to_owned());
    }
    let per_delegate = args.cycles_per_second / args.delegates.max(1) as f64;
    let mut config = ClusterConfig::new(
        target,
        &cli.user_token,
        &cli.servant_token,
        args.servants,
        args.delegates,
        Workload::Rate {
            jobs_per_second: per_delegate,
        },
    );
    apply(&mut config, &args.run, protocol);
    config.delegate.running_tasks_interval = (args.running_tasks_interval_ms > 0)
        .then(|| Duration::from_millis(args.running_tasks_interval_ms));
    eprintln!(
        "grant-cycles: {} servants, {} of them also delegates, {:.0} grant cycles/s ({:.2}/s per delegate), tasks {}..{} ms, over {protocol}, against {target}",
        args.servants,
        args.delegates,
        args.cycles_per_second,
        per_delegate,
        args.run.task_min_ms,
        args.run.task_max_ms,
    );
    let header = json!({
        "bench": "grant-cycles",
        "servants": args.servants,
        "delegates": args.delegates,
        "cycles_per_second": args.cycles_per_second,
        "running_tasks_interval_ms": args.running_tasks_interval_ms,
    });
    measure(cli, &args.run, config, header).await
}

/// Runs `daemon-mix`; returns the number of failures.
async fn run_daemon_mix(
    cli: &Cli,
    args: &MixArgs,
    target: SocketAddr,
    protocol: Protocol,
) -> Result<u64, String> {
    let mut config = ClusterConfig::new(
        target,
        &cli.user_token,
        &cli.servant_token,
        args.machines,
        args.machines,
        Workload::Rate {
            jobs_per_second: args.jobs_per_machine,
        },
    );
    apply(&mut config, &args.run, protocol);
    config.delegate.running_tasks_interval = Some(Duration::from_secs(1));
    eprintln!(
        "daemon-mix: {} machines, each servant and delegate, {:.2} compilations/s each ({:.0} in all), over {protocol}, against {target}",
        args.machines,
        args.jobs_per_machine,
        args.jobs_per_machine * args.machines as f64,
    );
    let header = json!({
        "bench": "daemon-mix",
        "machines": args.machines,
        "jobs_per_machine": args.jobs_per_machine,
    });
    measure(cli, &args.run, config, header).await
}

/// Starts the cluster, warms up, measures, prints the report (stderr) and
/// one JSON line (stdout), stops. Returns the number of failures.
async fn measure(
    cli: &Cli,
    run: &RunArgs,
    config: ClusterConfig,
    mut result: Value,
) -> Result<u64, String> {
    let protocol = config.protocol;
    let cluster = Cluster::start(config);
    eprintln!(
        "{} machines; addressing: {:?}",
        cluster.machines(),
        cluster.addressing()
    );
    let registering = Instant::now();
    if !cluster.wait_ready(Duration::from_secs(30)).await {
        cluster.stop().await;
        return Err("servants did not register within 30 s".to_owned());
    }
    let stats = cluster.stats().clone();
    let registered = stats.events.servants_registered.load(Relaxed);
    eprintln!(
        "{registered} of {} servants registered in {:.2} s; warming up {} s",
        cluster.servants().len(),
        registering.elapsed().as_secs_f64(),
        run.warmup
    );
    tokio::time::sleep(Duration::from_secs(run.warmup)).await;

    stats.reset();
    let scheduler_before = cli.scheduler_pid.and_then(process::sample);
    let own_before = process::sample(std::process::id());
    let started = Instant::now();
    let window = Duration::from_secs(run.duration);
    let every = Duration::from_secs(run.progress_every);
    let mut last = (stats.reading(), Instant::now());
    while started.elapsed() < window {
        let left = window.saturating_sub(started.elapsed());
        let nap = if every.is_zero() {
            left
        } else {
            left.min(every)
        };
        tokio::time::sleep(nap).await;
        if !every.is_zero() && started.elapsed() < window {
            // This slice only, not the whole window so far.
            let now = (stats.reading(), Instant::now());
            let slice: Vec<u64> = now.0.0.iter().zip(&last.0.0).map(|(a, b)| a - b).collect();
            let calls = now.0.1 - last.0.1;
            let seconds = (now.1 - last.1).as_secs_f64();
            eprintln!(
                "  {:>5.1} s: {:>8.0} calls/s, p50 {} ms, p99 {} ms, max <= {} ms; errors so far {}, tasks running {}",
                started.elapsed().as_secs_f64(),
                calls as f64 / seconds.max(1e-9),
                millis(quantile_of(&slice, 0.5).unwrap_or_default()),
                millis(quantile_of(&slice, 0.99).unwrap_or_default()),
                millis(quantile_of(&slice, 1.0).unwrap_or_default()),
                stats.total_errors(),
                cluster.running_tasks()
            );
            last = now;
        }
    }
    let wall = started.elapsed();
    let report: Report = stats.report();
    let scheduler_after = cli.scheduler_pid.and_then(process::sample);
    let own_after = process::sample(std::process::id());
    let connections = cluster.connections();
    eprintln!();
    eprint!("{report}");
    let completed = stats.events.tasks_completed.load(Relaxed);
    eprintln!(
        "grant cycles completed: {completed} ({:.1}/s); tasks running at the end: {}; connections open: {connections}",
        completed as f64 / wall.as_secs_f64(),
        cluster.running_tasks()
    );
    let scheduler = cpu_json(scheduler_before, scheduler_after, wall);
    let loadgen = cpu_json(own_before, own_after, wall);
    eprintln!("scheduler: {scheduler}");
    eprintln!("loadgen: {loadgen}");
    let anomalies = stats.events.anomalies();
    let failures = report.total_errors() + anomalies;
    eprintln!("errors: {} (anomalies: {anomalies})", report.total_errors());

    let rpcs: BTreeMap<&str, Value> = report
        .rows
        .iter()
        .map(|row| (row.name, row_json(row)))
        .collect();
    let events: BTreeMap<&str, u64> = report.events.iter().copied().collect();
    if let Value::Object(fields) = &mut result {
        fields.insert("protocol".into(), json!(protocol.label()));
        fields.insert("machines_simulated".into(), json!(cluster.machines()));
        fields.insert("duration_s".into(), json!(round3(wall.as_secs_f64())));
        fields.insert("all".into(), row_json(&report.total));
        fields.insert("rpcs".into(), json!(rpcs));
        fields.insert("events".into(), json!(events));
        fields.insert("anomalies".into(), json!(anomalies));
        fields.insert(
            "grant_cycles_per_second".into(),
            json!(round3(completed as f64 / wall.as_secs_f64())),
        );
        fields.insert("connections".into(), json!(connections));
        // P5's yardstick: the scheduler's CPU per 1,000 simulated machines.
        let per_thousand = scheduler
            .get("cpu_seconds_per_second")
            .and_then(Value::as_f64)
            .filter(|_| cluster.machines() > 0)
            .map(|cpu| round3(cpu * 1000.0 / cluster.machines() as f64));
        fields.insert(
            "scheduler_cpu_per_1000_machines".into(),
            json!(per_thousand),
        );
        fields.insert("scheduler".into(), scheduler);
        fields.insert("loadgen".into(), loadgen);
    }
    println!("{result}");
    eprintln!("stopping: servants leave, delegates free their grants");
    cluster.stop().await;
    Ok(failures)
}

/// Runs `heartbeat-rate`; returns the number of failed calls.
async fn run_heartbeat_rate(
    cli: &Cli,
    args: &HeartbeatRateArgs,
    target: SocketAddr,
    protocol: Protocol,
) -> Result<u64, String> {
    let targets = args
        .targets
        .iter()
        .map(|name| {
            Target::parse(name)
                .ok_or_else(|| format!("unknown target {name:?}; use flare, http+pb, json or bare"))
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
    let results = heartbeat_rate::run(&config, |line| eprintln!("  {line}")).await?;
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
    let micros = |cpu: Option<Duration>| cpu.map(|cpu| round3(cpu.as_secs_f64() * 1e6));
    let mut failures = 0;
    for result in &results {
        let row = result.row();
        failures += row.error_count();
        let versus = |other: Option<&heartbeat_rate::TargetResult>| {
            other
                .filter(|other| other.ok > 0)
                .map(|other| round3(result.per_second() / other.per_second()))
        };
        // Requests per server CPU-second relative to another target: the
        // ratio a scheduler alone on its machine would see.
        let cpu_versus = |other: Option<&heartbeat_rate::TargetResult>| {
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
            fields.insert(
                "scheduler_cpu_us_per_request".into(),
                json!(micros(result.scheduler_cpu_per_request())),
            );
            fields.insert(
                "loadgen_cpu_us_per_request".into(),
                json!(micros(result.client_cpu_per_request())),
            );
        }
        println!("{line}");
    }
    Ok(failures)
}
