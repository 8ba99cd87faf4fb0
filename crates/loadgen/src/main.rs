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
//! - `task-list` (benchmark P6): daemons polling `GetRunningTasks` every
//!   second against many running tasks; bytes received (on the wire and
//!   inflated, with or without accepting compressed answers) and latency.
//!
//! - `farm` (benchmark P7): the farm's outcome, build times under the
//!   scheduler's placement beside an ideal placement's (docs/farm.md).
//!
//! The modes' earlier names (`hammer`, `cluster`, `mix`) still work.
//!
//! A person reads the report on stderr; each run also prints one JSON object
//! per line on stdout for scripts (`scripts/bench.sh` plots them).

mod cluster;
mod farm;
mod heartbeat_rate;
mod progress;
mod report;

use std::{
    net::{SocketAddr, ToSocketAddrs},
    process::ExitCode,
};

use clap::{Parser, Subcommand};
use yadcc_loadgen::process;
use yadcc_sim::{self as sim, Wire};

use cluster::{ClusterArgs, MixArgs, TaskListArgs};
use heartbeat_rate::HeartbeatRateArgs;

// Thousands of simulated daemons allocate and free small buffers and
// messages all the time; under glibc, malloc and free were about 55 % of
// the load generator's CPU (docs/benchmark-history.md, "The load generator's
// own cost").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Load generator for the yadcc scheduler: simulated daemons (servant and
/// delegate in one) speaking flare (default), http+pb or JSON, each machine
/// from its own 127.x.y.z address with at most two connections.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
pub(crate) struct Cli {
    /// Scheduler: HOST:PORT, flare://HOST:PORT, http+pb://HOST:PORT or
    /// http://HOST:PORT (the scheme picks the protocol unless --protocol is given).
    #[arg(long, global = true, default_value = "127.0.0.1:8336")]
    scheduler: String,

    /// Wire protocol of the simulated daemons: flare, http+pb or json.
    #[arg(long, global = true)]
    protocol: Option<Wire>,

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

    /// Threads of the load generator. Default: 1 for the cluster modes (the
    /// simulated daemons are driven by events: one thread serves thousands
    /// of them, and cheapest, with no hand-over between threads), 2 for
    /// heartbeat-rate (as fast as possible).
    #[arg(long, global = true)]
    threads: Option<usize>,

    /// Adds `"label": LABEL` to every JSON line (which scheduler or setup
    /// the run measured, for the tables and plots of scripts/bench.sh).
    #[arg(long, global = true)]
    label: Option<String>,

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
    /// Daemons polling the whole task list every second against many
    /// running tasks (benchmark P6).
    TaskList(TaskListArgs),
    /// A compile farm's builds placed by the scheduler, beside the same
    /// builds under an ideal placement (benchmark P7).
    Farm(farm::FarmArgs),
}
/// The scheduler's address, and the protocol its URI names, if any.
fn resolve(text: &str) -> Result<(SocketAddr, Option<Wire>), String> {
    let text = text.trim();
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, text),
    };
    let protocol = match scheme {
        None => None,
        Some("flare") => Some(Wire::Flare),
        Some("http+pb" | "http") => Some(Wire::HttpPb),
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
fn main() -> ExitCode {
    let mut cli = Cli::parse();
    let threads = cli.threads.unwrap_or(match cli.command {
        Command::HeartbeatRate(_) => 2,
        Command::GrantCycles(_)
        | Command::DaemonMix(_)
        | Command::TaskList(_)
        | Command::Farm(_) => 1,
    });
    cli.threads = Some(threads);
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
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
        Command::GrantCycles(args) => cluster::run_grant_cycles(&cli, args, target, protocol).await,
        Command::DaemonMix(args) => cluster::run_daemon_mix(&cli, args, target, protocol).await,
        Command::TaskList(args) => cluster::run_task_list(&cli, args, target, protocol).await,
        Command::HeartbeatRate(args) => heartbeat_rate::run(&cli, args, target, protocol).await,
        Command::Farm(args) => farm::run(&cli, args, target, protocol).await,
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
