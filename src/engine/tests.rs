//! Engine tests. Time is paused (`start_paused`) and moved with
//! `tokio::time::advance`; no test sleeps for real. Each test's name says the
//! rule it checks.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::*;

const USER: &str = "user-token-1";
const SERVANT: &str = "servant-token-1";
const ENV: &str = "gcc-12-digest";
/// The requesting machine of `req()` (no servant there).
const HOME: &str = "10.9.9.9";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("test socket address")
}

/// User and servant token sets without intersection; no adoption (so unknown
/// reported ids are expired at once, as in the reference).
fn config() -> Config {
    Config {
        user_tokens: TokenSet::new([USER]),
        servant_tokens: TokenSet::new([SERVANT]),
        adoption_window: Duration::ZERO,
        ..Config::default()
    }
}

/// A servant at `location`, seen from the same address, with `capacity`
/// slots, as many processors, no load, and the one test environment.
fn hb(location: &str, capacity: u32) -> Heartbeat {
    let a = addr(location);
    Heartbeat {
        token: SERVANT.into(),
        observed_ip: a.ip(),
        location: location.to_owned(),
        next_heartbeat_in: secs(10),
        version: 1,
        num_processors: capacity,
        current_load: 0,
        priority: ServantPriority::User,
        not_accepting_reason: None,
        capacity,
        total_memory: 0,
        memory_available: 0,
        environments: vec![ENV.to_owned()],
        running_tasks: Vec::new(),
    }
}

fn task(grant_id: u64) -> ReportedTask {
    ReportedTask {
        servant_task_id: grant_id ^ 0xffff,
        grant_id,
        task_digest: format!("task-{grant_id}"),
    }
}

/// One immediate grant, no waiting, 15 s lease, from 10.9.9.9 (no servant there).
/// A one-grant request from the machine at `requester`.
fn req_from(requester: &str) -> GrantRequest {
    GrantRequest {
        requester_ip: ip(requester),
        ..req()
    }
}

fn req() -> GrantRequest {
    GrantRequest {
        token: USER.into(),
        requester_ip: ip(HOME),
        wait: Duration::ZERO,
        answer_within: None,
        environment: ENV.to_owned(),
        immediate: 1,
        prefetch: 0,
        lease: secs(15),
        min_version: 0,
    }
}

fn req_wait(wait: Duration) -> GrantRequest {
    GrantRequest { wait, ..req() }
}

/// Lets spawned tasks (the expiry task, waiters) run.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Moves the paused clock and lets the expiry task react.
async fn advance(d: Duration) {
    tokio::time::advance(d).await;
    settle().await;
}

async fn grant_one(s: &Scheduler, r: GrantRequest) -> Grant {
    let grants = s.wait_for_starting_task(r).await.expect("a grant");
    assert_eq!(grants.len(), 1);
    grants[0]
}

fn free_one(s: &Scheduler, id: u64) {
    s.free(USER, ip(HOME), &[id]).expect("free");
}

fn servant_view(s: &Scheduler, location: &str) -> ServantView {
    s.snapshot()
        .servants
        .into_iter()
        .find(|v| v.observed_location == addr(location))
        .expect("servant in snapshot")
}

// ---------------------------------------------------------------- lifecycle

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

// ---------------------------------------------------------------- placement

#[tokio::test(start_paused = true)]
async fn placement_prefers_dedicated_servant_even_with_higher_load() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("127.0.0.1:1234", 10)).unwrap();
    let from_self = req_from("127.0.0.1");
    // Only the requester's own machine: it is used as the last resort.
    let g = grant_one(&s, from_self.clone()).await;
    assert_eq!(g.servant, addr("127.0.0.1:1234"));
    free_one(&s, g.id);

    let mut dedicated = hb("192.168.0.1:1234", 10);
    dedicated.current_load = 2;
    dedicated.priority = ServantPriority::Dedicated;
    s.heartbeat(dedicated).unwrap();
    let g = grant_one(&s, from_self).await;
    assert_eq!(g.servant, addr("192.168.0.1:1234"));
}

#[tokio::test(start_paused = true)]
async fn placement_dedicated_preference_ends_at_half_its_processors() {
    let s = Scheduler::new(config());
    let mut user = hb("10.0.0.1:8335", 16);
    user.num_processors = 16;
    s.heartbeat(user).unwrap();
    let mut dedicated = hb("10.0.0.2:8335", 4);
    dedicated.priority = ServantPriority::Dedicated;
    s.heartbeat(dedicated).unwrap();
    // 0 and 1 granted of 4 processors: under half, dedicated wins.
    assert_eq!(grant_one(&s, req()).await.servant, addr("10.0.0.2:8335"));
    assert_eq!(grant_one(&s, req()).await.servant, addr("10.0.0.2:8335"));
    // 2 of 4 is not under half: lowest utilisation wins (0/16 < 2/4).
    assert_eq!(grant_one(&s, req()).await.servant, addr("10.0.0.1:8335"));
}

#[tokio::test(start_paused = true)]
async fn placement_load_balance_sequence_is_a_b_c_b_a_b_c() {
    let s = Scheduler::new(config());
    let mk = |loc: &str, capacity: u32, load: u32| {
        let mut b = hb(loc, capacity);
        b.num_processors = 16;
        b.current_load = load;
        b
    };
    let mut servants = [
        ("A", mk("192.168.0.1:1111", 7, 1)),
        ("B", mk("192.168.0.2:2222", 8, 5)),
        ("C", mk("192.168.0.3:3333", 6, 12)),
    ];
    for (_, b) in &servants {
        s.heartbeat(b.clone()).unwrap();
    }
    let mut picks = Vec::new();
    for _ in 0..7 {
        let g = grant_one(&s, req_from("127.0.0.3")).await;
        let (name, beat) = servants
            .iter_mut()
            .find(|(_, b)| addr(&b.location) == g.servant)
            .expect("one of the three");
        picks.push(*name);
        // The picked servant reports our task as one more unit of load.
        beat.current_load += 1;
        s.heartbeat(beat.clone()).unwrap();
    }
    assert_eq!(picks, ["A", "B", "C", "B", "A", "B", "C"]);
}

#[tokio::test(start_paused = true)]
async fn placement_overloaded_servant_never_gets_a_task() {
    let s = Scheduler::new(config());
    let mut over = hb("192.168.0.9:9999", 7);
    over.num_processors = 16;
    over.current_load = 16;
    s.heartbeat(over).unwrap();
    assert_eq!(servant_view(&s, "192.168.0.9:9999").capacity_available, 0);
    let err = s
        .wait_for_starting_task(req_wait(secs(1)))
        .await
        .unwrap_err();
    assert_eq!(err, Rejection::NoQuotaAvailable);

    // Still never picked once other servants exist.
    let mut other = hb("192.168.0.1:1111", 7);
    other.num_processors = 16;
    s.heartbeat(other).unwrap();
    for _ in 0..7 {
        assert_eq!(grant_one(&s, req()).await.servant, addr("192.168.0.1:1111"));
    }
    assert_eq!(
        s.wait_for_starting_task(req()).await.unwrap_err(),
        Rejection::NoQuotaAvailable
    );
}

#[tokio::test(start_paused = true)]
async fn placement_ties_go_to_the_earliest_registered_servant() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.3:8335", 3)).unwrap();
    s.heartbeat(hb("10.0.0.1:8335", 6)).unwrap();
    // 0/3 == 0/6: earliest registered (10.0.0.3) wins.
    assert_eq!(grant_one(&s, req()).await.servant, addr("10.0.0.3:8335"));
    // 1/3 > 0/6.
    assert_eq!(grant_one(&s, req()).await.servant, addr("10.0.0.1:8335"));
    // 1/3 > 1/6.
    assert_eq!(grant_one(&s, req()).await.servant, addr("10.0.0.1:8335"));
    // 1/3 == 2/6 exactly (no float rounding): earliest wins.
    assert_eq!(grant_one(&s, req()).await.servant, addr("10.0.0.3:8335"));
}

#[tokio::test(start_paused = true)]
async fn self_avoidance_ipv4() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    s.heartbeat(hb("10.0.0.2:8335", 4)).unwrap();
    let mine = req_from("10.0.0.1");
    // Not the requester's machine although it registered first and is idle.
    for _ in 0..4 {
        assert_eq!(
            grant_one(&s, mine.clone()).await.servant,
            addr("10.0.0.2:8335")
        );
    }
    // Others are full: the requester's own machine is the last resort.
    assert_eq!(grant_one(&s, mine).await.servant, addr("10.0.0.1:8335"));
}

#[tokio::test(start_paused = true)]
async fn self_avoidance_ipv6() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("[fd00::1]:8335", 4)).unwrap();
    s.heartbeat(hb("[fd00::2]:8335", 4)).unwrap();
    let g = grant_one(&s, req_from("fd00::1")).await;
    assert_eq!(g.servant, addr("[fd00::2]:8335"));
    // A string-prefix test would confuse fd00::1 with fd00::10; addresses do not.
    let g = grant_one(&s, req_from("fd00::10")).await;
    assert_eq!(g.servant, addr("[fd00::1]:8335"));
}

#[tokio::test(start_paused = true)]
async fn self_avoidance_ipv4_mapped_ipv6() {
    let s = Scheduler::new(config());
    // The servant connects over a dual-stack socket: peer ::ffff:10.0.0.1.
    let mut mapped = hb("10.0.0.1:8335", 4);
    mapped.observed_ip = ip("::ffff:10.0.0.1");
    s.heartbeat(mapped).unwrap();
    s.heartbeat(hb("10.0.0.2:8335", 4)).unwrap();
    let v = servant_view(&s, "10.0.0.1:8335");
    assert_eq!(v.not_accepting_reason, None, "mapped address is not NAT");
    assert_eq!(v.max_tasks, 4);
    // Requester seen as IPv4-mapped too.
    let g = grant_one(&s, req_from("::ffff:10.0.0.1")).await;
    assert_eq!(g.servant, addr("10.0.0.2:8335"));
    // And a plain IPv4 requester against the mapped-registered servant.
    let g = grant_one(&s, req_from("10.0.0.1")).await;
    assert_eq!(g.servant, addr("10.0.0.2:8335"));
}

#[tokio::test(start_paused = true)]
async fn placement_skips_servants_older_than_min_version() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap(); // version 1
    let mut newer = hb("10.0.0.2:8335", 4);
    newer.version = 3;
    s.heartbeat(newer).unwrap();
    let g = grant_one(
        &s,
        GrantRequest {
            min_version: 2,
            ..req()
        },
    )
    .await;
    assert_eq!(g.servant, addr("10.0.0.2:8335"));
    let err = s
        .wait_for_starting_task(GrantRequest {
            min_version: 4,
            ..req()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Rejection::EnvironmentNotAvailable { .. }));
}

// ---------------------------------------------------------------- tokens

#[tokio::test(start_paused = true)]
async fn tokens_without_intersection() {
    let s = Scheduler::new(config());
    // Unknown token: denied everywhere.
    let mut bad = hb("10.0.0.1:8335", 4);
    bad.token = "nope".into();
    assert_eq!(s.heartbeat(bad).unwrap_err(), Rejection::AccessDenied);
    assert_eq!(s.get_config("nope").unwrap_err(), Rejection::AccessDenied);
    assert_eq!(
        s.wait_for_starting_task(GrantRequest {
            token: "nope".into(),
            ..req()
        })
        .await
        .unwrap_err(),
        Rejection::AccessDenied
    );
    assert_eq!(
        s.keep_alive("nope", ip(HOME), &[1], secs(1)).unwrap_err(),
        Rejection::AccessDenied
    );
    assert_eq!(
        s.free("nope", ip(HOME), &[1]).unwrap_err(),
        Rejection::AccessDenied
    );

    // A servant token is not a user token.
    assert_eq!(s.get_config(SERVANT).unwrap_err(), Rejection::AccessDenied);
    assert_eq!(
        s.free(SERVANT, ip(HOME), &[1]).unwrap_err(),
        Rejection::AccessDenied
    );

    // Heartbeat with only a user token: recorded, capacity 0, not verified.
    let mut user_only = hb("10.0.0.1:8335", 4);
    user_only.token = USER.into();
    let reply = s.heartbeat(user_only).unwrap();
    assert_eq!(reply.acceptable_tokens.len(), 3);
    let v = servant_view(&s, "10.0.0.1:8335");
    assert_eq!(v.max_tasks, 0);
    assert_eq!(
        v.not_accepting_reason,
        Some(NotAcceptingReason::NotVerified)
    );
    assert!(matches!(
        s.wait_for_starting_task(req()).await.unwrap_err(),
        Rejection::EnvironmentNotAvailable { .. }
    ));

    // With the servant token it is verified.
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    let v = servant_view(&s, "10.0.0.1:8335");
    assert_eq!(v.max_tasks, 4);
    assert_eq!(v.not_accepting_reason, None);
}

#[tokio::test(start_paused = true)]
async fn tokens_with_intersection() {
    let s = Scheduler::new(Config {
        user_tokens: TokenSet::new(["both", USER]),
        servant_tokens: TokenSet::new(["both"]),
        ..config()
    });
    let mut b = hb("10.0.0.1:8335", 4);
    b.token = "both".into();
    s.heartbeat(b).unwrap();
    assert_eq!(servant_view(&s, "10.0.0.1:8335").max_tasks, 4);
    assert!(s.get_config("both").is_ok());
    let g = grant_one(
        &s,
        GrantRequest {
            token: "both".into(),
            ..req()
        },
    )
    .await;
    s.free("both", ip(HOME), &[g.id]).unwrap();
}

#[test]
fn token_flag_entries_are_literal_and_an_empty_entry_is_the_empty_token() {
    // `--acceptable_user_tokens="a, "`: the tokens `a` and ` `, nobody else.
    let set = TokenSet::from_flag("a, ");
    assert!(set.accepts_token("a"));
    assert!(set.accepts_token(" "));
    assert!(!set.accepts_token("anything"));
    assert!(!set.accepts_token(""));
    assert!(!set.accepts_anyone() && !set.accepts_empty_token());
    // No trimming: " a" is not "a".
    assert!(!TokenSet::from_flag(" a").accepts_token("a"));
    // `a,` and `,a`: `a` and the empty token (daemons without --token).
    for flag in ["a,", ",a"] {
        let set = TokenSet::from_flag(flag);
        assert!(set.accepts_token("a") && set.accepts_token(""), "{flag}");
        assert!(!set.accepts_token("b"), "{flag}");
        assert!(set.accepts_empty_token() && !set.accepts_anyone(), "{flag}");
        assert_eq!(set.len(), 2);
    }
    // Only an explicitly empty whole flag is the open mode.
    let open = TokenSet::from_flag("");
    assert!(open.accepts_anyone() && open.accepts_token("whatever"));
    // An empty list accepts nobody.
    assert!(!TokenSet::new(Vec::<String>::new()).accepts_token(""));
    assert!(!TokenSet::default().accepts_token("a"));
}

#[tokio::test(start_paused = true)]
async fn tokens_empty_entry_is_the_empty_token_open_flag_is_anyone() {
    let listed = Scheduler::new(Config {
        user_tokens: TokenSet::from_flag(","),
        servant_tokens: TokenSet::from_flag("s,"),
        ..config()
    });
    assert!(listed.get_config("").is_ok());
    assert_eq!(
        listed.get_config("whatever").unwrap_err(),
        Rejection::AccessDenied
    );
    let mut b = hb("10.0.0.1:8335", 4);
    b.token = "anything".into();
    assert_eq!(listed.heartbeat(b).unwrap_err(), Rejection::AccessDenied);
    let mut b = hb("10.0.0.1:8335", 4);
    b.token = "".into();
    listed.heartbeat(b).unwrap();
    assert_eq!(servant_view(&listed, "10.0.0.1:8335").max_tasks, 4);

    let open = Scheduler::new(Config {
        user_tokens: TokenSet::from_flag(""),
        servant_tokens: TokenSet::from_flag(""),
        ..config()
    });
    assert!(open.get_config("whatever").is_ok());
    let mut b = hb("10.0.0.1:8335", 4);
    b.token = "anything".into();
    open.heartbeat(b).unwrap();
    assert_eq!(servant_view(&open, "10.0.0.1:8335").max_tasks, 4);

    let closed = Scheduler::new(Config {
        user_tokens: TokenSet::default(),
        servant_tokens: TokenSet::default(),
        ..config()
    });
    assert_eq!(closed.get_config("").unwrap_err(), Rejection::AccessDenied);
    let mut b = hb("10.0.0.1:8335", 4);
    b.token = "".into();
    assert_eq!(closed.heartbeat(b).unwrap_err(), Rejection::AccessDenied);
}

#[tokio::test(start_paused = true)]
async fn token_rollout_ring_of_three() {
    let s = Scheduler::new(Config {
        serving_daemon_token_rollout_interval: secs(60),
        ..config()
    });
    let first = s.get_config(USER).unwrap();
    assert_eq!(first.len(), 32, "128-bit hex");
    assert_eq!(
        s.get_config(USER).unwrap(),
        first,
        "same within one interval"
    );
    let ring = s
        .heartbeat(hb("10.0.0.1:8335", 4))
        .unwrap()
        .acceptable_tokens;
    assert_eq!(ring.len(), 3);
    assert_eq!(
        ring[1], first,
        "GetConfig returns the middle (active) token"
    );
    assert!(s.snapshot().serving_daemon_tokens_rollout_in <= secs(60));

    advance(secs(60)).await;
    let second = s.get_config(USER).unwrap();
    assert_ne!(second, first, "a new token after a rollout");
    let ring2 = s
        .heartbeat(hb("10.0.0.1:8335", 4))
        .unwrap()
        .acceptable_tokens;
    assert_eq!(ring2[0], ring[1], "oldest dropped, the rest shift");
    assert_eq!(ring2[1], ring[2]);
    assert_eq!(ring2[1], second);
}

#[tokio::test(start_paused = true)]
async fn token_ring_survives_restart_with_the_same_secret() {
    let secret = b"a shared secret of the deployment".to_vec();
    let cfg = Config {
        serving_daemon_token_secret: Some(secret.clone().into()),
        ..config()
    };
    let a = Scheduler::new(cfg.clone());
    let b = Scheduler::new(cfg);
    let active = a.get_config(USER).unwrap();
    let ring_b = b
        .heartbeat(hb("10.0.0.1:8335", 4))
        .unwrap()
        .acceptable_tokens;
    assert!(
        ring_b.contains(&active),
        "restarted instance accepts the old active token"
    );

    // The ring is the documented derivation of the wall-clock epoch.
    let epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 3600;
    let expected: Vec<String> = (epoch - 2..=epoch + 1)
        .map(|k| tokens::serving_token(&secret, k))
        .collect();
    assert!(expected.contains(&active));

    // Without a secret, instances differ.
    let c = Scheduler::new(config());
    let d = Scheduler::new(config());
    assert_ne!(c.get_config(USER).unwrap(), d.get_config(USER).unwrap());
}

#[test]
fn token_set_compares_every_token() {
    let set = TokenSet::new(["alpha", "beta"]);
    assert!(set.accepts(&tokens::digest("alpha")));
    assert!(set.accepts(&tokens::digest("beta")));
    assert!(!set.accepts(&tokens::digest("alph")));
    assert!(!set.accepts(&tokens::digest("alphaa")));
    assert!(!set.accepts(&tokens::digest("")));
}

#[test]
fn rejection_messages_never_contain_tokens() {
    let all = [
        Rejection::AccessDenied,
        Rejection::InvalidArgument("milliseconds_to_wait 20000 exceeds the 10000 ms limit".into()),
        Rejection::VersionTooOld {
            version: 1,
            minimum: 2,
        },
        Rejection::EnvironmentNotAvailable {
            environment: ENV.into(),
        },
        Rejection::NoQuotaAvailable,
    ];
    for r in all {
        let text = r.to_string();
        assert!(!text.contains(USER) && !text.contains(SERVANT), "{text}");
        assert!(!text.is_empty());
    }
    let cfg = format!("{:?}", config());
    assert!(!cfg.contains(USER) && !cfg.contains(SERVANT), "{cfg}");
}

#[test]
fn not_accepting_reason_codes_round_trip() {
    assert_eq!(NotAcceptingReason::from_code(0), None);
    for code in [1, 2, 3, 4, 100, 7] {
        let r = NotAcceptingReason::from_code(code).unwrap();
        assert_eq!(r.code(), code);
        assert!(!r.describe().is_empty());
    }
    assert_eq!(
        NotAcceptingReason::from_code(4),
        Some(NotAcceptingReason::BehindNat)
    );
    assert_eq!(
        NotAcceptingReason::from_code(100),
        Some(NotAcceptingReason::NotVerified)
    );
}

// ---------------------------------------------------------------- heartbeat rules

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
    s.heartbeat(rich).unwrap();
    assert_eq!(servant_view(&s, "10.0.0.1:8335").capacity_available, 4);

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
            environment: String::new(),
            ..req()
        })
        .await,
        "compiler_digest",
    );
    invalid(
        s.wait_for_starting_task(GrantRequest {
            immediate: 0,
            prefetch: 0,
            ..req()
        })
        .await,
        "immediate_reqs + prefetch_reqs is 0",
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

// ---------------------------------------------------------------- grants

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
    let waiting = tokio::spawn({
        let s = s.clone();
        async move {
            s.wait_for_starting_task(GrantRequest {
                immediate: 3,
                ..req_wait(secs(5))
            })
            .await
        }
    });
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
    let waiting = tokio::spawn({
        let s = s.clone();
        async move {
            s.wait_for_starting_task(GrantRequest {
                immediate: 2,
                prefetch: 1,
                ..req_wait(secs(5))
            })
            .await
        }
    });
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

// ---------------------------------------------------------------- waiting

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
    let waiting = tokio::spawn({
        let s = s.clone();
        async move { s.wait_for_starting_task(req_wait(secs(10))).await }
    });
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

    let spawn_wait = |min_version: u32| {
        let s = s.clone();
        tokio::spawn(async move {
            s.wait_for_starting_task(GrantRequest {
                min_version,
                ..req_wait(secs(10))
            })
            .await
        })
    };
    let needs_v2 = spawn_wait(2);
    settle().await;
    let any = spawn_wait(0);
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
    let first = tokio::spawn({
        let s = s.clone();
        async move { s.wait_for_starting_task(req_wait(secs(10))).await }
    });
    settle().await;
    let second = tokio::spawn({
        let s = s.clone();
        async move { s.wait_for_starting_task(req_wait(secs(10))).await }
    });
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

    let gone = tokio::spawn({
        let s = s.clone();
        async move { s.wait_for_starting_task(req_wait(secs(10))).await }
    });
    settle().await;
    let next = tokio::spawn({
        let s = s.clone();
        async move { s.wait_for_starting_task(req_wait(secs(10))).await }
    });
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
    let gone = tokio::spawn({
        let s = s.clone();
        async move { s.wait_for_starting_task(req_wait(secs(10))).await }
    });
    settle().await;
    let next = tokio::spawn({
        let s = s.clone();
        async move { s.wait_for_starting_task(req_wait(secs(10))).await }
    });
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
        queued.push(tokio::spawn({
            let s = s.clone();
            async move { s.wait_for_starting_task(req_wait(secs(10))).await }
        }));
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
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.wait_for_starting_task(req_wait(secs(10))).await })
        })
        .collect();
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

// ---------------------------------------------------------------- expiry

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
    let waiting = tokio::spawn({
        let s = s.clone();
        async move { s.wait_for_starting_task(req_wait(secs(10))).await }
    });
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
async fn expiry_task_stops_when_the_last_handle_is_dropped() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let shared = s.shared().clone();
    let clone = s.clone();
    drop(s);
    settle().await;
    assert!(!shared.lock().stopped, "a clone is still alive");
    drop(clone);
    settle().await;
    assert_eq!(Arc::strong_count(&shared), 1, "the expiry task let go");
}

// ---------------------------------------------------------------- reads

#[tokio::test(start_paused = true)]
async fn running_tasks_use_the_observed_location_and_are_cached() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    let g = grant_one(&s, req()).await;
    let mut b = hb("10.0.0.1:8335", 4);
    b.running_tasks = vec![task(g.id)];
    s.heartbeat(b.clone()).unwrap();

    let list = s.running_tasks();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].servant, addr("10.0.0.1:8335"));
    assert_eq!(list[0].grant_id, g.id);
    assert_eq!(list[0].task_digest, format!("task-{}", g.id));

    // Unchanged reports: the same cached list.
    s.heartbeat(b.clone()).unwrap();
    assert!(Arc::ptr_eq(&list, &s.running_tasks()));
    // A changed report is seen once the list is older than the refresh
    // interval: until then every caller shares the list already built.
    b.running_tasks.clear();
    s.heartbeat(b).unwrap();
    assert!(Arc::ptr_eq(&list, &s.running_tasks()));
    advance(config().running_tasks_refresh).await;
    assert!(s.running_tasks().is_empty());
}

#[tokio::test(start_paused = true)]
async fn running_tasks_list_only_live_grants_of_trusted_servants() {
    let s = Scheduler::new(Config {
        running_tasks_refresh: Duration::ZERO,
        ..config()
    });
    let beat = |location: &str, tasks: &[u64]| {
        let mut b = hb(location, 4);
        b.next_heartbeat_in = secs(30);
        b.running_tasks = tasks.iter().map(|&id| task(id)).collect();
        b
    };
    s.heartbeat(beat("10.0.0.1:8335", &[])).unwrap();
    s.heartbeat(beat("10.0.0.2:8335", &[])).unwrap();
    let g1 = grant_one(&s, req()).await;
    let g2 = grant_one(&s, req()).await;
    let (on_a, on_b) = if g1.servant == addr("10.0.0.1:8335") {
        (g1, g2)
    } else {
        (g2, g1)
    };
    assert_eq!(on_b.servant, addr("10.0.0.2:8335"));

    // Ids returned as expired (unknown, or live on another servant) are left out.
    let reply = s
        .heartbeat(beat("10.0.0.1:8335", &[on_a.id, 999, on_b.id]))
        .unwrap();
    assert_eq!(reply.expired_grant_ids, vec![999, on_b.id]);
    let ids =
        |s: &Scheduler| -> Vec<u64> { s.running_tasks().iter().map(|t| t.grant_id).collect() };
    assert_eq!(ids(&s), vec![on_a.id]);

    // A servant that turns out to be behind NAT (same observed location,
    // another reported one) shows nothing, even its live grants.
    let mut nat = beat("10.0.0.2:8335", &[on_b.id]);
    s.heartbeat(nat.clone()).unwrap();
    assert_eq!(ids(&s), vec![on_a.id, on_b.id]);
    nat.location = "192.168.1.2:8335".into();
    nat.observed_ip = ip("10.0.0.2");
    s.heartbeat(nat).unwrap();
    assert_eq!(ids(&s), vec![on_a.id]);

    // A servant presenting only a user token (not verified) shows nothing.
    let mut unverified = beat("10.0.0.1:8335", &[on_a.id]);
    unverified.token = USER.into();
    s.heartbeat(unverified).unwrap();
    assert!(ids(&s).is_empty());
    s.heartbeat(beat("10.0.0.1:8335", &[on_a.id])).unwrap();
    assert_eq!(ids(&s), vec![on_a.id]);

    // A zombie (lease ended, still reported) is left out.
    advance(secs(16)).await;
    let reply = s.heartbeat(beat("10.0.0.1:8335", &[on_a.id])).unwrap();
    assert_eq!(reply.expired_grant_ids, vec![on_a.id]);
    assert!(ids(&s).is_empty());
}

#[tokio::test(start_paused = true)]
async fn snapshot_fields() {
    let s = Scheduler::new(config());
    let mut a = hb("10.0.0.1:8335", 4);
    a.num_processors = 8;
    a.current_load = 6;
    a.total_memory = 32 << 30;
    a.memory_available = 20 << 30;
    a.priority = ServantPriority::Dedicated;
    a.version = 7;
    s.heartbeat(a).unwrap();
    advance(secs(1)).await;
    let mut nat = hb("10.0.0.2:8335", 4);
    nat.observed_ip = ip("10.0.0.3");
    s.heartbeat(nat).unwrap();
    let g = grant_one(
        &s,
        GrantRequest {
            prefetch: 1,
            immediate: 0,
            requester_ip: ip("10.0.0.9"),
            ..req()
        },
    )
    .await;
    advance(secs(2)).await;

    let snap = s.snapshot();
    assert_eq!(snap.uptime, secs(3));
    assert_eq!(snap.servants.len(), 2);
    let a = &snap.servants[0];
    assert_eq!(a.observed_location, addr("10.0.0.1:8335"));
    assert_eq!(a.reported_location, addr("10.0.0.1:8335"));
    assert_eq!(a.version, 7);
    assert_eq!(a.priority, ServantPriority::Dedicated);
    assert_eq!(a.environments, vec![ENV.to_owned()]);
    assert_eq!(a.max_tasks, 4);
    assert_eq!(a.not_accepting_reason, None);
    assert_eq!(a.num_processors, 8);
    assert_eq!(a.current_load, 6);
    // foreign = 6 - 1 = 5; min(4, 8 - 5) = 3
    assert_eq!(a.capacity_available, 3);
    assert_eq!(a.total_memory, 32 << 30);
    assert_eq!(a.memory_available, 20 << 30);
    assert_eq!(a.running, 1);
    assert_eq!(a.zombies, 0);
    assert_eq!(a.ever_assigned, 1);
    assert_eq!(a.reported_running_tasks, 0);
    assert_eq!(a.waiters, 0);
    assert_eq!(a.discovered_ago, secs(3));
    assert_eq!(a.expires_in, secs(7));
    assert!(!a.leaving);
    let n = &snap.servants[1];
    assert_eq!(n.observed_location, addr("10.0.0.3:8335"));
    assert_eq!(n.not_accepting_reason, Some(NotAcceptingReason::BehindNat));

    assert_eq!(snap.grants.len(), 1);
    let gv = &snap.grants[0];
    assert_eq!(gv.id, g.id);
    assert_eq!(gv.requester, Some(ip("10.0.0.9")));
    assert_eq!(gv.servant, addr("10.0.0.1:8335"));
    assert_eq!(gv.environment.as_deref(), Some(ENV));
    assert_eq!(gv.age, secs(2));
    assert_eq!(gv.lease_left, secs(13));
    assert!(gv.prefetch && !gv.zombie && !gv.adopted);

    assert_eq!(snap.environments.len(), 1);
    let e = &snap.environments[0];
    assert_eq!(e.digest, ENV);
    assert_eq!(e.servants, 2);
    assert_eq!(e.capacity_available, 3);
    assert_eq!(e.running, 1);
    assert_eq!(e.waiters, 0);

    let t = snap.totals;
    assert_eq!(t.servants_up, 2);
    assert_eq!(t.servants_accepting, 1);
    assert_eq!(t.capacity, 4);
    assert_eq!(t.capacity_available, 2);
    assert_eq!(t.capacity_unavailable, 1);
    assert_eq!(t.running, 1);
    assert_eq!(t.zombies, 0);
    assert_eq!(t.waiters, 0);
    assert_eq!(t.grants, 1);
    assert_eq!(snap.counters.grants_issued, 1);
    assert!(snap.serving_daemon_tokens_rollout_in <= secs(3600));
}

#[tokio::test(start_paused = true)]
async fn snapshot_counts_waiters_per_environment_and_servant() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let _held = grant_one(&s, req()).await;
    let _w = tokio::spawn({
        let s = s.clone();
        async move { s.wait_for_starting_task(req_wait(secs(10))).await }
    });
    settle().await;
    let snap = s.snapshot();
    assert_eq!(snap.totals.waiters, 1);
    assert_eq!(snap.environments[0].waiters, 1);
    assert_eq!(snap.servants[0].waiters, 1);
}

#[tokio::test(start_paused = true)]
async fn wait_future_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let s = Scheduler::new(config());
    let fut = s.wait_for_starting_task(req());
    assert_send(&fut);
    drop(fut);
}

#[test]
fn utilisation_key_orders_exactly_like_cross_multiplication() {
    use super::placement::{MAX_SLOTS, PlaceKey};
    let order = |g1: u32, a1: u32, g2: u32, a2: u32| {
        let k1 = PlaceKey::new(1, g1, a1, 7);
        let k2 = PlaceKey::new(1, g2, a2, 7);
        let cross = (u64::from(g1) * u64::from(a2)).cmp(&(u64::from(g2) * u64::from(a1)));
        assert_eq!(k1.rank.cmp(&k2.rank), cross, "{g1}/{a1} vs {g2}/{a2}");
    };
    for a1 in 1..=24 {
        for g1 in 0..a1 {
            for a2 in 1..=24 {
                for g2 in 0..a2 {
                    order(g1, a1, g2, a2);
                }
            }
        }
    }
    // Near the top of the range, where 1/(a1*a2) is smallest.
    let big = [
        MAX_SLOTS,
        MAX_SLOTS - 1,
        MAX_SLOTS - 2,
        1 << 30,
        (1 << 30) + 1,
    ];
    for &a1 in &big {
        for &a2 in &big {
            for g1 in [0, 1, a1 / 2, a1 - 2, a1 - 1] {
                for g2 in [0, 1, a2 / 2, a2 - 2, a2 - 1] {
                    order(g1, a1, g2, a2);
                }
            }
        }
    }
    for _ in 0..100_000 {
        let a1 = rand::random_range(1..=MAX_SLOTS);
        let a2 = rand::random_range(1..=MAX_SLOTS);
        order(rand::random_range(0..a1), a1, rand::random_range(0..a2), a2);
    }
    // Tier dominates utilisation.
    assert!(PlaceKey::new(0, 9, 10, 1) < PlaceKey::new(1, 0, 10, 0));
}

/// The placement rule computed the slow way, from a snapshot: what the
/// indexes (with their lazily updated entries) must agree with.
fn expected_pick(
    snap: &Snapshot,
    env: &str,
    requester: IpAddr,
    min_version: u32,
) -> Option<SocketAddr> {
    let requester = requester.to_canonical();
    let mut best: Option<(u8, u32, u32, usize)> = None; // tier, granted, available, order
    let mut own = None;
    for (order, v) in snap.servants.iter().enumerate() {
        if !v.environments.iter().any(|e| e == env)
            || v.version < min_version
            || v.capacity_available <= v.running
        {
            continue;
        }
        if v.observed_location.ip() == requester {
            own.get_or_insert(v.observed_location);
            continue;
        }
        let tier = if v.priority == ServantPriority::Dedicated
            && u64::from(v.running) * 2 < u64::from(v.num_processors)
        {
            0
        } else {
            1
        };
        let better = match best {
            None => true,
            Some((t, g, a, _)) => {
                let mine = u64::from(v.running) * u64::from(a);
                let theirs = u64::from(g) * u64::from(v.capacity_available);
                (tier, mine) < (t, theirs)
            }
        };
        if better {
            best = Some((tier, v.running, v.capacity_available, order));
        }
    }
    best.map(|(_, _, _, order)| snap.servants[order].observed_location)
        .or(own)
}

#[tokio::test(start_paused = true)]
async fn placement_indexes_agree_with_a_full_scan_under_random_operations() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    // ENGINE_TEST_SEED=n tries another sequence.
    let seed = std::env::var("ENGINE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let mut rng = StdRng::seed_from_u64(seed);
    let s = Scheduler::new(config());
    let envs = ["e0", "e1", "e2", "e3"];
    let locations: Vec<String> = (1..=12).map(|i| format!("10.0.0.{i}:8335")).collect();
    let mut live: Vec<u64> = Vec::new();
    let mut picks = 0;
    for step in 0..3_000 {
        match rng.random_range(0..10) {
            0..=2 => {
                let loc = &locations[rng.random_range(0..locations.len())];
                let mut b = hb(loc, rng.random_range(0..8));
                b.next_heartbeat_in = secs(rng.random_range(5..30));
                b.num_processors = rng.random_range(0..16);
                b.current_load = rng.random_range(0..12);
                b.version = rng.random_range(1..4);
                b.priority = if rng.random_bool(0.4) {
                    ServantPriority::Dedicated
                } else {
                    ServantPriority::User
                };
                b.environments = envs
                    .iter()
                    .filter(|_| rng.random_bool(0.6))
                    .map(|e| (*e).to_owned())
                    .collect();
                s.heartbeat(b).unwrap();
            }
            3..=6 => {
                let env = envs[rng.random_range(0..envs.len())];
                let requester = ip(&format!("10.0.0.{}", rng.random_range(1..=14)));
                let min_version = rng.random_range(0..4);
                let expected = expected_pick(&s.snapshot(), env, requester, min_version);
                let got = s
                    .wait_for_starting_task(GrantRequest {
                        environment: env.into(),
                        requester_ip: requester,
                        min_version,
                        lease: secs(rng.random_range(1..20)),
                        ..req()
                    })
                    .await;
                match got {
                    Ok(g) => {
                        assert_eq!(Some(g[0].servant), expected, "step {step}");
                        live.push(g[0].id);
                        picks += 1;
                    }
                    Err(_) => assert_eq!(expected, None, "step {step}"),
                }
            }
            7 | 8 if !live.is_empty() => {
                let id = live.swap_remove(rng.random_range(0..live.len()));
                s.free(USER, ip(HOME), &[id]).unwrap();
            }
            _ => advance(ms(rng.random_range(100..3_000))).await,
        }
    }
    assert!(picks > 300, "the test exercised placement ({picks} grants)");
}

#[tokio::test(start_paused = true)]
async fn grant_ids_look_random_even_when_a_slot_is_reused() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let mut ids = HashSet::new();
    let mut low_bits = HashSet::new();
    for _ in 0..2_000 {
        // The same table slot every time.
        let g = grant_one(&s, req()).await;
        assert_ne!(g.id, 0);
        assert!(ids.insert(g.id));
        low_bits.insert(g.id & 0xff_ffff);
        free_one(&s, g.id);
        assert_eq!(
            s.keep_alive(USER, ip(HOME), &[g.id], secs(1)).unwrap(),
            [false]
        );
    }
    assert!(low_bits.len() > 1_900, "the slot does not show in the id");
}

#[test]
fn grant_table_slab_and_side_map_hold_distinct_ids() {
    use super::grants::{GrantRec, GrantTable};
    let rec = |adopted: bool| GrantRec {
        servant: 1,
        servant_addr: addr("10.0.0.1:8335"),
        owner: None,
        environment: None,
        granted_at: Instant::now(),
        lease_until: Instant::now(),
        prefetch: false,
        zombie: false,
        adopted,
    };
    let mut t = GrantTable::with_slot_limit(4);
    t.insert_adopted(42, rec(true));
    let ids: Vec<u64> = (0..10).map(|_| t.insert_new(rec(false))).collect();
    assert_eq!(t.len(), 11);
    let distinct: HashSet<u64> = ids.iter().copied().chain([42]).collect();
    assert_eq!(distinct.len(), 11);
    assert!(ids.iter().all(|&id| id != 0 && t.contains_key(&id)));
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

// ---------------------------------------------------------------- issue 10: fidelity

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
    let waiting = tokio::spawn({
        let s = s.clone();
        async move {
            s.wait_for_starting_task(GrantRequest {
                immediate: 0,
                prefetch: 1,
                ..req_wait(secs(10))
            })
            .await
        }
    });
    settle().await;
    let mut b = hb("10.0.0.1:8335", 1);
    b.environments = vec!["other".into()];
    s.heartbeat(b).unwrap();
    assert_eq!(
        waiting.await.unwrap().unwrap_err(),
        Rejection::NoQuotaAvailable
    );
}

#[tokio::test(start_paused = true)]
async fn token_is_checked_before_version_and_arguments_in_every_call() {
    let s = Scheduler::new(Config {
        min_daemon_version: 5,
        ..config()
    });
    let bad_everything = || {
        let mut b = hb("10.0.0.1:8335", 4);
        b.version = 1;
        b.location = "not-a-location".into();
        b.next_heartbeat_in = secs(40);
        b.running_tasks = (1..=10_000).map(task).collect();
        b
    };
    // Heartbeat: token -> min_daemon_version -> location -> next_heartbeat_in_ms.
    let mut b = bad_everything();
    b.token = "nope".into();
    assert_eq!(s.heartbeat(b).unwrap_err(), Rejection::AccessDenied);
    assert!(matches!(
        s.heartbeat(bad_everything()).unwrap_err(),
        Rejection::VersionTooOld { .. }
    ));
    let mut b = bad_everything();
    b.version = 5;
    match s.heartbeat(b).unwrap_err() {
        Rejection::InvalidArgument(msg) => assert!(msg.starts_with("location"), "{msg}"),
        other => panic!("{other:?}"),
    }
    let mut b = bad_everything();
    b.version = 5;
    b.location = "10.0.0.1:8335".into();
    match s.heartbeat(b).unwrap_err() {
        Rejection::InvalidArgument(msg) => {
            assert!(msg.starts_with("next_heartbeat_in_ms"), "{msg}")
        }
        other => panic!("{other:?}"),
    }
    // The other calls: the token before any argument.
    let bad_wait = GrantRequest {
        token: "nope".into(),
        environment: String::new(),
        immediate: 0,
        prefetch: 0,
        ..req_wait(secs(20))
    };
    assert_eq!(
        s.wait_for_starting_task(bad_wait).await.unwrap_err(),
        Rejection::AccessDenied
    );
    let too_many: Vec<u64> = (1..=70_000).collect();
    assert_eq!(
        s.keep_alive("nope", ip(HOME), &too_many, secs(40))
            .unwrap_err(),
        Rejection::AccessDenied
    );
    assert_eq!(
        s.free("nope", ip(HOME), &too_many).unwrap_err(),
        Rejection::AccessDenied
    );
}

// ---------------------------------------------------------------- issue 10: adoption

/// A restarted engine with a 15 s adoption window.
fn restarted() -> Config {
    Config {
        adoption_window: secs(15),
        adopted_lease: secs(15),
        ..config()
    }
}

fn beat_with(location: &str, tasks: &[u64]) -> Heartbeat {
    let mut b = hb(location, 2);
    b.next_heartbeat_in = secs(30);
    b.running_tasks = tasks.iter().map(|&id| task(id)).collect();
    b
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
    let s = Scheduler::new(restarted());
    // The delegate renews before its servant has reported after the restart.
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[42], secs(30)).unwrap(),
        [true]
    );
    assert_eq!(s.snapshot().counters.early_renewals, 1);
    // Another machine cannot take it over.
    assert_eq!(
        s.keep_alive(USER, ip("10.7.7.7"), &[42], secs(30)).unwrap(),
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
    assert_eq!(s.shared().lock().adoption.remembered(), 2);
    // Past the bound of retired ids the window closes early: nothing more
    // is adopted (safe), and its memory is gone.
    s.heartbeat(beat_with("10.0.0.1:8335", &[])).unwrap();
    for _ in 0..3 {
        let g = grant_one(&s, req()).await;
        free_one(&s, g.id);
    }
    assert_eq!(s.shared().lock().adoption.remembered(), 0);
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

// ---------------------------------------------------------------- issue 10: trust

#[tokio::test(start_paused = true)]
async fn a_grant_belongs_to_whoever_received_it() {
    let s = Scheduler::new(Config {
        user_tokens: TokenSet::new([USER, "other-user"]),
        ..config()
    });
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    let g = grant_one(&s, req()).await;
    // Same token, another machine; same machine, another token.
    assert_eq!(
        s.keep_alive(USER, ip("10.7.7.7"), &[g.id], secs(10))
            .unwrap(),
        [false]
    );
    assert_eq!(
        s.keep_alive("other-user", ip(HOME), &[g.id], secs(10))
            .unwrap(),
        [false]
    );
    s.free(USER, ip("10.7.7.7"), &[g.id]).unwrap();
    let snap = s.snapshot();
    assert_eq!(snap.totals.grants, 1, "the free was skipped");
    assert_eq!(snap.counters.renewals_refused, 2);
    assert_eq!(snap.counters.frees_refused, 1);
    assert_eq!(snap.counters.frees, 0);
    let thief = snap
        .requesters
        .iter()
        .find(|r| r.ip == ip("10.7.7.7"))
        .unwrap();
    assert_eq!(thief.refused_total, 2);
    // The owner still renews and frees it (IPv4-mapped IPv6 is the same machine).
    let mapped: IpAddr = "::ffff:10.9.9.9".parse().unwrap();
    assert_eq!(
        s.keep_alive(USER, mapped, &[g.id], secs(10)).unwrap(),
        [true]
    );
    s.free(USER, ip(HOME), &[g.id]).unwrap();
    assert_eq!(s.snapshot().totals.grants, 0);
}

#[tokio::test(start_paused = true)]
async fn an_adopted_grant_belongs_to_its_first_renewer() {
    let s = Scheduler::new(restarted());
    s.heartbeat(beat_with("10.0.0.1:8335", &[42])).unwrap();
    assert_eq!(
        s.keep_alive(USER, ip("10.5.5.5"), &[42], secs(10)).unwrap(),
        [true]
    );
    assert_eq!(
        s.keep_alive(USER, ip(HOME), &[42], secs(10)).unwrap(),
        [false]
    );
    s.free(USER, ip(HOME), &[42]).unwrap();
    assert_eq!(s.snapshot().totals.grants, 1);
    s.free(USER, ip("10.5.5.5"), &[42]).unwrap();
    assert_eq!(s.snapshot().totals.grants, 0);
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

#[test]
fn secrets_never_show_in_debug_output() {
    let secret = b"the-serving-secret".to_vec();
    let config = Config {
        serving_daemon_token_secret: Some(secret.into()),
        ..config()
    };
    let mut b = hb("10.0.0.1:8335", 1);
    b.token = "hb-secret-token".into();
    let r = GrantRequest {
        token: "req-secret-token".into(),
        ..req()
    };
    let ring = tokens::TokenRing::new(Some(b"ring-secret".to_vec()), secs(60), Instant::now());
    let shown = format!(
        "{config:?} {b:?} {r:?} {ring:?} {:?} {:?}",
        TokenSet::from_flag("flag-secret,"),
        Redacted("plain-secret")
    );
    for secret in [
        USER,
        SERVANT,
        "the-serving-secret",
        "hb-secret-token",
        "req-secret-token",
        "ring-secret",
        "flag-secret",
        "plain-secret",
    ] {
        assert!(!shown.contains(secret), "{secret} in {shown}");
    }
    assert!(shown.contains("<redacted>"));
}

// ---------------------------------------------------------------- issue 10: fair shares

#[tokio::test(start_paused = true)]
async fn a_freed_slot_goes_to_the_machine_served_least_recently() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let mut held = (grant_one(&s, req_from("10.3.3.3")).await, "10.3.3.3");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let queue = |machine: &'static str, n: usize| {
        for _ in 0..n {
            let s = s.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let r = s
                    .wait_for_starting_task(GrantRequest {
                        wait: secs(10),
                        answer_within: None,
                        ..req_from(machine)
                    })
                    .await;
                let _ = tx.send((machine, r));
            });
        }
    };
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
async fn one_machine_s_waiters_are_capped() {
    let s = Scheduler::new(Config {
        limits: Limits {
            max_waiters_per_machine: 2,
            ..Limits::default()
        },
        ..config()
    });
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let _held = grant_one(&s, req()).await;
    let mut queued = Vec::new();
    for machine in ["10.1.1.1", "10.1.1.1", "10.2.2.2"] {
        queued.push(tokio::spawn({
            let s = s.clone();
            async move {
                s.wait_for_starting_task(GrantRequest {
                    wait: secs(10),
                    answer_within: None,
                    ..req_from(machine)
                })
                .await
            }
        }));
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
    assert_eq!(by_ip("10.2.2.2").waiting, 1);
    assert_eq!(by_ip(HOME).grants_held, 1);
    assert_eq!(by_ip(HOME).grants_total, 1);
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
