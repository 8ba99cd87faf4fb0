use super::*;

fn command() -> Command {
    Command::new("test")
        .arg(Arg::new("port").long("port"))
        .arg(Arg::new("help").long("help").action(ArgAction::Help))
        .arg(
            Arg::new("tokens")
                .long("acceptable_user_tokens")
                .visible_alias("acceptable-user-tokens"),
        )
        .arg(switch(Arg::new("demo").long("demo")))
        .arg(switch(
            Arg::new("open")
                .long("debugging_no_inspect_auth")
                .alias("debugging-no-inspect-auth"),
        ))
}

/// What `--fromenv` reads in these tests.
fn environment(name: &str) -> Option<OsString> {
    match name {
        "FLAGS_port" => Some("9000".into()),
        "FLAGS_demo" => Some("true".into()),
        "FLAGS_acceptable_user_tokens" => Some("a,b".into()),
        "FLAGS_v" => Some("2".into()),
        "FLAGS_fromenv" => Some("fromenv".into()),
        "FLAGS_tryfromenv" => Some("tryfromenv,port".into()),
        _ => None,
    }
}

fn run(args: &[&str]) -> Result<Normalised, String> {
    normalise(
        &command(),
        std::iter::once("prog")
            .chain(args.iter().copied())
            .map(OsString::from),
        environment,
    )
}

fn args(args: &[&str]) -> Vec<String> {
    run(args)
        .unwrap()
        .args
        .into_iter()
        .skip(1)
        .map(|arg| arg.into_string().unwrap())
        .collect()
}

#[test]
fn single_dash_long_flags_become_double_dash() {
    assert_eq!(
        args(&["-port=9000", "-acceptable_user_tokens", "a,b", "-h"]),
        vec!["--port=9000", "--acceptable_user_tokens=a,b", "-h"]
    );
    // gflags takes the next word as the value, even one starting with `-`.
    assert_eq!(
        args(&["--acceptable_user_tokens", "-secret"]),
        vec!["--acceptable_user_tokens=-secret"]
    );
}

#[test]
fn booleans_take_gflags_spellings_and_the_last_one_wins() {
    assert_eq!(args(&["--demo"]), vec!["--demo"]);
    assert_eq!(args(&["-demo=true"]), vec!["--demo"]);
    // False is said explicitly, so that it also wins over YADCC_DEMO.
    assert_eq!(args(&["--demo", "--nodemo"]), vec!["--demo=false"]);
    assert_eq!(args(&["--demo=false"]), vec!["--demo=false"]);
    assert_eq!(args(&["--nodemo", "--demo=yes"]), vec!["--demo"]);
    assert_eq!(
        args(&["--debugging-no-inspect-auth=1"]),
        vec!["--debugging_no_inspect_auth"]
    );
    let error = run(&["--demo=maybe"]).unwrap_err();
    assert!(error.contains("--demo=maybe"), "{error}");
}

#[test]
fn framework_flags_are_dropped_with_a_warning() {
    let normalised = run(&[
        "--logtostderr",
        "--v=2",
        "--log_dir",
        "/var/log/yadcc",
        "-minloglevel",
        "1",
        "--nologtostderr",
        "--flare_concurrency_hint=8",
        "--port=1",
    ])
    .unwrap();
    let kept: Vec<_> = normalised.args.iter().skip(1).collect();
    assert_eq!(kept, vec!["--port=1"]);
    assert_eq!(normalised.warnings.len(), 6, "{:?}", normalised.warnings);
    assert!(normalised.warnings[0].contains("--logtostderr"));
    assert!(normalised.warnings[5].contains("flare"));
    assert!(
        normalised
            .warnings
            .iter()
            .all(|warning| warning.contains("no effect"))
    );
}

#[test]
fn glogs_one_letter_verbosity_is_accepted_in_every_spelling() {
    for spelling in [&["-v=1"][..], &["--v=1"], &["-v", "1"], &["--v", "1"]] {
        let normalised = run(spelling).unwrap();
        assert_eq!(
            normalised.args.len(),
            1,
            "{spelling:?}: only the program name"
        );
        assert_eq!(normalised.warnings.len(), 1, "{spelling:?}");
        assert!(normalised.warnings[0].contains("--v "), "{spelling:?}");
    }
    // clap's own one-letter flags stay as they are.
    assert_eq!(args(&["-h"]), vec!["-h"]);
}

#[test]
fn fromenv_reads_flags_in_place_and_later_flags_override() {
    assert_eq!(
        args(&[
            "--port=1",
            "--fromenv=port,demo",
            "--acceptable_user_tokens=c"
        ]),
        vec![
            "--port=1",
            "--port=9000",
            "--acceptable_user_tokens=c",
            "--demo"
        ]
    );
    assert_eq!(
        args(&["-fromenv", "acceptable_user_tokens", "--port=2"]),
        vec!["--acceptable_user_tokens=a,b", "--port=2"]
    );
    // A framework flag from the environment is ignored like one on the line.
    let glog = run(&["--fromenv=v"]).unwrap();
    assert_eq!((glog.args.len(), glog.warnings.len()), (1, 1));
    // A variable that is not set: an error for --fromenv only.
    let error = run(&["--fromenv=port,debugging_no_inspect_auth"]).unwrap_err();
    assert!(
        error.contains("FLAGS_debugging_no_inspect_auth not found in environment"),
        "{error}"
    );
    assert_eq!(
        args(&["--tryfromenv=debugging_no_inspect_auth,port"]),
        vec!["--port=9000"]
    );
    for (list, expected) in [
        ("port,,demo", "empty entry"),
        ("-port", "begins with '-'"),
        ("prot", "unknown command line flag 'prot'"),
        ("fromenv", "infinite recursion"),
    ] {
        let error = run(&[&format!("--fromenv={list}")]).unwrap_err();
        assert!(error.contains(expected), "{list}: {error}");
    }
    // A variable that lists itself again is stopped, not followed forever.
    let error = run(&["--tryfromenv=tryfromenv"]).unwrap_err();
    assert!(error.contains("--fromenv/--tryfromenv"), "{error}");
}

#[test]
fn gflags_help_flags_show_the_usage() {
    assert_eq!(args(&["--helpfull"]), vec!["--help"]);
    assert_eq!(args(&["-helpshort"]), vec!["--help"]);
    assert_eq!(args(&["--helpfull=false", "--port=1"]), vec!["--port=1"]);
}

#[test]
fn a_glog_switch_does_not_swallow_the_next_word() {
    // `--logtostderr` takes no value: `8336` stays for clap (which then
    // refuses it, as the original would ignore it).
    assert_eq!(args(&["--logtostderr", "8336"]), vec!["8336"]);
}

#[test]
fn unknown_flags_pass_through_for_clap_to_refuse() {
    assert_eq!(args(&["-prot=1"]), vec!["--prot=1"]);
    // A flag without a value does not take the next word.
    assert_eq!(args(&["-help", "--demo"]), vec!["--help", "--demo"]);
}

#[test]
fn everything_after_a_double_dash_is_left_alone() {
    assert_eq!(
        args(&["--demo", "--", "-demo"]),
        vec!["--demo", "--", "-demo"]
    );
}

#[test]
fn flag_files_hold_one_flag_per_line_with_comments() {
    let flags = parse_flagfile(
        "# scheduler flags\n  --port=9000\r\n\n-acceptable_user_tokens=a, b \n#--demo\n",
    )
    .unwrap();
    // Values are literal: the trailing space is part of the token list.
    assert_eq!(flags, vec!["--port=9000", "-acceptable_user_tokens=a, b "]);
    let error = parse_flagfile("--port=1\nyadcc-scheduler\n").unwrap_err();
    assert!(error.contains("line 2"), "{error}");
}

#[test]
fn flag_files_expand_in_place_and_later_flags_override() {
    let dir = std::env::temp_dir().join(format!("yadcc-flagfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let inner = dir.join("inner.flags");
    let outer = dir.join("outer.flags");
    std::fs::write(&inner, "--demo\n").unwrap();
    std::fs::write(
        &outer,
        format!("--port=1\n--flagfile={}\n--logtostderr\n", inner.display()),
    )
    .unwrap();
    let outer_flag = format!("-flagfile={}", outer.display());
    let normalised = run(&[&outer_flag, "--port=2"]).unwrap();
    let kept: Vec<_> = normalised.args.iter().skip(1).collect();
    assert_eq!(kept, vec!["--port=1", "--port=2", "--demo"]);
    assert_eq!(normalised.warnings.len(), 1);

    let looping = dir.join("loop.flags");
    std::fs::write(&looping, format!("--flagfile={}\n", looping.display())).unwrap();
    let error = run(&[&format!("--flagfile={}", looping.display())]).unwrap_err();
    assert!(error.contains("include itself"), "{error}");

    let missing = run(&["--flagfile", "/nonexistent/yadcc.flags"]).unwrap_err();
    assert!(missing.contains("/nonexistent/yadcc.flags"), "{missing}");
    std::fs::remove_dir_all(&dir).unwrap();
}
