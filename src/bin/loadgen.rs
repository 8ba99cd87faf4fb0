//! `yadcc-loadgen`: drives a yadcc scheduler with simulated daemons over real
//! sockets and reports, per RPC, throughput, latency percentiles and errors.
//!
//! - `cluster`: servants heartbeating every second and delegates acquiring,
//!   renewing and freeing grants at a chosen rate (benchmark P3).
//! - `hammer`: one call as fast as possible over N connections: Heartbeat in
//!   binary and JSON against the bare route (benchmark P1; the scheduler must
//!   run with `--bench_bare_route` for `bare`).

use std::{
    net::{SocketAddr, ToSocketAddrs},
    process::ExitCode,
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use clap::{Args, Parser, Subcommand, ValueEnum};
use yadcc_scheduler::{
    http::codec::Encoding,
    sim::{
        self, Cluster, ClusterConfig, Workload,
        hammer::{self, HammerConfig, Target},
        process::{self, ProcessSample},
        stats::{millis, quantile_of},
    },
};

/// Load generator for the yadcc scheduler: simulated servants and delegates
/// speaking http+pb (or JSON), each machine from its own 127.x.y.z address.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// Scheduler address: HOST:PORT, http://HOST:PORT or http+pb://HOST:PORT.
    #[arg(long, global = true, default_value = "127.0.0.1:8336")]
    scheduler: String,

    /// User token (what delegates present). Default: the demo's.
    #[arg(long, global = true, default_value = sim::DEMO_USER_TOKEN)]
    user_token: String,

    /// Servant token (what servants present). Default: the demo's.
    #[arg(long, global = true, default_value = sim::DEMO_SERVANT_TOKEN)]
    servant_token: String,

    /// PID of the scheduler (same host): report its CPU use and peak RSS (VmHWM).
    #[arg(long, global = true)]
    scheduler_pid: Option<u32>,

    /// Exit with status 1 if any call failed (or, for `cluster`, any task was
    /// killed or refused a renewal).
    #[arg(long, global = true)]
    fail_on_errors: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A simulated cluster at a steady rate (benchmark P3).
    Cluster(ClusterArgs),
    /// One call as fast as possible over N connections (benchmark P1).
    Hammer(HammerArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum EncodingArg {
    Binary,
    Json,
}

#[derive(Debug, Args)]
struct ClusterArgs {
    /// Simulated servants, each heartbeating once a second on its own connection.
    #[arg(long, default_value_t = 100)]
    servants: usize,

    /// Simulated delegates.
    #[arg(long, default_value_t = 10)]
    delegates: usize,

    /// Grant cycles (acquire, renew, free) started per second, over all delegates.
    #[arg(long, default_value_t = 100.0)]
    cycles_per_second: f64,

    /// Measured seconds.
    #[arg(long, default_value_t = 30)]
    duration: u64,

    /// Seconds run before measuring (after every servant registered).
    #[arg(long, default_value_t = 5)]
    warmup: u64,

    /// Body encoding.
    #[arg(long, value_enum, default_value = "binary")]
    encoding: EncodingArg,

    /// Shortest compilation, in milliseconds (at least a renewal interval, so
    /// every cycle renews).
    #[arg(long, default_value_t = 1200)]
    task_min_ms: u64,

    /// Longest compilation, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    task_max_ms: u64,

    /// Between a delegate's GetRunningTasks calls, in milliseconds (0: never).
    #[arg(long, default_value_t = 1000)]
    running_tasks_interval_ms: u64,

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
struct HammerArgs {
    /// Connections, each one simulated servant with one request in flight.
    #[arg(long, default_value_t = 64)]
    connections: usize,

    /// Measured seconds per target per round (at most 25).
    #[arg(long, default_value_t = 5)]
    duration: u64,

    /// Unmeasured seconds before each measured phase.
    #[arg(long, default_value_t = 1)]
    warmup: u64,

    /// Times the targets are run in turn.
    #[arg(long, default_value_t = 2)]
    rounds: usize,

    /// Comma-separated: bare (needs --bench_bare_route), binary, json.
    #[arg(long, default_value = "bare,binary,json", value_delimiter = ',')]
    targets: Vec<String>,

    /// Environments in each heartbeat.
    #[arg(long, default_value_t = 5)]
    environments: usize,

    /// Running tasks in each heartbeat (each under a real grant).
    #[arg(long, default_value_t = 16)]
    tasks: usize,
}

fn resolve(text: &str) -> Result<SocketAddr, String> {
    let bare = text
        .trim()
        .trim_start_matches("http+pb://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    bare.to_socket_addrs()
        .map_err(|error| format!("--scheduler {text:?}: {error}"))?
        .next()
        .ok_or_else(|| format!("--scheduler {text:?} resolves to nothing"))
}

fn cpu_line(
    name: &str,
    before: Option<ProcessSample>,
    after: Option<ProcessSample>,
    wall: Duration,
) -> Option<String> {
    let (before, after) = (before?, after?);
    let used = after.cpu.saturating_sub(before.cpu);
    Some(format!(
        "{name}: {:.2} CPU-seconds per second over the window; RSS {:.1} MiB, peak RSS (VmHWM) {:.1} MiB",
        used.as_secs_f64() / wall.as_secs_f64().max(1e-9),
        after.rss_kib as f64 / 1024.0,
        after.peak_rss_kib as f64 / 1024.0
    ))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let target = match resolve(&cli.scheduler) {
        Ok(target) => target,
        Err(message) => {
            eprintln!("yadcc-loadgen: {message}");
            return ExitCode::from(2);
        }
    };
    let outcome = match &cli.command {
        Command::Cluster(args) => run_cluster(&cli, args, target).await,
        Command::Hammer(args) => run_hammer(&cli, args, target).await,
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

/// Runs `cluster`; returns the number of failures.
async fn run_cluster(cli: &Cli, args: &ClusterArgs, target: SocketAddr) -> Result<u64, String> {
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
    config.encoding = match args.encoding {
        EncodingArg::Binary => Encoding::Binary,
        EncodingArg::Json => Encoding::Json,
    };
    config.environments = args.environments;
    config.seed = args.seed;
    config.delegate.prefetch = args.prefetch;
    config.delegate.task_duration = Duration::from_millis(args.task_min_ms)
        ..=Duration::from_millis(args.task_max_ms.max(args.task_min_ms));
    config.delegate.running_tasks_interval = (args.running_tasks_interval_ms > 0)
        .then(|| Duration::from_millis(args.running_tasks_interval_ms));
    println!(
        "cluster: {} servants, {} delegates, {:.0} grant cycles/s ({:.2}/s per delegate), tasks {}..{} ms, {} encoding, against {target}",
        args.servants,
        args.delegates,
        args.cycles_per_second,
        per_delegate,
        args.task_min_ms,
        args.task_max_ms,
        config.encoding.label()
    );
    let cluster = Cluster::start(config);
    println!("addressing: {:?}", cluster.addressing());
    let registering = Instant::now();
    if !cluster.wait_ready(Duration::from_secs(30)).await {
        cluster.stop().await;
        return Err("servants did not register within 30 s".to_owned());
    }
    let stats = cluster.stats().clone();
    println!(
        "{} of {} servants registered in {:.2} s; warming up {} s",
        stats.events.servants_registered.load(Relaxed),
        args.servants,
        registering.elapsed().as_secs_f64(),
        args.warmup
    );
    tokio::time::sleep(Duration::from_secs(args.warmup)).await;

    stats.reset();
    let scheduler_before = cli.scheduler_pid.and_then(process::sample);
    let own_before = process::sample(std::process::id());
    let started = Instant::now();
    let window = Duration::from_secs(args.duration);
    let every = Duration::from_secs(args.progress_every);
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
            println!(
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
    let report = stats.report();
    let scheduler_after = cli.scheduler_pid.and_then(process::sample);
    let own_after = process::sample(std::process::id());
    println!();
    print!("{report}");
    let completed = stats.events.tasks_completed.load(Relaxed);
    println!(
        "grant cycles completed: {completed} ({:.1}/s); tasks running at the end: {}",
        completed as f64 / wall.as_secs_f64(),
        cluster.running_tasks()
    );
    if let Some(line) = cpu_line("scheduler", scheduler_before, scheduler_after, wall) {
        println!("{line}");
    }
    if let Some(line) = cpu_line("loadgen", own_before, own_after, wall) {
        println!("{line}");
    }
    let failures = report.total_errors() + stats.events.anomalies();
    println!(
        "errors: {} (anomalies: {})",
        report.total_errors(),
        stats.events.anomalies()
    );
    println!("stopping: servants leave, delegates free their grants");
    cluster.stop().await;
    Ok(failures)
}

/// Runs `hammer`; returns the number of failed calls.
async fn run_hammer(cli: &Cli, args: &HammerArgs, target: SocketAddr) -> Result<u64, String> {
    let targets = args
        .targets
        .iter()
        .map(|name| {
            Target::parse(name)
                .ok_or_else(|| format!("unknown target {name:?}; use bare, binary or json"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let config = HammerConfig {
        target,
        user_token: cli.user_token.clone(),
        servant_token: cli.servant_token.clone(),
        connections: args.connections,
        duration: Duration::from_secs(args.duration),
        warmup: Duration::from_secs(args.warmup),
        rounds: args.rounds,
        targets,
        environments: args.environments,
        tasks_per_servant: args.tasks,
        scheduler_pid: cli.scheduler_pid,
    };
    println!(
        "hammer: {} connections, {} round(s) of {} s per target (after {} s warm-up), against {target}",
        args.connections, args.rounds, args.duration, args.warmup
    );
    let scheduler_before = cli.scheduler_pid.and_then(process::sample);
    let started = Instant::now();
    let results = hammer::run(&config, |line| println!("  {line}")).await?;
    let scheduler_after = cli.scheduler_pid.and_then(process::sample);
    println!();
    println!(
        "{:<18} {:>9} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>9} {:>7}",
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
        "cpu ratio",
        "errors"
    );
    let bare = results.iter().find(|result| result.target == Target::Bare);
    let mut failures = 0;
    for result in &results {
        let row = result.row();
        failures += row.error_count();
        let ratio = bare.map_or_else(
            || "-".to_owned(),
            |bare| format!("{:.2}x", result.per_second() / bare.per_second()),
        );
        let micros = |cpu: Option<Duration>| {
            cpu.map_or_else(
                || "-".to_owned(),
                |cpu| format!("{:.1}", cpu.as_secs_f64() * 1e6),
            )
        };
        // Requests per server CPU-second, relative to the bare route: the
        // ratio a scheduler alone on its machine would see.
        let cpu_ratio = bare
            .and_then(|bare| {
                let mine = result.scheduler_cpu_per_request()?;
                let theirs = bare.scheduler_cpu_per_request()?;
                Some(format!(
                    "{:.2}x",
                    theirs.as_secs_f64() / mine.as_secs_f64().max(1e-12)
                ))
            })
            .unwrap_or_else(|| "-".to_owned());
        let kinds: Vec<String> = row
            .errors
            .iter()
            .map(|(kind, count)| format!("{kind}={count}"))
            .collect();
        println!(
            "{:<18} {:>9} {:>10} {:>10.0} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>9} {:>7} {}",
            row.name,
            result.request_bytes,
            row.ok,
            row.per_second,
            millis(row.p50),
            millis(row.p99),
            millis(row.p999),
            ratio,
            micros(result.scheduler_cpu_per_request()),
            micros(result.client_cpu_per_request()),
            cpu_ratio,
            row.error_count(),
            kinds.join(" ")
        );
    }
    if let Some(line) = cpu_line(
        "scheduler",
        scheduler_before,
        scheduler_after,
        started.elapsed(),
    ) {
        println!("{line}");
    }
    Ok(failures)
}
