//! The simulated cluster against the real server: servants register, delegates
//! get grants, run tasks on the servants, renew and free them, without errors.

use std::time::Duration;

use yadcc_sim::{Cluster, ClusterConfig, Wire, Workload};

use crate::{
    fixtures::eventually,
    support::{SERVANT_TOKEN, STEP, Server, USER_TOKEN, heavy},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_simulated_cluster_runs_without_errors() {
    let _heavy = heavy().await;
    let server = Server::start().await;
    let mut config = ClusterConfig::new(
        server.addr,
        USER_TOKEN,
        SERVANT_TOKEN,
        5,
        3,
        Workload::Rate {
            jobs_per_second: 25.0,
        },
    );
    config.delegate.task_duration = Duration::from_millis(100)..=Duration::from_millis(600);
    config.delegate.renew_interval = Duration::from_millis(300);
    config.delegate.running_tasks_interval = Some(Duration::from_millis(300));
    config.seed = Some(1);
    // Plain-HTTP JSON, as scripts call; the daemons' own protocols are
    // exercised in `daemons.rs`.
    config.protocol = Wire::Json;
    let cluster = Cluster::start(config);
    assert!(
        cluster.wait_ready(STEP).await,
        "servants register and delegates start"
    );
    // Grants made, renewed and freed: the cluster has gone round.
    assert!(
        eventually(|| {
            let counters = server.engine.snapshot().counters;
            counters.grants_issued > 0 && counters.frees > 0 && counters.renewals > 0
        })
        .await,
        "{:?}",
        server.engine.snapshot().counters
    );

    let snapshot = server.engine.snapshot();
    assert_eq!(snapshot.totals.servants_up, 5, "{:?}", snapshot.totals);
    assert_eq!(
        snapshot.totals.servants_accepting, 5,
        "{:?}",
        snapshot.servants
    );
    assert!(
        snapshot.counters.grants_issued > 0,
        "{:?}",
        snapshot.counters
    );
    assert!(snapshot.counters.frees > 0, "{:?}", snapshot.counters);
    assert!(snapshot.counters.renewals > 0, "{:?}", snapshot.counters);
    // Every servant is seen at its own loopback address, reporting it as is.
    for servant in &snapshot.servants {
        assert_eq!(servant.observed_location, servant.reported_location);
    }

    let stats = cluster.stats().clone();
    cluster.stop().await;
    let report = stats.report();
    assert_eq!(stats.total_errors(), 0, "{report}");
    assert_eq!(stats.events.anomalies(), 0, "{report}");
    let completed = report
        .events
        .iter()
        .find(|(name, _)| *name == "tasks_completed")
        .map_or(0, |(_, count)| *count);
    assert!(completed > 0, "{report}");

    // Leaving servants said goodbye; delegates gave their grants back.
    let after = server.engine.snapshot();
    assert_eq!(after.totals.servants_accepting, 0, "{:?}", after.totals);
    assert_eq!(after.totals.grants, 0, "{:?}", after.totals);
    server.stop().await;
}
