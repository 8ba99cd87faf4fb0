//! The inspection snapshot.

use super::*;

#[tokio::test(start_paused = true)]
async fn snapshot_fields() {
    // The original's capacity rule, whose figure the dump shows the same
    // way (rule "own load" has its own tests).
    let s = Scheduler::new(Config {
        foreign_load_from_own_average: false,
        ..config()
    });
    let mut a = hb("10.0.0.1:8335", 4);
    a.num_processors = 8;
    a.current_load = 6;
    a.total_memory = 32 << 30;
    a.memory_available = 20 << 30;
    a.priority = ServantPriority::Dedicated;
    a.version = 7;
    s.heartbeat(a).unwrap();
    advance(secs(1)).await;
    let mut nat = hb("10.0.0.2:8335", 4);
    nat.observed_ip = ip("10.0.0.3");
    s.heartbeat(nat).unwrap();
    let g = grant_one(
        &s,
        GrantRequest {
            prefetch: 1,
            immediate: 0,
            requester_ip: ip("10.0.0.9"),
            ..req()
        },
    )
    .await;
    advance(secs(2)).await;

    let snap = s.snapshot();
    assert_eq!(snap.uptime, secs(3));
    assert_eq!(snap.servants.len(), 2);
    let a = &snap.servants[0];
    assert_eq!(a.observed_location, addr("10.0.0.1:8335"));
    assert_eq!(a.reported_location, addr("10.0.0.1:8335"));
    assert_eq!(a.version, 7);
    assert_eq!(a.priority, ServantPriority::Dedicated);
    assert_eq!(a.environments, vec![ENV.to_owned()]);
    assert_eq!(a.max_tasks, 4);
    assert_eq!(a.not_accepting_reason, None);
    assert_eq!(a.num_processors, 8);
    assert_eq!(a.current_load, 6);
    // foreign = 6 - 1 = 5; min(4, 8 - 5) = 3
    assert_eq!(a.capacity_available, 3);
    assert_eq!(a.total_memory, 32 << 30);
    assert_eq!(a.memory_available, 20 << 30);
    assert_eq!(a.running, 1);
    assert_eq!(a.zombies, 0);
    assert_eq!(a.ever_assigned, 1);
    assert_eq!(a.reported_running_tasks, 0);
    assert_eq!(a.waiters, 0);
    assert_eq!(a.discovered_ago, secs(3));
    assert_eq!(a.expires_in, secs(7));
    assert!(!a.leaving);
    let n = &snap.servants[1];
    assert_eq!(n.observed_location, addr("10.0.0.3:8335"));
    assert_eq!(n.not_accepting_reason, Some(NotAcceptingReason::BehindNat));

    assert_eq!(snap.grants.len(), 1);
    let gv = &snap.grants[0];
    assert_eq!(gv.id, g.id);
    assert_eq!(gv.requester, Some(ip("10.0.0.9")));
    assert_eq!(gv.servant, addr("10.0.0.1:8335"));
    assert_eq!(gv.environment.as_deref(), Some(ENV));
    assert_eq!(gv.age, secs(2));
    assert_eq!(gv.lease_left, secs(13));
    assert!(gv.prefetch && !gv.zombie && !gv.adopted);

    assert_eq!(snap.environments.len(), 1);
    let e = &snap.environments[0];
    assert_eq!(e.digest, ENV);
    assert_eq!(e.servants, 2);
    assert_eq!(e.capacity_available, 3);
    assert_eq!(e.running, 1);
    assert_eq!(e.waiters, 0);

    let t = snap.totals;
    assert_eq!(t.servants_up, 2);
    assert_eq!(t.servants_accepting, 1);
    assert_eq!(t.capacity, 4);
    assert_eq!(t.capacity_available, 2);
    assert_eq!(t.capacity_unavailable, 1);
    assert_eq!(t.running, 1);
    assert_eq!(t.zombies, 0);
    assert_eq!(t.waiters, 0);
    assert_eq!(t.grants, 1);
    assert_eq!(snap.counters.grants_issued, 1);
    assert!(snap.serving_daemon_tokens_rollout_in <= secs(3600));
}

#[tokio::test(start_paused = true)]
async fn snapshot_counts_waiters_per_environment_and_servant() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let _held = grant_one(&s, req()).await;
    let _w = spawn_wait(&s, req_wait(secs(10)));
    settle().await;
    let snap = s.snapshot();
    assert_eq!(snap.totals.waiters, 1);
    assert_eq!(snap.environments[0].waiters, 1);
    assert_eq!(snap.servants[0].waiters, 1);
}
