//! Issue 10's restart: stock daemons (emulated, flare, each machine from its
//! own 127.x address) keep compiling while the real binary is SIGKILLed under
//! load and started again at once on the same port with the same serving-daemon
//! secret. No running task may be killed (its grant id returned to its servant
//! in `expired_tasks`) and no renewal refused (`KeepTaskAlive` answered false):
//! the new instance adopts what the servants report. With the adoption window
//! closed (`--adoption_window=0`) the same run kills tasks, which shows the
//! first test measures the adoption and not a lucky moment.
//!
//! A restart on the port a killed instance held waits for the port: the
//! last tests hold it on purpose.

use std::{
    net::SocketAddr,
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use yadcc_sim::{Cluster, ClusterConfig, Wire, Workload, stats::Stats};

use crate::fixtures::{eventually, eventually_within};
use crate::support::{Binary, Launch, SERVANT_TOKEN, STEP, USER_TOKEN, heavy, http_client};

const SECRET_FLAG: &str = "--serving_daemon_token_secret=restart-test-secret";
const MACHINES: usize = 30;
/// Tasks that must be running when the scheduler is killed.
const RUNNING_AT_KILL: usize = 10;
/// The longest simulated compilation, so every task running at the kill has to
/// be renewed by, and freed on, the new instance after this long.
const LONGEST_TASK: Duration = Duration::from_millis(4500);
/// The tail of the run in which no call may fail any more.
const SETTLED: Duration = Duration::from_secs(4);
/// Bound on every wait for the cluster to get somewhere: far above what it
/// needs, so only a real failure reaches it.
const PATIENCE: Duration = Duration::from_secs(60);

fn tasks_completed(stats: &Stats) -> u64 {
    stats.events.tasks_completed.load(Relaxed)
}

fn grants_received(stats: &Stats) -> u64 {
    stats.events.grants_received.load(Relaxed)
}

/// Waits until `done` holds, for at most [`PATIENCE`].
async fn until(done: impl FnMut() -> bool) -> bool {
    eventually_within(PATIENCE, done).await
}

/// A counter or gauge of the restarted scheduler's `/metrics`.
async fn metric(addr: SocketAddr, name: &str) -> u64 {
    let text = http_client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// What a run through a restart measured.
struct Outcome {
    report: String,
    tasks_killed: u64,
    renewals_refused: u64,
    unknown_servants: u64,
    running_at_kill: usize,
    completed_after_restart: u64,
    grants_after_restart: u64,
    errors_before_kill: u64,
    /// Calls cut by the kill, sent while nothing listened, or answered before
    /// the servants' first heartbeats reached the new instance.
    errors_around_restart: u64,
    errors_once_settled: u64,
    /// What the restarted instance itself counted.
    adopted: u64,
    servants_up_after_restart: u64,
}

/// Runs the cluster against the binary, SIGKILLs it under load and restarts it
/// on the same port with `restart_flags` added.
async fn run_through_restart(restart_flags: &'static [&'static str]) -> Outcome {
    let mut first = tokio::task::spawn_blocking(|| Binary::start(&[SECRET_FLAG], None))
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
    config.protocol = Wire::Flare;
    config.servant_capacity = Some(4);
    config.delegate.task_duration = Duration::from_millis(1500)..=LONGEST_TASK;
    config.seed = Some(10);
    let cluster = Cluster::start(config);
    assert!(
        cluster.wait_ready(STEP).await,
        "servants register with the first instance"
    );
    let stats = cluster.stats().clone();
    assert!(
        until(|| cluster.running_tasks() >= RUNNING_AT_KILL && tasks_completed(&stats) > 0).await,
        "the cluster never had {RUNNING_AT_KILL} tasks running:\n{}",
        stats.report()
    );

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
        Launch {
            listen: addr,
            flags: &flags,
            ..Launch::default()
        }
        .start()
    })
    .await
    .expect("restart the binary");
    assert_eq!(second.addr, addr, "restarted on the same port");
    let restarted_at = Instant::now();

    // Every task running at the kill ends on the new instance, and new ones
    // are granted and completed there.
    let finished = until(|| {
        restarted_at.elapsed() >= LONGEST_TASK
            && grants_received(&stats) > grants_before_kill
            && tasks_completed(&stats) - completed_before_kill > running_at_kill as u64
    })
    .await;
    let errors_at_settling = stats.total_errors();
    tokio::time::sleep(SETTLED).await;
    let errors_at_end = stats.total_errors();
    let adopted = metric(addr, "yadcc_scheduler_adoptions_total").await;
    let servants_up_after_restart = metric(addr, "yadcc_scheduler_servants_up").await;
    cluster.stop().await;
    drop(second);
    let report = format!(
        "running at the kill: {running_at_kill}; the restarted instance adopted {adopted}, \
         sees {servants_up_after_restart} servants\n{}",
        stats.report()
    );
    assert!(finished, "the cluster did not recover:\n{report}");

    Outcome {
        report,
        tasks_killed: stats.events.tasks_killed.load(Relaxed),
        renewals_refused: stats.events.renewals_refused.load(Relaxed),
        unknown_servants: stats.events.unknown_servants.load(Relaxed),
        running_at_kill,
        completed_after_restart: tasks_completed(&stats) - completed_before_kill,
        grants_after_restart: grants_received(&stats) - grants_before_kill,
        errors_before_kill,
        errors_around_restart: errors_at_settling - errors_before_kill,
        errors_once_settled: errors_at_end - errors_at_settling,
        adopted,
        servants_up_after_restart,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_then_restart_kills_no_task_and_refuses_no_renewal() {
    let _heavy = heavy().await;
    let outcome = run_through_restart(&[]).await;
    let report = &outcome.report;
    eprintln!(
        "restart: {} running at the kill, {} adopted, {} completed after; \
         {} calls failed around the restart, {} once settled; \
         {} tasks killed, {} renewals refused",
        outcome.running_at_kill,
        outcome.adopted,
        outcome.completed_after_restart,
        outcome.errors_around_restart,
        outcome.errors_once_settled,
        outcome.tasks_killed,
        outcome.renewals_refused,
    );
    assert!(outcome.grants_after_restart > 0, "{report}");
    assert_eq!(outcome.errors_before_kill, 0, "{report}");
    // The servants reached the new instance, which adopted their tasks...
    assert_eq!(
        outcome.servants_up_after_restart, MACHINES as u64,
        "{report}"
    );
    assert!(outcome.adopted > 0, "{report}");
    // ...so none was killed and no renewal refused.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_adoption_window_the_same_restart_kills_tasks() {
    let _heavy = heavy().await;
    let outcome = run_through_restart(&["--adoption_window=0"]).await;
    let report = &outcome.report;
    eprintln!(
        "restart with --adoption_window=0: {} running at the kill, {} adopted; \
         {} tasks killed, {} renewals refused",
        outcome.running_at_kill, outcome.adopted, outcome.tasks_killed, outcome.renewals_refused,
    );
    // The same servants reached the new instance with the same reports...
    assert_eq!(
        outcome.servants_up_after_restart, MACHINES as u64,
        "{report}"
    );
    // ...which adopted nothing and had their tasks killed.
    assert_eq!(outcome.adopted, 0, "{report}");
    assert!(outcome.tasks_killed > 0, "{report}");
}

/// A loopback port held by this process until the listener is dropped.
fn held_port() -> (std::net::TcpListener, SocketAddr) {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("hold a port");
    let addr = holder.local_addr().expect("its address");
    (holder, addr)
}

#[tokio::test]
async fn a_start_on_a_held_port_waits_for_it_and_says_so() {
    let (holder, addr) = held_port();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(1));
        drop(holder);
    });
    let starting = Launch {
        listen: addr,
        ..Launch::default()
    }
    .spawn();
    // Bound: the second the port is held, plus the start, with a margin
    // for a loaded machine; without the retry it exits at once instead.
    let (found, mut starting) = tokio::task::spawn_blocking(move || {
        let found = starting.listening_within(STEP);
        (found, starting)
    })
    .await
    .expect("wait for the binary");
    holder.join().expect("holder");
    let _ = starting.child.kill();
    let _ = starting.child.wait();
    let log = starting.log;
    assert_eq!(found, Some(addr), "{}", log.lines().join("\n"));
    assert!(
        log.contains(&format!("{addr} is in use")),
        "the wait is logged:\n{}",
        log.lines().join("\n")
    );
}

#[tokio::test]
async fn a_port_held_for_good_fails_the_start_with_the_reason() {
    let (_holder, addr) = held_port();
    let starting = Launch {
        listen: addr,
        ..Launch::default()
    }
    .spawn();
    let mut child = starting.child;
    let log = starting.log;
    let status = tokio::task::spawn_blocking(move || {
        // The binary gives up after its 5 s of patience; far less than this.
        let give_up_at = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().expect("poll the binary") {
                return Some(status);
            }
            if Instant::now() > give_up_at {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .expect("wait for the binary");
    // The last lines reach the log once the pipe is drained.
    let reason_printed = eventually(|| log.contains(&format!("cannot listen on {addr}"))).await;
    let log = log.lines().join("\n");
    let status = status.unwrap_or_else(|| panic!("still running on a held port:\n{log}"));
    assert!(!status.success(), "{log}");
    assert!(reason_printed, "the reason is printed:\n{log}");
}
