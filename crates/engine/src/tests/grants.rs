//! Grants: issue, lease, renew, free, ids and their table, ownership.

use super::*;

#[tokio::test(start_paused = true)]
async fn full_lifecycle_heartbeat_grant_renew_free_expiry() {
    let s = Scheduler::new(config());
    let reply = s.heartbeat(hb("127.0.0.1:1234", 10)).unwrap();
    assert_eq!(reply.acceptable_tokens.len(), 3);
    assert!(reply.expired_grant_ids.is_empty());

    // Unknown environment fails at once.
    let err = s
        .wait_for_starting_task(GrantRequest {
            environment: "not found".into(),
            ..req_wait(secs(1))
        })
        .await
        .unwrap_err();
    assert_eq!(
        err,
        Rejection::EnvironmentNotAvailable {
            environment: "not found".into()
        }
    );

    // Ten grants, all on the one servant (the requester's own machine is the last resort).
    let mut grants = Vec::new();
    for _ in 0..10 {
        let g = grant_one(
            &s,
            GrantRequest {
                requester_ip: ip("127.0.0.1"),
                lease: secs(5),
                ..req_wait(secs(1))
            },
        )
        .await;
        assert_eq!(g.servant, addr("127.0.0.1:1234"));
        assert_ne!(g.id, 0);
        assert!(!g.prefetch);
        grants.push(g.id);
    }

    // The eleventh waits the full second and gets nothing.
    let t0 = Instant::now();
    let err = s
        .wait_for_starting_task(req_wait(secs(1)))
        .await
        .unwrap_err();
    assert_eq!(err, Rejection::NoQuotaAvailable);
    assert_eq!(t0.elapsed(), secs(1));

    // Renew: unknown -> false, ours -> true.
    assert_eq!(
        s.keep_alive(USER, ip("127.0.0.1"), &[12_345_678], secs(1))
            .unwrap(),
        vec![false]
    );
    assert_eq!(
        s.keep_alive(USER, ip("127.0.0.1"), &grants, secs(1))
            .unwrap(),
        vec![true; 10]
    );

    // Ids the engine never granted are returned as expired.
    let mut beat = hb("127.0.0.1:1234", 10);
    beat.running_tasks = vec![task(grants[0]), task(1_000_002), task(1_000_003)];
    let reply = s.heartbeat(beat).unwrap();
    assert_eq!(reply.expired_grant_ids, vec![1_000_002, 1_000_003]);

    // Leases end: renewals fail, listed ids come back expired.
    advance(secs(2)).await;
    assert_eq!(
        s.keep_alive(USER, ip("127.0.0.1"), &grants, secs(1))
            .unwrap(),
        vec![false; 10]
    );
    let mut beat = hb("127.0.0.1:1234", 10);
    beat.running_tasks = grants.iter().map(|&id| task(id)).collect();
    assert_eq!(s.heartbeat(beat).unwrap().expired_grant_ids, grants);

    // Free them all; the servant then expires.
    s.free(USER, ip("127.0.0.1"), &grants).unwrap();
    let mut beat = hb("127.0.0.1:1234", 10);
    beat.next_heartbeat_in = secs(1);
    s.heartbeat(beat).unwrap();
    advance(secs(2)).await;
    let err = s
        .wait_for_starting_task(req_wait(secs(1)))
        .await
        .unwrap_err();
    assert!(matches!(err, Rejection::EnvironmentNotAvailable { .. }));
    let snap = s.snapshot();
    assert!(snap.servants.is_empty());
    assert!(snap.grants.is_empty());
    assert_eq!(snap.counters.servants_expired, 1);
    assert_eq!(snap.counters.grants_issued, 10);
    assert_eq!(snap.counters.leases_expired, 10);
    assert_eq!(snap.counters.renewals, 10);
}

#[tokio::test(start_paused = true)]
async fn partial_grants_immediate_first_then_prefetch() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 3)).unwrap();
    let grants = s
        .wait_for_starting_task(GrantRequest {
            immediate: 2,
            prefetch: 3,
            ..req()
        })
        .await
        .unwrap();
    assert_eq!(grants.len(), 3, "fewer than asked: only 3 slots");
    let flags: Vec<bool> = grants.iter().map(|g| g.prefetch).collect();
    assert_eq!(flags, [false, false, true]);
    let ids: HashSet<u64> = grants.iter().map(|g| g.id).collect();
    assert_eq!(ids.len(), 3);

    // Prefetch only: the first grant is a prefetch grant.
    s.free(
        USER,
        ip(HOME),
        &grants.iter().map(|g| g.id).collect::<Vec<_>>(),
    )
    .unwrap();
    let grants = s
        .wait_for_starting_task(GrantRequest {
            immediate: 0,
            prefetch: 2,
            ..req()
        })
        .await
        .unwrap();
    assert_eq!(grants.len(), 2);
    assert!(grants.iter().all(|g| g.prefetch));
}

#[tokio::test(start_paused = true)]
async fn only_the_first_grant_waits() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    let a = grant_one(&s, req()).await;
    let b = grant_one(&s, req()).await;
    let waiting = spawn_wait(
        &s,
        GrantRequest {
            immediate: 3,
            ..req_wait(secs(5))
        },
    );
    settle().await;
    free_one(&s, a.id);
    settle().await;
    // One slot freed: the waiter returns with one grant, not waiting for more.
    let grants = waiting.await.unwrap().unwrap();
    assert_eq!(grants.len(), 1);
    free_one(&s, b.id);
    assert_eq!(s.snapshot().totals.waiters, 0);
    assert_eq!(s.snapshot().totals.grants, 1);
}

#[tokio::test(start_paused = true)]
async fn woken_waiter_takes_extras_when_nobody_else_waits() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let a = grant_one(&s, req()).await;
    let waiting = spawn_wait(
        &s,
        GrantRequest {
            immediate: 2,
            prefetch: 1,
            ..req_wait(secs(5))
        },
    );
    settle().await;
    // The servant grows to 4 slots and the held grant is freed: 4 free now.
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    free_one(&s, a.id);
    let grants = waiting.await.unwrap().unwrap();
    let flags: Vec<bool> = grants.iter().map(|g| g.prefetch).collect();
    assert_eq!(flags, [false, false, true]);
}

#[tokio::test(start_paused = true)]
async fn grant_lease_runs_from_the_moment_of_the_grant() {
    let s = Scheduler::new(config());
    let mut b = hb("10.0.0.1:8335", 2);
    b.next_heartbeat_in = secs(30);
    s.heartbeat(b).unwrap();
    let g = grant_one(
        &s,
        GrantRequest {
            lease: secs(3),
            ..req()
        },
    )
    .await;
    let view = s.snapshot().grants[0].clone();
    assert_eq!(view.lease_left, secs(3));
    advance(ms(2_900)).await;
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[g.id], secs(3)).unwrap(),
        vec![true]
    );
    advance(ms(2_900)).await;
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[g.id], secs(3)).unwrap(),
        vec![true],
        "renewed lease"
    );
    advance(ms(3_100)).await;
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[g.id], secs(3)).unwrap(),
        vec![false]
    );
}

#[tokio::test(start_paused = true)]
async fn keep_alive_one_status_per_id_in_order() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    let a = grant_one(&s, req()).await;
    let z = grant_one(
        &s,
        GrantRequest {
            lease: secs(1),
            ..req()
        },
    )
    .await;
    let b = grant_one(&s, req()).await;
    advance(secs(2)).await; // z becomes a zombie
    let statuses = s
        .keep_alive(USER, ip(HOME), &[a.id, 777, z.id, b.id, a.id], secs(10))
        .unwrap();
    assert_eq!(statuses, [true, false, false, true, true]);
}

#[tokio::test(start_paused = true)]
async fn free_with_unknown_ids_in_the_middle_frees_all_known_ones() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 3)).unwrap();
    let g: Vec<u64> = s
        .wait_for_starting_task(GrantRequest {
            immediate: 3,
            ..req()
        })
        .await
        .unwrap()
        .iter()
        .map(|g| g.id)
        .collect();
    s.free(USER, ip(HOME), &[g[0], 999, g[1], 0, 12345, g[2]])
        .unwrap();
    let snap = s.snapshot();
    assert!(snap.grants.is_empty());
    assert_eq!(snap.counters.frees, 3);
    assert_eq!(snap.servants[0].running, 0);
    // Capacity is back at once.
    assert_eq!(
        s.wait_for_starting_task(GrantRequest {
            immediate: 3,
            ..req()
        })
        .await
        .unwrap()
        .len(),
        3
    );
}

#[tokio::test(start_paused = true)]
async fn grant_ids_unique_and_nonzero_across_two_instances() {
    let mut seen = HashSet::new();
    for _ in 0..2 {
        let s = Scheduler::new(config());
        s.heartbeat(hb("10.0.0.1:8335", 2048)).unwrap();
        for _ in 0..2 {
            let grants = s
                .wait_for_starting_task(GrantRequest {
                    immediate: 1000,
                    ..req()
                })
                .await
                .unwrap();
            assert_eq!(grants.len(), 1000);
            for g in grants {
                assert_ne!(g.id, 0);
                assert!(seen.insert(g.id), "id {} reused", g.id);
            }
        }
    }
    assert_eq!(seen.len(), 4000);
}

#[tokio::test(start_paused = true)]
async fn grant_ids_look_random_even_when_a_slot_is_reused() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let mut ids = HashSet::new();
    let mut low_bits = HashSet::new();
    let mut high_bits_seen = 0u64;
    for _ in 0..2_000 {
        // The same table slot every time.
        let g = grant_one(&s, req()).await;
        assert_ne!(g.id, 0);
        assert!(ids.insert(g.id));
        low_bits.insert(g.id & 0xff_ffff);
        assert!(
            g.id < 1 << 53,
            "{} is beyond a double's exact integers",
            g.id
        );
        high_bits_seen = high_bits_seen.max(g.id);
        free_one(&s, g.id);
        assert_eq!(
            s.keep_alive(USER, ip(HOME), &[g.id], secs(1)).unwrap(),
            [false]
        );
    }
    assert!(low_bits.len() > 1_900, "the slot does not show in the id");
    assert!(
        high_bits_seen >= 1 << 52,
        "ids reach the top of the 53 bits: drawn over all of them"
    );
}

#[test]
fn grant_table_slab_and_side_map_hold_distinct_ids() {
    use crate::grants::{GrantRec, GrantTable};
    let rec = |adopted: bool| GrantRec {
        servant: 1,
        servant_addr: addr("10.0.0.1:8335"),
        owner: None,
        tenant: None,
        environment: None,
        granted_at: Instant::now(),
        lease_until: Instant::now(),
        prefetch: false,
        zombie: false,
        adopted,
        listed: false,
    };
    let mut t = GrantTable::with_slot_limit(4);
    t.insert_adopted(42, rec(true));
    let ids: Vec<u64> = (0..10).map(|_| t.insert_new(rec(false))).collect();
    assert_eq!(t.len(), 11);
    let distinct: HashSet<u64> = ids.iter().copied().chain([42]).collect();
    assert_eq!(distinct.len(), 11);
    assert!(ids.iter().all(|&id| id != 0 && t.contains_key(&id)));
    assert!(
        ids.iter().all(|&id| id < 1 << 53),
        "slab and side-map ids survive a JSON reader's doubles: {ids:?}"
    );
    assert!(t.get(&42).is_some_and(|g| g.adopted));
    assert!(!t.contains_key(&0));
    assert!(!t.contains_key(&43));
    assert_eq!(t.iter().count(), 11);
    for id in &ids {
        assert!(t.remove(id).is_some());
        assert!(t.remove(id).is_none());
        assert!(!t.contains_key(id));
    }
    assert_eq!(t.len(), 1);
    // Freed slots are reused under new ids.
    let again = t.insert_new(rec(false));
    assert!(!ids.contains(&again));
    assert!(t.get_mut(&again).is_some());
}

#[tokio::test(start_paused = true)]
async fn grants_above_the_per_call_limit_are_capped_never_refused() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 2000)).unwrap();
    // A delegate running `make -j1100` asks for 1100 + 1.
    let grants = s
        .wait_for_starting_task(GrantRequest {
            immediate: 1100,
            prefetch: 1,
            ..req()
        })
        .await
        .expect("capped, not refused");
    assert_eq!(grants.len(), 1024);
    assert!(grants.iter().all(|g| !g.prefetch), "immediate ones first");
    // Absurd values are capped the same way.
    let grants = s
        .wait_for_starting_task(GrantRequest {
            immediate: u32::MAX,
            prefetch: u32::MAX,
            ..req()
        })
        .await
        .unwrap();
    assert_eq!(grants.len(), 2000 - 1024, "what the cluster has");
}

#[tokio::test(start_paused = true)]
async fn a_grant_belongs_to_its_token_whatever_address_renews_it() {
    let s = Scheduler::new(Config {
        user_tokens: TokenSet::new([USER, "other-user"]),
        ..config()
    });
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    let g = grant_one(&s, req()).await;
    // Another token, on the holder's machine and on another: refused.
    assert_eq!(
        s.keep_alive("other-user", ip(HOME), &[g.id], secs(10))
            .unwrap(),
        [false]
    );
    s.free("other-user", ip("10.7.7.7"), &[g.id]).unwrap();
    // A guessed id with the holder's own token is unknown, not a renewal.
    assert_eq!(
        s.keep_alive(USER, ip("10.7.7.7"), &[g.id ^ 1], secs(10))
            .unwrap(),
        [false]
    );
    let snap = s.snapshot();
    assert_eq!(snap.totals.grants, 1, "the stranger's free was skipped");
    assert_eq!(snap.counters.renewals_refused, 1);
    assert_eq!(snap.counters.frees_refused, 1);
    assert_eq!(snap.counters.frees, 0);
    let stranger = snap
        .requesters
        .iter()
        .find(|r| r.ip == ip("10.7.7.7"))
        .unwrap();
    assert_eq!(stranger.refused_total, 1);
    // The holder's token from a second address (a NAT pool that is not
    // sticky) keeps the task through several leases, then frees it there.
    for _ in 0..6 {
        tokio::time::advance(secs(8)).await;
        s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
        assert_eq!(
            s.keep_alive(USER, ip("10.7.7.7"), &[g.id], secs(10))
                .unwrap(),
            [true]
        );
    }
    let snap = s.snapshot();
    assert_eq!(snap.totals.grants, 1, "alive after 48 s of 10 s leases");
    assert_eq!(snap.counters.renewals_refused, 1, "none of them refused");
    let mapped: IpAddr = "::ffff:10.9.9.9".parse().unwrap();
    assert_eq!(
        s.keep_alive(USER, mapped, &[g.id], secs(10)).unwrap(),
        [true]
    );
    s.free(USER, ip("10.7.7.7"), &[g.id]).unwrap();
    let snap = s.snapshot();
    assert_eq!(snap.totals.grants, 0);
    assert_eq!(snap.counters.frees, 1);
    let home = snap.requesters.iter().find(|r| r.ip == ip(HOME)).unwrap();
    assert_eq!(home.grants_held, 0, "the receiver's address held it");
}

/// A scheduler with one live grant of 127.0.0.1's, and ids of 4 slices and a
/// bit, unknown but that grant's at the returned index (in the fourth slice).
async fn one_grant_among_unknown_ids() -> (Scheduler, Grant, Vec<u64>, usize) {
    let s = Scheduler::new(config());
    s.heartbeat(hb("127.0.0.1:1234", 10)).unwrap();
    let live = grant_one(
        &s,
        GrantRequest {
            requester_ip: ip("127.0.0.1"),
            ..req_wait(secs(1))
        },
    )
    .await;
    let mut ids: Vec<u64> = (1..=(4 * ID_SLICE as u64 + 10)).collect();
    let at = 3 * ID_SLICE + 5;
    ids[at] = live.id;
    (s, live, ids, at)
}

#[tokio::test(start_paused = true)]
async fn a_huge_renewal_lets_other_calls_through_between_slices() {
    let (s, live, ids, at) = one_grant_among_unknown_ids().await;
    let renewing = {
        let s = s.clone();
        tokio::spawn(async move {
            s.keep_alive_in_slices(USER, ip("127.0.0.1"), &ids, secs(10))
                .await
        })
    };
    // Another call runs while the renewal is under way: the renewal yields
    // between its slices instead of holding the engine for the whole batch.
    tokio::task::yield_now().await;
    assert!(!renewing.is_finished(), "the renewal is sliced");
    let other = s
        .keep_alive(USER, ip("127.0.0.1"), &[live.id], secs(10))
        .unwrap();
    assert_eq!(other, [true]);
    let statuses = renewing.await.unwrap().unwrap();
    assert_eq!(
        statuses.len(),
        4 * ID_SLICE + 10,
        "one status per id, in order"
    );
    assert!(statuses[at]);
    assert_eq!(statuses.iter().filter(|&&renewed| renewed).count(), 1);
    // The checks come first, as for a small call.
    assert_eq!(
        s.keep_alive_in_slices("wrong", ip("127.0.0.1"), &[live.id], secs(10))
            .await
            .unwrap_err(),
        Rejection::AccessDenied
    );
}

#[tokio::test(start_paused = true)]
async fn a_huge_release_lets_other_calls_through_between_slices() {
    let (s, live, ids, _) = one_grant_among_unknown_ids().await;
    let freeing = {
        let s = s.clone();
        tokio::spawn(async move { s.free_in_slices(USER, ip("127.0.0.1"), &ids).await })
    };
    tokio::task::yield_now().await;
    assert!(!freeing.is_finished(), "the release is sliced");
    // Between slices another call runs, and the grant in a later slice is
    // still held.
    assert_eq!(
        s.keep_alive(USER, ip("127.0.0.1"), &[live.id], secs(10))
            .unwrap(),
        [true]
    );
    freeing.await.unwrap().unwrap();
    assert_eq!(
        s.keep_alive(USER, ip("127.0.0.1"), &[live.id], secs(10))
            .unwrap(),
        [false],
        "freed by its slice"
    );
    // The checks come first, as for a small call.
    assert_eq!(
        s.free_in_slices("wrong", ip("127.0.0.1"), &[live.id])
            .await
            .unwrap_err(),
        Rejection::AccessDenied
    );
}
