//! Tokens: user and servant sets, the flag's splitting rule, the serving-daemon
//! ring, the order of checks, and secrets kept out of messages.

use super::*;

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
    // An empty flag is never the open mode (settings refuse it before):
    // split literally, it is the empty token alone.
    let empty = TokenSet::from_flag("");
    assert!(!empty.accepts_anyone() && !empty.accepts_token("whatever"));
    assert!(empty.accepts_token(""));
    // Only the explicit open mode accepts anyone.
    let open = TokenSet::anyone();
    assert!(open.accepts_anyone() && open.accepts_token("whatever"));
    // An empty list accepts nobody.
    assert!(!TokenSet::new(Vec::<String>::new()).accepts_token(""));
    assert!(!TokenSet::default().accepts_token("a"));
}

#[tokio::test(start_paused = true)]
async fn tokens_empty_entry_is_the_empty_token_open_mode_is_anyone() {
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
        user_tokens: TokenSet::anyone(),
        servant_tokens: TokenSet::anyone(),
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
        .map(|k| crate::tokens::serving_token(&secret, k))
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
    assert!(set.accepts(&crate::tokens::digest("alpha")));
    assert!(set.accepts(&crate::tokens::digest("beta")));
    assert!(!set.accepts(&crate::tokens::digest("alph")));
    assert!(!set.accepts(&crate::tokens::digest("alphaa")));
    assert!(!set.accepts(&crate::tokens::digest("")));
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
    let ring =
        crate::tokens::TokenRing::new(Some(b"ring-secret".to_vec()), secs(60), Instant::now());
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
