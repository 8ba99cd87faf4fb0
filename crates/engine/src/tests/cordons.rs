//! Rule "cordon": a cordoned servant gets no new grant, keeps what it runs,
//! and everything else stays as it was; drains report until drained.

use super::*;

fn cordon(drain: bool) -> Cordon {
    Cordon {
        drain,
        reason: "disk".to_owned(),
        by: "token:0123456789ab".to_owned(),
        since_unix_ms: 1_700_000_000_000,
    }
}

fn view(s: &Scheduler, location: &str) -> CordonView {
    s.cordons()
        .into_iter()
        .find(|view| view.location == addr(location))
        .expect("a cordon there")
}

#[tokio::test(start_paused = true)]
async fn a_cordoned_servant_gets_no_new_grant_and_keeps_its_tasks() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    s.heartbeat(hb("10.0.0.2:8335", 4)).unwrap();
    // Ties go to the earliest registered: A.
    let on_a = grant_one(&s, req()).await;
    assert_eq!(on_a.servant, addr("10.0.0.1:8335"));

    s.cordon(addr("10.0.0.1:8335"), cordon(false));
    for _ in 0..4 {
        assert_eq!(grant_one(&s, req()).await.servant, addr("10.0.0.2:8335"));
    }
    // B is full and A cordoned: nothing for a call that may not wait.
    assert_eq!(
        s.wait_for_starting_task(req()).await,
        Err(Rejection::NoQuotaAvailable)
    );

    // A's task goes on: its heartbeat lists it and nothing is expired, it is
    // in the running-task list, its owner renews and frees it.
    let reply = s.heartbeat(beat_with("10.0.0.1:8335", &[on_a.id])).unwrap();
    assert!(reply.expired_grant_ids.is_empty());
    advance(secs(2)).await;
    assert!(
        s.running_tasks()
            .iter()
            .any(|task| task.grant_id == on_a.id)
    );
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[on_a.id], secs(15)),
        Ok(vec![true])
    );
    assert_eq!(view(&s, "10.0.0.1:8335").running, 1);
    free_one(&s, on_a.id);
    assert_eq!(view(&s, "10.0.0.1:8335").running, 0);
    let a = servant_view(&s, "10.0.0.1:8335");
    assert_eq!(a.cordon.map(|c| c.state), Some(CordonState::Cordoned));
    // The freed slot is A's, and A is still cordoned.
    assert_eq!(
        s.wait_for_starting_task(req()).await,
        Err(Rejection::NoQuotaAvailable)
    );
}

#[tokio::test(start_paused = true)]
async fn a_location_cordoned_before_its_servant_registers_is_cordoned_when_it_arrives() {
    let s = Scheduler::new(config());
    s.cordon(addr("10.0.0.1:8335"), cordon(false));
    let early = view(&s, "10.0.0.1:8335");
    assert!(!early.registered);
    assert_eq!(early.running, 0);
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    assert!(view(&s, "10.0.0.1:8335").registered);
    // Its environment is offered (the call waits rather than failing), but
    // no grant goes there.
    let waiting = spawn_wait(&s, req_wait(secs(5)));
    settle().await;
    assert!(!waiting.is_finished(), "queued, not refused");
    assert!(s.uncordon(addr("10.0.0.1:8335")));
    settle().await;
    // Uncordoned: the queued call is served at once, not at the next heartbeat.
    let grants = waiting.await.unwrap().expect("served on uncordon");
    assert_eq!(grants[0].servant, addr("10.0.0.1:8335"));
    assert!(s.cordons().is_empty());
    assert!(
        !s.uncordon(addr("10.0.0.1:8335")),
        "nothing left to uncordon"
    );
}

#[tokio::test(start_paused = true)]
async fn a_queued_call_for_a_cordoned_farm_times_out_as_no_quota() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    s.cordon(addr("10.0.0.1:8335"), cordon(true));
    let waiting = spawn_wait(&s, req_wait(secs(2)));
    advance(secs(3)).await;
    assert_eq!(waiting.await.unwrap(), Err(Rejection::NoQuotaAvailable));
}

#[tokio::test(start_paused = true)]
async fn a_drain_reports_running_tasks_until_none_is_left() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    let first = grant_one(&s, req()).await;
    let second = grant_one(&s, req()).await;
    let drained = s.cordon(addr("10.0.0.1:8335"), cordon(true));
    assert_eq!((drained.state, drained.running), (CordonState::Draining, 2));
    free_one(&s, first.id);
    assert_eq!(view(&s, "10.0.0.1:8335").running, 1);
    // A lease that runs out is a zombie: the servant may still run the
    // task, so the drain waits for its report to drop it.
    s.heartbeat(beat_with("10.0.0.1:8335", &[second.id]))
        .unwrap();
    advance(secs(16)).await;
    let zombie = view(&s, "10.0.0.1:8335");
    assert_eq!((zombie.state, zombie.running), (CordonState::Draining, 1));
    s.heartbeat(beat_with("10.0.0.1:8335", &[])).unwrap();
    let done = view(&s, "10.0.0.1:8335");
    assert_eq!((done.state, done.running), (CordonState::Drained, 0));
    // A cordon over a drain keeps it out without reporting the drain.
    s.cordon(addr("10.0.0.1:8335"), cordon(false));
    assert_eq!(view(&s, "10.0.0.1:8335").state, CordonState::Cordoned);
}

/// Placement, the task list and the replies of uncordoned servants are
/// what they would be without any cordon.
#[tokio::test(start_paused = true)]
async fn servants_not_cordoned_see_no_difference() {
    async fn run(cordoned_elsewhere: bool) -> (Vec<SocketAddr>, Vec<u64>, usize) {
        let s = Scheduler::new(config());
        if cordoned_elsewhere {
            s.cordon(addr("10.0.0.9:8335"), cordon(false));
        }
        let mut beats = std::collections::BTreeMap::new();
        for (location, capacity, load) in [
            ("10.0.0.1:8335", 4, 1),
            ("10.0.0.2:8335", 8, 3),
            ("10.0.0.3:8335", 2, 0),
        ] {
            let mut beat = hb(location, capacity);
            beat.num_processors = 8;
            beat.current_load = load;
            s.heartbeat(beat.clone()).unwrap();
            beats.insert(addr(location), beat);
        }
        let mut picks = Vec::new();
        let mut expired = Vec::new();
        for _ in 0..8 {
            let grant = grant_one(&s, req()).await;
            picks.push(grant.servant);
            // The servant reports it, and an id nobody granted.
            let beat = beats.get_mut(&grant.servant).unwrap();
            beat.running_tasks.retain(|task| task.grant_id != 999);
            beat.running_tasks.extend([task(grant.id), task(999)]);
            expired.extend(s.heartbeat(beat.clone()).unwrap().expired_grant_ids);
        }
        advance(secs(2)).await;
        (picks, expired, s.running_tasks().len())
    }
    let (picks, expired, listed) = run(false).await;
    assert_eq!(listed, 8);
    assert_eq!(expired.len(), 8);
    assert_eq!(
        picks
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        3
    );
    assert_eq!(run(true).await, run(false).await);
}

#[tokio::test(start_paused = true)]
async fn cordons_outlive_the_servant_and_a_restart_and_are_replaced_as_a_whole() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    s.cordon(addr("10.0.0.1:8335"), cordon(false));
    advance(secs(11)).await;
    assert!(s.snapshot().servants.is_empty(), "expired");
    s.restart();
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    assert_eq!(
        s.wait_for_starting_task(req()).await,
        Err(Rejection::NoQuotaAvailable),
        "still cordoned after expiry and restart"
    );

    // What a new leader read replaces every cordon at once.
    s.replace_cordons(vec![(addr("10.0.0.2:8335"), cordon(true))]);
    let listed: Vec<SocketAddr> = s.cordons().iter().map(|view| view.location).collect();
    assert_eq!(listed, [addr("10.0.0.2:8335")]);
    assert_eq!(grant_one(&s, req()).await.servant, addr("10.0.0.1:8335"));
}

#[tokio::test(start_paused = true)]
async fn a_cordon_covers_the_reported_location_or_the_observed_one() {
    let s = Scheduler::new(config());
    // Seen at 10.0.0.7, reporting 192.168.1.7 (behind NAT: no slot anyway).
    let mut nat = hb("192.168.1.7:8335", 4);
    nat.observed_ip = ip("10.0.0.7");
    s.heartbeat(nat.clone()).unwrap();
    s.cordon(addr("192.168.1.7:8335"), cordon(false));
    assert!(view(&s, "192.168.1.7:8335").registered);
    s.uncordon(addr("192.168.1.7:8335"));
    s.cordon(addr("10.0.0.7:8335"), cordon(false));
    assert!(view(&s, "10.0.0.7:8335").registered);
    // An IPv4-mapped address names the same machine.
    assert_eq!(
        s.check_cordon("[::ffff:10.0.0.7]:8335", ""),
        Ok(addr("10.0.0.7:8335"))
    );
}

#[tokio::test(start_paused = true)]
async fn a_cordoned_servants_free_slots_count_as_unavailable() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    s.heartbeat(hb("10.0.0.2:8335", 4)).unwrap();
    grant_one(&s, req()).await;
    s.cordon(addr("10.0.0.1:8335"), cordon(false));
    let (totals, _) = s.totals();
    assert_eq!(totals.capacity, 8);
    assert_eq!(totals.running, 1);
    assert_eq!(totals.capacity_available, 4, "only B's");
    assert_eq!(totals.capacity_unavailable, 3, "A's free slots");
    // One set of numbers: the cordoned servant is up but not accepting.
    assert_eq!(
        (
            totals.servants_up,
            totals.servants_accepting,
            totals.servants_cordoned
        ),
        (2, 1, 1)
    );
    assert_eq!(
        totals.running + totals.capacity_available + totals.capacity_unavailable,
        totals.capacity
    );
    s.cordon(addr("10.0.0.2:8335"), cordon(true));
    let (drained, _) = s.totals();
    assert_eq!(
        (drained.servants_accepting, drained.servants_cordoned),
        (0, 2)
    );
}

#[tokio::test(start_paused = true)]
async fn the_capacity_split_adds_up_when_a_servant_runs_more_than_it_offers() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    for _ in 0..3 {
        grant_one(&s, req()).await;
    }
    // A offers fewer slots than it now runs, with load on top: its grants
    // go on, and the split says how many run beyond its slots.
    s.heartbeat(Heartbeat {
        current_load: 3,
        ..hb("10.0.0.1:8335", 1)
    })
    .unwrap();
    s.heartbeat(hb("10.0.0.2:8335", 4)).unwrap();
    let (totals, _) = s.totals();
    assert_eq!(totals.capacity, 5);
    assert_eq!(totals.running, 3);
    assert_eq!(totals.running_over_capacity, 2, "3 grants on A's 1 slot");
    assert_eq!(
        totals.running + totals.capacity_available + totals.capacity_unavailable,
        totals.capacity + totals.running_over_capacity
    );
}

#[tokio::test(start_paused = true)]
async fn what_an_operator_names_is_checked_before_anything_changes() {
    let limits = Limits {
        max_cordons: 2,
        max_cordon_reason_chars: 10,
        ..Limits::default()
    };
    let s = Scheduler::new(Config { limits, ..config() });
    let refused = |location: &str, reason: &str| match s.check_cordon(location, reason) {
        Err(Rejection::InvalidArgument(why)) => why,
        other => panic!("{location} {reason:?}: {other:?}"),
    };
    assert!(refused("10.0.0.1", "").contains("location"));
    assert!(refused("server-7:8335", "").contains("location"));
    assert!(refused("10.0.0.1:8335", "x".repeat(11).as_str()).contains("10 character"));
    assert!(refused("10.0.0.1:8335", "two\nlines").contains("control"));
    // Ten characters of four bytes each are within the limit.
    assert!(s.check_cordon("10.0.0.1:8335", &"é".repeat(10)).is_ok());
    s.cordon(addr("10.0.0.1:8335"), cordon(false));
    s.cordon(addr("10.0.0.2:8335"), cordon(false));
    assert!(refused("10.0.0.3:8335", "").contains("2 locations"));
    // One already cordoned may be set again.
    assert!(s.check_cordon("10.0.0.2:8335", "").is_ok());
    assert_eq!(s.cordons().len(), 2);
}
