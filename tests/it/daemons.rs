//! Stock daemons, emulated as they really behave, against the real server on
//! a real socket, on each of their protocols: every machine servant and
//! delegate at once, all its calls on at most two shared connections, many in
//! flight at once, the daemons' periods and client timeouts (Heartbeat 2 s),
//! and capacity so scarce that `WaitForStartingTask` long polls wait. A server
//! that answers a connection's calls in order makes a Heartbeat wait behind a
//! long poll, and it times out.

use std::{
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};
use yadcc_pb::Method;

use yadcc_sim::{Cluster, ClusterConfig, Wire, Workload, stats::Call};

use crate::support::{SERVANT_TOKEN, STEP, Server, USER_TOKEN, heavy};

/// Heartbeats (and running-task polls) each machine makes, one a second:
/// at least 10 s of emulation.
const ROUNDS: u64 = 10;
const MACHINES: usize = 4;
/// Bound on the emulation: far longer than the rounds take, so only a
/// stuck cluster reaches it.
const PATIENCE: Duration = Duration::from_secs(90);

async fn stock_daemons_run_cleanly_over(protocol: Wire) {
    let _heavy = heavy().await;
    let server = Server::start().await;
    let mut config = ClusterConfig::new(
        server.addr,
        USER_TOKEN,
        SERVANT_TOKEN,
        MACHINES,
        MACHINES,
        // 4 machines x 3 compilations/s x ~0.75 s = ~9 slots wanted, 4 offered
        // (one each, and never its own): jobs queue and long polls wait.
        Workload::Rate {
            jobs_per_second: 3.0,
        },
    );
    config.protocol = protocol;
    config.servant_capacity = Some(1);
    config.delegate.task_duration = Duration::from_millis(300)..=Duration::from_millis(1200);
    config.seed = Some(9);
    let cluster = Cluster::start(config);
    assert!(
        cluster.wait_ready(STEP).await,
        "servants register over {protocol}"
    );
    let stats = cluster.stats().clone();
    let ok = |rpc| stats.call(Call::Rpc(rpc)).ok.load(Relaxed);
    let floor = MACHINES as u64 * ROUNDS;
    let long_poll_waited = || {
        let waits = stats.call(Call::Rpc(Method::WaitForStartingTask));
        waits.latency.max() >= Duration::from_millis(500) || waits.no_quota.load(Relaxed) > 0
    };
    let enough = || {
        ok(Method::Heartbeat) >= floor
            && ok(Method::GetRunningTasks) >= floor
            && ok(Method::GetConfig) >= MACHINES as u64
            && ok(Method::KeepTaskAlive) > 0
            && ok(Method::FreeTask) > 0
            && long_poll_waited()
    };
    let give_up_at = Instant::now() + PATIENCE;
    let mut most_connections = 0;
    while !enough() && Instant::now() < give_up_at {
        tokio::time::sleep(Duration::from_millis(100)).await;
        most_connections = most_connections.max(cluster.connections());
    }
    cluster.stop().await;
    server.stop().await;
    let report = stats.report();

    assert_eq!(stats.total_errors(), 0, "over {protocol}:\n{report}");
    assert_eq!(stats.events.anomalies(), 0, "over {protocol}:\n{report}");
    // Every machine heartbeats and asks for running tasks every second.
    assert!(ok(Method::Heartbeat) >= floor, "{report}");
    assert!(ok(Method::GetRunningTasks) >= floor, "{report}");
    assert!(ok(Method::GetConfig) >= MACHINES as u64, "{report}");
    assert!(ok(Method::KeepTaskAlive) > 0, "{report}");
    assert!(ok(Method::FreeTask) > 0, "{report}");
    // The long polls did wait, so other calls shared connections with them.
    assert!(
        long_poll_waited(),
        "no long poll waited over {protocol}:\n{report}"
    );
    // At most two connections per daemon, none lost and replaced.
    let opened = stats.events.connections_opened.load(Relaxed);
    assert!(opened <= 2 * MACHINES as u64, "{opened} opened:\n{report}");
    assert!(most_connections <= 2 * MACHINES, "{most_connections}");
    assert!(
        most_connections > MACHINES,
        "calls in flight together open a second connection: {most_connections}"
    );
    assert_eq!(stats.events.connections_lost.load(Relaxed), 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_daemons_over_flare_see_no_timeouts_and_no_errors() {
    stock_daemons_run_cleanly_over(Wire::Flare).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_daemons_over_http_pb_see_no_timeouts_and_no_errors() {
    stock_daemons_run_cleanly_over(Wire::HttpPb).await;
}
