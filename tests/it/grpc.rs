//! gRPC over h2c on the Connect path, with hyper's HTTP/2 client: framing,
//! trailers, error codes, the JSON sub-type and deadlines. The helpers here
//! (server, framing, one h2c call) serve `grpc_web` and `grpc_clients` too.

use std::{net::SocketAddr, time::Duration};

use axum::http::{HeaderMap, Request, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::{net::TcpStream, time::Instant};
use yadcc_engine as engine;
use yadcc_pb as pb;
use yadcc_scheduler::rpc::state::TransportSettings;

use crate::{fixtures::take_the_only_slot, support::*};

pub const BODY_LIMIT: usize = 4096;

/// The server the Python client expects: version floor 5, a 4 KiB body
/// limit, no servants yet.
pub async fn server() -> Server {
    server_secured(yadcc_scheduler::security::SecuritySettings::default()).await
}

/// The same server with `security` (TLS on its port).
pub async fn server_secured(security: yadcc_scheduler::security::SecuritySettings) -> Server {
    Server::start_with(
        engine::Config {
            min_daemon_version: 5,
            // As long after start: unknown ids are neither adopted nor
            // renewed early, so the client's unknown id renews false.
            adoption_window: std::time::Duration::ZERO,
            ..engine_config()
        },
        TransportSettings {
            max_body_bytes: BODY_LIMIT,
            security,
            ..TransportSettings::default()
        },
        "127.0.0.1:0",
    )
    .await
}

pub fn frame(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut framed = vec![flags];
    framed.extend((payload.len() as u32).to_be_bytes());
    framed.extend_from_slice(payload);
    framed
}

/// Splits a body into its length-prefixed frames.
pub fn frames(mut body: &[u8]) -> Vec<(u8, Vec<u8>)> {
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
pub struct H2Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl H2Answer {
    /// `grpc-status`, from the trailers or (trailers-only) the headers.
    pub fn grpc_status(&self) -> &str {
        self.trailers
            .as_ref()
            .and_then(|trailers| trailers.get("grpc-status"))
            .or_else(|| self.headers.get("grpc-status"))
            .expect("grpc-status in trailers or headers")
            .to_str()
            .unwrap()
    }

    pub fn grpc_message(&self) -> String {
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
pub async fn h2_call(
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
pub type Headers = &'static [(&'static str, &'static str)];

pub const GRPC: Headers = &[("content-type", "application/grpc"), ("te", "trailers")];

pub fn rpc_path(method: &str) -> String {
    format!("/{SERVICE}/{method}")
}

pub fn get_config(token: &str) -> Vec<u8> {
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

#[tokio::test]
async fn a_long_poll_with_a_200ms_grpc_timeout_ends_in_deadline_exceeded_near_200ms() {
    let server = server().await;
    take_the_only_slot(&server, 5).await;
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
        elapsed >= Duration::from_millis(190) && elapsed < Duration::from_secs(4),
        "near 200 ms, well before the 8 s wait: {elapsed:?}"
    );
    assert_eq!(
        server.engine.snapshot().totals.waiters,
        0,
        "the waiter left"
    );
    server.stop().await;
}
