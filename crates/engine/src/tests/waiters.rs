//! Waiting requests: availability, timeouts, fairness between machines,
//! cancellation, bounds and shutdown.

use super::*;

#[tokio::test(start_paused = true)]
async fn environment_not_available_at_once_even_with_wait() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    let t0 = Instant::now();
    let err = s
        .wait_for_starting_task(GrantRequest {
            environment: "clang-17".into(),
            ..req_wait(secs(5))
        })
        .await
        .unwrap_err();
    assert_eq!(
        err,
        Rejection::EnvironmentNotAvailable {
            environment: "clang-17".into()
        }
    );
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn environment_disappearing_mid_wait_fails_the_waiter() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let _held = grant_one(&s, req()).await;
    let waiting = spawn_wait(&s, req_wait(secs(10)));
    settle().await;
    assert_eq!(s.snapshot().totals.waiters, 1);
    let t0 = Instant::now();
    // The servant drops the environment.
    let mut b = hb("10.0.0.1:8335", 1);
    b.environments = vec!["other".into()];
    s.heartbeat(b).unwrap();
    let err = waiting.await.unwrap().unwrap_err();
    assert!(matches!(err, Rejection::EnvironmentNotAvailable { .. }));
    assert_eq!(
        t0.elapsed(),
        Duration::ZERO,
        "answered at once, not at timeout"
    );
    assert_eq!(s.snapshot().totals.waiters, 0);
}

#[tokio::test(start_paused = true)]
async fn environment_disappearing_by_servant_expiry_fails_the_waiter() {
    let s = Scheduler::new(config());
    let mut b = hb("10.0.0.1:8335", 1);
    b.next_heartbeat_in = secs(3);
    s.heartbeat(b).unwrap();
    let _held = grant_one(&s, req()).await;
    let t0 = Instant::now();
    let err = s
        .wait_for_starting_task(req_wait(secs(10)))
        .await
        .unwrap_err();
    assert!(matches!(err, Rejection::EnvironmentNotAvailable { .. }));
    assert_eq!(t0.elapsed(), secs(3), "at the servant's expiry");
}

#[tokio::test(start_paused = true)]
async fn waiter_timeout_answers_no_quota() {
    let s = Scheduler::new(config());
    let mut b = hb("10.0.0.1:8335", 1);
    b.next_heartbeat_in = secs(30);
    s.heartbeat(b).unwrap();
    let _held = grant_one(&s, req()).await;
    let t0 = Instant::now();
    let err = s
        .wait_for_starting_task(req_wait(secs(2)))
        .await
        .unwrap_err();
    assert_eq!(err, Rejection::NoQuotaAvailable);
    assert_eq!(t0.elapsed(), secs(2));
    let snap = s.snapshot();
    assert_eq!(snap.totals.waiters, 0);
    assert_eq!(snap.counters.no_quota, 1);
    assert_eq!(snap.totals.grants, 1);
}

#[tokio::test(start_paused = true)]
async fn fairness_100_waiters_served_in_arrival_order() {
    // One call each from 100 machines never served: arrival order.
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let mut held = (grant_one(&s, req()).await, HOME.to_owned());
    let (tx, mut rx) = mpsc::unbounded_channel();
    for i in 0..100usize {
        let s = s.clone();
        let tx = tx.clone();
        let machine = format!("10.1.0.{i}");
        tokio::spawn(async move {
            let r = s
                .wait_for_starting_task(GrantRequest {
                    wait: secs(10),
                    answer_within: None,
                    ..req_from(&machine)
                })
                .await;
            let _ = tx.send((i, machine, r));
        });
        settle().await; // arrival order = spawn order
    }
    assert_eq!(s.snapshot().totals.waiters, 100);
    for expected in 0..100usize {
        s.free(USER, ip(&held.1), &[held.0.id]).unwrap();
        let (i, machine, r) = rx.recv().await.unwrap();
        assert_eq!(i, expected, "served in arrival order");
        let grants = r.unwrap();
        assert_eq!(grants.len(), 1);
        held = (grants[0], machine);
        // Exactly one slot: nobody else got one.
        assert_eq!(s.snapshot().totals.grants, 1);
    }
    assert_eq!(s.snapshot().totals.waiters, 0);
}

#[tokio::test(start_paused = true)]
async fn fairness_skips_waiters_the_capacity_cannot_satisfy() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap(); // version 1
    let mut newer = hb("10.0.0.2:8335", 1);
    newer.version = 2;
    s.heartbeat(newer).unwrap();
    let old_grant = grant_one(&s, req()).await;
    let new_grant = grant_one(&s, req()).await;
    assert_eq!(old_grant.servant, addr("10.0.0.1:8335"));
    assert_eq!(new_grant.servant, addr("10.0.0.2:8335"));

    let wait_for_version = |min_version: u32| {
        spawn_wait(
            &s,
            GrantRequest {
                min_version,
                ..req_wait(secs(10))
            },
        )
    };
    let needs_v2 = wait_for_version(2);
    settle().await;
    let any = wait_for_version(0);
    settle().await;

    // A version-1 slot frees: the first waiter cannot use it, the second gets it.
    free_one(&s, old_grant.id);
    let g = any.await.unwrap().unwrap();
    assert_eq!(g[0].servant, addr("10.0.0.1:8335"));
    assert!(!needs_v2.is_finished());
    free_one(&s, new_grant.id);
    let g = needs_v2.await.unwrap().unwrap();
    assert_eq!(g[0].servant, addr("10.0.0.2:8335"));
}

#[tokio::test(start_paused = true)]
async fn waiters_served_when_a_heartbeat_raises_capacity_or_a_servant_joins() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let _held = grant_one(&s, req()).await;
    let first = spawn_wait(&s, req_wait(secs(10)));
    settle().await;
    let second = spawn_wait(&s, req_wait(secs(10)));
    settle().await;
    // Capacity 1 -> 2.
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    assert_eq!(
        first.await.unwrap().unwrap()[0].servant,
        addr("10.0.0.1:8335")
    );
    assert!(!second.is_finished());
    // A new servant joins.
    s.heartbeat(hb("10.0.0.2:8335", 1)).unwrap();
    assert_eq!(
        second.await.unwrap().unwrap()[0].servant,
        addr("10.0.0.2:8335")
    );
}

#[tokio::test(start_paused = true)]
async fn cancelled_waiter_leaves_the_queue_and_the_next_is_served() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let held = grant_one(&s, req()).await;

    // A client that goes away: the future is dropped while queued.
    tokio::select! {
        _ = s.wait_for_starting_task(req_wait(secs(10))) => panic!("no capacity"),
        () = tokio::time::sleep(secs(1)) => {}
    }
    assert_eq!(
        s.snapshot().totals.waiters,
        0,
        "dropped future left the queue"
    );

    let gone = spawn_wait(&s, req_wait(secs(10)));
    settle().await;
    let next = spawn_wait(&s, req_wait(secs(10)));
    settle().await;
    gone.abort();
    settle().await;
    assert_eq!(s.snapshot().totals.waiters, 1);
    free_one(&s, held.id);
    let g = next.await.unwrap().unwrap();
    assert_eq!(g.len(), 1);
    assert_eq!(s.snapshot().totals.grants, 1, "no leaked grant");
}

#[tokio::test(start_paused = true)]
async fn cancelled_waiter_releases_a_grant_handed_to_it_but_not_received() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let held = grant_one(&s, req()).await;
    let gone = spawn_wait(&s, req_wait(secs(10)));
    settle().await;
    let next = spawn_wait(&s, req_wait(secs(10)));
    settle().await;
    // The free hands the slot to `gone` under the lock; it is cancelled before
    // it runs to receive it.
    free_one(&s, held.id);
    assert_eq!(s.snapshot().totals.grants, 1);
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    // Its grant was released and went to the next waiter.
    let g = next.await.unwrap().unwrap();
    assert_eq!(g.len(), 1);
    let snap = s.snapshot();
    assert_eq!(snap.totals.grants, 1, "no leaked grant");
    assert_eq!(snap.grants[0].id, g[0].id);
    assert_eq!(snap.counters.frees, 2);
}

#[tokio::test(start_paused = true)]
async fn max_waiters_answers_no_quota_at_once() {
    let s = Scheduler::new(Config {
        limits: Limits {
            max_waiters: 2,
            ..Limits::default()
        },
        ..config()
    });
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let _held = grant_one(&s, req()).await;
    let mut queued = Vec::new();
    for _ in 0..2 {
        queued.push(spawn_wait(&s, req_wait(secs(10))));
        settle().await;
    }
    let t0 = Instant::now();
    assert_eq!(
        s.wait_for_starting_task(req_wait(secs(10)))
            .await
            .unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    assert_eq!(t0.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn shutdown_answers_waiters_and_later_waits_do_not_block() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let held = grant_one(&s, req()).await;
    let waiters: Vec<_> = (0..2).map(|_| spawn_wait(&s, req_wait(secs(10)))).collect();
    settle().await;
    let t0 = Instant::now();
    s.shutdown();
    s.shutdown(); // idempotent
    for w in waiters {
        assert_eq!(w.await.unwrap().unwrap_err(), Rejection::NoQuotaAvailable);
    }
    assert_eq!(
        s.wait_for_starting_task(req_wait(secs(10)))
            .await
            .unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    assert_eq!(t0.elapsed(), Duration::ZERO, "nothing waited");
    // Capacity free right now is still granted.
    free_one(&s, held.id);
    assert_eq!(
        s.wait_for_starting_task(req_wait(secs(10)))
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn wait_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let s = Scheduler::new(config());
    let fut = s.wait_for_starting_task(req());
    assert_send(&fut);
    drop(fut);
}

#[tokio::test(start_paused = true)]
async fn prefetch_only_call_for_an_unoffered_environment_gets_no_quota() {
    let s = Scheduler::new(config());
    let prefetch_only = GrantRequest {
        immediate: 0,
        prefetch: 1,
        environment: "nobody-offers-this".into(),
        ..req_wait(secs(5))
    };
    assert_eq!(
        s.wait_for_starting_task(prefetch_only.clone())
            .await
            .unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    // With immediate requests it is still "environment not available".
    assert!(matches!(
        s.wait_for_starting_task(GrantRequest {
            immediate: 1,
            ..prefetch_only
        })
        .await
        .unwrap_err(),
        Rejection::EnvironmentNotAvailable { .. }
    ));

    // The same when the environment disappears while the call waits.
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let _held = grant_one(&s, req()).await;
    let waiting = spawn_wait(
        &s,
        GrantRequest {
            immediate: 0,
            prefetch: 1,
            ..req_wait(secs(10))
        },
    );
    settle().await;
    let mut b = hb("10.0.0.1:8335", 1);
    b.environments = vec!["other".into()];
    s.heartbeat(b).unwrap();
    assert_eq!(
        waiting.await.unwrap().unwrap_err(),
        Rejection::NoQuotaAvailable
    );
}

/// As the original answers them: an empty digest names an environment
/// nobody offers (even when a servant lists an empty one), and a call asking
/// for no grant gets none; both at once, counted as "no quota" when that is
/// the answer.
#[tokio::test(start_paused = true)]
async fn an_empty_digest_is_unavailable_and_asking_for_nothing_gets_no_quota() {
    let s = Scheduler::new(config());
    let mut b = hb("10.0.0.1:8335", 4);
    b.environments = vec![String::new(), ENV.into()];
    s.heartbeat(b).unwrap();
    let empty = GrantRequest {
        environment: String::new(),
        ..req_wait(secs(5))
    };
    assert!(matches!(
        s.wait_for_starting_task(empty.clone()).await.unwrap_err(),
        Rejection::EnvironmentNotAvailable { .. }
    ));
    assert_eq!(
        s.wait_for_starting_task(GrantRequest {
            immediate: 0,
            prefetch: 1,
            ..empty.clone()
        })
        .await
        .unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    let asked = Instant::now();
    for environment in [ENV, ""] {
        assert_eq!(
            s.wait_for_starting_task(GrantRequest {
                immediate: 0,
                prefetch: 0,
                environment: environment.into(),
                ..req_wait(secs(5))
            })
            .await
            .unwrap_err(),
            Rejection::NoQuotaAvailable,
            "{environment:?}"
        );
    }
    assert_eq!(Instant::now(), asked, "answered at once, never queued");
    assert_eq!(s.totals().1.no_quota, 3);
    assert_eq!(s.totals().0.grants, 0, "nothing was granted");
}

#[tokio::test(start_paused = true)]
async fn a_freed_slot_goes_to_the_machine_served_least_recently() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let mut held = (grant_one(&s, req_from("10.3.3.3")).await, "10.3.3.3");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let queue = |machine: &'static str, n| spawn_labelled(&s, &tx, machine, req_from(machine), n);
    // One machine queues 40 long polls, then a colleague's machine one.
    queue("10.1.1.1", 40);
    settle().await;
    queue("10.2.2.2", 1);
    settle().await;
    assert_eq!(s.snapshot().totals.waiters, 41);
    let mut order = Vec::new();
    for _ in 0..3 {
        s.free(USER, ip(held.1), &[held.0.id]).unwrap();
        let (machine, r) = rx.recv().await.unwrap();
        held = (r.unwrap()[0], machine);
        order.push(machine);
    }
    // The first slot goes to the first in line; the second to the machine
    // not served yet, not to the 40-poll build; then the build again.
    assert_eq!(order, ["10.1.1.1", "10.2.2.2", "10.1.1.1"]);
}

#[tokio::test(start_paused = true)]
async fn one_requesters_waiters_are_capped() {
    let s = Scheduler::new(Config {
        limits: Limits {
            max_waiters_per_requester: 2,
            ..Limits::default()
        },
        ..config()
    });
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let _held = grant_one(&s, req()).await;
    let mut queued = Vec::new();
    for machine in ["10.1.1.1", "10.1.1.1", "10.2.2.2"] {
        queued.push(spawn_wait(
            &s,
            GrantRequest {
                wait: secs(10),
                answer_within: None,
                ..req_from(machine)
            },
        ));
        settle().await;
    }
    assert_eq!(s.snapshot().totals.waiters, 3);
    let t0 = Instant::now();
    assert_eq!(
        s.wait_for_starting_task(GrantRequest {
            wait: secs(10),
            answer_within: None,
            ..req_from("10.1.1.1")
        })
        .await
        .unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    assert_eq!(t0.elapsed(), Duration::ZERO, "at once");
    let by_ip = |ip_: &str| {
        s.snapshot()
            .requesters
            .into_iter()
            .find(|r| r.ip == ip(ip_))
            .unwrap()
    };
    assert_eq!(by_ip("10.1.1.1").waiting, 2);
    assert_eq!(by_ip("10.1.1.1").wait_cap_refusals, 1, "the cap bit");
    assert_eq!(by_ip("10.2.2.2").waiting, 1);
    assert_eq!(by_ip("10.2.2.2").wait_cap_refusals, 0);
    assert_eq!(by_ip(HOME).grants_held, 1);
    assert_eq!(by_ip(HOME).grants_total, 1);
    let counters = s.totals().1;
    assert_eq!(
        (
            counters.wait_refused_requester_cap,
            counters.wait_refused_total_cap
        ),
        (1, 0)
    );
}

/// Daemons behind one NAT address are requesters of their own, one per
/// connection: each has its own cap, and the total cap still holds.
#[tokio::test(start_paused = true)]
async fn each_daemon_connection_has_its_own_waiter_cap_under_the_total() {
    let s = Scheduler::new(Config {
        limits: Limits {
            max_waiters_per_requester: 2,
            max_waiters: 6,
            ..Limits::default()
        },
        ..config()
    });
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let _held = grant_one(&s, req()).await;
    let waiting = |r: GrantRequest| GrantRequest {
        wait: secs(10),
        answer_within: None,
        ..r
    };
    let mut queued = Vec::new();
    // Two connections of one office address, two long polls each, and a
    // JSON caller from the same address (its own requester).
    for r in [
        req_on("10.5.5.5", 1),
        req_on("10.5.5.5", 1),
        req_on("10.5.5.5", 2),
        req_on("10.5.5.5", 2),
        req_from("10.5.5.5"),
    ] {
        queued.push(spawn_wait(&s, waiting(r)));
        settle().await;
    }
    assert_eq!(s.snapshot().totals.waiters, 5, "none refused by a cap");
    let office = |s: &Scheduler| {
        s.snapshot()
            .requesters
            .into_iter()
            .find(|r| r.ip == ip("10.5.5.5"))
            .unwrap()
    };
    assert_eq!(office(&s).waiting, 5);
    assert_eq!(office(&s).waiting_requesters, 3);
    assert_eq!(office(&s).wait_cap_refusals, 0);

    // A third call on connection 1: its own cap.
    let refused = s.wait_for_starting_task(waiting(req_on("10.5.5.5", 1)));
    assert_eq!(refused.await.unwrap_err(), Rejection::NoQuotaAvailable);
    // A new connection queues, up to the total; then the total is full.
    queued.push(spawn_wait(&s, waiting(req_on("10.5.5.5", 3))));
    settle().await;
    assert_eq!(s.snapshot().totals.waiters, 6);
    let refused = s.wait_for_starting_task(waiting(req_on("10.5.5.5", 4)));
    assert_eq!(refused.await.unwrap_err(), Rejection::NoQuotaAvailable);
    let counters = s.totals().1;
    assert_eq!(
        (
            counters.wait_refused_requester_cap,
            counters.wait_refused_total_cap
        ),
        (1, 1)
    );
    assert_eq!(office(&s).wait_cap_refusals, 2);
    assert_eq!(office(&s).waiting_requesters, 4);
    assert_eq!(s.snapshot().totals.waiters, 6);
}

/// Rule "fair shares per requester": behind one address, a daemon's
/// connection with one long poll takes turns with another's forty.
#[tokio::test(start_paused = true)]
async fn daemons_behind_one_address_take_turns_by_connection() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let mut held = grant_one(&s, req_from("10.3.3.3")).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let queue =
        |connection: u64, n| spawn_labelled(&s, &tx, connection, req_on("10.5.5.5", connection), n);
    queue(1, 40);
    settle().await;
    queue(2, 1);
    settle().await;
    let mut order = Vec::new();
    let mut owner = "10.3.3.3";
    for _ in 0..3 {
        s.free(USER, ip(owner), &[held.id]).unwrap();
        let (connection, r) = rx.recv().await.unwrap();
        held = r.unwrap()[0];
        owner = "10.5.5.5";
        order.push(connection);
    }
    assert_eq!(order, [1, 2, 1], "the single poll did not wait for forty");
}

/// Rule "grant ownership" stays with the address and token: a grant
/// received on one of a daemon's connections is renewed and freed on the
/// other.
#[tokio::test(start_paused = true)]
async fn a_grant_is_the_address_s_whatever_the_connection_it_came_on() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    let g = grant_one(&s, req_on("10.5.5.5", 7)).await;
    let renewed = s.keep_alive(USER, ip("10.5.5.5"), &[g.id], secs(10));
    assert_eq!(renewed.unwrap(), vec![true]);
    s.free(USER, ip("10.5.5.5"), &[g.id]).unwrap();
    assert_eq!(s.totals().0.grants, 0);
    let office = s
        .snapshot()
        .requesters
        .into_iter()
        .find(|r| r.ip == ip("10.5.5.5"))
        .unwrap();
    assert_eq!((office.grants_total, office.refused_total), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn fair_shares_hold_across_environments_and_versions() {
    // Two environments on one servant; machine A waits in both, B in one.
    // Freed slots alternate between machines, whatever the environment.
    let s = Scheduler::new(config());
    let mut b = hb("10.0.0.1:8335", 1);
    b.environments = vec!["x".into(), "y".into()];
    s.heartbeat(b).unwrap();
    let env = |e: &str, machine: &str| GrantRequest {
        environment: e.into(),
        wait: secs(10),
        answer_within: None,
        ..req_from(machine)
    };
    let mut held = (
        grant_one(&s, env("x", "10.3.3.3")).await,
        "10.3.3.3".to_owned(),
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    for (e, machine) in [
        ("x", "10.1.1.1"),
        ("y", "10.1.1.1"),
        ("x", "10.1.1.1"),
        ("y", "10.2.2.2"),
    ] {
        let s = s.clone();
        let tx = tx.clone();
        let r = env(e, machine);
        tokio::spawn(async move {
            let _ = tx.send((
                r.requester_ip.to_string(),
                s.wait_for_starting_task(r).await,
            ));
        });
        settle().await;
    }
    let mut order = Vec::new();
    for _ in 0..4 {
        s.free(USER, ip(&held.1), &[held.0.id]).unwrap();
        let (machine, r) = rx.recv().await.unwrap();
        held = (r.unwrap()[0], machine.clone());
        order.push(machine);
    }
    assert_eq!(order, ["10.1.1.1", "10.2.2.2", "10.1.1.1", "10.1.1.1"]);
}
