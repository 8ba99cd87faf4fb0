//! The operators' service over real sockets: every protocol the gateway
//! speaks answers it (JSON and binary `POST /rpc/...`, Connect, gRPC,
//! gRPC-Web) and refuses a call without a token (401), with a daemon's
//! token or a wrong one (403), both `STATUS_ACCESS_DENIED`; the daemons'
//! binary protocol does not carry it. Accepted actions are in the audit list
//! (newest first) and in the log, with who, what and from where.

use prost::Message;
use serde_json::{Value, json};
use yadcc_pb as pb;

use crate::{
    grpc::{frame, frames, h2_call},
    support::*,
};

pub const ADMIN_TOKEN: &str = "operator-token-1";

fn admin_path(method: &str) -> String {
    format!("/rpc/{}.{method}", pb::ADMIN_SERVICE)
}

/// One JSON call of the operators' service; the status and the body.
pub async fn admin_json(
    addr: std::net::SocketAddr,
    method: &str,
    token: Option<&str>,
    body: Value,
) -> (u16, Value) {
    let mut request = http_client()
        .post(format!("http://{addr}{}", admin_path(method)))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("admin call");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "raw": text }));
    (status, value)
}

#[tokio::test]
async fn no_token_a_daemons_token_and_a_wrong_one_are_refused_on_every_route() {
    let server = Server::start_with_admin(&[ADMIN_TOKEN]).await;
    for method in ["CordonServant", "ListServantStates", "ListAuditEvents"] {
        let body = json!({ "location": "127.0.0.9:8335" });
        let (status, answer) = admin_json(server.addr, method, None, body.clone()).await;
        assert_eq!(status, 401, "{method}: {answer}");
        assert_eq!(answer["code"], "unauthenticated");
        assert_eq!(answer["status"], "STATUS_ACCESS_DENIED");
        for token in [USER_TOKEN, SERVANT_TOKEN, "wrong", "operator-token-"] {
            let (status, answer) = admin_json(server.addr, method, Some(token), body.clone()).await;
            assert_eq!(status, 403, "{method} with {token}: {answer}");
            assert_eq!(answer["code"], "permission_denied");
            assert_eq!(answer["status"], "STATUS_ACCESS_DENIED");
            assert_eq!(answer["rpcErrorCode"], 1003);
        }
    }
    // The credential is checked first: a bad request without one is 401.
    let (status, _) = admin_json(server.addr, "CordonServant", None, json!({"location": 7})).await;
    assert_eq!(status, 401);
    // The basic auth of the dashboard is no admin credential either.
    let response = http_client()
        .post(server.url(&admin_path("ListAuditEvents")))
        .header("content-type", "application/json")
        .basic_auth("admin", Some(ADMIN_TOKEN))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(
        response.headers()["www-authenticate"],
        "Bearer realm=\"yadcc-admin\""
    );
    assert!(server.engine.cordons().is_empty(), "nothing was done");
    server.stop().await;
}

#[tokio::test]
async fn a_closed_admin_api_refuses_every_token() {
    let server = Server::start().await;
    let (status, answer) = admin_json(
        server.addr,
        "ListServantStates",
        Some(ADMIN_TOKEN),
        json!({}),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("--admin_tokens"),
        "{answer}"
    );
    server.stop().await;
}

/// The actions of a `ListAuditEventsResponse` in proto3 JSON, newest first.
pub fn audit_actions(events: &Value) -> Vec<&str> {
    events["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|event| event["action"].as_str().unwrap_or_default())
        .collect()
}

/// `ServantState` of a `ListServantStatesResponse` in proto3 JSON, by location.
fn listed(answer: &Value, location: &str) -> Option<Value> {
    answer["servants"]
        .as_array()?
        .iter()
        .find(|servant| servant["location"] == location)
        .cloned()
}

#[tokio::test]
async fn every_protocol_of_the_gateway_serves_the_admin_service() {
    let server = Server::start_with_admin(&[ADMIN_TOKEN]).await;
    let bearer = format!("Bearer {ADMIN_TOKEN}");

    // JSON over POST /rpc/.
    let (status, answer) = admin_json(
        server.addr,
        "CordonServant",
        Some(ADMIN_TOKEN),
        json!({ "location": "127.0.0.2:8335", "reason": "json" }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["servant"]["state"], "CORDON_STATE_CORDONED");
    assert_eq!(answer["servant"]["who"], "token:admin-token-1");

    // Binary protobuf over POST /rpc/, as http+pb with a sequence number.
    let drain = pb::DrainServantRequest {
        location: "127.0.0.3:8335".into(),
        reason: "binary".into(),
    };
    let mut connection = Connection::open(server.addr).await;
    connection
        .send(&http_request(
            &admin_path("DrainServant"),
            &[
                ("Content-Type", "application/x-protobuf"),
                ("Rpc-SeqNo", "4"),
                ("Authorization", &bearer),
            ],
            &drain.encode_to_vec(),
        ))
        .await;
    let response = connection.read_response().await;
    assert_eq!(response.status, 200);
    assert_eq!(response.header("rpc-seqno"), Some("4"));
    let drained: pb::DrainServantResponse = response.decode();
    assert_eq!(
        drained.servant.unwrap().state,
        pb::CordonState::Drained as i32,
        "nothing runs there"
    );

    // Connect, JSON.
    let connect = http_client()
        .post(server.url(&format!("/{}/ListServantStates", pb::ADMIN_SERVICE)))
        .header("content-type", "application/json")
        .bearer_auth(ADMIN_TOKEN)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(connect.status(), 200);
    let states: Value = connect.json().await.unwrap();
    assert_eq!(listed(&states, "127.0.0.2:8335").unwrap()["reason"], "json");
    assert_eq!(
        listed(&states, "127.0.0.3:8335").unwrap()["state"],
        "CORDON_STATE_DRAINED"
    );

    // gRPC over h2c: an uncordon, then the same call without a token.
    let path = format!("/{}/UncordonServant", pb::ADMIN_SERVICE);
    let uncordon = pb::UncordonServantRequest {
        location: "127.0.0.2:8335".into(),
    }
    .encode_to_vec();
    let grpc_headers = [
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("authorization", bearer.as_str()),
    ];
    let answer = h2_call(server.addr, &path, &grpc_headers, frame(0, &uncordon)).await;
    assert_eq!(answer.grpc_status(), "0", "{}", answer.grpc_message());
    let reply = pb::UncordonServantResponse::decode(&frames(&answer.body)[0].1[..]).unwrap();
    assert!(reply.was_cordoned);
    let refused = h2_call(server.addr, &path, &grpc_headers[..2], frame(0, &uncordon)).await;
    assert_eq!(refused.grpc_status(), "16", "unauthenticated");

    // gRPC-Web over HTTP/1.1, as a browser library sends it.
    let mut connection = Connection::open(server.addr).await;
    connection
        .send(&http_request(
            &format!("/{}/ListAuditEvents", pb::ADMIN_SERVICE),
            &[
                ("Content-Type", "application/grpc-web+proto"),
                ("X-Grpc-Web", "1"),
                ("Authorization", &bearer),
            ],
            &frame(0, &pb::ListAuditEventsRequest {}.encode_to_vec()),
        ))
        .await;
    let response = connection.read_response().await;
    assert_eq!(response.status, 200);
    let body = frames(&response.body);
    let events = pb::ListAuditEventsResponse::decode(&body[0].1[..]).unwrap();
    let actions: Vec<(&str, &str)> = events
        .events
        .iter()
        .map(|event| (event.action.as_str(), event.protocol.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("UncordonServant", "grpc"),
            ("DrainServant", "http+pb"),
            ("CordonServant", "http+pb"),
        ],
        "newest first, each with the protocol it came over"
    );
    assert!(events.events.iter().all(|event| event.peer == "127.0.0.1"));

    // The daemons' binary protocol knows no such method.
    let mut connection = Connection::open(server.addr).await;
    let mut frame_bytes = bytes::BytesMut::new();
    yadcc_sim::wire::encode_flare_frame(
        &mut frame_bytes,
        &yadcc_sim::wire::request_meta_accepting(
            1,
            Method::ListAuditEvents.full_name().to_owned(),
            std::time::Duration::from_secs(2),
            0,
        ),
        &[],
        &[],
    );
    connection.send(&frame_bytes).await;
    let answer = connection.read_flare().await;
    assert_eq!(answer.status(), 10, "an unknown method on flare://");
    server.stop().await;
}

#[tokio::test]
async fn bad_arguments_are_invalid_and_change_nothing() {
    let server = Server::start_with_admin(&[ADMIN_TOKEN]).await;
    for body in [
        json!({}),
        json!({ "location": "servant-7:8335" }),
        json!({ "location": "127.0.0.2" }),
        json!({ "location": "127.0.0.2:8335", "reason": "x".repeat(201) }),
        json!({ "location": "127.0.0.2:8335", "reason": "two\nlines" }),
    ] {
        let (status, answer) =
            admin_json(server.addr, "DrainServant", Some(ADMIN_TOKEN), body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["status"], "STATUS_INVALID_ARGUMENT", "{body}");
    }
    let (_, events) =
        admin_json(server.addr, "ListAuditEvents", Some(ADMIN_TOKEN), json!({})).await;
    assert_eq!(events, json!({}), "no event: nothing was done");
    server.stop().await;
}

#[tokio::test]
async fn a_cordoned_servant_is_marked_on_the_dashboard_with_reason_and_who() {
    let server = Server::start_with_admin(&[ADMIN_TOKEN]).await;
    heartbeat_from(&server, "127.0.0.2", "127.0.0.2:8335", 4).await;
    let (status, _) = admin_json(
        server.addr,
        "DrainServant",
        Some(ADMIN_TOKEN),
        json!({ "location": "127.0.0.2:8335", "reason": "new disk" }),
    )
    .await;
    assert_eq!(status, 200);
    admin_json(
        server.addr,
        "CordonServant",
        Some(ADMIN_TOKEN),
        json!({ "location": "127.0.0.5:8335", "reason": "not yet racked" }),
    )
    .await;
    let overview = crate::protocols::overview(&server).await;
    let servant = &overview["servants"][0];
    assert_eq!(servant["location"], "127.0.0.2:8335");
    assert_eq!(servant["cordon"]["state"], "drained");
    assert_eq!(servant["cordon"]["reason"], "new disk");
    assert_eq!(servant["cordon"]["by"], "token:admin-token-1");
    let cordons: Vec<(&str, bool)> = overview["cordons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|cordon| {
            (
                cordon["location"].as_str().unwrap(),
                cordon["registered"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        cordons,
        [("127.0.0.2:8335", true), ("127.0.0.5:8335", false)]
    );
    // Its slots count as unavailable: it takes no task.
    assert_eq!(overview["totals"]["capacityAvailable"], 0);
    server.stop().await;
}

#[tokio::test]
async fn cordons_and_the_audit_name_the_operators_label_never_a_trace_of_the_token() {
    let labelled = "alice:alices-long-secret";
    let flag = format!("--admin_tokens={labelled},plain-token");
    let server = Binary::start(&[&flag, "--debugging_no_inspect_auth"], None);
    let addr = server.addr;
    let (status, answer) = admin_json(
        addr,
        "CordonServant",
        Some("alices-long-secret"),
        json!({ "location": "127.0.0.2:8335", "reason": "disk" }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["servant"]["who"], "token:alice");
    let (status, answer) = admin_json(
        addr,
        "DrainServant",
        Some("plain-token"),
        json!({ "location": "127.0.0.3:8335", "reason": "plain" }),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["servant"]["who"], "token:admin-token-2",
        "a plain token keeps working, named by its place"
    );
    let (status, _) = admin_json(addr, "ListServantStates", Some(labelled), json!({})).await;
    assert_eq!(status, 403, "the label is no part of the token");

    let (_, states) = admin_json(addr, "ListServantStates", Some("plain-token"), json!({})).await;
    let (_, audit) = admin_json(addr, "ListAuditEvents", Some("plain-token"), json!({})).await;
    let overview: Value = http_client()
        .get(format!("http://{addr}/api/v1/overview"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let by_location = |list: &Value, key: &str, location: &str| {
        list.as_array()
            .unwrap_or_else(|| panic!("{list}"))
            .iter()
            .find(|entry| entry["location"] == location)
            .map(|entry| entry[key].clone())
    };
    assert_eq!(
        by_location(&states["servants"], "who", "127.0.0.2:8335"),
        Some(json!("token:alice")),
        "{states}"
    );
    assert_eq!(
        by_location(&audit["events"], "who", "127.0.0.2:8335"),
        Some(json!("token:alice")),
        "{audit}"
    );
    assert_eq!(
        by_location(&overview["cordons"], "by", "127.0.0.2:8335"),
        Some(json!("token:alice")),
        "{overview}"
    );
    let everything = format!("{states}{audit}{overview}{}", server.log().join("\n"));
    for secret in ["alices-long-secret", "plain-token"] {
        assert!(!everything.contains(secret), "{secret} shown");
        let trace = yadcc_scheduler::admin::fingerprint(secret);
        assert!(
            !everything.contains(&trace),
            "a fingerprint of {secret} shown"
        );
    }
    assert!(
        server
            .log()
            .iter()
            .any(|line| line.contains("labels alice, admin-token-2")),
        "{:?}",
        server.log()
    );
}
