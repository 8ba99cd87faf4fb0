//! gRPC-Web (binary and text) over plain HTTP/1.1 bytes as a browser
//! library sends them, CORS for browsers on other origins, and the metrics
//! of gRPC and gRPC-Web calls.

use std::net::SocketAddr;

use axum::http::HeaderValue;
use base64::Engine as _;
use prost::Message;
use yadcc_pb as pb;
use yadcc_scheduler::rpc::state::TransportSettings;

use crate::{
    grpc::{GRPC, frame, frames, get_config, h2_call, rpc_path, server},
    support::*,
};

/// gRPC-Web over plain HTTP/1.1, byte for byte as a browser library sends it.
async fn grpc_web_call(
    addr: SocketAddr,
    content_type: &str,
    extra: &str,
    body: &[u8],
) -> HttpResponse {
    let mut connection = Connection::open(addr).await;
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
    let mut stalled = Connection::open(server.addr).await;
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
        TransportSettings {
            cors_allowed_origins: origins
                .iter()
                .map(|origin| HeaderValue::from_str(origin).unwrap())
                .collect(),
            ..TransportSettings::default()
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
