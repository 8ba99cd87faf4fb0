//! Expiry: zombies, servants that stop beating, and the expiry task itself.

use super::*;

#[tokio::test(start_paused = true)]
async fn zombie_counts_until_the_servant_stops_listing_it() {
    let s = Scheduler::new(config());
    let mut b = hb("10.0.0.1:8335", 1);
    b.next_heartbeat_in = secs(30);
    s.heartbeat(b.clone()).unwrap();
    let g = grant_one(
        &s,
        GrantRequest {
            lease: secs(5),
            ..req()
        },
    )
    .await;
    advance(secs(6)).await;
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[g.id], secs(5)).unwrap(),
        vec![false]
    );
    let v = servant_view(&s, "10.0.0.1:8335");
    assert_eq!((v.running, v.zombies), (1, 1));
    assert_eq!(
        s.wait_for_starting_task(req()).await.unwrap_err(),
        Rejection::NoQuotaAvailable,
        "a zombie still holds its slot"
    );

    // Still listed: returned as expired, still counted.
    b.running_tasks = vec![task(g.id)];
    assert_eq!(
        s.heartbeat(b.clone()).unwrap().expired_grant_ids,
        vec![g.id]
    );
    assert_eq!(servant_view(&s, "10.0.0.1:8335").running, 1);

    // A waiter queues; the next heartbeat no longer lists the zombie: it is
    // forgotten and its slot serves the waiter.
    let waiting = spawn_wait(&s, req_wait(secs(10)));
    settle().await;
    b.running_tasks.clear();
    assert!(s.heartbeat(b).unwrap().expired_grant_ids.is_empty());
    assert_eq!(waiting.await.unwrap().unwrap().len(), 1);
    let snap = s.snapshot();
    assert_eq!(snap.counters.leases_expired, 1);
    assert_eq!(snap.counters.zombies_reaped, 1);
    assert_eq!(snap.servants[0].zombies, 0);
    assert_eq!(snap.servants[0].running, 1);
}

#[tokio::test(start_paused = true)]
async fn zombie_freed_explicitly_releases_capacity() {
    let s = Scheduler::new(config());
    let mut b = hb("10.0.0.1:8335", 1);
    b.next_heartbeat_in = secs(30);
    s.heartbeat(b).unwrap();
    let g = grant_one(
        &s,
        GrantRequest {
            lease: secs(1),
            ..req()
        },
    )
    .await;
    advance(secs(2)).await;
    assert_eq!(s.snapshot().servants[0].zombies, 1);
    free_one(&s, g.id);
    assert_eq!(grant_one(&s, req()).await.servant, addr("10.0.0.1:8335"));
}

#[tokio::test(start_paused = true)]
async fn orphan_sweep_drops_grants_of_an_expired_servant() {
    let s = Scheduler::new(config());
    let mut b = hb("10.0.0.1:8335", 4);
    b.next_heartbeat_in = secs(5);
    s.heartbeat(b).unwrap();
    let live = grant_one(
        &s,
        GrantRequest {
            lease: secs(30),
            ..req()
        },
    )
    .await;
    let zombie = grant_one(
        &s,
        GrantRequest {
            lease: secs(1),
            ..req()
        },
    )
    .await;
    let mut b = hb("10.0.0.1:8335", 4);
    b.running_tasks = vec![task(live.id), task(zombie.id)];
    b.next_heartbeat_in = secs(5);
    s.heartbeat(b).unwrap();
    assert_eq!(s.running_tasks().len(), 2);
    advance(secs(6)).await;
    let snap = s.snapshot();
    assert!(snap.servants.is_empty());
    assert!(
        snap.grants.is_empty(),
        "live and zombie grants forgotten at once"
    );
    assert!(s.running_tasks().is_empty(), "reported tasks dropped");
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[live.id], secs(5)).unwrap(),
        vec![false]
    );
    s.free(USER, ip(HOME), &[live.id, zombie.id]).unwrap();
    assert_eq!(s.snapshot().counters.frees, 0);
}

#[tokio::test(start_paused = true)]
async fn expiry_task_stops_when_the_last_handle_is_dropped() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let shared = s.shared().clone();
    let clone = s.clone();
    drop(s);
    settle().await;
    assert!(
        !shared.with_state(|st, _| st.is_stopped()),
        "a clone is still alive"
    );
    drop(clone);
    settle().await;
    assert_eq!(Arc::strong_count(&shared), 1, "the expiry task let go");
}

#[tokio::test(start_paused = true)]
async fn the_edge_sees_the_addresses_of_live_servants_only() {
    let s = Scheduler::new(config());
    let hosts = s.servant_hosts();
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    s.heartbeat(hb("10.0.0.1:8336", 1)).unwrap();
    let mut short = hb("10.0.0.2:8335", 1);
    short.next_heartbeat_in = secs(2);
    s.heartbeat(short).unwrap();
    assert!(hosts.includes(ip("10.0.0.1")));
    assert!(
        hosts.includes(ip("::ffff:10.0.0.2")),
        "one address, either form"
    );
    assert!(!hosts.includes(ip("10.0.0.3")));

    // Silent past its interval: no longer a servant's address.
    advance(secs(3)).await;
    settle().await;
    assert!(!hosts.includes(ip("10.0.0.2")));
    // One of two servants on an address leaves; the other keeps it.
    let mut leaving = hb("10.0.0.1:8336", 1);
    leaving.next_heartbeat_in = Duration::ZERO;
    s.heartbeat(leaving).unwrap();
    settle().await;
    assert!(hosts.includes(ip("10.0.0.1")));

    // A restart forgets every servant, for the handle taken before too.
    s.restart();
    assert!(!hosts.includes(ip("10.0.0.1")));
    s.heartbeat(hb("10.0.0.4:8335", 1)).unwrap();
    assert!(hosts.includes(ip("10.0.0.4")));
}
