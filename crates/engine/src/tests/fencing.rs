//! Rules "fencing" and "leadership": an instance grants only while its
//! fence is open, and one that wins an election starts as a restarted one.

use super::*;

fn fenced(fence: &GrantFence) -> Config {
    Config {
        grant_fence: fence.clone(),
        ..restarted()
    }
}

#[tokio::test(start_paused = true)]
async fn nothing_is_granted_once_the_lease_deadline_passed_even_to_a_waiting_call() {
    let fence = GrantFence::closed();
    let s = Scheduler::new(fenced(&fence));
    let mut beat = hb("10.0.0.1:8335", 1);
    beat.next_heartbeat_in = secs(30);
    s.heartbeat(beat).unwrap();
    // Closed: a standby places nothing.
    assert_eq!(
        s.wait_for_starting_task(req()).await.unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    fence.open_until(Instant::now() + secs(3));
    let first = grant_one(&s, req()).await;
    // A call waits for the only slot; the lease runs out (no renewal came)
    // before the slot frees: the freed slot goes to nobody.
    let waiting = spawn_wait(&s, req_wait(secs(10)));
    settle().await;
    advance(secs(3)).await;
    free_one(&s, first.id);
    settle().await;
    assert!(!waiting.is_finished(), "not served after the deadline");
    advance(secs(7)).await;
    assert_eq!(
        waiting.await.unwrap().unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    assert!(s.snapshot().grants.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_new_leader_forgets_its_old_term_and_adopts_what_servants_report() {
    let fence = GrantFence::closed();
    let s = Scheduler::new(fenced(&fence));
    fence.open_until(Instant::now() + secs(3600));
    s.heartbeat(beat_with("10.0.0.1:8335", &[])).unwrap();
    let old = grant_one(&s, req()).await;
    // A call queued when leadership is lost is answered by the restart.
    let other = spawn_wait(&s, req_wait(secs(10)));
    grant_one(&s, req()).await;
    settle().await;
    // After the first adoption window, it wins again.
    advance(secs(20)).await;
    s.restart();
    settle().await;
    assert_eq!(
        other.await.unwrap().unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    let snap = s.snapshot();
    assert!(
        snap.servants.is_empty() && snap.grants.is_empty(),
        "nothing of the old term"
    );
    // The other leader granted 77 meanwhile; the servant reports it and the
    // old term's id: both adopted (a restarted instance knows neither).
    let reply = s
        .heartbeat(beat_with("10.0.0.1:8335", &[old.id, 77]))
        .unwrap();
    assert!(reply.expired_grant_ids.is_empty(), "adopted, not killed");
    assert_eq!(s.snapshot().counters.adoptions, 2);
    // Early renewal inside the new window.
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[78], secs(15)).unwrap(),
        vec![true]
    );
}

#[tokio::test(start_paused = true)]
async fn while_the_fence_is_closed_an_unknown_environment_waits_for_its_servants() {
    let fence = GrantFence::closed();
    let s = Scheduler::new(fenced(&fence));
    // Taking over: a delegate asks before any servant reported here.
    let early = spawn_wait(&s, req_wait(secs(5)));
    let mut nobody = req_wait(secs(5));
    nobody.environment = "nobody-offers-this".to_owned();
    let unoffered = spawn_wait(&s, nobody);
    // A prefetch-only call is answered as ever: it never waits.
    let mut prefetch = req_wait(secs(5));
    (prefetch.immediate, prefetch.prefetch) = (0, 1);
    assert_eq!(
        s.wait_for_starting_task(prefetch).await.unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    settle().await;
    assert!(
        !early.is_finished() && !unoffered.is_finished(),
        "both wait"
    );
    // The servant reports; still nothing is placed while closed.
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    settle().await;
    assert!(!early.is_finished(), "no grant while the fence is closed");
    // Won: the fence opens and the queue is served at once.
    fence.open_until(Instant::now() + secs(3));
    s.serve_waiters();
    settle().await;
    assert_eq!(early.await.unwrap().unwrap().len(), 1);
    assert!(matches!(
        unoffered.await.unwrap().unwrap_err(),
        Rejection::EnvironmentNotAvailable { .. }
    ));
    // With the fence open, the rule is the original's again: at once.
    let mut later = req_wait(secs(5));
    later.environment = "nobody-offers-this".to_owned();
    assert!(matches!(
        s.wait_for_starting_task(later).await.unwrap_err(),
        Rejection::EnvironmentNotAvailable { .. }
    ));
    // The unoffered environment's slot went with its last waiter.
    let environments = s.snapshot().environments;
    assert!(
        environments
            .iter()
            .all(|e| e.digest != "nobody-offers-this"),
        "{environments:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn just_after_a_win_an_unknown_environment_waits_for_the_servants_to_report() {
    let fence = GrantFence::closed();
    let s = Scheduler::new(fenced(&fence));
    // Won without taking over: a fresh state, the fence open at once.
    s.restart();
    fence.open_until(Instant::now() + secs(3600));
    let early = spawn_wait(&s, req_wait(secs(8)));
    let mut nobody = req_wait(secs(8));
    nobody.environment = "nobody-offers-this".to_owned();
    let unoffered = spawn_wait(&s, nobody);
    settle().await;
    assert!(
        !early.is_finished() && !unoffered.is_finished(),
        "both wait for the servants to report"
    );
    // The servant reports its environment: granted at once.
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    settle().await;
    assert_eq!(early.await.unwrap().unwrap().len(), 1);
    // Once settled, what nobody offers is answered as at admission, long
    // before the call's own 8 s.
    advance(SERVANTS_SETTLE).await;
    settle().await;
    assert!(
        unoffered.is_finished(),
        "answered when the servants settled"
    );
    assert!(matches!(
        unoffered.await.unwrap().unwrap_err(),
        Rejection::EnvironmentNotAvailable { .. }
    ));
    let mut later = req_wait(secs(5));
    later.environment = "nobody-offers-this".to_owned();
    assert!(matches!(
        s.wait_for_starting_task(later).await.unwrap_err(),
        Rejection::EnvironmentNotAvailable { .. }
    ));
}
