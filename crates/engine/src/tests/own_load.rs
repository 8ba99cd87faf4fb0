//! Rule "own load": with `foreign_load_from_own_average`, the foreign load
//! is the reported 15 s average minus this scheduler's own 15 s average
//! there, so a servant whose compiles just ended is not taken for busy.

use super::*;

/// `seconds` of the servant at 10.0.0.1 running `ids`: heartbeats listing
/// them and renewals, every second, as the daemons do.
async fn run_for(s: &Scheduler, ids: &[u64], seconds: u64) {
    for _ in 0..seconds {
        tokio::time::advance(secs(1)).await;
        let renewed = s.keep_alive(USER, ip(HOME), ids, secs(15)).unwrap();
        assert!(renewed.iter().all(|&r| r));
        let mut beat = hb("10.0.0.1:8335", 8);
        beat.current_load = ids.len() as u32;
        beat.running_tasks = ids.iter().map(|&id| task(id)).collect();
        s.heartbeat(beat).unwrap();
    }
}

/// A servant of 8 processors that ran 8 of our compiles for 14 s, all freed
/// just now, reporting the daemon's 15 s average (still 8): its capacity.
async fn capacity_right_after_our_burst(own_average: bool) -> u32 {
    let s = Scheduler::new(Config {
        foreign_load_from_own_average: own_average,
        ..config()
    });
    s.heartbeat(hb("10.0.0.1:8335", 8)).unwrap();
    let grants = s
        .wait_for_starting_task(GrantRequest {
            immediate: 8,
            ..req()
        })
        .await
        .unwrap();
    assert_eq!(grants.len(), 8);
    let ids: Vec<u64> = grants.iter().map(|g| g.id).collect();
    run_for(&s, &ids, 14).await;
    s.free(USER, ip(HOME), &ids).unwrap();
    let mut busy = hb("10.0.0.1:8335", 8);
    busy.current_load = 8;
    s.heartbeat(busy).unwrap();
    servant_view(&s, "10.0.0.1:8335").capacity_available
}

#[tokio::test(start_paused = true)]
async fn own_load_our_ended_burst_is_not_foreign_work() {
    // The original's rule: 8 reported, none held now, so 8 foreign.
    assert_eq!(capacity_right_after_our_burst(false).await, 0);
    assert_eq!(capacity_right_after_our_burst(true).await, 8);
}

#[tokio::test(start_paused = true)]
async fn own_load_a_grant_made_since_the_report_is_not_taken_off_the_owners_work() {
    // 8 processors, the owner busy on 6 at the report, then one of ours
    // granted: 7 busy, 1 idle. The original's rule takes the new grant off
    // the reported load (foreign 5, capacity 3: 2 more grants, one
    // processor too many); ours leaves the owner's 6 (capacity 2: 1 more).
    for (own_average, capacity) in [(false, 3), (true, 2)] {
        let s = Scheduler::new(Config {
            foreign_load_from_own_average: own_average,
            ..config()
        });
        let mut busy = hb("10.0.0.1:8335", 8);
        busy.current_load = 6;
        s.heartbeat(busy).unwrap();
        let grants = s.wait_for_starting_task(req()).await.unwrap();
        assert_eq!(grants.len(), 1);
        let v = servant_view(&s, "10.0.0.1:8335");
        assert_eq!((own_average, v.capacity_available), (own_average, capacity));
    }
}

#[tokio::test(start_paused = true)]
async fn own_load_the_owners_work_still_counts() {
    let s = Scheduler::new(Config {
        foreign_load_from_own_average: true,
        ..config()
    });
    let mut busy = hb("10.0.0.1:8335", 8);
    busy.current_load = 6;
    s.heartbeat(busy.clone()).unwrap();
    assert_eq!(servant_view(&s, "10.0.0.1:8335").capacity_available, 2);
    // Ours held for the whole window count as ours, not the owner's: a
    // report of 8 with 2 of ours is 6 foreign.
    let grants = s.wait_for_starting_task(req()).await.unwrap();
    let more = s.wait_for_starting_task(req()).await.unwrap();
    assert_eq!(grants.len() + more.len(), 2);
    let ids = [grants[0].id, more[0].id];
    run_for(&s, &ids, 20).await;
    busy.current_load = 8;
    busy.running_tasks = ids.iter().map(|&id| task(id)).collect();
    s.heartbeat(busy).unwrap();
    let v = servant_view(&s, "10.0.0.1:8335");
    assert_eq!((v.running, v.capacity_available), (2, 2));
}
