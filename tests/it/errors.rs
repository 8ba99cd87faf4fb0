//! Every reachable row of the error table, triggered over a real socket, on
//! both route styles; and bad bodies never take the server down.

use prost::Message;
use yadcc_engine as engine;
use yadcc_pb as pb;
use yadcc_scheduler::rpc::{error::ErrorKind, state::TransportSettings};

use crate::support::*;

const BODY_LIMIT: usize = 1024;

async fn server() -> Server {
    Server::start_with(
        engine::Config {
            min_daemon_version: 5,
            ..engine_config()
        },
        TransportSettings {
            max_body_bytes: BODY_LIMIT,
            ..TransportSettings::default()
        },
        "127.0.0.1:0",
    )
    .await
}

fn servant(version: u32) -> pb::HeartbeatRequest {
    pb::HeartbeatRequest {
        version,
        ..heartbeat("127.0.0.1:8335", 1)
    }
}

/// A raw request that provokes `kind`, or None where no client can provoke it.
fn trigger(kind: ErrorKind, path: &str) -> Option<Vec<u8>> {
    let post = |method: &str, content_type: &str, body: &[u8]| {
        let headers = [("Rpc-SeqNo", "9"), ("Content-Type", content_type)];
        http_request(&format!("{path}{method}"), &headers, body)
    };
    let binary = |method: &str, message: &dyn Fn() -> Vec<u8>| {
        post(method, "application/x-protobuf", &message())
    };
    use pb::Status;
    Some(match kind {
        ErrorKind::Scheduler(Status::NoQuotaAvailable) => binary("WaitForStartingTask", &|| {
            wait_request(0, 1, 0).encode_to_vec()
        }),
        ErrorKind::Scheduler(Status::AccessDenied) => binary("FreeTask", &|| {
            pb::FreeTaskRequest {
                token: "bad".into(),
                task_grant_ids: vec![],
            }
            .encode_to_vec()
        }),
        ErrorKind::Scheduler(Status::InvalidArgument) => binary("Heartbeat", &|| {
            pb::HeartbeatRequest {
                location: "nowhere".into(),
                ..servant(5)
            }
            .encode_to_vec()
        }),
        ErrorKind::Scheduler(Status::VersionTooOld) => {
            binary("Heartbeat", &|| servant(4).encode_to_vec())
        }
        ErrorKind::Scheduler(Status::EnvironmentNotAvailable) => {
            binary("WaitForStartingTask", &|| {
                pb::WaitForStartingTaskRequest {
                    env_desc: Some(pb::EnvironmentDesc {
                        compiler_digest: "nobody-has-this".into(),
                    }),
                    ..wait_request(1000, 1, 0)
                }
                .encode_to_vec()
            })
        }
        ErrorKind::DeadlineExceeded => {
            // Headers promise a body that never comes.
            format!("POST {path}GetConfig HTTP/1.1\r\nRpc-Timeout: 200\r\nConnect-Timeout-Ms: 200\r\nContent-Type: application/x-protobuf\r\nContent-Length: 50\r\n\r\n").into_bytes()
        }
        ErrorKind::MalformedRequest => {
            post("GetConfig", "application/x-protobuf", &[0x0a, 0x05, b'a'])
        }
        ErrorKind::UnsupportedMediaType => post("GetConfig", "text/x-protobuf", b"token: \"x\""),
        // A page of another site (a daemon sends no `Origin`).
        ErrorKind::CrossSite => http_request(
            &format!("{path}GetConfig"),
            &[
                ("Rpc-SeqNo", "9"),
                ("Origin", "http://evil.example"),
                ("Content-Type", "application/x-protobuf"),
            ],
            b"",
        ),
        ErrorKind::PayloadTooLarge => post(
            "Heartbeat",
            "application/x-protobuf",
            &vec![0u8; BODY_LIMIT + 1],
        ),
        ErrorKind::MethodNotAllowed => format!("GET {path}GetConfig HTTP/1.1\r\n\r\n").into_bytes(),
        ErrorKind::MethodNotFound => binary("NoSuchMethod", &Vec::new),
        // Under `/rpc/` another service is an unknown method (see
        // `another_service_under_rpc_is_an_unknown_method`): the path of
        // another service is Connect's, whichever style is being checked.
        ErrorKind::ServiceNotFound => {
            "POST /yadcc.scheduler.OtherService/GetConfig HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
                .as_bytes()
                .to_vec()
        }
        // The operators' service without a credential: its path in this
        // route style.
        ErrorKind::Unauthenticated => http_request(
            &format!(
                "{}ListAuditEvents",
                path.replace(SERVICE, pb::ADMIN_SERVICE)
            ),
            &[("Rpc-SeqNo", "9"), ("Content-Type", "application/json")],
            b"{}",
        ),
        // Not reachable by a client: no RPC of this server is unimplemented,
        // and Internal/Unknown are bugs. Their rows are checked in unit tests.
        ErrorKind::Scheduler(Status::NotImplemented | Status::Unknown) | ErrorKind::Internal => {
            return None;
        }
        // Rows of the binary protocol, checked in `flare`.
        ErrorKind::Overloaded | ErrorKind::CompressionNotSupported => return None,
    })
}

#[tokio::test]
async fn every_reachable_error_row_is_what_the_table_says() {
    let server = server().await;
    // Capacity for exactly one grant, taken, so "no quota" is reachable.
    let taken = call_http_pb(server.addr, Method::Heartbeat, &servant(5)).await;
    assert_eq!(taken.status, 200);
    let grant = call_http_pb(
        server.addr,
        Method::WaitForStartingTask,
        &wait_request(0, 1, 0),
    )
    .await;
    assert_eq!(grant.status, 200);

    let mut checked = 0;
    for path in [format!("/rpc/{SERVICE}."), format!("/{SERVICE}/")] {
        for kind in ErrorKind::ALL {
            let Some(request) = trigger(kind, &path) else {
                continue;
            };
            let mut connection = Connection::open(server.addr).await;
            connection.send(&request).await;
            let response = connection.read_response().await;
            let wire = kind.wire();
            let context = format!("{kind:?} on {path}");
            assert_eq!(response.status, wire.http_status.as_u16(), "{context}");
            assert_eq!(
                response.header("rpc-error-code"),
                Some(wire.rpc_code.to_string().as_str()),
                "{context}"
            );
            assert!(
                response
                    .header("rpc-error-reason")
                    .is_some_and(|reason| !reason.is_empty()),
                "{context}"
            );
            assert_eq!(
                response.header("content-type"),
                Some("application/json"),
                "{context}"
            );
            let body: serde_json::Value =
                serde_json::from_slice(&response.body).expect("JSON error body");
            assert_eq!(body["code"], wire.connect_code, "{context}");
            assert_eq!(body["rpcErrorCode"], wire.rpc_code, "{context}");
            assert!(
                body["message"]
                    .as_str()
                    .is_some_and(|message| !message.is_empty()),
                "{context}"
            );
            if kind == ErrorKind::MethodNotAllowed {
                assert_eq!(response.header("allow"), Some("POST"));
            }
            if kind == ErrorKind::Unauthenticated {
                assert_eq!(
                    response.header("www-authenticate"),
                    Some("Bearer realm=\"yadcc-admin\""),
                    "{context}"
                );
                assert_eq!(body["status"], "STATUS_ACCESS_DENIED", "{context}");
            }
            // The original's words, which daemons print, on every protocol.
            let original = match kind {
                ErrorKind::Scheduler(pb::Status::NoQuotaAvailable) => {
                    Some("The compilation cloud is busy now.")
                }
                ErrorKind::Scheduler(pb::Status::EnvironmentNotAvailable) => {
                    Some("No matched servant environment.")
                }
                _ => None,
            };
            if let Some(original) = original {
                assert_eq!(body["message"], original, "{context}");
                assert_eq!(
                    response.header("rpc-error-reason"),
                    Some(original),
                    "{context}"
                );
            }
            if path.starts_with("/rpc/") && request.windows(9).any(|w| w == b"Rpc-SeqNo") {
                assert_eq!(response.header("rpc-seqno"), Some("9"), "{context}");
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * 14, "every reachable row on both route styles");
    server.stop().await;
}

/// The daemons' framework looks up the whole name under `/rpc/`: another
/// service's method is an unknown method (10), as it answers, for daemons
/// and scripts alike; Connect's path of another service is no route (9).
#[tokio::test]
async fn another_service_under_rpc_is_an_unknown_method() {
    let server = server().await;
    for (path, code) in [
        ("/rpc/yadcc.scheduler.OtherService.GetConfig", "10"),
        ("/rpc/NoServiceAtAll", "10"),
        (&format!("/rpc/{SERVICE}.NoSuchMethod"), "10"),
        ("/yadcc.scheduler.OtherService/GetConfig", "9"),
    ] {
        for seq_no in [Some("4"), None] {
            let mut headers = vec![("Content-Type", "application/x-protobuf")];
            headers.extend(seq_no.map(|seq_no| ("Rpc-SeqNo", seq_no)));
            let mut connection = Connection::open(server.addr).await;
            connection.send(&http_request(path, &headers, &[])).await;
            let response = connection.read_response().await;
            assert_eq!(response.status, 404, "{path} {seq_no:?}");
            assert_eq!(
                response.header("rpc-error-code"),
                Some(code),
                "{path} {seq_no:?}"
            );
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_bodies_get_documented_errors_and_the_server_keeps_serving() {
    let server = server().await;
    let client = http_client();
    let url = server.url(&format!("/rpc/{SERVICE}.Heartbeat"));
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "application/x-protobuf",
            servant(5).encode_to_vec()[..7].to_vec(),
            400,
        ),
        ("application/x-protobuf", vec![0xff; 16], 400),
        ("application/json", b"{\"token\": ".to_vec(), 400),
        ("application/json", b"[1, 2, 3]".to_vec(), 400),
        ("application/json", br#"{"capacity": "lots"}"#.to_vec(), 400),
        ("application/json", br#"{"capacity": -1}"#.to_vec(), 400),
        (
            "application/json",
            br#"{"envDescs": {"compilerDigest": "x"}}"#.to_vec(),
            400,
        ),
        ("application/json", vec![b' '; 64 * 1024], 413),
    ];
    for (content_type, body, expected) in cases {
        let response = client
            .post(&url)
            .header("content-type", content_type)
            .body(body.clone())
            .send()
            .await
            .expect("send");
        assert_eq!(
            response.status().as_u16(),
            expected,
            "{content_type} {:?}",
            String::from_utf8_lossy(&body[..body.len().min(40)])
        );
        let code = response.headers()["rpc-error-code"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(code, "5");
        // Still serving, on a new request.
        let config = client
            .post(server.url(&format!("/rpc/{SERVICE}.GetConfig")))
            .header("content-type", "application/json")
            .body(format!(r#"{{"token":"{USER_TOKEN}"}}"#))
            .send()
            .await
            .expect("send");
        assert_eq!(config.status().as_u16(), 200);
    }
    server.stop().await;
}
