//! The adoption window after a restart: what is adopted, what never is, early
//! renewals and frees, and the bounds of its memory.

use super::*;

#[tokio::test(start_paused = true)]
async fn adoption_window_adopts_unknown_tasks_then_expires_them() {
    let s = Scheduler::new(Config {
        adoption_window: secs(15),
        adopted_lease: secs(15),
        ..config()
    });
    // Just after a restart: a servant reports tasks under grants we do not know.
    let beat = |tasks: &[u64]| {
        let mut b = hb("10.0.0.1:8335", 2);
        b.next_heartbeat_in = secs(30);
        b.running_tasks = tasks.iter().map(|&id| task(id)).collect();
        b
    };
    let b = beat(&[42, 43]);
    let reply = s.heartbeat(b).unwrap();
    assert!(reply.expired_grant_ids.is_empty(), "adopted, not killed");
    let snap = s.snapshot();
    assert_eq!(snap.counters.adoptions, 2);
    assert!(
        snap.grants
            .iter()
            .all(|g| g.adopted && g.requester.is_none())
    );
    assert_eq!(snap.servants[0].running, 2);
    // They count against capacity.
    assert_eq!(
        s.wait_for_starting_task(req()).await.unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    // An id known on another servant is never adopted.
    let mut other = hb("10.0.0.2:8335", 2);
    other.running_tasks = vec![task(42)];
    assert_eq!(s.heartbeat(other).unwrap().expired_grant_ids, vec![42]);

    // The owner renews 42 and frees nothing; 43 is never renewed.
    advance(secs(10)).await;
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[42], secs(15)).unwrap(),
        vec![true]
    );
    assert!(
        s.heartbeat(beat(&[42, 43]))
            .unwrap()
            .expired_grant_ids
            .is_empty()
    );

    // After the window: unknown ids are expired; 43's lease ended (zombie).
    advance(secs(6)).await;
    let reply = s.heartbeat(beat(&[42, 43, 44])).unwrap();
    assert_eq!(reply.expired_grant_ids, vec![43, 44]);
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[42, 43], secs(15)).unwrap(),
        [true, false]
    );
    // Adopted grants are freeable.
    s.free(USER, ip(HOME), &[42]).unwrap();
    assert_eq!(grant_one(&s, req()).await.servant.port(), 8335);
}

#[tokio::test(start_paused = true)]
async fn adoption_only_from_verified_servants_not_behind_nat() {
    let s = Scheduler::new(restarted());
    let mut unverified = beat_with("10.0.0.1:8335", &[41]);
    unverified.token = USER.into();
    assert_eq!(s.heartbeat(unverified).unwrap().expired_grant_ids, [41]);
    let mut nat = beat_with("192.168.0.2:8335", &[42]);
    nat.observed_ip = ip("10.0.0.2");
    assert_eq!(s.heartbeat(nat).unwrap().expired_grant_ids, [42]);
    assert!(
        s.heartbeat(beat_with("10.0.0.3:8335", &[43]))
            .unwrap()
            .expired_grant_ids
            .is_empty()
    );
    let snap = s.snapshot();
    assert_eq!(snap.counters.adoptions, 1);
    assert_eq!(snap.grants.len(), 1);
    assert_eq!(snap.grants[0].id, 43);
}

#[tokio::test(start_paused = true)]
async fn an_id_this_instance_issued_freed_or_expired_is_never_adopted() {
    let s = Scheduler::new(restarted());
    s.heartbeat(beat_with("10.0.0.1:8335", &[])).unwrap();
    let freed = grant_one(&s, req()).await;
    let expired = grant_one(
        &s,
        GrantRequest {
            lease: secs(2),
            ..req()
        },
    )
    .await;
    s.heartbeat(beat_with("10.0.0.1:8335", &[freed.id, expired.id]))
        .unwrap();
    // A heartbeat sent just before the FreeTask arrives after it.
    s.free(USER, ip(HOME), &[freed.id]).unwrap();
    let reply = s
        .heartbeat(beat_with("10.0.0.1:8335", &[freed.id, expired.id]))
        .unwrap();
    assert_eq!(reply.expired_grant_ids, [freed.id], "not brought back");
    // The other lease ends; the servant stops listing it (reaped), then a
    // late heartbeat lists it again.
    advance(secs(3)).await;
    s.heartbeat(beat_with("10.0.0.1:8335", &[])).unwrap();
    let reply = s
        .heartbeat(beat_with("10.0.0.1:8335", &[expired.id]))
        .unwrap();
    assert_eq!(reply.expired_grant_ids, [expired.id]);
    let snap = s.snapshot();
    assert_eq!(snap.counters.adoptions, 0);
    assert_eq!(snap.totals.grants, 0, "both slots are free");
}

#[tokio::test(start_paused = true)]
async fn an_adopted_grant_ends_when_its_servant_stops_listing_it() {
    let s = Scheduler::new(restarted());
    s.heartbeat(beat_with("10.0.0.1:8335", &[42, 43])).unwrap();
    assert_eq!(servant_view(&s, "10.0.0.1:8335").running, 2);
    s.heartbeat(beat_with("10.0.0.1:8335", &[43])).unwrap();
    let snap = s.snapshot();
    assert_eq!(snap.servants[0].running, 1, "the slot came back at once");
    assert_eq!(snap.counters.adoptions_ended, 1);
    // It does not come back later in the window.
    let reply = s.heartbeat(beat_with("10.0.0.1:8335", &[42, 43])).unwrap();
    assert_eq!(reply.expired_grant_ids, [42]);
    assert_eq!(grant_one(&s, req()).await.servant.port(), 8335);
}

#[tokio::test(start_paused = true)]
async fn early_renewal_inside_the_window_is_true_and_honoured_on_report() {
    let s = Scheduler::new(Config {
        user_tokens: TokenSet::new([USER, "other-user"]),
        ..restarted()
    });
    // The delegate renews before its servant has reported after the restart.
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[42], secs(30)).unwrap(),
        [true]
    );
    assert_eq!(s.snapshot().counters.early_renewals, 1);
    // Another token cannot take it over, from any machine.
    assert_eq!(
        s.keep_alive("other-user", ip("10.7.7.7"), &[42], secs(30))
            .unwrap(),
        [false]
    );
    advance(secs(5)).await;
    s.heartbeat(beat_with("10.0.0.1:8335", &[42])).unwrap();
    let g = s.snapshot().grants[0].clone();
    assert!(g.adopted);
    assert_eq!(g.requester, Some(ip(HOME)), "owned by its renewer");
    // The renewal (30 s from t=0) is honoured, not the 15 s adopted lease.
    assert_eq!(g.lease_left, secs(25));
    // After the window, an id nobody reported is unknown.
    advance(secs(11)).await;
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[77, 42], secs(30)).unwrap(),
        [false, true]
    );
}

#[tokio::test(start_paused = true)]
async fn adoption_memory_is_bounded() {
    let s = Scheduler::new(Config {
        limits: Limits {
            max_adoption_early_renewals: 2,
            max_adoption_retired_ids: 2,
            ..Limits::default()
        },
        ..restarted()
    });
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[1, 2, 3], secs(10)).unwrap(),
        [true, true, false]
    );
    assert_eq!(
        s.shared()
            .with_state(|st, _| st.grants.adoption_remembered()),
        2
    );
    // Past the bound of retired ids the window closes early: nothing more
    // is adopted (safe), and its memory is gone.
    s.heartbeat(beat_with("10.0.0.1:8335", &[])).unwrap();
    for _ in 0..3 {
        let g = grant_one(&s, req()).await;
        free_one(&s, g.id);
    }
    assert_eq!(
        s.shared()
            .with_state(|st, _| st.grants.adoption_remembered()),
        0
    );
    let reply = s.heartbeat(beat_with("10.0.0.1:8335", &[99])).unwrap();
    assert_eq!(reply.expired_grant_ids, [99]);
}

#[tokio::test(start_paused = true)]
async fn one_machine_cannot_use_up_the_room_for_early_renewals() {
    let s = Scheduler::new(restarted());
    let max_ids = Limits::default().max_ids_per_request;
    let share = Limits::default().max_adoption_early_renewals_per_machine;
    // One call with as many made-up ids as a call may carry.
    let flood: Vec<u64> = (1_000_000..).take(max_ids).collect();
    let answers = s
        .keep_alive(USER, ip("10.6.6.6"), &flood, secs(30))
        .unwrap();
    assert_eq!(answers.iter().filter(|&&a| a).count(), share);
    assert!(!answers[share], "past its share, that machine hears false");
    // A real delegate's early renewal is still remembered and honoured.
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[42], secs(30)).unwrap(),
        [true]
    );
    advance(secs(5)).await;
    s.heartbeat(beat_with("10.0.0.1:8335", &[42])).unwrap();
    let g = s.snapshot().grants[0].clone();
    assert_eq!(g.id, 42);
    assert_eq!(g.requester, Some(ip(HOME)));
    assert_eq!(g.lease_left, secs(25), "the early renewal is honoured");
}

#[tokio::test(start_paused = true)]
async fn freeing_made_up_ids_does_not_close_the_adoption_window() {
    let s = Scheduler::new(restarted());
    // A delegate frees a task of the previous instance before its servant
    // has reported it.
    s.free(USER, ip(HOME), &[7]).unwrap();
    // Then someone with the user token frees more made-up ids than the
    // window remembers.
    let max_ids = Limits::default().max_ids_per_request as u64;
    let calls = (Limits::default().max_adoption_retired_ids as u64).div_ceil(max_ids) + 1;
    for call in 0..calls {
        let flood: Vec<u64> = (0..max_ids)
            .map(|i| 1_000_000 + call * max_ids + i)
            .collect();
        s.free(USER, ip("10.6.6.6"), &flood).unwrap();
    }
    // The window is still open: a task nobody freed is adopted, the one
    // freed early is not.
    let reply = s.heartbeat(beat_with("10.0.0.1:8335", &[7, 42])).unwrap();
    assert_eq!(reply.expired_grant_ids, [7]);
    let snap = s.snapshot();
    assert_eq!(snap.counters.adoptions, 1);
    assert_eq!(snap.grants[0].id, 42);
}

#[tokio::test(start_paused = true)]
async fn an_adopted_grant_belongs_to_its_first_renewer() {
    let s = Scheduler::new(Config {
        user_tokens: TokenSet::new([USER, "other-user"]),
        ..restarted()
    });
    s.heartbeat(beat_with("10.0.0.1:8335", &[42])).unwrap();
    assert_eq!(
        s.keep_alive(USER, ip("10.5.5.5"), &[42], secs(10)).unwrap(),
        [true]
    );
    assert_eq!(
        s.keep_alive("other-user", ip("10.5.5.5"), &[42], secs(10))
            .unwrap(),
        [false]
    );
    s.free("other-user", ip(HOME), &[42]).unwrap();
    assert_eq!(s.snapshot().totals.grants, 1);
    // Its renewer's token is its holder's from any address.
    s.free(USER, ip(HOME), &[42]).unwrap();
    assert_eq!(s.snapshot().totals.grants, 0);
}
