//! Rule "broken servants": a servant whose immediate grants keep coming
//! back at once, before any heartbeat listed them, is ejected for a time
//! that grows with each ejection, then tried with one grant; never more than
//! the share cap at once; rule "observed speed" learns only from grants that
//! ran; `eject_broken_servants: false` keeps it in rotation.

use super::*;
use crate::ejection::CONSECUTIVE_BROKEN;

const BROKEN: &str = "10.0.0.9:8335";
const BROKEN_TOO: &str = "10.0.0.8:8335";
/// An environment only the broken servants offer, so each test places
/// grants on them at will.
const ONLY_BROKEN: &str = "broken-only-digest";
/// The good servants' time to compile, and how many there are.
const COMPILE: Duration = Duration::from_secs(2);
const GOOD: usize = 2;

fn engine(eject: bool) -> Scheduler {
    Scheduler::new(Config {
        eject_broken_servants: eject,
        ..config()
    })
}

/// Heartbeats of the good servants (4 slots each) and of `broken`.
fn beat(s: &Scheduler, broken: &[&str]) {
    for i in 1..=GOOD {
        s.heartbeat(hb(&format!("10.0.0.{i}:8335"), 4)).unwrap();
    }
    for location in broken {
        let mut b = hb(location, 4);
        b.environments = vec![ENV.to_owned(), ONLY_BROKEN.to_owned()];
        s.heartbeat(b).unwrap();
    }
}

/// Moves the clock by `d` while every servant beats each second.
async fn beating(s: &Scheduler, broken: &[&str], d: Duration) {
    let mut left = d;
    while !left.is_zero() {
        let step = left.min(secs(1));
        advance(step).await;
        beat(s, broken);
        left -= step;
    }
}

fn only_broken() -> GrantRequest {
    GrantRequest {
        environment: ONLY_BROKEN.to_owned(),
        ..req()
    }
}

/// `n` grants on the broken servants' environment, each given back after
/// `held`; returns where they went.
async fn return_after(s: &Scheduler, n: usize, held: Duration) -> Vec<SocketAddr> {
    let mut servants = Vec::new();
    for _ in 0..n {
        let g = grant_one(s, only_broken()).await;
        servants.push(g.servant);
        advance(held).await;
        free_one(s, g.id);
    }
    servants
}

/// Teaches the farm its typical hold: 8 grants on the good servants.
async fn typical_hold(s: &Scheduler) {
    for _ in 0..8 {
        beat(s, &[BROKEN]);
        let g = grant_one(
            s,
            GrantRequest {
                immediate: 1,
                ..req()
            },
        )
        .await;
        assert_ne!(g.servant, addr(BROKEN));
        advance(COMPILE).await;
        free_one(s, g.id);
    }
}

fn state(s: &Scheduler, location: &str) -> (&'static str, OutlierView) {
    let view = servant_view(s, location).outlier;
    (view.state(), view)
}

#[tokio::test(start_paused = true)]
async fn five_broken_grants_eject_a_servant_for_a_time_that_grows_and_a_trial_brings_it_back() {
    let s = engine(true);
    beat(&s, &[BROKEN]);
    return_after(&s, 4, ms(10)).await;
    assert_eq!(state(&s, BROKEN).0, "in_rotation", "four are not enough");
    return_after(&s, 1, ms(10)).await;
    let (name, view) = state(&s, BROKEN);
    assert_eq!(name, "ejected");
    assert_eq!(view.ejected_for, Some(secs(30)));
    assert_eq!(view.last_evidence.map(|e| e.held), Some(ms(10)));
    let snap = s.snapshot();
    assert_eq!(
        (snap.counters.broken_grants, snap.counters.ejections),
        (5, 1)
    );
    assert_eq!(snap.totals.servants_ejected, 1);
    assert_eq!(snap.ejections.len(), 1);
    assert_eq!(snap.ejections[0].servant, addr(BROKEN));
    // Ejected: nothing goes to it, its slots are not counted free.
    assert_eq!(
        s.wait_for_starting_task(only_broken()).await.unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    assert_eq!(snap.totals.capacity_available, 4 * GOOD as u64);
    for _ in 0..4 * GOOD {
        assert_ne!(grant_one(&s, req()).await.servant, addr(BROKEN));
    }
    s.free(
        USER,
        ip(HOME),
        &s.snapshot().grants.iter().map(|g| g.id).collect::<Vec<_>>(),
    )
    .unwrap();
    // Back after 30 s, at its first heartbeat, with one grant at a time.
    beating(&s, &[BROKEN], secs(29)).await;
    assert_eq!(state(&s, BROKEN).0, "ejected");
    beating(&s, &[BROKEN], secs(1)).await;
    assert_eq!(state(&s, BROKEN).0, "on_trial");
    let trial = s
        .wait_for_starting_task(GrantRequest {
            immediate: 2,
            ..only_broken()
        })
        .await
        .unwrap();
    assert_eq!(trial.len(), 1, "one grant on trial");
    // Broken again: ejected at once, for twice as long.
    advance(ms(10)).await;
    free_one(&s, trial[0].id);
    let (name, view) = state(&s, BROKEN);
    assert_eq!((name, view.ejected_for), ("ejected", Some(secs(60))));
    // Repaired: its trial grant runs, and it is back in rotation.
    beating(&s, &[BROKEN], secs(60)).await;
    assert_eq!(state(&s, BROKEN).0, "on_trial");
    let g = grant_one(&s, only_broken()).await;
    advance(COMPILE).await;
    free_one(&s, g.id);
    assert_eq!(state(&s, BROKEN).0, "in_rotation");
    let grants = s
        .wait_for_starting_task(GrantRequest {
            immediate: 3,
            ..only_broken()
        })
        .await
        .unwrap();
    assert_eq!(grants.len(), 3, "all its slots again");
}

#[tokio::test(start_paused = true)]
async fn never_more_than_the_share_cap_is_ejected_at_once() {
    // Four servants: a tenth rounds to none, and at least one may go.
    let s = engine(true);
    beat(&s, &[BROKEN, BROKEN_TOO]);
    // The broken servants take turns (equal utilisation, registration
    // order), so ten grants are five broken ones each.
    let servants = return_after(&s, 10, ms(10)).await;
    assert!(servants.contains(&addr(BROKEN)) && servants.contains(&addr(BROKEN_TOO)));
    let ejected: Vec<&str> = [BROKEN, BROKEN_TOO]
        .into_iter()
        .filter(|b| state(&s, b).0 == "ejected")
        .collect();
    assert_eq!(ejected.len(), 1, "{ejected:?}");
    let snap = s.snapshot();
    assert_eq!(snap.totals.servants_ejected, 1);
    assert!(snap.counters.ejections_capped >= 1);
    assert_eq!(snap.counters.ejections, 1);
}

#[tokio::test(start_paused = true)]
async fn with_the_flag_off_a_broken_servant_stays_but_its_speed_is_not_learnt() {
    let s = engine(false);
    beat(&s, &[BROKEN]);
    return_after(&s, 12, ms(10)).await;
    let view = servant_view(&s, BROKEN);
    assert_eq!(view.outlier.state(), "in_rotation");
    let snap = s.snapshot();
    assert_eq!(
        (snap.counters.broken_grants, snap.counters.ejections),
        (12, 0)
    );
    // Rule "observed speed" learnt nothing from grants that did not run.
    assert_eq!(view.typical_grant, None);
    assert_eq!(view.speed_class, 0);
}

#[tokio::test(start_paused = true)]
async fn a_grant_held_near_the_typical_time_ran() {
    let s = engine(true);
    beat(&s, &[BROKEN]);
    // With a typical hold of 2 s, 200 ms is a quick compile, not a failure
    // (and makes the typical hold about 750 ms); 30 ms is far sooner (under
    // a sixteenth).
    typical_hold(&s).await;
    beat(&s, &[BROKEN]);
    return_after(&s, 6, ms(200)).await;
    assert_eq!(s.snapshot().counters.broken_grants, 0);
    assert_eq!(state(&s, BROKEN).0, "in_rotation");
    return_after(&s, 5, ms(30)).await;
    assert_eq!(state(&s, BROKEN).0, "ejected");
}

#[tokio::test(start_paused = true)]
async fn a_grant_a_heartbeat_listed_ran_however_short() {
    let s = engine(true);
    beat(&s, &[BROKEN]);
    for _ in 0..6 {
        let g = grant_one(&s, only_broken()).await;
        let mut b = hb(BROKEN, 4);
        b.environments = vec![ENV.to_owned(), ONLY_BROKEN.to_owned()];
        b.running_tasks = vec![task(g.id)];
        s.heartbeat(b).unwrap();
        advance(ms(10)).await;
        free_one(&s, g.id);
    }
    assert_eq!(s.snapshot().counters.broken_grants, 0);
    assert_eq!(state(&s, BROKEN).0, "in_rotation");
    // The same returns unlisted are broken.
    return_after(&s, 5, ms(10)).await;
    assert_eq!(s.snapshot().counters.broken_grants, 5);
}

#[tokio::test(start_paused = true)]
async fn a_grant_that_ran_clears_the_count_of_broken_ones() {
    let s = engine(true);
    beat(&s, &[BROKEN]);
    for _ in 0..3 {
        return_after(&s, 4, ms(10)).await;
        return_after(&s, 1, COMPILE).await;
    }
    assert_eq!(s.snapshot().counters.broken_grants, 12);
    assert_eq!(state(&s, BROKEN).0, "in_rotation", "never five in a row");
}

#[tokio::test(start_paused = true)]
async fn the_last_live_servant_is_never_ejected() {
    // A farm of one whose compiles are all shorter than the detector's
    // bound: however many come back at once, the farm keeps its servant.
    let s = engine(true);
    let mut lone = hb(BROKEN, 4);
    lone.environments = vec![ONLY_BROKEN.to_owned()];
    s.heartbeat(lone).unwrap();
    let servants = return_after(&s, 3 * CONSECUTIVE_BROKEN as usize, ms(10)).await;
    assert!(
        servants.iter().all(|at| *at == addr(BROKEN)),
        "{servants:?}"
    );
    assert_eq!(state(&s, BROKEN).0, "in_rotation");
    let snap = s.snapshot();
    assert_eq!(snap.totals.servants_ejected, 0);
    assert_eq!(snap.counters.ejections, 0);
    assert!(snap.counters.ejections_capped >= 1);
}
