//! The cluster modes: `grant-cycles` (P3), `daemon-mix` (P5), `task-list`
//! (P6), and what they share: a simulated cluster started, warmed up,
//! measured and reported.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use clap::Args;
use serde_json::{Value, json};
use yadcc_pb::Method;
use yadcc_sim::{
    Cluster, ClusterConfig, Wire, Workload,
    stats::{Call, Report},
    wire::{DAEMON_ACCEPTABLE_COMPRESSION, compression::ACCEPT_UNCOMPRESSED},
};

use crate::{
    Cli, process,
    progress::{calls_so_far, watch_window},
    report::{cpu_json, emit, round3, row_json},
};

/// The measurement window every cluster mode has.
#[derive(Debug, Args)]
pub(crate) struct WindowArgs {
    /// Measured seconds.
    #[arg(long, default_value_t = 30)]
    duration: u64,

    /// Seconds run before measuring (after every servant registered).
    #[arg(long, default_value_t = 5)]
    warmup: u64,

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

/// What `grant-cycles` and `daemon-mix` share.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    window: WindowArgs,

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
}

#[derive(Debug, Args)]
pub(crate) struct ClusterArgs {
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
pub(crate) struct MixArgs {
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
pub(crate) struct TaskListArgs {
    /// Servants (machines 0..N), each heartbeating every second with the
    /// tasks it runs, so the scheduler's list holds them.
    #[arg(long, default_value_t = 2000)]
    servants: usize,

    /// Daemons polling GetRunningTasks every second (machines 0..N, also
    /// servants); they hold the running tasks, renewing them every second.
    #[arg(long, default_value_t = 1000)]
    pollers: usize,

    /// Tasks running in the cluster, spread over the pollers; each one done
    /// is replaced at once, so the list changes every second.
    #[arg(long, default_value_t = 20_000)]
    tasks: usize,

    /// Shortest task, in seconds.
    #[arg(long, default_value_t = 100)]
    task_min_s: u64,

    /// Longest task, in seconds.
    #[arg(long, default_value_t = 300)]
    task_max_s: u64,

    /// Accept compressed answers as stock daemons do
    /// (`acceptable_compression_algorithms = 62`: none, gzip, lz4 frame,
    /// snappy, zstd) instead of only uncompressed ones (2).
    #[arg(long)]
    accept_compression: bool,

    #[command(flatten)]
    window: WindowArgs,
}

/// Applies the window's options.
fn apply_window(config: &mut ClusterConfig, window: &WindowArgs, protocol: Wire) {
    config.protocol = protocol;
    config.environments = window.environments;
    config.seed = window.seed;
}

/// Applies the options `grant-cycles` and `daemon-mix` share.
fn apply(config: &mut ClusterConfig, run: &RunArgs, protocol: Wire) {
    apply_window(config, &run.window, protocol);
    config.delegate.prefetch = run.prefetch;
    config.delegate.task_duration = Duration::from_millis(run.task_min_ms)
        ..=Duration::from_millis(run.task_max_ms.max(run.task_min_ms));
}

/// Runs `grant-cycles`; returns the number of failures.
pub(crate) async fn run_grant_cycles(
    cli: &Cli,
    args: &ClusterArgs,
    target: SocketAddr,
    protocol: Wire,
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
    measure(cli, &args.run.window, config, None, header).await
}

/// Runs `daemon-mix`; returns the number of failures.
pub(crate) async fn run_daemon_mix(
    cli: &Cli,
    args: &MixArgs,
    target: SocketAddr,
    protocol: Wire,
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
    measure(cli, &args.run.window, config, None, header).await
}

/// Runs `task-list`; returns the number of failures.
pub(crate) async fn run_task_list(
    cli: &Cli,
    args: &TaskListArgs,
    target: SocketAddr,
    protocol: Wire,
) -> Result<u64, String> {
    if args.pollers == 0 || args.pollers > args.servants {
        return Err("--pollers must be between 1 and --servants".to_owned());
    }
    let per_poller = args.tasks.div_ceil(args.pollers);
    let mut config = ClusterConfig::new(
        target,
        &cli.user_token,
        &cli.servant_token,
        args.servants,
        args.pollers,
        Workload::Steady {
            running: per_poller as u32,
        },
    );
    apply_window(&mut config, &args.window, protocol);
    config.delegate.task_duration = Duration::from_secs(args.task_min_s)
        ..=Duration::from_secs(args.task_max_s.max(args.task_min_s));
    // Room for the tasks however unevenly they are placed, and the prefetches.
    config.servant_capacity = Some((2 * args.tasks.div_ceil(args.servants) + 2) as u32);
    config.acceptable_compression = if args.accept_compression {
        DAEMON_ACCEPTABLE_COMPRESSION
    } else {
        ACCEPT_UNCOMPRESSED
    };
    let tasks = per_poller * args.pollers;
    eprintln!(
        "task-list: {} servants, {} of them polling GetRunningTasks every second and holding {per_poller} tasks each ({tasks} in all, {}..{} s each), answers accepted {}, over {protocol}, against {target}",
        args.servants,
        args.pollers,
        args.task_min_s,
        args.task_max_s,
        if args.accept_compression {
            "compressed (62)"
        } else {
            "uncompressed only"
        },
    );
    let header = json!({
        "bench": "task-list",
        "servants": args.servants,
        "pollers": args.pollers,
        "tasks": tasks,
        "accept_compression": args.accept_compression,
        "acceptable_compression_algorithms": config.acceptable_compression,
    });
    measure(cli, &args.window, config, Some(tasks), header).await
}

/// Waiting for the tasks to run, at most.
const FILLING: Duration = Duration::from_secs(120);

/// Starts the cluster, waits for `running` tasks if given, warms up,
/// measures, prints the report (stderr) and one JSON line (stdout), stops.
/// Returns the number of failures.
async fn measure(
    cli: &Cli,
    run: &WindowArgs,
    config: ClusterConfig,
    running: Option<usize>,
    mut result: Value,
) -> Result<u64, String> {
    let protocol = config.protocol;
    let cluster = start_ready(config, running).await?;
    eprintln!("warming up {} s", run.warmup);
    tokio::time::sleep(Duration::from_secs(run.warmup)).await;
    let measured = measure_window(cli, run, &cluster, running.is_some()).await;
    let failures = measured.report.total_errors() + measured.anomalies;
    eprintln!(
        "errors: {} (anomalies: {})",
        measured.report.total_errors(),
        measured.anomalies
    );
    if let Value::Object(fields) = &mut result {
        fields.extend(measured.json(protocol, cli.threads));
    }
    emit(cli, result);
    eprintln!("stopping: servants leave, delegates free their grants");
    cluster.stop().await;
    Ok(failures)
}

/// Starts the cluster and waits until its servants registered and, if
/// `running` is given, nearly that many tasks run; stops it if they do not.
async fn start_ready(config: ClusterConfig, running: Option<usize>) -> Result<Cluster, String> {
    let cluster = Cluster::start(config);
    eprintln!(
        "{} machines; addressing: {:?}",
        cluster.machines(),
        cluster.addressing()
    );
    let registering = Instant::now();
    if !cluster.wait_ready(Duration::from_secs(30)).await {
        let calls = calls_so_far(cluster.stats());
        cluster.stop().await;
        return Err(format!(
            "servants did not register within 30 s; calls: {calls}"
        ));
    }
    let registered = cluster.stats().events.servants_registered.load(Relaxed);
    eprintln!(
        "{registered} of {} servants registered in {:.2} s",
        cluster.servants().len(),
        registering.elapsed().as_secs_f64(),
    );
    if (registered as usize) < cluster.servants().len() {
        eprintln!("calls so far: {}", calls_so_far(cluster.stats()));
    }
    if let Some(wanted) = running {
        let filling = Instant::now();
        // Nearly all: the ones being replaced at any moment are missing.
        while cluster.running_tasks() < wanted * 95 / 100 {
            if filling.elapsed() > FILLING {
                let running = cluster.running_tasks();
                let calls = calls_so_far(cluster.stats());
                cluster.stop().await;
                return Err(format!(
                    "{running} of {wanted} tasks running after {} s; calls: {calls}",
                    FILLING.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "{} tasks running after {:.1} s",
            cluster.running_tasks(),
            filling.elapsed().as_secs_f64()
        );
    }
    Ok(cluster)
}

/// What one measured window gave.
struct Measured {
    wall: Duration,
    report: Report,
    machines: usize,
    connections: usize,
    completed: u64,
    anomalies: u64,
    scheduler: Value,
    loadgen: Value,
    loadgen_per_machine: Option<f64>,
    task_list: Value,
}

/// Measures the window from now (counters reset), printing progress and
/// then the report on stderr.
async fn measure_window(
    cli: &Cli,
    run: &WindowArgs,
    cluster: &Cluster,
    show_task_list: bool,
) -> Measured {
    let stats = cluster.stats().clone();
    stats.reset();
    let scheduler_before = cli.scheduler_pid.and_then(process::sample);
    let own_before = process::sample(std::process::id());
    let started = Instant::now();
    watch_window(
        &stats,
        started,
        Duration::from_secs(run.duration),
        Duration::from_secs(run.progress_every),
        || cluster.running_tasks(),
    )
    .await;
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
    // The load generator's own cost per simulated machine: its process CPU
    // time (user + system, /proc/self/stat) over the window.
    let loadgen_per_machine = loadgen
        .get("cpu_seconds_per_second")
        .and_then(Value::as_f64)
        .filter(|_| cluster.machines() > 0)
        .map(|cpu| round3(cpu * 1000.0 / cluster.machines() as f64));
    if let Some(per_machine) = loadgen_per_machine {
        eprintln!(
            "loadgen: {per_machine:.3} ms of CPU per simulated machine per second (process CPU time over the window)"
        );
    }
    let task_list = task_list_json(&report, &stats);
    if show_task_list {
        eprintln!("task list: {task_list}");
    }
    Measured {
        wall,
        anomalies: stats.events.anomalies(),
        report,
        machines: cluster.machines(),
        connections,
        completed,
        scheduler,
        loadgen,
        loadgen_per_machine,
        task_list,
    }
}

impl Measured {
    /// The run's JSON fields (beside the mode's header).
    fn json(self, protocol: Wire, threads: Option<usize>) -> serde_json::Map<String, Value> {
        let rpcs: BTreeMap<&str, Value> = self
            .report
            .rows
            .iter()
            .map(|row| (row.name, row_json(row)))
            .collect();
        let events: BTreeMap<&str, u64> = self.report.events.iter().copied().collect();
        // P5's yardstick: the scheduler's CPU per 1,000 simulated machines.
        let per_thousand = self
            .scheduler
            .get("cpu_seconds_per_second")
            .and_then(Value::as_f64)
            .filter(|_| self.machines > 0)
            .map(|cpu| round3(cpu * 1000.0 / self.machines as f64));
        let seconds = self.wall.as_secs_f64();
        let mut fields = serde_json::Map::new();
        fields.insert("protocol".into(), json!(protocol.label()));
        fields.insert("machines_simulated".into(), json!(self.machines));
        fields.insert("duration_s".into(), json!(round3(seconds)));
        fields.insert("all".into(), json!(row_json(&self.report.total)));
        fields.insert("rpcs".into(), json!(rpcs));
        fields.insert("events".into(), json!(events));
        fields.insert("anomalies".into(), json!(self.anomalies));
        fields.insert(
            "grant_cycles_per_second".into(),
            json!(round3(self.completed as f64 / seconds)),
        );
        fields.insert("connections".into(), json!(self.connections));
        fields.insert(
            "scheduler_cpu_per_1000_machines".into(),
            json!(per_thousand),
        );
        fields.insert("scheduler".into(), json!(self.scheduler));
        fields.insert("loadgen".into(), json!(self.loadgen));
        fields.insert(
            "loadgen_cpu_ms_per_machine_second".into(),
            json!(self.loadgen_per_machine),
        );
        fields.insert("loadgen_threads".into(), json!(threads));
        fields.insert("task_list".into(), json!(self.task_list));
        fields
    }
}

/// P6's figures: the `GetRunningTasks` answers as received (on the wire and
/// inflated), how many came compressed, their latency, the longest list.
fn task_list_json(report: &Report, stats: &yadcc_sim::Stats) -> Value {
    let name = Call::Rpc(Method::GetRunningTasks).name();
    let Some(row) = report.rows.iter().find(|row| row.name == name) else {
        return Value::Null;
    };
    let wire = row.answer_bytes_per_second;
    let inflated = row.message_bytes_per_second;
    json!({
        "answers_per_second": round3(row.per_second),
        "received_bytes_per_second": wire.round(),
        "inflated_bytes_per_second": inflated.round(),
        "received_vs_inflated": (inflated > 0.0).then(|| round3(wire / inflated)),
        "compressed_answers": row.compressed,
        "uncompressed_answers": row.ok.saturating_sub(row.compressed),
        "p50_ms": crate::report::ms(row.p50),
        "p99_ms": crate::report::ms(row.p99),
        "largest_list_tasks": stats.events.largest_task_list.load(Relaxed),
    })
}
