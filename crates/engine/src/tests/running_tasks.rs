//! GetRunningTasks: what is listed, from whom, and the version of the list.

use super::*;

#[tokio::test(start_paused = true)]
async fn running_tasks_use_the_observed_location_and_change_version_at_most_once_per_refresh() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    let g = grant_one(&s, req()).await;
    let mut b = hb("10.0.0.1:8335", 4);
    b.running_tasks = vec![task(g.id)];
    s.heartbeat(b.clone()).unwrap();

    let (version, list) = s.running_tasks_with_version();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].servant, addr("10.0.0.1:8335"));
    assert_eq!(list[0].grant_id, g.id);
    assert_eq!(list[0].task_digest, format!("task-{}", g.id));
    assert_eq!(s.running_tasks_version(), version);

    // Unchanged reports: the same version.
    s.heartbeat(b.clone()).unwrap();
    assert_eq!(s.running_tasks_version(), version);
    // A changed report is shown once the version shown is older than the
    // refresh interval: until then every caller keeps the answer it has.
    b.running_tasks.clear();
    s.heartbeat(b).unwrap();
    assert_eq!(s.running_tasks_version(), version);
    advance(config().running_tasks_refresh).await;
    assert_ne!(s.running_tasks_version(), version);
    assert!(s.running_tasks().is_empty());
}

#[tokio::test(start_paused = true)]
async fn running_tasks_list_only_live_grants_of_trusted_servants() {
    let s = Scheduler::new(Config {
        running_tasks_refresh: Duration::ZERO,
        ..config()
    });
    let beat = |location: &str, tasks: &[u64]| {
        let mut b = hb(location, 4);
        b.next_heartbeat_in = secs(30);
        b.running_tasks = tasks.iter().map(|&id| task(id)).collect();
        b
    };
    s.heartbeat(beat("10.0.0.1:8335", &[])).unwrap();
    s.heartbeat(beat("10.0.0.2:8335", &[])).unwrap();
    let g1 = grant_one(&s, req()).await;
    let g2 = grant_one(&s, req()).await;
    let (on_a, on_b) = if g1.servant == addr("10.0.0.1:8335") {
        (g1, g2)
    } else {
        (g2, g1)
    };
    assert_eq!(on_b.servant, addr("10.0.0.2:8335"));

    // Ids returned as expired (unknown, or live on another servant) are left out.
    let reply = s
        .heartbeat(beat("10.0.0.1:8335", &[on_a.id, 999, on_b.id]))
        .unwrap();
    assert_eq!(reply.expired_grant_ids, vec![999, on_b.id]);
    let ids =
        |s: &Scheduler| -> Vec<u64> { s.running_tasks().iter().map(|t| t.grant_id).collect() };
    assert_eq!(ids(&s), vec![on_a.id]);

    // A servant that turns out to be behind NAT (same observed location,
    // another reported one) shows nothing, even its live grants.
    let mut nat = beat("10.0.0.2:8335", &[on_b.id]);
    s.heartbeat(nat.clone()).unwrap();
    assert_eq!(ids(&s), vec![on_a.id, on_b.id]);
    nat.location = "192.168.1.2:8335".into();
    nat.observed_ip = ip("10.0.0.2");
    s.heartbeat(nat).unwrap();
    assert_eq!(ids(&s), vec![on_a.id]);

    // A servant presenting only a user token (not verified) shows nothing.
    let mut unverified = beat("10.0.0.1:8335", &[on_a.id]);
    unverified.token = USER.into();
    s.heartbeat(unverified).unwrap();
    assert!(ids(&s).is_empty());
    s.heartbeat(beat("10.0.0.1:8335", &[on_a.id])).unwrap();
    assert_eq!(ids(&s), vec![on_a.id]);

    // A zombie (lease ended, still reported) is left out.
    advance(secs(16)).await;
    let reply = s.heartbeat(beat("10.0.0.1:8335", &[on_a.id])).unwrap();
    assert_eq!(reply.expired_grant_ids, vec![on_a.id]);
    assert!(ids(&s).is_empty());
}
