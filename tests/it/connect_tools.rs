//! Connect tools with their defaults: `buf curl` (whose default protocol is
//! Connect) lists and calls by server reflection with no flag but
//! `--http2-prior-knowledge`; the health service's stream over raw Connect
//! framing; and the refusals a Connect client of these services can meet.

use prost::Message;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse, health_check_response};
use yadcc_scheduler::readiness::NotReady;

use crate::{
    grpc::{frame, frames, rpc_path, server},
    support::*,
    tools::{installed, run, said, tool},
};

const WATCH: &str = "/grpc.health.v1.Health/Watch";
const CHECK: &str = "/grpc.health.v1.Health/Check";

/// Flag of Connect's end-of-stream envelope.
const END_STREAM: u8 = 0x02;

#[tokio::test]
async fn buf_curl_lists_and_calls_with_its_default_protocol() {
    let Some(buf) = installed("npm/node_modules/.bin/buf") else {
        return;
    };
    let server = server().await;
    let curl = |args: &[&str]| {
        let mut command = tool(&buf);
        command
            .arg("curl")
            .arg("--http2-prior-knowledge")
            .args(args);
        command
    };

    // Reflection over a Connect bidi stream, v1 first as buf tries it.
    let output = run(curl(&["--list-methods", &server.url("")])).await;
    assert!(output.status.success(), "{}", said(&output));
    let listed = String::from_utf8_lossy(&output.stdout);
    for method in [
        "yadcc.scheduler.SchedulerService/Heartbeat",
        "yadcc.scheduler.SchedulerService/GetRunningTasks",
        "yadcc.scheduler.AdminService/CordonServant",
        "yadcc.scheduler.AdminService/UncordonServant",
        "yadcc.scheduler.AdminService/DrainServant",
        "yadcc.scheduler.AdminService/ListServantStates",
        "yadcc.scheduler.AdminService/ListAuditEvents",
        "grpc.health.v1.Health/Check",
        "grpc.health.v1.Health/Watch",
        "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ] {
        assert!(listed.contains(method), "{method} not listed: {listed}");
    }

    let data = format!(r#"{{"token":"{USER_TOKEN}"}}"#);
    let output = run(curl(&["-d", &data, &server.url(&rpc_path("GetConfig"))])).await;
    assert!(output.status.success(), "{}", said(&output));
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(answer["servingDaemonToken"].is_string(), "{answer}");

    let output = run(curl(&["-d", "{}", &server.url(CHECK)])).await;
    assert!(output.status.success(), "{}", said(&output));
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(answer["status"], "SERVING", "{answer}");
    server.stop().await;
}

/// Reads whole envelopes from a streaming answer as they arrive.
struct Envelopes {
    response: reqwest::Response,
    buffered: Vec<u8>,
}

impl Envelopes {
    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            if self.buffered.len() >= 5 {
                let length = u32::from_be_bytes(self.buffered[1..5].try_into().unwrap()) as usize;
                if self.buffered.len() >= 5 + length {
                    let envelope: Vec<u8> = self.buffered.drain(..5 + length).collect();
                    return Some((envelope[0], envelope[5..].to_vec()));
                }
            }
            let chunk = tokio::time::timeout(STEP, self.response.chunk())
                .await
                .expect("an envelope in time")
                .expect("the stream reads")?;
            self.buffered.extend_from_slice(&chunk);
        }
    }
}

fn status_of(envelope: (u8, Vec<u8>)) -> health_check_response::ServingStatus {
    assert_eq!(envelope.0, 0, "a message envelope");
    HealthCheckResponse::decode(&envelope.1[..])
        .unwrap()
        .status()
}

#[tokio::test]
async fn a_connect_stream_watches_the_health_through_a_change() {
    use health_check_response::ServingStatus;
    let server = Server::start().await;
    // Server streaming works over HTTP/1.1 too: the request is one envelope.
    let request = HealthCheckRequest {
        service: SERVICE.into(),
    };
    let response = reqwest::Client::new()
        .post(server.url(WATCH))
        .header("content-type", "application/connect+proto")
        .header("connect-protocol-version", "1")
        .body(frame(0, &request.encode_to_vec()))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/connect+proto"
    );
    let mut envelopes = Envelopes {
        response,
        buffered: Vec::new(),
    };
    assert_eq!(
        status_of(envelopes.next().await.unwrap()),
        ServingStatus::Serving
    );

    server.readiness.set_not_ready(NotReady::ShuttingDown);
    assert_eq!(
        status_of(envelopes.next().await.unwrap()),
        ServingStatus::NotServing
    );
    // A final status ends the stream: an end-of-stream envelope, no error.
    let (flags, end) = envelopes.next().await.unwrap();
    assert_eq!(flags, END_STREAM);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&end).unwrap(),
        serde_json::json!({})
    );
    assert!(envelopes.next().await.is_none());
    server.stop().await;
}

#[tokio::test]
async fn connect_refusals_say_what_works() {
    let server = Server::start().await;
    let client = reqwest::Client::new();
    let post = |path: &str, content_type: &str, body: Vec<u8>| {
        client
            .post(server.url(path))
            .header("content-type", content_type)
            .body(body)
            .send()
    };
    let check = HealthCheckRequest::default().encode_to_vec();

    // JSON: these services carry binary protobuf only.
    let refused = post(CHECK, "application/json", b"{}".to_vec())
        .await
        .unwrap();
    assert_eq!(refused.status(), 415);
    assert_eq!(refused.headers()["accept-post"], "application/proto");

    // A unary call of a streaming method, and the other way round.
    let refused = post(WATCH, "application/proto", check.clone())
        .await
        .unwrap();
    assert_eq!(refused.status(), 415);
    assert_eq!(
        refused.headers()["accept-post"],
        "application/connect+proto"
    );
    let refused = post(CHECK, "application/connect+proto", frame(0, &check))
        .await
        .unwrap();
    assert_eq!(refused.status(), 415);

    // No such procedure.
    let refused = post(
        "/grpc.health.v1.Health/List",
        "application/proto",
        check.clone(),
    )
    .await
    .unwrap();
    assert_eq!(refused.status(), 404);
    let error: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(error["code"], "unimplemented", "{error}");

    // Compressed: not read here.
    let refused = client
        .post(server.url(CHECK))
        .header("content-type", "application/proto")
        .header("content-encoding", "gzip")
        .body(check.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 501);
    let error: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(error["code"], "unimplemented", "{error}");

    // A streaming failure is an end-of-stream envelope with HTTP 200.
    let refused = client
        .post(server.url(WATCH))
        .header("content-type", "application/connect+proto")
        .header("connect-protocol-version", "2")
        .body(frame(0, &check))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 200);
    let body = refused.bytes().await.unwrap();
    let envelopes = frames(&body);
    assert_eq!(envelopes.len(), 1);
    assert_eq!(envelopes[0].0, END_STREAM);
    let end: serde_json::Value = serde_json::from_slice(&envelopes[0].1).unwrap();
    assert_eq!(end["error"]["code"], "invalid_argument", "{end}");

    // Not a POST.
    let refused = client
        .get(server.url(CHECK))
        .header("content-type", "application/proto")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 405);
    assert_eq!(refused.headers()["allow"], "POST");
    server.stop().await;
}
