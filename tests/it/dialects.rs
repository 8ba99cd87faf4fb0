//! Every RPC in every encoding, on both route styles, through the same handlers.

use prost::Message;
use serde_json::{Value, json};
use yadcc_pb as pb;

use crate::support::*;

#[derive(Clone, Copy, Debug)]
enum Route {
    HttpPb,
    Connect,
}

fn path(route: Route, method: &str) -> &'static str {
    let method = pb::Method::from_name(method).expect("an RPC of the service");
    match route {
        Route::HttpPb => method.rpc_path(),
        Route::Connect => method.connect_path(),
    }
}

/// Posts `body` with the given content type; returns the status, the
/// answer's content type and its body.
async fn post(
    server: &Server,
    route: Route,
    method: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, String, bytes::Bytes) {
    let response = http_client()
        .post(server.url(path(route, method)))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    let echoed = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    (status, echoed, response.bytes().await.expect("body"))
}

/// Posts a JSON body; returns status, the answer as JSON, its content type.
async fn post_json(
    server: &Server,
    route: Route,
    method: &str,
    content_type: &str,
    body: Value,
) -> (u16, Value, String) {
    let (status, echoed, bytes) = post(
        server,
        route,
        method,
        content_type,
        body.to_string().into_bytes(),
    )
    .await;
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("JSON answer")
    };
    (status, value, echoed)
}

/// Posts a binary message; returns status, the decoded answer, its content type.
async fn post_binary<T: Message + Default>(
    server: &Server,
    route: Route,
    method: &str,
    content_type: &str,
    message: &impl Message,
) -> (u16, T, String) {
    let (status, echoed, bytes) =
        post(server, route, method, content_type, message.encode_to_vec()).await;
    (status, T::decode(bytes).unwrap_or_default(), echoed)
}

#[tokio::test]
async fn every_rpc_works_in_json_on_both_route_styles() {
    for route in [Route::HttpPb, Route::Connect] {
        for content_type in [
            "application/json",
            "application/json; charset=utf-8",
            "application/x-proto3-json",
        ] {
            let server = Server::start().await;
            let context = format!("{route:?} {content_type}");
            // snake_case in (as the original framework's JSON), camelCase out.
            let (status, reply, echoed) = post_json(
                &server,
                route,
                "Heartbeat",
                content_type,
                json!({
                    "token": SERVANT_TOKEN, "next_heartbeat_in_ms": 10000, "version": 1,
                    "location": "127.0.0.1:8335", "num_processors": 8, "capacity": 4,
                    "servant_priority": "SERVANT_PRIORITY_DEDICATED",
                    "env_descs": [{"compiler_digest": DIGEST}],
                    "totalMemoryInBytes": "0", "memory_available_in_bytes": 0
                }),
            )
            .await;
            assert_eq!(status, 200, "{context}: {reply}");
            assert_eq!(echoed, content_type.split(';').next().unwrap(), "{context}");
            assert_eq!(
                reply["acceptableTokens"].as_array().map(Vec::len),
                Some(3),
                "{context}"
            );

            let (status, reply, _) = post_json(
                &server,
                route,
                "GetConfig",
                content_type,
                json!({"token": USER_TOKEN}),
            )
            .await;
            assert_eq!(status, 200, "{context}");
            let token = reply["servingDaemonToken"].as_str().expect("token");
            assert!(reply["acceptableTokens"].is_null());
            assert_eq!(token.len(), 32, "128-bit hex token");

            let (status, reply, _) = post_json(&server, route, "WaitForStartingTask", content_type, json!({
                "token": USER_TOKEN, "millisecondsToWait": 1000, "envDesc": {"compilerDigest": DIGEST},
                "immediateReqs": 1, "prefetchReqs": 1, "nextKeepAliveInMs": 15000
            })).await;
            assert_eq!(status, 200, "{context}: {reply}");
            let grants = reply["grants"].as_array().expect("grants");
            assert_eq!(grants.len(), 2, "{context}");
            let ids: Vec<String> = grants
                .iter()
                .map(|grant| {
                    grant["taskGrantId"]
                        .as_str()
                        .expect("64-bit ids are strings")
                        .to_owned()
                })
                .collect();
            assert_eq!(grants[0]["servantLocation"], "127.0.0.1:8335");

            // 64-bit ids are accepted as strings and as numbers.
            let as_number: u64 = ids[1].parse().unwrap();
            let (status, reply, _) = post_json(&server, route, "KeepTaskAlive", content_type, json!({
                "token": USER_TOKEN, "taskGrantIds": [ids[0], as_number, "42"], "nextKeepAliveInMs": 10000
            })).await;
            assert_eq!(status, 200, "{context}: {reply}");
            // 42 was never granted: still `true`, as the server started
            // less than its adoption window ago (an early renewal, see docs/differences.md).
            assert_eq!(reply["statuses"], json!([true, true, true]), "{context}");

            let (status, reply, _) =
                post_json(&server, route, "GetRunningTasks", content_type, json!({})).await;
            assert_eq!(status, 200, "{context}");
            assert_eq!(reply, json!({}), "no servant reported a task yet");

            let (status, reply, _) = post_json(
                &server,
                route,
                "FreeTask",
                content_type,
                json!({"token": USER_TOKEN, "taskGrantIds": ids}),
            )
            .await;
            assert_eq!((status, reply), (200, json!({})), "{context}");
            assert_eq!(server.engine.snapshot().totals.grants, 0, "{context}");
            server.stop().await;
        }
    }
}

#[tokio::test]
async fn every_rpc_works_in_binary_on_both_route_styles() {
    for route in [Route::HttpPb, Route::Connect] {
        for content_type in [
            "application/x-protobuf",
            "application/protobuf",
            "application/proto",
            "application/octet-stream",
        ] {
            let server = Server::start().await;
            let context = format!("{route:?} {content_type}");
            let (status, reply, echoed): (_, pb::HeartbeatResponse, _) = post_binary(
                &server,
                route,
                "Heartbeat",
                content_type,
                &heartbeat("127.0.0.1:8335", 4),
            )
            .await;
            assert_eq!((status, echoed.as_str()), (200, content_type), "{context}");
            assert_eq!(reply.acceptable_tokens.len(), 3);

            let (status, config, _): (_, pb::GetConfigResponse, _) = post_binary(
                &server,
                route,
                "GetConfig",
                content_type,
                &pb::GetConfigRequest {
                    token: USER_TOKEN.into(),
                },
            )
            .await;
            assert_eq!(status, 200);
            assert!(
                reply
                    .acceptable_tokens
                    .contains(&config.serving_daemon_token),
                "the active token is acceptable"
            );

            let (status, granted, _): (_, pb::WaitForStartingTaskResponse, _) = post_binary(
                &server,
                route,
                "WaitForStartingTask",
                content_type,
                &wait_request(1000, 1, 0),
            )
            .await;
            assert_eq!((status, granted.grants.len()), (200, 1), "{context}");
            let id = granted.grants[0].task_grant_id;

            let (status, renewed, _): (_, pb::KeepTaskAliveResponse, _) = post_binary(
                &server,
                route,
                "KeepTaskAlive",
                content_type,
                &pb::KeepTaskAliveRequest {
                    token: USER_TOKEN.into(),
                    task_grant_ids: vec![id],
                    next_keep_alive_in_ms: 10_000,
                },
            )
            .await;
            assert_eq!((status, renewed.statuses), (200, vec![true]));

            let (status, _, _): (_, pb::GetRunningTasksResponse, _) = post_binary(
                &server,
                route,
                "GetRunningTasks",
                content_type,
                &pb::GetRunningTasksRequest {},
            )
            .await;
            assert_eq!(status, 200);

            let (status, _, _): (_, pb::FreeTaskResponse, _) = post_binary(
                &server,
                route,
                "FreeTask",
                content_type,
                &pb::FreeTaskRequest {
                    token: USER_TOKEN.into(),
                    task_grant_ids: vec![id],
                },
            )
            .await;
            assert_eq!(status, 200);
            assert_eq!(server.engine.snapshot().totals.grants, 0, "{context}");
            server.stop().await;
        }
    }
}

#[tokio::test]
async fn connect_errors_carry_code_and_message_in_the_body() {
    let server = Server::start().await;
    let (status, body, content_type) = post_json(
        &server,
        Route::Connect,
        "GetConfig",
        "application/json",
        json!({"token": "nope"}),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(content_type, "application/json");
    assert_eq!(body["code"], "permission_denied");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|message| !message.is_empty())
    );
    assert_eq!(body["rpcErrorCode"], 1003);
    assert_eq!(body["status"], "STATUS_ACCESS_DENIED");
    server.stop().await;
}

#[tokio::test]
async fn unknown_json_fields_are_ignored_and_nulls_of_messages_accepted() {
    let server = Server::start().await;
    let (status, body, _) = post_json(
        &server,
        Route::HttpPb,
        "GetConfig",
        "application/json",
        json!({"token": USER_TOKEN, "someFutureField": {"x": 1}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // `null` for lists of messages: their default, the empty list.
    let (status, body, _) = post_json(
        &server,
        Route::HttpPb,
        "Heartbeat",
        "application/json",
        json!({
            "token": SERVANT_TOKEN,
            "location": "127.0.0.1:8335",
            "nextHeartbeatInMs": 10000,
            "capacity": 2,
            "envDescs": null,
            "runningTasks": null,
        }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let snapshot = server.engine.snapshot();
    assert_eq!(snapshot.totals.servants_up, 1);
    assert!(snapshot.servants[0].environments.is_empty());

    // `null` for a message: decoded as absent, so the call gets past the
    // decoder (which would answer code 5) to the scheduler, which answers
    // with one of its own statuses (a missing environment).
    let (_, body, _) = post_json(
        &server,
        Route::HttpPb,
        "WaitForStartingTask",
        "application/json",
        json!({"token": USER_TOKEN, "envDesc": null, "immediateReqs": 1}),
    )
    .await;
    assert!(
        body["rpcErrorCode"]
            .as_u64()
            .is_some_and(|code| code >= 1000),
        "{body}"
    );
    server.stop().await;
}

/// Every JSON body the server sends ends with a newline: an answer, an
/// error and the inspection pages, so `curl` leaves the prompt on a line of
/// its own.
#[tokio::test]
async fn every_json_answer_ends_with_a_newline() {
    let server = Server::start_inspectable().await;
    let answered = post(
        &server,
        Route::HttpPb,
        "GetConfig",
        "application/json",
        json!({"token": USER_TOKEN}).to_string().into_bytes(),
    )
    .await;
    let refused = post(
        &server,
        Route::Connect,
        "GetConfig",
        "application/json",
        json!({"token": "not-a-token"}).to_string().into_bytes(),
    )
    .await;
    let malformed = post(
        &server,
        Route::HttpPb,
        "GetConfig",
        "application/json",
        b"{".to_vec(),
    )
    .await;
    assert_eq!(answered.0, 200);
    assert_ne!(refused.0, 200);
    assert_eq!(malformed.0, 400);
    let mut bodies = vec![
        ("an answer", answered.2),
        ("a refusal", refused.2),
        ("a malformed body", malformed.2),
    ];
    for page in [
        "/api/v1/overview",
        "/api/v1/history",
        "/api/v1/tenants",
        "/inspect/vars",
    ] {
        let response = http_client()
            .get(server.url(page))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 200, "{page}");
        bodies.push((page, response.bytes().await.expect("body")));
    }
    for (what, body) in bodies {
        let text = String::from_utf8_lossy(&body);
        assert!(text.ends_with("}\n"), "{what}: {text:?}");
        serde_json::from_slice::<Value>(&body).unwrap_or_else(|error| panic!("{what}: {error}"));
    }
}
