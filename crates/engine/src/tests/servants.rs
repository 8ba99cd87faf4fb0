//! Servants: heartbeat rules (version, memory floor, NAT, leaving, old daemons),
//! request limits and the cluster's bound on reported tasks.

use super::*;

#[tokio::test(start_paused = true)]
async fn heartbeat_version_too_old() {
    let s = Scheduler::new(Config {
        min_daemon_version: 5,
        ..config()
    });
    let mut old = hb("10.0.0.1:8335", 4);
    old.version = 4;
    assert_eq!(
        s.heartbeat(old).unwrap_err(),
        Rejection::VersionTooOld {
            version: 4,
            minimum: 5
        }
    );
    // Token is checked before the version.
    let mut old_bad = hb("10.0.0.1:8335", 4);
    old_bad.version = 4;
    old_bad.token = "nope".into();
    assert_eq!(s.heartbeat(old_bad).unwrap_err(), Rejection::AccessDenied);
    let mut ok = hb("10.0.0.1:8335", 4);
    ok.version = 5;
    assert!(s.heartbeat(ok).is_ok());
}

#[tokio::test(start_paused = true)]
async fn heartbeat_memory_floor_applies_only_when_total_memory_is_reported() {
    let s = Scheduler::new(config());
    let mut poor = hb("10.0.0.1:8335", 4);
    poor.total_memory = 64 << 30;
    poor.memory_available = 5 << 30;
    s.heartbeat(poor).unwrap();
    let v = servant_view(&s, "10.0.0.1:8335");
    assert_eq!(v.capacity_available, 0);
    assert_eq!(v.max_tasks, 4);
    assert_eq!(
        v.not_accepting_reason,
        Some(NotAcceptingReason::PoorMachine)
    );
    assert_eq!(
        s.wait_for_starting_task(req()).await.unwrap_err(),
        Rejection::NoQuotaAvailable
    );

    // Enough memory again.
    let mut rich = hb("10.0.0.1:8335", 4);
    rich.total_memory = 64 << 30;
    rich.memory_available = 10 << 30;
    s.heartbeat(rich.clone()).unwrap();
    assert_eq!(servant_view(&s, "10.0.0.1:8335").capacity_available, 4);

    // Short of memory while running two: its capacity is what it runs (the
    // original's figure), so nothing more goes there.
    let held = s
        .wait_for_starting_task(GrantRequest {
            immediate: 2,
            ..req()
        })
        .await
        .unwrap();
    assert_eq!(held.len(), 2);
    s.heartbeat(Heartbeat {
        memory_available: 1 << 30,
        ..rich.clone()
    })
    .unwrap();
    let v = servant_view(&s, "10.0.0.1:8335");
    assert_eq!((v.running, v.capacity_available), (2, 2));
    assert_eq!(
        s.wait_for_starting_task(req()).await.unwrap_err(),
        Rejection::NoQuotaAvailable
    );
    let totals = s.totals().0;
    assert_eq!(
        (totals.capacity_available, totals.capacity_unavailable),
        (0, 2)
    );
    s.free(USER, ip(HOME), &[held[0].id, held[1].id]).unwrap();
    s.heartbeat(rich).unwrap();

    // total_memory 0: not reported, no floor even with 0 available.
    let mut unknown = hb("10.0.0.2:8335", 4);
    unknown.total_memory = 0;
    unknown.memory_available = 0;
    s.heartbeat(unknown).unwrap();
    assert_eq!(servant_view(&s, "10.0.0.2:8335").capacity_available, 4);
}

#[tokio::test(start_paused = true)]
async fn heartbeat_behind_nat_is_kept_with_zero_capacity() {
    let s = Scheduler::new(config());
    let mut nat = hb("10.0.0.1:8335", 4);
    nat.observed_ip = ip("172.16.5.5");
    s.heartbeat(nat).unwrap();
    let snap = s.snapshot();
    assert_eq!(snap.servants.len(), 1);
    let v = &snap.servants[0];
    assert_eq!(
        v.observed_location,
        addr("172.16.5.5:8335"),
        "keyed by observed location"
    );
    assert_eq!(v.reported_location, addr("10.0.0.1:8335"));
    assert_eq!(v.max_tasks, 0);
    assert_eq!(v.not_accepting_reason, Some(NotAcceptingReason::BehindNat));
    assert!(matches!(
        s.wait_for_starting_task(req()).await.unwrap_err(),
        Rejection::EnvironmentNotAvailable { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn heartbeat_leaving_servant_has_zero_capacity_and_is_removed() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    let g = grant_one(&s, req()).await;
    let mut leaving = hb("10.0.0.1:8335", 4);
    leaving.next_heartbeat_in = Duration::ZERO;
    s.heartbeat(leaving).unwrap();
    // Capacity 0 at once.
    assert!(matches!(
        s.wait_for_starting_task(req()).await.unwrap_err(),
        Rejection::EnvironmentNotAvailable { .. }
    ));
    // Removed as soon as the sweeper runs, with its grants.
    settle().await;
    let snap = s.snapshot();
    assert!(snap.servants.is_empty());
    assert!(snap.grants.is_empty());
    assert_eq!(snap.counters.servants_expired, 1);
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[g.id], secs(1)).unwrap(),
        vec![false]
    );
}

#[tokio::test(start_paused = true)]
async fn heartbeat_old_daemon_num_processors_zero_means_capacity() {
    let s = Scheduler::new(config());
    let mut old = hb("10.0.0.1:8335", 6);
    old.num_processors = 0;
    old.current_load = 3;
    s.heartbeat(old).unwrap();
    let v = servant_view(&s, "10.0.0.1:8335");
    assert_eq!(v.num_processors, 6);
    // min(6, 6 - 3)
    assert_eq!(v.capacity_available, 3);
}

#[tokio::test(start_paused = true)]
async fn heartbeat_replaces_the_whole_record() {
    let s = Scheduler::new(config());
    let mut first = hb("10.0.0.1:8335", 4);
    first.environments = vec!["a".into(), "b".into()];
    s.heartbeat(first).unwrap();
    let mut second = hb("10.0.0.1:8335", 8);
    second.environments = vec!["c".into(), "b".into(), "c".into()];
    second.priority = ServantPriority::Dedicated;
    second.version = 9;
    s.heartbeat(second).unwrap();
    let snap = s.snapshot();
    let v = &snap.servants[0];
    assert_eq!(v.environments, vec!["b".to_owned(), "c".to_owned()]);
    assert_eq!(v.max_tasks, 8);
    assert_eq!(v.version, 9);
    assert_eq!(v.priority, ServantPriority::Dedicated);
    let digests: Vec<_> = snap
        .environments
        .iter()
        .map(|e| e.digest.as_str())
        .collect();
    assert_eq!(
        digests,
        ["b", "c"],
        "environment a is gone with its last servant"
    );
}

#[tokio::test(start_paused = true)]
async fn invalid_argument_limits() {
    let s = Scheduler::new(config());
    fn invalid<T: std::fmt::Debug>(r: Result<T, Rejection>, needle: &str) {
        match r {
            Err(Rejection::InvalidArgument(msg)) => {
                assert!(msg.contains(needle), "{msg:?} should mention {needle:?}")
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    let mut b = hb("10.0.0.1:8335", 4);
    b.next_heartbeat_in = ms(30_001);
    invalid(
        s.heartbeat(b),
        "next_heartbeat_in_ms 30001 exceeds the 30000 ms limit",
    );
    let mut b = hb("10.0.0.1:8335", 4);
    b.next_heartbeat_in = ms(30_000);
    assert!(s.heartbeat(b).is_ok(), "30000 ms is allowed");
    let mut b = hb("10.0.0.1:8335", 4);
    b.environments = (0..1025).map(|i| format!("env{i}")).collect();
    invalid(
        s.heartbeat(b),
        "env_descs has 1025 entries, more than the 1024 limit",
    );
    let mut b = hb("10.0.0.1:8335", 4);
    b.running_tasks = (1..=8193).map(task).collect();
    invalid(
        s.heartbeat(b),
        "running_tasks has 8193 entries, more than the 8192 limit",
    );
    // Characters, not bytes: 256 two-byte characters are within the limit.
    let mut b = hb("10.0.0.1:8335", 4);
    b.environments = vec!["é".repeat(256)];
    assert!(s.heartbeat(b).is_ok());
    let mut b = hb("10.0.0.1:8335", 4);
    b.environments = vec!["d".repeat(257)];
    invalid(
        s.heartbeat(b),
        "env_descs.compiler_digest is 257 characters long, more than the 256 character limit",
    );
    let mut b = hb("10.0.0.1:8335", 4);
    b.running_tasks = vec![ReportedTask {
        task_digest: "t".repeat(257),
        ..task(1)
    }];
    invalid(
        s.heartbeat(b),
        "running_tasks.task_digest is 257 characters",
    );
    let mut b = hb("10.0.0.1:8335", 4);
    b.location = "10.0.0.1".into();
    invalid(s.heartbeat(b), "location \"10.0.0.1\" is not IP:port");

    invalid(
        s.wait_for_starting_task(req_wait(ms(20_000))).await,
        "milliseconds_to_wait 20000 exceeds the 10000 ms limit",
    );
    invalid(
        s.wait_for_starting_task(GrantRequest {
            lease: ms(30_001),
            ..req()
        })
        .await,
        "next_keep_alive_in_ms 30001 exceeds the 30000 ms limit",
    );
    invalid(
        s.wait_for_starting_task(GrantRequest {
            environment: "e".repeat(257),
            ..req()
        })
        .await,
        "env_desc.compiler_digest is 257 characters long",
    );
    invalid(
        s.keep_alive(USER, ip(HOME), &[1], ms(30_001)),
        "next_keep_alive_in_ms 30001 exceeds the 30000 ms limit",
    );
    let ids: Vec<u64> = (1..=65_537).collect();
    invalid(
        s.keep_alive(USER, ip(HOME), &ids, secs(1)),
        "task_grant_ids has 65537 entries, more than the 65536 limit",
    );
    invalid(
        s.free(USER, ip(HOME), &ids),
        "task_grant_ids has 65537 entries, more than the 65536 limit",
    );
}

#[tokio::test(start_paused = true)]
async fn servant_reports_are_bounded_in_total() {
    let s = Scheduler::new(Config {
        limits: Limits {
            max_reported_tasks: 3,
            ..Limits::default()
        },
        ..config()
    });
    s.heartbeat(beat_with("10.0.0.1:8335", &[1, 2])).unwrap();
    match s.heartbeat(beat_with("10.0.0.2:8335", &[3, 4])) {
        Err(Rejection::InvalidArgument(msg)) => assert!(msg.contains("3 limit"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.snapshot().servants.len(),
        1,
        "the refused report changed nothing"
    );
    // A servant replacing its own report is counted once.
    s.heartbeat(beat_with("10.0.0.1:8335", &[5, 6])).unwrap();
    s.heartbeat(beat_with("10.0.0.2:8335", &[7])).unwrap();
    // A servant that leaves for good gives its share back.
    let mut leaving = beat_with("10.0.0.1:8335", &[]);
    leaving.next_heartbeat_in = Duration::ZERO;
    s.heartbeat(leaving).unwrap();
    s.heartbeat(beat_with("10.0.0.2:8335", &[7, 8, 9])).unwrap();
}

#[tokio::test(start_paused = true)]
async fn sums_over_servants_cannot_overflow() {
    let s = Scheduler::new(config());
    for i in 1..=3 {
        let mut b = hb(&format!("10.0.0.{i}:8335"), u32::MAX);
        b.num_processors = u32::MAX;
        s.heartbeat(b).unwrap();
    }
    let snap = s.snapshot();
    let per_servant = u64::from(snap.servants[0].capacity_available);
    assert_eq!(per_servant, (1 << 31) - 1);
    assert_eq!(snap.environments[0].capacity_available, 3 * per_servant);
    assert_eq!(snap.totals.capacity_available, 3 * per_servant);
}
