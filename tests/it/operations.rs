//! Health, readiness and Prometheus metrics: both exposition formats, each
//! checked by a real parser of its own (promtool for the classic text, the
//! Prometheus Python client's strict OpenMetrics parser for OpenMetrics).

use std::{io::Write, process::Stdio};
use yadcc_pb as pb;

use yadcc_scheduler::build_info;

use crate::support::*;

const OPENMETRICS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// `program` with `args`, fed `input`: exit success, stdout, stderr. None
/// when it cannot start (not installed).
fn run_with_input(
    program: impl AsRef<std::ffi::OsStr>,
    args: &[&str],
    input: &str,
) -> Option<(bool, String, String)> {
    let mut child = crate::tools::tool(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("feed the tool");
    let output = child.wait_with_output().expect("the tool ends");
    Some((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// A missing tool skips the check outside CI and fails it in CI.
fn tool_missing(what: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must install {what} (scripts/test.sh does)"
    );
    eprintln!("SKIPPED: no {what}; scripts/test.sh installs it");
}

/// `/metrics` with this `Accept` (None: no header): content type and body.
pub(crate) async fn scrape(server: &Server, accept: Option<&str>) -> (String, String) {
    let mut request = http_client().get(server.url("/metrics"));
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    let response = request.send().await.expect("scrape");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    (content_type, response.text().await.unwrap())
}

/// A server that has answered calls on two protocols, refused one and
/// granted one, so every family has series.
async fn busy_server() -> Server {
    let server = Server::start().await;
    register_servant(&server, 8335, 4).await;
    let granted = call_http_pb(
        server.addr,
        Method::WaitForStartingTask,
        &wait_request(0, 1, 0),
    )
    .await;
    assert_eq!(granted.status, 200);
    let denied = call_http_pb(
        server.addr,
        Method::GetConfig,
        &pb::GetConfigRequest { token: "x".into() },
    )
    .await;
    assert_eq!(denied.status, 403);
    let json = http_client()
        .post(server.url(Method::GetConfig.rpc_path()))
        .header("content-type", "application/json")
        .body(format!(r#"{{"token":"{USER_TOKEN}"}}"#))
        .send()
        .await
        .expect("json call");
    assert_eq!(json.status().as_u16(), 200);
    server
}

#[tokio::test]
async fn health_and_readiness_answer() {
    let server = Server::start().await;
    let client = http_client();
    for path in ["/healthz", "/readyz"] {
        let response = client.get(server.url(path)).send().await.expect("send");
        assert_eq!(response.status().as_u16(), 200, "{path}");
    }
    server.stop().await;
}

#[tokio::test]
async fn metrics_count_requests_and_show_the_cluster() {
    let server = busy_server().await;
    let (content_type, text) = scrape(&server, Some(OPENMETRICS_ACCEPT)).await;
    assert!(
        content_type.starts_with("application/openmetrics-text; version=1.0.0"),
        "{content_type}"
    );
    assert!(
        text.contains(r#"yadcc_scheduler_rpc_requests_total{protocol="http+pb",method="Heartbeat",encoding="binary",code="200"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"yadcc_scheduler_rpc_requests_total{protocol="http+pb",method="GetConfig",encoding="binary",code="403"} 1"#), "{text}");
    assert!(text.contains("yadcc_scheduler_servants_up 1"), "{text}");
    assert!(
        text.contains("yadcc_scheduler_capacity_available 3"),
        "{text}"
    );
    assert!(
        text.contains(
            r#"yadcc_scheduler_rpc_duration_seconds_count{protocol="http+pb",method="Heartbeat"} 1"#
        ),
        "latency by protocol and method: {text}"
    );
    assert!(
        text.contains(
            r#"yadcc_scheduler_rpc_duration_seconds_count{protocol="http+pb",method="GetConfig"} 2"#
        ),
        "the /rpc/ route is http+pb from any client: {text}"
    );
    assert!(
        text.contains(r#"yadcc_scheduler_rpc_requests_total{protocol="http+pb",method="GetConfig",encoding="json",code="200"} 1"#),
        "{text}"
    );
    assert!(
        !text.contains(r#"{protocol="http",method"#),
        "no call is labelled by the server it came through: {text}"
    );
    assert!(
        text.contains(r#"yadcc_scheduler_connections_accepted_total{protocol="http"}"#),
        "connections are labelled by the server that took them: {text}"
    );
    assert!(
        text.contains(r#"yadcc_scheduler_grant_wait_seconds_count{outcome="granted"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("yadcc_scheduler_grants_issued_total 1"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("# EOF"));
    let build = format!(
        r#"yadcc_scheduler_build_info{{version="{}",commit="{}"}} 1"#,
        build_info::VERSION,
        build_info::COMMIT
    );
    assert!(text.contains(&build), "{build} in {text}");
    assert!(
        !build_info::COMMIT.is_empty(),
        "a commit, or `unknown` outside git"
    );
    for process in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_max_fds ",
        "process_start_time_seconds ",
    ] {
        assert!(
            text.lines().any(|line| line.starts_with(process)),
            "{process}in {text}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn the_classic_text_is_served_unless_openmetrics_is_preferred() {
    let server = Server::start().await;
    for accept in [
        None,
        Some("*/*"),
        Some("text/plain"),
        Some("text/plain;version=0.0.4;q=1,*/*;q=0.1"),
        Some("application/openmetrics-text;q=0.3,text/plain;q=0.9"),
    ] {
        let (content_type, text) = scrape(&server, accept).await;
        assert_eq!(
            content_type, "text/plain; version=0.0.4; charset=utf-8",
            "Accept: {accept:?}"
        );
        assert!(!text.contains("# EOF"), "{accept:?}");
        assert!(
            text.contains("# TYPE yadcc_scheduler_grants_issued_total counter\n"),
            "{accept:?}: {text}"
        );
    }
    for accept in [
        OPENMETRICS_ACCEPT,
        "application/openmetrics-text",
        "application/openmetrics-text; version=1.0.0, text/plain",
    ] {
        let (content_type, _) = scrape(&server, Some(accept)).await;
        assert!(
            content_type.starts_with("application/openmetrics-text"),
            "Accept: {accept}: {content_type}"
        );
    }
    server.stop().await;
}

/// `promtool check metrics` (Debian's `prometheus` package) finds nothing to
/// say about the classic text, with every family populated.
#[tokio::test]
async fn promtool_finds_the_classic_text_clean() {
    let server = busy_server().await;
    let (_, text) = scrape(&server, Some("text/plain;version=0.0.4")).await;
    let Some((ok, stdout, stderr)) = run_with_input("promtool", &["check", "metrics"], &text)
    else {
        tool_missing("promtool (Debian package prometheus)");
        server.stop().await;
        return;
    };
    assert!(
        ok && stdout.trim().is_empty() && stderr.trim().is_empty(),
        "promtool check metrics: {stdout}{stderr}\n{text}"
    );
    // Promtool must be able to fail here: it reads only the classic text,
    // and the OpenMetrics answer breaks its rules (the `info` type; a
    // counter's HELP naming the family, not its `_total` series).
    let (_, openmetrics) = scrape(&server, Some(OPENMETRICS_ACCEPT)).await;
    let (ok, stdout, stderr) =
        run_with_input("promtool", &["check", "metrics"], &openmetrics).expect("promtool");
    assert!(
        !ok && !format!("{stdout}{stderr}").trim().is_empty(),
        "promtool tells the formats apart: {stdout}{stderr}"
    );
    server.stop().await;
}

/// The OpenMetrics answer passes the Prometheus Python client's strict
/// OpenMetrics parser (`scripts/check_openmetrics.py`), with every family
/// populated; the classic text does not.
#[tokio::test]
async fn the_openmetrics_answer_parses_strictly() {
    let server = busy_server().await;
    let (_, openmetrics) = scrape(&server, Some(OPENMETRICS_ACCEPT)).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/check_openmetrics.py");
    let python = crate::tools::python_program();
    let Some((ok, stdout, stderr)) = run_with_input(&python, &[script], &openmetrics) else {
        tool_missing("python3");
        server.stop().await;
        return;
    };
    if !ok && stderr.contains("No module named 'prometheus_client'") {
        tool_missing("the prometheus-client Python package");
        server.stop().await;
        return;
    }
    assert!(ok, "{stderr}\n{openmetrics}");
    for family in [
        "yadcc_scheduler_rpc_requests counter",
        "yadcc_scheduler_rpc_duration_seconds histogram",
        "yadcc_scheduler_build info 1",
        "process_cpu_seconds counter 1",
    ] {
        assert!(stdout.contains(family), "{family} in {stdout}");
    }
    let (_, text) = scrape(&server, None).await;
    let (ok, _, stderr) = run_with_input(&python, &[script], &text).expect("python");
    assert!(!ok, "the classic text is not OpenMetrics: {stderr}");
    server.stop().await;
}
