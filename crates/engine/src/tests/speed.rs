//! Rule "observed speed": within a tier, a servant whose freed immediate
//! grants came back sooner is placed first; one with too few recent grants
//! is tried first; prefetch grants tell nothing.

use super::*;

const SLOW: &str = "10.0.0.1:8335";
const FAST: &str = "10.0.0.2:8335";
/// How long SLOW holds each grant.
const SLOW_HOLD: Duration = Duration::from_secs(2);
/// Rounds enough for both servants to be known (weight 8 after fading).
const ROUNDS: usize = 12;

fn engine(observed_speed: bool) -> Scheduler {
    Scheduler::new(Config {
        place_by_observed_speed: observed_speed,
        ..config()
    })
}

/// The environment only FAST offers while the servants' speeds are learnt,
/// so each call's grant lands where the test wants it.
const FAST_ONLY: &str = "clang-17-digest";

/// Heartbeats of both servants, 4 slots each (`slow_priority` for SLOW);
/// FAST offers `fast_env`.
fn beat(s: &Scheduler, slow_priority: ServantPriority, fast_env: &str) {
    let mut slow = hb(SLOW, 4);
    slow.priority = slow_priority;
    s.heartbeat(slow).unwrap();
    let mut fast = hb(FAST, 4);
    fast.environments = vec![fast_env.to_owned()];
    s.heartbeat(fast).unwrap();
}

/// `rounds` of one grant on each servant, freed after the time the servant
/// takes: [`SLOW_HOLD`] on SLOW, `fast_hold` on FAST, FAST's grants being
/// prefetch grants if `fast_prefetch`.
async fn learn(s: &Scheduler, fast_hold: Duration, fast_prefetch: bool, rounds: usize) {
    for _ in 0..rounds {
        beat(s, ServantPriority::User, FAST_ONLY);
        let slow = grant_one(s, req()).await;
        let fast = grant_one(
            s,
            GrantRequest {
                environment: FAST_ONLY.into(),
                immediate: u32::from(!fast_prefetch),
                prefetch: u32::from(fast_prefetch),
                ..req()
            },
        )
        .await;
        assert_eq!((slow.servant, fast.servant), (addr(SLOW), addr(FAST)));
        assert_eq!(fast.prefetch, fast_prefetch);
        let mut ends = [(SLOW_HOLD, slow.id), (fast_hold, fast.id)];
        ends.sort();
        advance(ends[0].0).await;
        free_one(s, ends[0].1);
        advance(ends[1].0 - ends[0].0).await;
        free_one(s, ends[1].1);
    }
}

/// Where one grant goes once both servants offer the environment (a
/// prefetch grant: placed in the same order, and freed at once without
/// telling either servant's speed).
async fn first_pick(s: &Scheduler, slow_priority: ServantPriority) -> SocketAddr {
    beat(s, slow_priority, ENV);
    let g = grant_one(
        s,
        GrantRequest {
            immediate: 0,
            prefetch: 1,
            ..req()
        },
    )
    .await;
    free_one(s, g.id);
    g.servant
}

/// Where a grant goes after [`ROUNDS`] of [`learn`] on a new engine.
async fn learnt_pick(rule: bool, fast_hold: Duration, fast_prefetch: bool) -> SocketAddr {
    let s = engine(rule);
    learn(&s, fast_hold, fast_prefetch, ROUNDS).await;
    first_pick(&s, ServantPriority::User).await
}

#[tokio::test(start_paused = true)]
async fn observed_speed_the_servant_that_gives_grants_back_sooner_goes_first() {
    // SLOW registered first: with equal utilisation the original picks it.
    assert_eq!(learnt_pick(false, ms(500), false).await, addr(SLOW));
    assert_eq!(learnt_pick(true, ms(500), false).await, addr(FAST));
}

#[tokio::test(start_paused = true)]
async fn observed_speed_a_servant_without_enough_grants_is_tried_first() {
    let s = engine(true);
    // 7 grants each: neither is known yet, so the original's order holds.
    learn(&s, ms(500), false, 7).await;
    assert_eq!(first_pick(&s, ServantPriority::User).await, addr(SLOW));
    learn(&s, ms(500), false, ROUNDS - 7).await;
    assert_eq!(first_pick(&s, ServantPriority::User).await, addr(FAST));
    // Four minutes without a grant back: the evidence has faded (12 grants
    // halved four times), both are unknown again.
    advance(secs(240)).await;
    assert_eq!(first_pick(&s, ServantPriority::User).await, addr(SLOW));
}

#[tokio::test(start_paused = true)]
async fn observed_speed_does_not_reorder_the_tiers() {
    let s = engine(true);
    learn(&s, ms(500), false, ROUNDS).await;
    // SLOW dedicated and under half its processors: tier 0 whatever its speed.
    assert_eq!(first_pick(&s, ServantPriority::Dedicated).await, addr(SLOW));
    assert_eq!(first_pick(&s, ServantPriority::User).await, addr(FAST));
}

#[tokio::test(start_paused = true)]
async fn observed_speed_prefetch_grants_tell_nothing() {
    // SLOW's grants take 2 s, FAST's 4 s: as immediate grants, FAST is the
    // slower; as prefetch grants (a daemon keeps them for its next
    // compile), they tell nothing, FAST is unknown and tried first.
    assert_eq!(learnt_pick(true, secs(4), false).await, addr(SLOW));
    assert_eq!(learnt_pick(true, secs(4), true).await, addr(FAST));
}
