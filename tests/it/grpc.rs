//! gRPC over h2c and gRPC-Web (binary and text) on the Connect path, server
//! reflection, and CORS; with real clients: hyper's HTTP/2 client, raw
//! HTTP/1.1 bytes, a Python grpcio client and `buf curl` (the last two are
//! installed by scripts/test.sh).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use axum::http::{HeaderMap, HeaderValue, Request, header};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::{net::TcpStream, time::Instant};
use yadcc_scheduler::{engine, http::state::HttpSettings, pb};

use crate::support::*;

const BODY_LIMIT: usize = 4096;

/// The server the Python client expects: version floor 5, a 4 KiB body
/// limit, no servants yet.
async fn server() -> Server {
    Server::start_with(
        engine::Config {
            min_daemon_version: 5,
            // As long after start: unknown ids are neither adopted nor
            // renewed early, so the client's unknown id renews false.
            adoption_window: std::time::Duration::ZERO,
            ..engine_config()
        },
        HttpSettings {
            max_body_bytes: BODY_LIMIT,
            ..HttpSettings::default()
        },
        "127.0.0.1:0",
    )
    .await
}

fn frame(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut framed = vec![flags];
    framed.extend((payload.len() as u32).to_be_bytes());
    framed.extend_from_slice(payload);
    framed
}

/// Splits a body into its length-prefixed frames.
fn frames(mut body: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    while !body.is_empty() {
        assert!(body.len() >= 5, "truncated frame prefix: {body:?}");
        let length = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        assert!(body.len() >= 5 + length, "truncated frame");
        frames.push((body[0], body[5..5 + length].to_vec()));
        body = &body[5 + length..];
    }
    frames
}

/// One gRPC answer over HTTP/2: headers, the body's bytes, trailers.
struct H2Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

impl H2Answer {
    /// `grpc-status`, from the trailers or (trailers-only) the headers.
    fn grpc_status(&self) -> &str {
        self.trailers
            .as_ref()
            .and_then(|trailers| trailers.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .expect("grpc-status in trailers or headers")
            .to_str()
            .unwrap()
    }

    fn grpc_message(&self) -> String {
        self.trailers
            .as_ref()
            .and_then(|trailers| trailers.get("grpc-message"))
            .or_else(|| self.headers.get("grpc-message"))
            .map(|value| value.to_str().unwrap().to_owned())
            .unwrap_or_default()
    }
}

/// One gRPC call over a fresh h2c connection (HTTP/2 with prior knowledge,
/// as gRPC clients speak to a plain-text port).
async fn h2_call(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> H2Answer {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake");
    tokio::spawn(connection);
    let mut request = Request::post(format!("http://{addr}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::from(body))).unwrap();
    let response = tokio::time::timeout(STEP, sender.send_request(request))
        .await
        .expect("answer in time")
        .expect("h2 response");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let collected = tokio::time::timeout(STEP, response.into_body().collect())
        .await
        .expect("body in time")
        .expect("body");
    let trailers = collected.trailers().cloned();
    H2Answer {
        status,
        headers,
        body: collected.to_bytes(),
        trailers,
    }
}

/// Request headers of one call, as name and value.
type Headers = &'static [(&'static str, &'static str)];

const GRPC: Headers = &[("content-type", "application/grpc"), ("te", "trailers")];

fn rpc_path(method: &str) -> String {
    format!("/{SERVICE}/{method}")
}

fn get_config(token: &str) -> Vec<u8> {
    pb::GetConfigRequest {
        token: token.into(),
    }
    .encode_to_vec()
}

#[tokio::test]
async fn grpc_over_h2c_answers_a_frame_and_ok_trailers() {
    let server = server().await;
    let answer = h2_call(
        server.addr,
        &rpc_path("GetConfig"),
        GRPC,
        frame(0, &get_config(USER_TOKEN)),
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.headers[header::CONTENT_TYPE], "application/grpc");
    let trailers = answer.trailers.as_ref().expect("HTTP/2 trailers");
    assert_eq!(trailers["grpc-status"], "0");
    let frames = frames(&answer.body);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0, 0, "uncompressed");
    let config = pb::GetConfigResponse::decode(frames[0].1.as_slice()).unwrap();
    assert_eq!(config.serving_daemon_token.len(), 32);
    server.stop().await;
}

#[tokio::test]
async fn grpc_errors_are_trailers_only_with_the_table_code() {
    let server = server().await;
    let answer = h2_call(
        server.addr,
        &rpc_path("GetConfig"),
        GRPC,
        frame(0, &get_config("wrong")),
    )
    .await;
    assert_eq!(answer.status, 200, "gRPC failures are HTTP 200");
    assert!(answer.body.is_empty(), "trailers-only");
    assert_eq!(answer.headers["grpc-status"], "7", "permission_denied");
    assert!(answer.grpc_message().contains("access denied"));

    let cases: Vec<(&str, Headers, Vec<u8>, &str)> = vec![
        // Undecodable message: invalid_argument.
        ("GetConfig", GRPC, frame(0, &[0x0a, 0x05, b'a']), "3"),
        // Over the body limit: resource_exhausted.
        (
            "GetConfig",
            GRPC,
            frame(0, &get_config(&"x".repeat(BODY_LIMIT))),
            "8",
        ),
        // Compressed without grpc-encoding: internal.
        ("GetConfig", GRPC, frame(1, &get_config(USER_TOKEN)), "13"),
        // Compressed with a compression not read here: unimplemented.
        (
            "GetConfig",
            &[
                ("content-type", "application/grpc"),
                ("grpc-encoding", "snappy"),
            ],
            frame(1, &get_config(USER_TOKEN)),
            "12",
        ),
        // No message at all.
        ("GetConfig", GRPC, Vec::new(), "3"),
        // Unsupported sub-type.
        (
            "GetConfig",
            &[("content-type", "application/grpc+thrift")],
            frame(0, b""),
            "3",
        ),
        // Malformed deadline.
        (
            "GetConfig",
            &[
                ("content-type", "application/grpc"),
                ("grpc-timeout", "soon"),
            ],
            frame(0, b""),
            "3",
        ),
        ("NoSuchMethod", GRPC, frame(0, b""), "12"),
    ];
    for (method, headers, body, code) in cases {
        let answer = h2_call(server.addr, &rpc_path(method), headers, body).await;
        assert_eq!(answer.status, 200, "{method} {headers:?}");
        assert_eq!(
            answer.grpc_status(),
            code,
            "{method} {headers:?}: {}",
            answer.grpc_message()
        );
        assert!(!answer.grpc_message().is_empty());
    }
    // An unknown service, in the request's own framing.
    let answer = h2_call(server.addr, "/other.Service/Call", GRPC, frame(0, b"")).await;
    assert_eq!(answer.grpc_status(), "12");
    server.stop().await;
}

#[tokio::test]
async fn grpc_messages_are_percent_encoded() {
    let server = server().await;
    // The method name is echoed in the message; a space stays, `%` does not.
    let answer = h2_call(server.addr, &rpc_path("No%25Such"), GRPC, frame(0, b"")).await;
    assert_eq!(answer.grpc_status(), "12");
    let message = answer.grpc_message();
    assert!(message.contains("No%25Such"), "{message}");
    assert!(message.is_ascii());
    server.stop().await;
}

#[tokio::test]
async fn grpc_json_uses_the_proto3_json_mapping() {
    let server = server().await;
    let answer = h2_call(
        server.addr,
        &rpc_path("GetConfig"),
        &[("content-type", "application/grpc+json")],
        frame(0, format!(r#"{{"token":"{USER_TOKEN}"}}"#).as_bytes()),
    )
    .await;
    assert_eq!(
        answer.headers[header::CONTENT_TYPE],
        "application/grpc+json"
    );
    assert_eq!(answer.grpc_status(), "0");
    let frames = frames(&answer.body);
    let json: serde_json::Value = serde_json::from_slice(&frames[0].1).unwrap();
    assert!(json["servingDaemonToken"].is_string(), "{json}");
    server.stop().await;
}

/// A saturated server: one slot, taken.
async fn saturated() -> Server {
    let server = server().await;
    let beat = pb::HeartbeatRequest {
        version: 5,
        ..heartbeat("127.0.0.1:8335", 1)
    };
    assert_eq!(call_raw(server.addr, "Heartbeat", &beat).await.status, 200);
    acquire(&server, 1, 0).await;
    server
}

#[tokio::test]
async fn a_long_poll_with_a_200ms_grpc_timeout_ends_in_deadline_exceeded_near_200ms() {
    let server = saturated().await;
    let started = Instant::now();
    let answer = h2_call(
        server.addr,
        &rpc_path("WaitForStartingTask"),
        &[
            ("content-type", "application/grpc"),
            ("grpc-timeout", "200m"),
        ],
        frame(0, &wait_request(8000, 1, 0).encode_to_vec()),
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(answer.grpc_status(), "4", "{}", answer.grpc_message());
    // The server's own answer, not a client-side give-up.
    assert!(answer.grpc_message().contains("deadline"));
    assert!(
        elapsed >= Duration::from_millis(190) && elapsed < Duration::from_millis(1500),
        "{elapsed:?}"
    );
    assert_eq!(
        server.engine.snapshot().totals.waiters,
        0,
        "the waiter left"
    );
    server.stop().await;
}

/// gRPC-Web over plain HTTP/1.1, byte for byte as a browser library sends it.
async fn grpc_web_call(
    addr: SocketAddr,
    content_type: &str,
    extra: &str,
    body: &[u8],
) -> RawResponse {
    let mut connection = RawConnection::open(addr).await;
    let mut request = format!(
        "POST /{SERVICE}/GetConfig HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nX-Grpc-Web: 1\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    connection.send(&request).await;
    connection.read_response().await
}

fn trailer_lines(block: &[u8]) -> Vec<String> {
    String::from_utf8(block.to_vec())
        .unwrap()
        .split("\r\n")
        .filter(|line| !line.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn grpc_web_binary_ends_with_a_trailer_frame() {
    let server = server().await;
    let ok = grpc_web_call(
        server.addr,
        "application/grpc-web+proto",
        "",
        &frame(0, &get_config(USER_TOKEN)),
    )
    .await;
    assert_eq!(ok.status, 200);
    assert_eq!(
        ok.header("content-type"),
        Some("application/grpc-web+proto")
    );
    let body = frames(&ok.body);
    assert_eq!(body.len(), 2);
    assert_eq!(body[0].0, 0);
    pb::GetConfigResponse::decode(body[0].1.as_slice()).unwrap();
    assert_eq!(body[1].0, 0x80, "trailer frame");
    assert_eq!(trailer_lines(&body[1].1), ["grpc-status:0"]);

    let denied = grpc_web_call(
        server.addr,
        "application/grpc-web",
        "",
        &frame(0, &get_config("wrong")),
    )
    .await;
    let body = frames(&denied.body);
    assert_eq!(body.len(), 1, "only the trailer frame");
    assert_eq!(body[0].0, 0x80);
    let lines = trailer_lines(&body[0].1);
    assert_eq!(lines[0], "grpc-status:7");
    assert!(
        lines[1].starts_with("grpc-message:access denied"),
        "{lines:?}"
    );

    // Headers promise a body that never comes: the deadline still holds.
    let mut stalled = RawConnection::open(server.addr).await;
    stalled
        .send(
            format!(
                "POST /{SERVICE}/GetConfig HTTP/1.1\r\nHost: x\r\nContent-Type: application/grpc-web\r\nGrpc-Timeout: 200m\r\nContent-Length: 55\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
    let late = stalled.read_response().await;
    assert_eq!(trailer_lines(&frames(&late.body)[0].1)[0], "grpc-status:4");
    server.stop().await;
}

#[tokio::test]
async fn grpc_web_text_is_base64_both_ways() {
    let server = server().await;
    let b64 = base64::engine::general_purpose::STANDARD;
    let request = b64.encode(frame(0, &get_config(USER_TOKEN)));
    let answer = grpc_web_call(
        server.addr,
        "application/grpc-web-text",
        "Accept: application/grpc-web-text\r\n",
        request.as_bytes(),
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("content-type"),
        Some("application/grpc-web-text")
    );
    let decoded = b64.decode(&answer.body).expect("base64 answer");
    let body = frames(&decoded);
    assert_eq!(body.len(), 2);
    let config = pb::GetConfigResponse::decode(body[0].1.as_slice()).unwrap();
    assert!(!config.serving_daemon_token.is_empty());
    assert_eq!(trailer_lines(&body[1].1), ["grpc-status:0"]);

    let garbage = grpc_web_call(server.addr, "application/grpc-web-text", "", b"%%%%").await;
    let decoded = b64.decode(&garbage.body).unwrap();
    assert_eq!(trailer_lines(&frames(&decoded)[0].1)[0], "grpc-status:3");
    server.stop().await;
}

async fn server_with_cors(origins: &[&str]) -> Server {
    Server::start_with(
        engine_config(),
        HttpSettings {
            cors_allowed_origins: origins
                .iter()
                .map(|origin| HeaderValue::from_str(origin).unwrap())
                .collect(),
            ..HttpSettings::default()
        },
        "127.0.0.1:0",
    )
    .await
}

async fn preflight(server: &Server, origin: &str, request_headers: &str) -> reqwest::Response {
    http_client()
        .request(reqwest::Method::OPTIONS, server.url(&rpc_path("GetConfig")))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", request_headers)
        .send()
        .await
        .expect("preflight")
}

#[tokio::test]
async fn cors_lets_configured_origins_call_and_read_the_status_headers() {
    let server = server_with_cors(&["https://app.example"]).await;
    let allowed = preflight(
        &server,
        "https://app.example",
        "content-type,x-grpc-web,grpc-timeout",
    )
    .await;
    assert!(allowed.status().is_success());
    let headers = allowed.headers();
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    let allow_headers = headers["access-control-allow-headers"].to_str().unwrap();
    for needed in [
        "content-type",
        "x-grpc-web",
        "grpc-timeout",
        "connect-protocol-version",
    ] {
        assert!(allow_headers.contains(needed), "{allow_headers}");
    }

    let call = http_client()
        .post(server.url(&rpc_path("GetConfig")))
        .header("origin", "https://app.example")
        .header("content-type", "application/grpc-web+proto")
        .body(frame(0, &get_config(USER_TOKEN)))
        .send()
        .await
        .unwrap();
    let expose = call.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_owned();
    for needed in ["grpc-status", "grpc-message", "rpc-error-code"] {
        assert!(expose.contains(needed), "{expose}");
    }

    let stranger = preflight(&server, "https://evil.example", "content-type").await;
    assert!(
        stranger
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    server.stop().await;
}

#[tokio::test]
async fn without_configured_origins_there_is_no_cors() {
    let server = Server::start().await;
    let answer = preflight(&server, "https://app.example", "content-type").await;
    assert!(
        answer
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    assert_eq!(answer.status().as_u16(), 405, "OPTIONS is just not a POST");
    server.stop().await;
}

// ---------------------------------------------------------------------------
// Stock clients, installed by scripts/test.sh into target/test-tools.

/// Where scripts/test.sh installs the Python and npm test tools.
fn test_tools() -> PathBuf {
    std::env::var_os("YADCC_TEST_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools"))
}

/// The tool at `relative`, or None (and a skip) when it is not installed;
/// in CI a missing tool is a failure.
fn installed(relative: &str) -> Option<PathBuf> {
    let path = test_tools().join(relative);
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must install {relative} (scripts/test.sh does)"
    );
    eprintln!(
        "SKIPPED: {} is missing; scripts/test.sh installs it",
        path.display()
    );
    None
}

/// Runs a blocking client off the runtime, so the server keeps serving.
async fn run(mut command: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || command.output().expect("client starts"))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_python_grpcio_client_calls_every_rpc_and_gets_the_table_codes() {
    let Some(python_path) = installed("python/grpc_tools") else {
        return;
    };
    let server = server().await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut command = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()));
    command
        .arg(root.join("tests/grpc/client.py"))
        .arg(server.addr.to_string())
        .arg(root.join("proto"))
        .env("PYTHONPATH", python_path.parent().unwrap());
    let output = run(command).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("all gRPC checks passed"), "{stdout}");
    server.stop().await;
}

fn buf_curl(buf: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(buf);
    command
        .arg("curl")
        .arg("--http2-prior-knowledge")
        .args(args);
    command
}

#[tokio::test]
async fn buf_curl_lists_and_calls_over_grpc_and_grpc_web_by_reflection_alone() {
    let Some(buf) = installed("npm/node_modules/.bin/buf") else {
        return;
    };
    let server = server().await;
    let base = server.url("");
    for protocol in ["grpc", "grpcweb"] {
        for reflect in ["grpc-v1", "grpc-v1alpha"] {
            let output = run(buf_curl(
                &buf,
                &[
                    "--protocol",
                    protocol,
                    "--reflect-protocol",
                    reflect,
                    "--list-methods",
                    &base,
                ],
            ))
            .await;
            let listed = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{protocol} {reflect}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            for method in [
                "Heartbeat",
                "GetConfig",
                "WaitForStartingTask",
                "KeepTaskAlive",
                "FreeTask",
                "GetRunningTasks",
            ] {
                assert!(
                    listed.contains(&format!("{SERVICE}/{method}")),
                    "{protocol}: {listed}"
                );
            }
        }

        let data = format!(r#"{{"token":"{USER_TOKEN}"}}"#);
        let output = run(buf_curl(
            &buf,
            &[
                "--protocol",
                protocol,
                "-d",
                &data,
                &server.url(&rpc_path("GetConfig")),
            ],
        ))
        .await;
        assert!(
            output.status.success(),
            "{protocol}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert!(answer["servingDaemonToken"].is_string(), "{answer}");

        let output = run(buf_curl(
            &buf,
            &[
                "--protocol",
                protocol,
                "-d",
                r#"{"token":"wrong"}"#,
                &server.url(&rpc_path("GetConfig")),
            ],
        ))
        .await;
        assert!(!output.status.success());
        let error: serde_json::Value = serde_json::from_slice(&output.stderr).unwrap();
        assert_eq!(error["code"], "permission_denied", "{protocol}: {error}");
    }
    server.stop().await;
}

#[tokio::test]
async fn metrics_count_grpc_and_grpc_web_calls_under_their_protocol() {
    let server = server().await;
    let ok = h2_call(
        server.addr,
        &rpc_path("GetConfig"),
        GRPC,
        frame(0, &get_config(USER_TOKEN)),
    )
    .await;
    assert_eq!(ok.grpc_status(), "0");
    let denied = grpc_web_call(
        server.addr,
        "application/grpc-web-text",
        "",
        base64::engine::general_purpose::STANDARD
            .encode(frame(0, &get_config("wrong")))
            .as_bytes(),
    )
    .await;
    assert_eq!(denied.status, 200);
    let text = http_client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The code label is the error table's HTTP status, as for every protocol.
    for line in [
        r#"yadcc_scheduler_rpc_requests_total{protocol="grpc",method="GetConfig",encoding="binary",code="200"} 1"#,
        r#"yadcc_scheduler_rpc_requests_total{protocol="grpc-web",method="GetConfig",encoding="binary",code="403"} 1"#,
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    server.stop().await;
}
