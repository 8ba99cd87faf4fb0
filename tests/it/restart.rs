//! Issue 10's restart: stock daemons (emulated, flare, each machine from its
//! own 127.x address) keep compiling while the real binary is SIGKILLed under
//! load and started again at once on the same port with the same serving-daemon
//! secret. No running task may be killed (its grant id returned to its servant
//! in `expired_tasks`) and no renewal refused (`KeepTaskAlive` answered false):
//! the new instance adopts what the servants report.

use std::{
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use yadcc_scheduler::sim::{Cluster, ClusterConfig, Protocol, Workload, stats::Stats};

use crate::support::{Binary, SERVANT_TOKEN, USER_TOKEN};

const SECRET_FLAG: &str = "--serving_daemon_token_secret=restart-test-secret";
const MACHINES: usize = 30;
/// Load before the kill, once every servant has registered.
const BEFORE_KILL: Duration = Duration::from_secs(5);
/// Emulation after the restart: longer than the longest compilation, so every
/// task running at the kill has to be renewed by, and freed on, the new instance.
const AFTER_RESTART: Duration = Duration::from_secs(8);
/// The tail of `AFTER_RESTART` in which no call may fail any more.
const SETTLED: Duration = Duration::from_secs(4);

fn tasks_completed(stats: &Stats) -> u64 {
    stats.events.tasks_completed.load(Relaxed)
}

fn grants_received(stats: &Stats) -> u64 {
    stats.events.grants_received.load(Relaxed)
}

/// What a run through a restart measured.
struct Outcome {
    report: String,
    tasks_killed: u64,
    renewals_refused: u64,
    unknown_servants: u64,
    running_at_kill: usize,
    completed_before_kill: u64,
    completed_after_restart: u64,
    grants_after_restart: u64,
    errors_before_kill: u64,
    /// Calls cut by the kill, sent while nothing listened, or answered before
    /// the servants' first heartbeats reached the new instance.
    errors_around_restart: u64,
    errors_once_settled: u64,
}

/// Runs the cluster against the binary, SIGKILLs it under load and restarts it
/// with `restart_flags` added.
async fn run_through_restart(restart_flags: &'static [&'static str]) -> Outcome {
    let first_flags = [SECRET_FLAG];
    let mut first = tokio::task::spawn_blocking(move || Binary::start(&first_flags, None))
        .await
        .expect("start the binary");
    let addr = first.addr;

    let mut config = ClusterConfig::new(
        addr,
        USER_TOKEN,
        SERVANT_TOKEN,
        MACHINES,
        MACHINES,
        // 30 machines x 1 compilation/s x ~3 s = ~90 slots wanted of 120:
        // busy, with dozens of tasks running at any moment.
        Workload::Rate {
            jobs_per_second: 1.0,
        },
    );
    config.protocol = Protocol::Flare;
    config.servant_capacity = Some(4);
    config.delegate.task_duration = Duration::from_millis(1500)..=Duration::from_millis(4500);
    config.seed = Some(10);
    let cluster = Cluster::start(config);
    assert!(
        cluster.wait_ready(Duration::from_secs(5)).await,
        "servants register with the first instance"
    );
    let stats = cluster.stats().clone();
    tokio::time::sleep(BEFORE_KILL).await;

    let running_at_kill = cluster.running_tasks();
    let completed_before_kill = tasks_completed(&stats);
    let grants_before_kill = grants_received(&stats);
    let errors_before_kill = stats.total_errors();
    // Child::kill is SIGKILL: no graceful shutdown, nothing saved.
    first.child.kill().expect("SIGKILL the scheduler");
    first.child.wait().expect("reap the scheduler");
    let second = tokio::task::spawn_blocking(move || {
        let mut flags = vec![SECRET_FLAG];
        flags.extend_from_slice(restart_flags);
        Binary::start_on(addr, &flags, None)
    })
    .await
    .expect("restart the binary");
    assert_eq!(second.addr, addr, "restarted on the same port");
    let restarted_at = Instant::now();

    tokio::time::sleep(AFTER_RESTART - SETTLED).await;
    let errors_at_settling = stats.total_errors();
    tokio::time::sleep(AFTER_RESTART.saturating_sub(restarted_at.elapsed())).await;
    let errors_at_end = stats.total_errors();
    cluster.stop().await;
    drop(second);

    Outcome {
        report: format!("running at the kill: {running_at_kill}\n{}", stats.report()),
        tasks_killed: stats.events.tasks_killed.load(Relaxed),
        renewals_refused: stats.events.renewals_refused.load(Relaxed),
        unknown_servants: stats.events.unknown_servants.load(Relaxed),
        running_at_kill,
        completed_before_kill,
        completed_after_restart: tasks_completed(&stats) - completed_before_kill,
        grants_after_restart: grants_received(&stats) - grants_before_kill,
        errors_before_kill,
        errors_around_restart: errors_at_settling - errors_before_kill,
        errors_once_settled: errors_at_end - errors_at_settling,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_then_restart_kills_no_task_and_refuses_no_renewal() {
    let outcome = run_through_restart(&[]).await;
    let report = &outcome.report;
    eprintln!(
        "restart: {} running at the kill, {} completed before, {} after; \
         {} calls failed around the restart, {} once settled; \
         {} tasks killed, {} renewals refused",
        outcome.running_at_kill,
        outcome.completed_before_kill,
        outcome.completed_after_restart,
        outcome.errors_around_restart,
        outcome.errors_once_settled,
        outcome.tasks_killed,
        outcome.renewals_refused,
    );
    // The kill landed under load, and the cluster worked on both sides of it.
    assert!(outcome.running_at_kill >= 10, "{report}");
    assert!(outcome.completed_before_kill > 0, "{report}");
    assert!(outcome.grants_after_restart > 0, "{report}");
    // Every task running at the kill ends within the window, plus new ones.
    assert!(
        outcome.completed_after_restart > outcome.running_at_kill as u64,
        "{report}"
    );
    assert_eq!(outcome.errors_before_kill, 0, "{report}");
    assert_eq!(outcome.tasks_killed, 0, "{report}");
    assert_eq!(outcome.renewals_refused, 0, "{report}");
    assert_eq!(outcome.unknown_servants, 0, "{report}");
    // The restart costs some calls (counted, not asserted: how many depends
    // on what was in flight), then none.
    assert_eq!(
        outcome.errors_once_settled, 0,
        "{} errors around the restart, then more:\n{report}",
        outcome.errors_around_restart
    );
}
