//! A real compilation through two real daemons and this scheduler: a servant
//! daemon (machine `servant`) and a delegate daemon with the stock compiler
//! wrapper `yadcc-cxx` (machine `delegate`) compile `sample.cc` remotely,
//! once, then [`CONCURRENT`] variants at once against the servant's two
//! slots, so that long polls wait. Every object must equal a local
//! `g++ -c`, every compilation must have run on the servant, neither daemon
//! may complain about the scheduler, and the scheduler must have answered
//! every daemon call (a long poll may find no slot in time).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use super::{
    COMPILE_LIMIT, Lan, Peers, daemon_calls, failed_daemon_calls, remote_compile, scheduler,
    scheduler_complaints, servant_and_delegate,
};
use crate::support::{bounded, heavy, run_bounded};

/// Compilations at once after the first.
const CONCURRENT: usize = 4;
const SOURCE: &str = include_str!("sample.cc");
const FLAGS: [&str; 2] = ["-std=c++17", "-O2"];

/// Compiles `sample.cc` with `-DVARIANT=variant` through the delegate daemon
/// into `object`.
async fn remote_compile_sample(
    peers: &Peers,
    lan: &Lan,
    variant: usize,
    object: String,
) -> Result<(), String> {
    let mut args: Vec<String> = FLAGS.iter().map(|flag| flag.to_string()).collect();
    args.extend([
        format!("-DVARIANT={variant}"),
        "-c".to_owned(),
        "sample.cc".to_owned(),
        "-o".to_owned(),
        object,
    ]);
    remote_compile(peers, lan, &args).await
}

/// The same compilation by the local g++.
async fn local_compile(work: &Path, variant: usize, object: &str) {
    let mut command = bounded(COMPILE_LIMIT, "g++");
    command
        .current_dir(work)
        .args(FLAGS)
        .arg(format!("-DVARIANT={variant}"))
        .args(["-c", "sample.cc", "-o", object]);
    let output = run_bounded(command).await;
    assert!(
        output.status.success(),
        "g++ -c: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn same_bytes(work: &Path, one: &str, other: &str) -> bool {
    let read = |name: &str| std::fs::read(work.join(name)).unwrap_or_default();
    let one = read(one);
    !one.is_empty() && one == read(other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the original yadcc ($YADCC_PEERS), root and network namespaces: scripts/test.sh runs it"]
async fn real_daemons_compile_remotely_through_this_scheduler_with_identical_objects() {
    let _heavy = heavy().await;
    let peers = Peers::required();
    let started = Instant::now();
    let lan = Lan::new(&["servant", "delegate"]);
    let scheduler = scheduler(&lan);
    let (mut servant, mut delegate) =
        servant_and_delegate(&peers, &lan, scheduler.addr, scheduler.addr).await;
    let registered_after = started.elapsed();
    std::fs::write(lan.work.join("sample.cc"), SOURCE).expect("the source");

    let mut failures = Vec::new();
    let first = Instant::now();
    if let Err(error) = remote_compile_sample(&peers, &lan, 0, "remote.o".to_owned()).await {
        failures.push(format!("the compiler wrapper failed: {error}"));
    }
    let first_took = first.elapsed();
    local_compile(&lan.work, 0, "local.o").await;
    if !same_bytes(&lan.work, "remote.o", "local.o") {
        failures.push("the remote object differs from a local g++ -c".to_owned());
    }
    let mut link = bounded(COMPILE_LIMIT, "g++");
    link.current_dir(&lan.work)
        .args(["remote.o", "-o", "sample"]);
    let linked = run_bounded(link).await.status.success();
    let ran = linked
        && run_bounded({
            let mut run = bounded(Duration::from_secs(30), lan.work.join("sample"));
            run.current_dir(&lan.work);
            run
        })
        .await
        .status
        .success();
    if !ran {
        failures.push("the remote object does not link or run".to_owned());
    }

    let concurrent = Instant::now();
    let compiles: Vec<_> = (1..=CONCURRENT)
        .map(|variant| remote_compile_sample(&peers, &lan, variant, format!("remote{variant}.o")))
        .collect();
    let results = futures_util::future::join_all(compiles).await;
    let concurrent_took = concurrent.elapsed();
    for (variant, result) in (1..=CONCURRENT).zip(results) {
        if let Err(error) = result {
            failures.push(format!("compilation {variant} failed: {error}"));
        }
        let local = format!("local{variant}.o");
        local_compile(&lan.work, variant, &local).await;
        if !same_bytes(&lan.work, &format!("remote{variant}.o"), &local) {
            failures.push(format!("object {variant} differs from a local g++ -c"));
        }
    }

    servant.stop().await;
    delegate.stop().await;
    let (servant_log, delegate_log) = (servant.log_text(), delegate.log_text());
    let remote = servant_log.matches("Executing:").count();
    if remote < 1 + CONCURRENT {
        failures.push(format!(
            "only {remote} of {} compilations ran on the servant",
            1 + CONCURRENT
        ));
    }
    for (name, log) in [("servant", &servant_log), ("delegate", &delegate_log)] {
        for complaint in scheduler_complaints(log) {
            failures.push(format!("the {name} daemon logged: {complaint}"));
        }
    }
    let access = scheduler.log();
    for failed in failed_daemon_calls(&access) {
        failures.push(format!(
            "the scheduler answered a daemon call with an error: {failed}"
        ));
    }
    // (One call may bring several grants: the daemon prefetches.)
    if daemon_calls(&access, "WaitForStartingTask", lan.ip("delegate")).1 == 0 {
        failures.push("no WaitForStartingTask of the delegate was granted".to_owned());
    }
    for machine in ["servant", "delegate"] {
        for rpc in ["Heartbeat", "GetConfig", "GetRunningTasks"] {
            if daemon_calls(&access, rpc, lan.ip(machine)).1 == 0 {
                failures.push(format!("no {rpc} answered to the {machine} daemon"));
            }
        }
    }
    println!(
        "e2e: {remote} remote compilations on the servant daemon ({} at once), objects identical: {}; \
         registered after {:.1} s, first compilation {:.1} s, the concurrent ones {:.1} s, all {:.1} s",
        CONCURRENT,
        if failures.is_empty() { "yes" } else { "NO" },
        registered_after.as_secs_f64(),
        first_took.as_secs_f64(),
        concurrent_took.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    assert!(
        failures.is_empty(),
        "{}\n\nservant:\n{servant_log}\ndelegate:\n{delegate_log}",
        failures.join("\n")
    );
}
