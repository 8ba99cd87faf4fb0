//! The standard gRPC health service against the readiness `/readyz`
//! reports: the stock Python client (grpcio-health-checking) through a
//! shutdown, and one readiness seen by `/readyz`, gRPC and Connect alike.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::Stdio,
};

use prost::Message;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse, health_check_response};
use yadcc_scheduler::readiness::NotReady;

use crate::{
    grpc::{frame, frames, h2_call},
    support::*,
    tools::{installed, python},
};

const CHECK: &str = "/grpc.health.v1.Health/Check";

fn check_request(service: &str) -> Vec<u8> {
    HealthCheckRequest {
        service: service.into(),
    }
    .encode_to_vec()
}

#[tokio::test]
async fn grpcio_health_checking_sees_serving_then_not_serving_through_a_shutdown() {
    let Some(python_path) = installed("python/grpc_health") else {
        return;
    };
    let server = Server::start().await;
    let mut command = python();
    command
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc/health.py"))
        .arg(server.addr.to_string())
        .env("PYTHONPATH", python_path.parent().unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("python starts");
    let stdout = child.stdout.take().unwrap();
    // Read until the client is watching, then leave the rest to the end.
    let (seen, rest) = tokio::task::spawn_blocking(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut seen = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            seen.push_str(&line);
            seen.push('\n');
            if line == "watching SERVING" {
                break;
            }
        }
        (seen, lines)
    })
    .await
    .unwrap();
    assert!(
        seen.ends_with("watching SERVING\n"),
        "the client never watched SERVING:\n{seen}\n{}",
        stderr_of(&mut child)
    );

    server.stop().await;
    let tail = tokio::task::spawn_blocking(move || {
        rest.map(|line| line.unwrap() + "\n").collect::<String>()
    })
    .await
    .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().map(|status| (status, child)))
        .await
        .unwrap()
        .expect("python ends");
    let (status, mut child) = status;
    assert!(
        status.success() && tail.contains("all health checks passed"),
        "health client failed:\n{seen}{tail}\n{}",
        stderr_of(&mut child)
    );
}

fn stderr_of(child: &mut std::process::Child) -> String {
    use std::io::Read;
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    stderr
}

/// The status a gRPC `Check` of `service` answers, over h2c.
async fn grpc_check(server: &Server, service: &str) -> i32 {
    let answer = h2_call(
        server.addr,
        CHECK,
        &[("content-type", "application/grpc"), ("te", "trailers")],
        frame(0, &check_request(service)),
    )
    .await;
    assert_eq!(answer.grpc_status(), "0", "{}", answer.grpc_message());
    let frames = frames(&answer.body);
    assert_eq!(frames.len(), 1);
    HealthCheckResponse::decode(&frames[0].1[..])
        .unwrap()
        .status
}

/// The status a Connect unary `Check` of `service` answers, over HTTP/1.1.
async fn connect_check(server: &Server, service: &str) -> i32 {
    let response = reqwest::Client::new()
        .post(server.url(CHECK))
        .header("content-type", "application/proto")
        .header("connect-protocol-version", "1")
        .body(check_request(service))
        .send()
        .await
        .expect("Connect Check");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/proto");
    HealthCheckResponse::decode(response.bytes().await.unwrap())
        .unwrap()
        .status
}

async fn readyz(server: &Server) -> (u16, String) {
    let response = reqwest::get(server.url("/readyz")).await.expect("readyz");
    (
        response.status().as_u16(),
        response.text().await.unwrap_or_default(),
    )
}

/// Every name reported has `expected` health, over gRPC and Connect alike.
async fn assert_health(server: &Server, expected: health_check_response::ServingStatus) {
    for service in ["", SERVICE] {
        assert_eq!(
            grpc_check(server, service).await,
            expected as i32,
            "gRPC {service:?}"
        );
        assert_eq!(
            connect_check(server, service).await,
            expected as i32,
            "Connect {service:?}"
        );
    }
}

#[tokio::test]
async fn readyz_and_every_health_protocol_report_the_one_readiness() {
    use health_check_response::ServingStatus;
    let server = Server::start().await;
    assert_eq!(readyz(&server).await.0, 200);
    assert_health(&server, ServingStatus::Serving).await;

    // As the edge does when a shutdown begins (and a standby would), but
    // with the server still taking connections: every report follows.
    server.readiness.set_not_ready(NotReady::ShuttingDown);
    assert_eq!(readyz(&server).await, (503, "shutting down\n".to_owned()));
    assert_health(&server, ServingStatus::NotServing).await;
    server.stop().await;
}

#[tokio::test]
async fn a_check_of_another_name_is_not_found_on_every_protocol() {
    let server = Server::start().await;
    let answer = h2_call(
        server.addr,
        CHECK,
        &[("content-type", "application/grpc")],
        frame(0, &check_request("no.such.Service")),
    )
    .await;
    assert_eq!(answer.grpc_status(), "5", "NOT_FOUND");

    let response = reqwest::Client::new()
        .post(server.url(CHECK))
        .header("content-type", "application/proto")
        .body(check_request("no.such.Service"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let error: serde_json::Value = response.json().await.unwrap();
    assert_eq!(error["code"], "not_found", "{error}");
    assert!(
        error["message"].as_str().unwrap().contains(SERVICE),
        "names what it reports: {error}"
    );
    server.stop().await;
}
