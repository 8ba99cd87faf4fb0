//! The command line as operators write it, and what it turns into.

use std::{ffi::OsString, time::Duration};

use super::*;
use crate::{dashboard::InspectAccess, edge::EdgeSettings, engine};

pub(super) fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_args(std::iter::once("yadcc-scheduler").chain(args.iter().copied())).unwrap()
}

#[test]
fn sizes_use_binary_units() {
    assert_eq!(parse_size("10G"), Ok(10 << 30));
    assert_eq!(parse_size("512m"), Ok(512 << 20));
    assert_eq!(parse_size("4MiB"), Ok(4 << 20));
    assert_eq!(parse_size("4096"), Ok(4096));
    assert!(parse_size("ten").is_err());
    assert!(parse_size("99999999999T").is_err());
}

#[test]
fn reference_and_kebab_spellings_are_both_accepted() {
    let snake = cli(&[
        "--acceptable_user_tokens=u1,u2",
        "--acceptable_servant_tokens=s",
        "--min_daemon_version=3",
    ]);
    let kebab = cli(&[
        "--acceptable-user-tokens=u1,u2",
        "--acceptable-servant-tokens=s",
        "--min-daemon-version=3",
    ]);
    let (snake, kebab) = (snake.settings().unwrap(), kebab.settings().unwrap());
    assert_eq!(
        snake.engine.user_tokens,
        engine::TokenSet::new(["u1", "u2"])
    );
    assert_eq!(snake.engine.user_tokens, kebab.engine.user_tokens);
    assert_eq!(kebab.engine.min_daemon_version, 3);
    assert_eq!(snake.listen.port(), 8336);
    assert_eq!(snake.transport.max_body_bytes, 4 << 20);
    assert_eq!(
        snake.engine.servant_min_memory_for_accepting_new_task,
        10 << 30
    );
}

#[test]
fn edge_flags_have_documented_defaults_and_bounds() {
    let settings = cli(&[
        "--acceptable_user_tokens=u",
        "--acceptable_servant_tokens=s",
    ])
    .settings()
    .unwrap();
    assert_eq!(settings.transport.edge, EdgeSettings::default());
    let tuned = cli(&[
        "--acceptable_user_tokens=u",
        "--acceptable_servant_tokens=s",
        "--header_read_timeout=500ms",
        "--idle_timeout=2m",
        "--max_connections=100",
        "--max_connections_per_ip=3",
        "--max_buffered_body_bytes=8M",
        "--http2_max_concurrent_streams=16",
    ])
    .settings()
    .unwrap()
    .transport
    .edge;
    assert_eq!(tuned.header_read_timeout, Duration::from_millis(500));
    assert_eq!(tuned.idle_timeout, Duration::from_secs(120));
    assert_eq!(tuned.max_connections, Some(100));
    assert_eq!(tuned.max_connections_per_ip, Some(3));
    assert_eq!(tuned.max_buffered_body_bytes, 8 << 20);
    assert_eq!(tuned.http2_max_concurrent_streams, 16);
    assert!(
        Cli::try_parse_args([
            "yadcc-scheduler",
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
            "--http2_max_concurrent_streams=0",
        ])
        .is_err(),
        "a connection needs a stream"
    );
    let error = cli(&[
        "--acceptable_user_tokens=u",
        "--acceptable_servant_tokens=s",
        "--idle_timeout=30s",
    ])
    .settings()
    .unwrap_err();
    assert!(error.contains("--idle_timeout"), "{error}");
    assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
    assert!(parse_duration("soon").is_err());
}

/// Every cap a daemon or an office can run into has a flag, defaulting to
/// the engine's and the edge's own defaults.
#[test]
fn cap_flags_default_to_the_limits_and_tune_them() {
    let defaults = cli(&[
        "--acceptable_user_tokens=u",
        "--acceptable_servant_tokens=s",
    ])
    .settings()
    .unwrap();
    let limits = engine::Limits::default();
    assert_eq!(defaults.engine.limits.max_waiters, limits.max_waiters);
    assert_eq!(
        defaults.engine.limits.max_waiters_per_requester,
        limits.max_waiters_per_requester
    );
    // Derived: 4096, at most half the connection cap.
    let edge = &defaults.transport.edge;
    assert_eq!(edge.max_connections_per_ip, None);
    assert_eq!(edge.connection_cap_per_ip(1_000_000), 4096);
    assert_eq!(edge.connection_cap_per_ip(4160), 2080, "an office of 2,000");
    assert_eq!(edge.connection_cap_per_ip(960), 480);
    assert_eq!(
        defaults.transport.edge.max_calls_in_flight_per_connection,
        crate::edge::MAX_CALLS_IN_FLIGHT_PER_CONNECTION
    );
    assert_eq!(
        defaults.transport.max_running_tasks_bytes,
        crate::rpc::running_tasks::DEFAULT_MAX_ANSWER_BYTES
    );
    let tuned = cli(&[
        "--acceptable_user_tokens=u",
        "--acceptable_servant_tokens=s",
        "--max_waiters=500",
        "--max_waiters_per_requester=8",
        "--max_calls_in_flight_per_connection=16",
        "--max_connections_per_ip=2500",
        "--max_running_tasks_bytes=128M",
    ])
    .settings()
    .unwrap();
    assert_eq!(tuned.engine.limits.max_waiters, 500);
    assert_eq!(tuned.engine.limits.max_waiters_per_requester, 8);
    assert_eq!(tuned.transport.edge.max_calls_in_flight_per_connection, 16);
    assert_eq!(tuned.transport.edge.max_connections_per_ip, Some(2500));
    assert_eq!(
        tuned.transport.edge.connection_cap_per_ip(960),
        2500,
        "as configured"
    );
    assert_eq!(tuned.transport.max_running_tasks_bytes, 128 << 20);
    for zero in [
        "--max_waiters=0",
        "--max_waiters_per_requester=0",
        "--max_calls_in_flight_per_connection=0",
    ] {
        let refused = Cli::try_parse_args([
            "yadcc-scheduler",
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
            zero,
        ]);
        assert!(refused.is_err(), "{zero}");
    }
}

#[test]
fn the_access_log_keeps_errors_by_default_and_takes_all_or_off() {
    use crate::logging::AccessLog;
    let mode = |extra: &[&str]| {
        let mut args = vec![
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
        ];
        args.extend(extra);
        cli(&args)
            .settings()
            .map(|settings| settings.transport.access_log)
    };
    assert_eq!(mode(&[]), Ok(AccessLog::Errors));
    assert_eq!(mode(&["--access_log=all"]), Ok(AccessLog::All));
    assert_eq!(mode(&["--access-log=off"]), Ok(AccessLog::Off));
    assert!(
        Cli::try_parse_args([
            "yadcc-scheduler",
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
            "--access_log=some",
        ])
        .is_err()
    );
}

#[test]
fn durations_are_capped_at_a_day() {
    assert_eq!(parse_duration("24h"), Ok(MAX_FLAG_DURATION));
    assert_eq!(parse_duration("86400"), Ok(MAX_FLAG_DURATION));
    for too_long in ["25h", "86401s", "18446744073709551615ms", "1441m"] {
        let error = parse_duration(too_long).unwrap_err();
        assert!(error.contains("24h maximum"), "{too_long}: {error}");
    }
    let error = Cli::try_parse_args([
        "yadcc-scheduler",
        "--header_read_timeout=18446744073709551615ms",
    ])
    .unwrap_err()
    .to_string();
    assert!(error.contains("24h maximum"), "{error}");
}

#[test]
fn starting_without_tokens_says_what_to_pass() {
    let error = cli(&["--acceptable_user_tokens=u"]).settings().unwrap_err();
    assert!(error.contains("--acceptable_servant_tokens"), "{error}");
    assert!(error.contains("--acceptable_user_tokens"), "{error}");
}

#[test]
fn the_demo_needs_no_other_flag_and_stays_on_loopback() {
    let settings = cli(&["--demo"]).settings().unwrap();
    assert!(settings.demo);
    assert_eq!(settings.listen.to_string(), "127.0.0.1:8336");
    assert_eq!(
        settings.engine.servant_tokens,
        engine::TokenSet::new([crate::sim::DEMO_SERVANT_TOKEN])
    );
    let given = cli(&["--demo", "--port=9", "--acceptable_user_tokens=u"])
        .settings()
        .unwrap();
    assert_eq!(given.engine.user_tokens, engine::TokenSet::new(["u"]));
    assert!(
        given.engine.tenancy.is_none(),
        "given tokens form one tenant"
    );
    assert_eq!(given.listen.port(), 9);
    // Stock daemons speak flare: so does the demo unless told otherwise.
    assert_eq!(settings.demo_protocol, crate::sim::Wire::Flare);
    let over_http = cli(&["--demo", "--protocol=http+pb"]).settings().unwrap();
    assert_eq!(over_http.demo_protocol, crate::sim::Wire::HttpPb);
    assert!(cli(&["--demo"]).settings().is_ok());
    assert!(Cli::try_parse_args(["yadcc-scheduler", "--demo", "--protocol=grpc"]).is_err());
}

#[test]
fn the_demo_opens_every_feature_with_public_credentials_on_loopback_only() {
    use crate::config::demo::{DEMO_ADMIN_TOKEN, DEMO_CI_TOKEN};
    let settings = cli(&["--demo"]).settings().unwrap();
    assert!(settings.admin_tokens.accepts(DEMO_ADMIN_TOKEN));
    let tenancy = settings.engine.tenancy.expect("the demo's tenants");
    let tenant_of = |token: &str| {
        let digest = engine::token_digest(token);
        tenancy
            .tenants
            .iter()
            .find(|tenant| tenant.token_digests.contains(&digest))
            .map(|tenant| (tenant.name.as_str(), tenant.weight, tenant.max_share))
    };
    assert_eq!(
        tenant_of(crate::sim::DEMO_USER_TOKEN),
        Some(("developers", 3.0, None))
    );
    assert_eq!(tenant_of(DEMO_CI_TOKEN), Some(("ci", 1.0, Some(0.5))));
    assert_eq!(
        tenancy.servant_tokens,
        Some(engine::TokenSet::new([crate::sim::DEMO_SERVANT_TOKEN]))
    );
    // A public admin token must not reach the network.
    let exposed = cli(&["--demo", "--listen=0.0.0.0:8336"])
        .settings()
        .unwrap();
    assert!(exposed.admin_tokens.is_closed());
    // Given credentials replace the demo's.
    let given = cli(&["--demo", "--admin_tokens=mine"]).settings().unwrap();
    assert!(given.admin_tokens.accepts("mine"));
    assert!(!given.admin_tokens.accepts(DEMO_ADMIN_TOKEN));
    let servants = cli(&["--demo", "--acceptable_servant_tokens=s"])
        .settings()
        .unwrap();
    assert_eq!(servants.engine.servant_tokens, engine::TokenSet::new(["s"]));
    assert!(servants.engine.tenancy.is_some());
}

fn gflags(args: &[&str]) -> (Cli, Vec<String>) {
    Cli::parse_gflags(
        std::iter::once("yadcc-scheduler")
            .chain(args.iter().copied())
            .map(OsString::from),
    )
    .unwrap()
}

#[test]
fn the_originals_command_line_works_unchanged() {
    let (cli, warnings) = gflags(&[
        "-port=8337",
        "--acceptable_user_tokens=user-secret-1,user-secret-2",
        "-acceptable_servant_tokens",
        "servant-secret",
        "--serving_daemon_token_secret=daemon-secret",
        "--min_daemon_version=2",
        "--serving_daemon_token_rollout_interval=600",
        "--servant_min_memory_for_accepting_new_task=4G",
        "--inspect_credential=ops:pw",
        "--logtostderr",
        "--v=1",
        "--log_dir=/var/log/yadcc",
        "--flare_concurrency_hint=8",
        "--port=8338",
    ]);
    let settings = cli.settings().unwrap();
    assert_eq!(settings.listen.port(), 8338, "the last --port wins");
    assert_eq!(
        settings.engine.user_tokens,
        engine::TokenSet::new(["user-secret-1", "user-secret-2"])
    );
    assert_eq!(
        settings.engine.servant_tokens,
        engine::TokenSet::new(["servant-secret"])
    );
    assert_eq!(settings.engine.min_daemon_version, 2);
    assert_eq!(
        settings.engine.serving_daemon_token_rollout_interval,
        Duration::from_secs(600)
    );
    assert_eq!(
        settings.engine.servant_min_memory_for_accepting_new_task,
        4 << 30
    );
    assert!(
        matches!(settings.transport.inspect, InspectAccess::Credential(ref c) if c.as_str() == "ops:pw")
    );
    assert!(
        !format!("{:?}", settings.transport).contains("ops:pw"),
        "the credential never reaches a log"
    );
    let printed = format!("{cli:?}");
    for secret in ["user-secret", "servant-secret", "daemon-secret", "ops:pw"] {
        assert!(!printed.contains(secret), "{secret} leaks: {printed}");
    }
    assert!(printed.contains("<redacted>"), "{printed}");
    assert_eq!(warnings.len(), 4, "{warnings:?}");
}

#[test]
fn a_flagfile_and_the_originals_booleans_work() {
    let path = std::env::temp_dir().join(format!("yadcc-cli-{}.flags", std::process::id()));
    std::fs::write(
        &path,
        "# production\n--acceptable_user_tokens=u\n--acceptable_servant_tokens=s\n--debugging_no_inspect_auth\n",
    )
    .unwrap();
    let (cli, _) = gflags(&[&format!("--flagfile={}", path.display())]);
    assert!(matches!(
        cli.settings().unwrap().transport.inspect,
        InspectAccess::Open
    ));
    let (cli, _) = gflags(&[
        &format!("-flagfile={}", path.display()),
        "--nodebugging_no_inspect_auth",
    ]);
    assert!(matches!(
        cli.settings().unwrap().transport.inspect,
        InspectAccess::Closed
    ));
    std::fs::remove_file(&path).unwrap();
    let error =
        Cli::parse_gflags(["yadcc-scheduler", "--flagfile=/nonexistent"].map(OsString::from))
            .unwrap_err()
            .to_string();
    assert!(error.contains("/nonexistent"), "{error}");
}

#[test]
fn inspection_is_closed_unless_a_flag_opens_it() {
    let tokens = [
        "--acceptable_user_tokens=u",
        "--acceptable_servant_tokens=s",
    ];
    let access = |extra: &[&str]| {
        let args: Vec<&str> = tokens.iter().chain(extra).copied().collect();
        cli(&args).settings().unwrap().transport.inspect
    };
    assert!(matches!(access(&[]), InspectAccess::Closed));
    assert!(matches!(
        access(&["--debugging_no_inspect_auth"]),
        InspectAccess::Open
    ));
    assert!(matches!(
        access(&["--inspect_credential=a:b"]),
        InspectAccess::Credential(_)
    ));
    // The original: the debugging flag wins over a credential.
    assert!(matches!(
        access(&["--inspect_credential=a:b", "--debugging_no_inspect_auth"]),
        InspectAccess::Open
    ));
    // The demo on loopback is open; the demo on the network is not.
    assert!(matches!(access(&["--demo"]), InspectAccess::Open));
    assert!(matches!(
        access(&["--demo", "--listen=0.0.0.0:8336"]),
        InspectAccess::Closed
    ));
}

fn user_tokens(flag: &str) -> engine::TokenSet {
    cli(&[
        &format!("--acceptable_user_tokens={flag}"),
        "--acceptable_servant_tokens=s",
    ])
    .settings()
    .unwrap()
    .engine
    .user_tokens
}

#[test]
fn token_lists_are_read_as_the_original_reads_them() {
    // Literal entries: "a, " is `a` and a single space, nothing else.
    let spaced = user_tokens("a, ");
    assert!(spaced.accepts_token("a") && spaced.accepts_token(" "));
    assert!(!spaced.accepts_token("b") && !spaced.accepts_token(""));
    assert!(!spaced.accepts_anyone() && !spaced.accepts_empty_token());
    // An empty entry (the original's empty token, what a template's unset
    // variable leaves) stops the start, on either list, wherever it is.
    for flag in ["--acceptable_user_tokens", "--acceptable_servant_tokens"] {
        for value in ["a,", ",a", "a,,b", ","] {
            let other = if flag.contains("user") {
                "--acceptable_servant_tokens=s"
            } else {
                "--acceptable_user_tokens=u"
            };
            let error = cli(&[&format!("{flag}={value}"), other])
                .settings()
                .expect_err("an empty entry");
            assert!(
                error.starts_with(flag) && error.contains("empty entry"),
                "{flag}={value}: {error}"
            );
        }
    }
}

#[test]
fn a_flagfile_keeps_token_lists_literal() {
    let path = std::env::temp_dir().join(format!("yadcc-tokens-{}.flags", std::process::id()));
    std::fs::write(
        &path,
        "--acceptable_user_tokens=a, \n--acceptable_servant_tokens=s\n",
    )
    .unwrap();
    let (cli, _) = gflags(&[&format!("--flagfile={}", path.display())]);
    std::fs::remove_file(&path).unwrap();
    let tokens = cli.settings().unwrap().engine.user_tokens;
    assert!(tokens.accepts_token(" ") && !tokens.accepts_token("b"));
}

#[test]
fn an_empty_token_flag_stops_the_start_and_names_the_flag() {
    for (args, flag) in [
        (
            ["--acceptable_user_tokens=", "--acceptable_servant_tokens=s"],
            "--acceptable_user_tokens",
        ),
        (
            ["--acceptable_user_tokens=u", "--acceptable_servant_tokens="],
            "--acceptable_servant_tokens",
        ),
    ] {
        let error = cli(&args).settings().unwrap_err();
        assert!(error.starts_with(&format!("{flag} is empty")), "{error}");
        assert!(error.contains("--insecure_accept_any_token"), "{error}");
    }
}

#[test]
fn only_the_explicit_flag_lets_anyone_in() {
    let settings = cli(&["--insecure_accept_any_token"]).settings().unwrap();
    assert_eq!(settings.engine.user_tokens, engine::TokenSet::anyone());
    assert_eq!(settings.engine.servant_tokens, engine::TokenSet::anyone());
    // Never together with a token list: one of them would be ignored.
    let error = Cli::try_parse_args([
        "yadcc-scheduler",
        "--insecure_accept_any_token",
        "--acceptable_user_tokens=u",
    ])
    .unwrap_err()
    .to_string();
    assert!(error.contains("cannot be used with"), "{error}");
}

#[test]
fn an_empty_credential_keeps_inspection_closed() {
    let settings = cli(&[
        "--acceptable_user_tokens=u",
        "--acceptable_servant_tokens=s",
        "--inspect_credential=",
    ])
    .settings()
    .unwrap();
    assert!(matches!(settings.transport.inspect, InspectAccess::Closed));
    let error = cli(&[
        "--acceptable_user_tokens=u",
        "--acceptable_servant_tokens=s",
        "--inspect_credential=nocolon",
    ])
    .settings()
    .unwrap_err();
    assert!(error.contains("user:password"), "{error}");
}

#[test]
fn every_flag_has_its_kebab_alias_and_environment_variable() {
    let command = Cli::command_line();
    let flags: Vec<_> = command
        .get_arguments()
        .filter(|arg| arg.get_long().is_some())
        .collect();
    assert!(flags.len() > 20, "{} flags", flags.len());
    for arg in flags {
        let long = arg.get_long().unwrap();
        let env = arg.get_env().map(|env| env.to_string_lossy().into_owned());
        assert_eq!(
            env,
            Some(format!("YADCC_{}", long.to_ascii_uppercase())),
            "--{long}"
        );
        if long.contains('_') {
            let aliases = arg.get_visible_aliases().unwrap_or_default();
            assert_eq!(aliases, [long.replace('_', "-")], "--{long}");
        }
    }
    let secret = command
        .get_arguments()
        .find(|arg| arg.get_long() == Some("serving_daemon_token_secret"))
        .unwrap();
    assert!(
        secret.is_hide_env_values_set(),
        "secrets never show in --help"
    );
}

/// The benchmark's route is in a build with the `bench-route` feature only:
/// the production binary does not know the flag.
#[test]
fn the_bench_route_flag_exists_only_in_bench_builds() {
    let parsed = Cli::try_parse_args(["yadcc-scheduler", "--demo", "--bench_bare_route"]);
    #[cfg(not(feature = "bench-route"))]
    assert!(parsed.is_err());
    #[cfg(feature = "bench-route")]
    {
        assert!(parsed.unwrap().settings().unwrap().bench_bare_route);
        assert!(!cli(&["--demo"]).settings().unwrap().bench_bare_route);
    }
}

#[test]
fn a_tenants_file_replaces_the_user_tokens_flag() {
    let dir = std::env::temp_dir().join(format!("tenants-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let with_servants = dir.join("with-servants.toml");
    std::fs::write(
        &with_servants,
        "[servants]\ntokens = [\"s-file\"]\n[[tenant]]\nname = \"ci\"\nweight = 2\nuser_tokens = [\"ci\"]\n",
    )
    .unwrap();
    let without = dir.join("without.toml");
    std::fs::write(
        &without,
        "[[tenant]]\nname = \"ci\"\nweight = 1\nuser_tokens = [\"ci\"]\n",
    )
    .unwrap();
    let flag = |path: &std::path::Path| format!("--tenants_file={}", path.display());

    let settings = cli(&[&flag(&with_servants)]).settings().unwrap();
    let tenancy = settings.engine.tenancy.expect("the file's tenants");
    assert_eq!(tenancy.tenants[0].name, "ci");
    assert_eq!(tenancy.tenants[0].weight, 2.0);
    assert!(settings.engine.servant_tokens.accepts_token("s-file"));
    assert_eq!(
        settings.tenants_file.as_deref(),
        Some(with_servants.as_path())
    );

    let settings = cli(&[&flag(&without), "--acceptable_servant_tokens=s-flag"])
        .settings()
        .unwrap();
    assert!(settings.engine.servant_tokens.accepts_token("s-flag"));
    let error = cli(&[&flag(&without)]).settings().unwrap_err();
    assert!(error.contains("no servant tokens"), "{error}");

    let both = Cli::try_parse_args([
        "yadcc-scheduler",
        &flag(&without),
        "--acceptable_user_tokens=u",
    ]);
    assert!(both.is_err(), "the file and the user tokens flag conflict");
    for admin in ["--admin_tokens=ci", "--admin_tokens=alice:ci"] {
        let error = cli(&[&flag(&with_servants), admin]).settings().unwrap_err();
        assert!(error.contains("--admin_tokens"), "{admin}: {error}");
    }
    let error = cli(&[&flag(&with_servants), "--demo"])
        .settings()
        .unwrap_err();
    assert!(error.contains("--demo"), "{error}");
    let error = cli(&[&flag(&dir.join("missing.toml"))])
        .settings()
        .unwrap_err();
    assert!(error.contains("missing.toml"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The engine's settings from the token flags and `extra`, in gflags' form.
fn engine_settings(extra: &[&str]) -> engine::Config {
    let mut args = vec![
        "--acceptable_user_tokens=u",
        "--acceptable_servant_tokens=s",
    ];
    args.extend_from_slice(extra);
    let (cli, _) = gflags(&args);
    cli.settings().unwrap().engine
}

#[test]
fn the_placement_rules_are_on_unless_turned_off() {
    let own_load = |extra: &[&str]| engine_settings(extra).foreign_load_from_own_average;
    let by_speed = |extra: &[&str]| engine_settings(extra).place_by_observed_speed;
    assert!(own_load(&[]) && by_speed(&[]));
    assert!(own_load(&["--foreign_load_from_own_average"]));
    assert!(by_speed(&["--place_by_observed_speed"]));
    // The original's rules, in gflags' spellings and clap's; each alone.
    for off in [
        "--noforeign_load_from_own_average",
        "--foreign_load_from_own_average=false",
        "--foreign-load-from-own-average=false",
    ] {
        assert!(!own_load(&[off]) && by_speed(&[off]), "{off}");
    }
    for off in [
        "--noplace_by_observed_speed",
        "--place_by_observed_speed=false",
        "--place-by-observed-speed=false",
    ] {
        assert!(!by_speed(&[off]) && own_load(&[off]), "{off}");
    }
}
