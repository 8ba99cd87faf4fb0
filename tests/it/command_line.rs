//! The original's operators' command lines against the real binary: its
//! flags' spellings (glog's `-v`, gflags' `--fromenv`, `--tryfromenv`,
//! `--helpfull`, `--noflag` over a variable), its refusals (an empty token
//! list) and its inspection posture (an empty credential is closed, closed
//! pages answer 401 with a challenge).

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use base64::Engine as _;

use crate::support::*;

const PROGRAM: &str = env!("CARGO_BIN_EXE_yadcc-scheduler");
const TOKENS: [&str; 2] = [
    "--acceptable_user_tokens=u",
    "--acceptable_servant_tokens=s",
];

/// Starts the binary on a free loopback port with exactly `flags` and `env`
/// (off the runtime's threads: starting waits for its first log lines).
async fn start(flags: Vec<&'static str>, env: Vec<(&'static str, &'static str)>) -> Binary {
    tokio::task::spawn_blocking(move || {
        let listen = "127.0.0.1:0".parse().expect("address");
        Binary::start_exactly(listen, &flags, &env, None)
    })
    .await
    .expect("start")
}

/// The token flags and then `extra`.
fn with_tokens(extra: &[&'static str]) -> Vec<&'static str> {
    TOKENS.iter().chain(extra).copied().collect()
}

/// Runs the binary with `args` and `env` to its end (it must end within
/// [`STEP`]): its exit code, stdout and stderr.
fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut child = Command::new(PROGRAM)
        .args(["--listen=127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    let deadline = Instant::now() + STEP;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{args:?} did not exit: it started serving");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().expect("output");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The status of an anonymous GET of the dump, and its `WWW-Authenticate`.
async fn inspect(binary: &Binary, credential: Option<&str>) -> (u16, Option<String>) {
    let mut request = http_client().get(format!(
        "http://{}/inspect/vars/yadcc/task_dispatcher",
        binary.addr
    ));
    if let Some(credential) = credential {
        let encoded = base64::engine::general_purpose::STANDARD.encode(credential);
        request = request.header("authorization", format!("Basic {encoded}"));
    }
    let response = request.send().await.expect("GET the dump");
    let challenge = response
        .headers()
        .get("www-authenticate")
        .map(|value| value.to_str().expect("ASCII").to_owned());
    (response.status().as_u16(), challenge)
}

#[test]
fn an_empty_token_flag_refuses_to_start_naming_the_flag() {
    for (args, env, flag) in [
        (
            vec!["--acceptable_user_tokens=", "--acceptable_servant_tokens=s"],
            vec![],
            "--acceptable_user_tokens",
        ),
        (
            vec!["--acceptable_user_tokens=u"],
            vec![("YADCC_ACCEPTABLE_SERVANT_TOKENS", "")],
            "--acceptable_servant_tokens",
        ),
    ] {
        let (code, _, stderr) = run_to_exit(&args, &env);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&format!("{flag} is empty")), "{stderr}");
        assert!(stderr.contains("--insecure_accept_any_token"), "{stderr}");
    }
}

#[tokio::test]
async fn only_the_explicit_flag_lets_any_token_in() {
    let open = start(vec!["--insecure_accept_any_token"], vec![]).await;
    assert!(
        open.log()
            .iter()
            .any(|line| line.contains("--insecure_accept_any_token: ANYONE may")),
        "the log warns: {:?}",
        open.log()
    );
    for token in ["anything", ""] {
        let request = yadcc_pb::GetConfigRequest {
            token: token.into(),
        };
        let answer = call_http_pb(open.addr, Method::GetConfig, &request).await;
        assert_eq!(answer.status, 200, "{token:?}");
    }
    let (code, _, stderr) = run_to_exit(
        &[
            "--insecure_accept_any_token",
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[tokio::test]
async fn an_empty_credential_keeps_inspection_closed_with_a_challenge() {
    let closed = start(with_tokens(&["--inspect_credential="]), vec![]).await;
    let (status, challenge) = inspect(&closed, None).await;
    assert_eq!(status, 401);
    assert!(challenge.is_some_and(|value| value.starts_with("Basic ")));
    // Not even a credential made of the empty user and password opens it.
    assert_eq!(inspect(&closed, Some(":")).await.0, 401);
}

#[tokio::test]
async fn glogs_verbosity_is_accepted_in_every_spelling_and_ignored() {
    for verbosity in [&["-v=1"][..], &["--v=2"], &["-v", "3"], &["--v", "0"]] {
        let binary = start(with_tokens(verbosity), vec![]).await;
        let log = binary.log();
        assert!(
            log.iter()
                .any(|line| line.contains("--v is a flag of the original's logging library")),
            "{verbosity:?}: {log:?}"
        );
        let request = yadcc_pb::GetConfigRequest { token: "u".into() };
        let answer = call_http_pb(binary.addr, Method::GetConfig, &request).await;
        assert_eq!(answer.status, 200, "{verbosity:?}");
    }
}

#[tokio::test]
async fn fromenv_and_tryfromenv_read_flags_from_flags_variables() {
    let from_env = start(
        vec!["--fromenv=acceptable_user_tokens,acceptable_servant_tokens,inspect_credential"],
        vec![
            ("FLAGS_acceptable_user_tokens", "u"),
            ("FLAGS_acceptable_servant_tokens", "s"),
            ("FLAGS_inspect_credential", "ops:pw"),
        ],
    )
    .await;
    assert_eq!(inspect(&from_env, None).await.0, 401);
    assert_eq!(inspect(&from_env, Some("ops:pw")).await.0, 200);

    // --tryfromenv skips what is not set; --fromenv refuses to start.
    let tried = start(with_tokens(&["--tryfromenv=inspect_credential"]), vec![]).await;
    assert_eq!(inspect(&tried, Some("ops:pw")).await.0, 401, "closed");
    let (code, _, stderr) = run_to_exit(&with_tokens(&["--fromenv=inspect_credential"]), &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("FLAGS_inspect_credential not found in environment"),
        "{stderr}"
    );
}

#[test]
fn gflags_helpfull_shows_the_usage() {
    for help in ["--helpfull", "-helpfull", "--helpshort"] {
        let (code, stdout, stderr) = run_to_exit(&[help], &[]);
        assert_eq!(code, Some(0), "{help}: {stderr}");
        assert!(
            stdout.contains("Usage: yadcc-scheduler"),
            "{help}: {stdout}"
        );
        assert!(stdout.contains("--acceptable_user_tokens"), "{help}");
    }
}

/// `--noflag` on the command line wins over the flag's variable saying true,
/// as a later flag wins in gflags.
#[tokio::test]
async fn a_switch_set_false_on_the_command_line_overrides_its_variable() {
    let open = [("YADCC_DEBUGGING_NO_INSPECT_AUTH", "true")];
    let by_variable = start(with_tokens(&[]), open.to_vec()).await;
    assert_eq!(
        inspect(&by_variable, None).await.0,
        200,
        "the variable opens it"
    );
    for no in [
        "--nodebugging_no_inspect_auth",
        "--debugging_no_inspect_auth=false",
    ] {
        let overridden = start(with_tokens(&[no]), open.to_vec()).await;
        assert_eq!(inspect(&overridden, None).await.0, 401, "{no}");
    }
}

/// The access log lines of a server run with `flags`: three calls that
/// succeed, then five refused (a wrong token) within a second, then a
/// graceful stop, after which every line it wrote has been read.
async fn access_lines(flags: &'static [&'static str]) -> Vec<String> {
    let binary = tokio::task::spawn_blocking(move || {
        Launch {
            flags,
            rust_log: "info",
            ..Launch::default()
        }
        .start()
    })
    .await
    .expect("start");
    let tokens = [USER_TOKEN; 3].into_iter().chain(["wrong"; 5]);
    for token in tokens {
        let request = yadcc_pb::GetConfigRequest {
            token: token.into(),
        };
        call_http_pb(binary.addr, Method::GetConfig, &request).await;
    }
    let stopped = Command::new("kill")
        .args(["-TERM", &binary.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(stopped.success());
    let deadline = Instant::now() + STEP;
    while !binary
        .log()
        .iter()
        .any(|line| line.contains("shutting down"))
    {
        assert!(Instant::now() < deadline, "{:?}", binary.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    binary
        .log()
        .into_iter()
        .filter(|line| line.contains("yadcc_scheduler::access"))
        .collect()
}

#[tokio::test]
async fn the_access_log_keeps_failures_by_default_every_call_with_all_and_none_when_off() {
    let by_default = access_lines(&[]).await;
    assert_eq!(
        by_default.len(),
        1,
        "one line a second per kind: {by_default:?}"
    );
    assert!(by_default[0].contains("code=1003"), "{by_default:?}");
    let all = access_lines(&["--access_log=all"]).await;
    assert_eq!(all.len(), 8, "{all:?}");
    assert_eq!(all.iter().filter(|line| line.contains("code=0")).count(), 3);
    let off = access_lines(&["--access_log=off"]).await;
    assert_eq!(off, Vec::<String>::new());
}
