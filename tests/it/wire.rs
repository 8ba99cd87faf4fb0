//! The `http+pb` wire rules the yadcc daemons depend on, written byte for
//! byte as their framework's client writes them.

use bytes::BytesMut;
use prost::Message;
use yadcc_engine as engine;
use yadcc_pb as pb;
use yadcc_scheduler::rpc::state::TransportSettings;
use yadcc_sim::wire;

use crate::support::*;

#[tokio::test]
async fn original_client_request_without_host_gets_length_seq_no_and_protobuf() {
    let server = Server::start().await;
    let mut connection = Connection::open(server.addr).await;
    let body = heartbeat(&servant_location("127.0.0.1", 8335), 8).encode_to_vec();
    connection
        .send(&daemon_request(Method::Heartbeat, 17, &body, Some(10000)))
        .await;
    let response = connection.read_response().await;

    assert_eq!(response.status, 200);
    assert_eq!(response.header("rpc-seqno"), Some("17"));
    assert_eq!(
        response.header("content-type"),
        Some("application/x-protobuf")
    );
    assert_eq!(
        response.header("content-length"),
        Some(response.body.len().to_string().as_str())
    );
    let reply: pb::HeartbeatResponse = response.decode();
    assert_eq!(
        reply.acceptable_tokens.len(),
        3,
        "expiring, active and next token"
    );
    assert!(reply.expired_tasks.is_empty());
    server.stop().await;
}

#[tokio::test]
async fn pipelined_requests_on_one_connection_are_each_answered_with_their_seq_no() {
    let server = Server::start().await;
    let mut connection = Connection::open(server.addr).await;
    let config = pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    };
    let denied = pb::GetConfigRequest {
        token: "wrong".into(),
    };
    let heartbeat = heartbeat(&servant_location("127.0.0.1", 8335), 8);
    let mut burst = daemon_request(Method::GetConfig, 1, &config.encode_to_vec(), None);
    burst.extend(daemon_request(
        Method::Heartbeat,
        2,
        &heartbeat.encode_to_vec(),
        None,
    ));
    burst.extend(daemon_request(
        Method::GetConfig,
        3,
        &denied.encode_to_vec(),
        None,
    ));
    burst.extend(daemon_request(
        Method::GetConfig,
        4,
        &config.encode_to_vec(),
        None,
    ));
    connection.send(&burst).await;

    let mut seen = Vec::new();
    for _ in 0..4 {
        let response = connection.read_response().await;
        seen.push((
            response.header("rpc-seqno").unwrap_or_default().to_owned(),
            response.status,
        ));
    }
    // Answers go out as calls finish, matched by Rpc-SeqNo, not by order.
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("1".to_owned(), 200),
            ("2".to_owned(), 200),
            ("3".to_owned(), 403),
            ("4".to_owned(), 200)
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn failures_are_non_200_with_rpc_error_code_and_a_one_line_reason() {
    let server = Server::start().await;
    let denied = call_http_pb(
        server.addr,
        Method::GetConfig,
        &pb::GetConfigRequest {
            token: "wrong".into(),
        },
    )
    .await;
    assert_eq!(denied.status, 403);
    assert_eq!(denied.header("rpc-error-code"), Some("1003"));
    let reason = denied.header("rpc-error-reason").expect("a reason");
    assert!(!reason.is_empty() && !reason.contains('\r') && !reason.contains('\n'));
    assert!(
        !reason.contains("wrong"),
        "tokens never echo back: {reason}"
    );

    // A method the service does not have (the daemons' NotifyTaskStart).
    let mut connection = Connection::open(server.addr).await;
    let path = format!("/rpc/{SERVICE}.NotifyTaskStart");
    let mut request = BytesMut::new();
    wire::encode_http_pb(&mut request, &path, 1, None, &[]);
    connection.send(&request).await;
    let unknown_method = connection.read_response().await;
    assert_eq!(unknown_method.status, 404);
    assert_eq!(unknown_method.header("rpc-error-code"), Some("10"));
    server.stop().await;
}

#[tokio::test]
async fn the_full_lifecycle_works_over_binary_http_pb() {
    // As long after start: unknown ids are neither adopted nor renewed early.
    let server = Server::start_with(
        engine::Config {
            adoption_window: std::time::Duration::ZERO,
            ..engine_config()
        },
        TransportSettings::default(),
        "127.0.0.1:0",
    )
    .await;
    register_servant(&server, 8335, 4).await;

    let granted = acquire(&server, 2, 1).await;
    assert_eq!(granted.grants.len(), 3, "two immediate and one prefetch");
    let ids: Vec<u64> = granted
        .grants
        .iter()
        .map(|grant| grant.task_grant_id)
        .collect();
    assert!(ids.iter().all(|id| *id != 0), "grant ids are never 0");
    assert!(
        granted
            .grants
            .iter()
            .all(|grant| grant.servant_location == "127.0.0.1:8335")
    );

    let mut servant = heartbeat(&servant_location("127.0.0.1", 8335), 4);
    servant.running_tasks = vec![pb::RunningTask {
        servant_task_id: 1,
        task_grant_id: ids[0],
        servant_location: "127.0.0.1:8335".into(),
        task_digest: "task-a".into(),
    }];
    let reply: pb::HeartbeatResponse = call_http_pb(server.addr, Method::Heartbeat, &servant)
        .await
        .decode();
    assert!(
        reply.expired_tasks.is_empty(),
        "a granted task is not expired"
    );

    let running: pb::GetRunningTasksResponse = call_http_pb(
        server.addr,
        Method::GetRunningTasks,
        &pb::GetRunningTasksRequest {},
    )
    .await
    .decode();
    assert_eq!(running.running_tasks.len(), 1);
    assert_eq!(running.running_tasks[0].servant_task_id, 1);
    assert_eq!(running.running_tasks[0].task_digest, "task-a");
    assert_eq!(running.running_tasks[0].servant_location, "127.0.0.1:8335");
    assert_eq!(
        running.running_tasks[0].task_grant_id, 0,
        "grant ids stay out of the open RPC"
    );

    let renewed: pb::KeepTaskAliveResponse = call_http_pb(
        server.addr,
        Method::KeepTaskAlive,
        &pb::KeepTaskAliveRequest {
            token: USER_TOKEN.into(),
            task_grant_ids: vec![ids[0], 12345, ids[1]],
            next_keep_alive_in_ms: 10_000,
        },
    )
    .await
    .decode();
    assert_eq!(renewed.statuses, vec![true, false, true]);

    let freed = call_http_pb(
        server.addr,
        Method::FreeTask,
        &pb::FreeTaskRequest {
            token: USER_TOKEN.into(),
            task_grant_ids: ids.clone(),
        },
    )
    .await;
    assert_eq!(freed.status, 200);
    assert!(freed.body.is_empty(), "FreeTaskResponse has no fields");

    let after_free: pb::KeepTaskAliveResponse = call_http_pb(
        server.addr,
        Method::KeepTaskAlive,
        &pb::KeepTaskAliveRequest {
            token: USER_TOKEN.into(),
            task_grant_ids: ids,
            next_keep_alive_in_ms: 10_000,
        },
    )
    .await
    .decode();
    assert_eq!(after_free.statuses, vec![false, false, false]);
    server.stop().await;
}

#[tokio::test]
async fn self_avoidance_and_nat_use_the_observed_socket_address() {
    let server = Server::start().await;
    // Two machines: 127.0.0.2 and 127.0.0.3, each reporting its own address.
    heartbeat_from(&server, "127.0.0.2", "127.0.0.2:8335", 4).await;
    heartbeat_from(&server, "127.0.0.3", "127.0.0.3:8335", 4).await;
    // A machine behind NAT: it reports an address the scheduler does not see.
    heartbeat_from(&server, "127.0.0.4", "10.20.30.40:8335", 4).await;

    // The delegate on 127.0.0.2 is sent to the other machine.
    let mut delegate = Connection::open_from(server.addr, Some("127.0.0.2".parse().unwrap())).await;
    let body = wait_request(1000, 1, 0).encode_to_vec();
    delegate
        .send(&daemon_request(Method::WaitForStartingTask, 1, &body, None))
        .await;
    let granted: pb::WaitForStartingTaskResponse = delegate.read_response().await.decode();
    assert_eq!(granted.grants.len(), 1);
    assert_eq!(granted.grants[0].servant_location, "127.0.0.3:8335");

    let snapshot = server.engine.snapshot();
    let natted = snapshot
        .servants
        .iter()
        .find(|servant| servant.observed_location.ip().to_string() == "127.0.0.4")
        .expect("the NAT servant is listed");
    assert_eq!(natted.max_tasks, 0);
    assert_eq!(
        natted.not_accepting_reason,
        Some(yadcc_engine::NotAcceptingReason::BehindNat)
    );
    server.stop().await;
}

#[tokio::test]
async fn ipv6_servants_and_delegates_work() {
    let Ok(probe) = std::net::TcpListener::bind("[::1]:0") else {
        panic!("this machine has no IPv6 loopback; the gateway must work on IPv6");
    };
    drop(probe);
    let server = Server::start_with(engine_config(), Default::default(), "[::1]:0").await;
    let reply = call_http_pb(server.addr, Method::Heartbeat, &heartbeat("[::1]:8335", 2)).await;
    assert_eq!(reply.status, 200);
    let granted: pb::WaitForStartingTaskResponse = call_http_pb(
        server.addr,
        Method::WaitForStartingTask,
        &wait_request(1000, 1, 0),
    )
    .await
    .decode();
    assert_eq!(granted.grants[0].servant_location, "[::1]:8335");
    assert_eq!(server.engine.snapshot().servants[0].max_tasks, 2, "not NAT");
    server.stop().await;
}

/// The daemon connection's rules are one loop's for both protocols: over
/// the cap of calls in flight an `http+pb` call is answered "overloaded" as
/// a flare call is, and its `Connection: close` is honoured (the server reads
/// nothing after it and closes once every call is answered).
#[tokio::test]
async fn over_the_in_flight_cap_http_pb_is_answered_overloaded_and_connection_close_holds() {
    use yadcc_scheduler::edge::MAX_CALLS_IN_FLIGHT_PER_CONNECTION;
    // Every long poll waits (none is refused for its requester's share), so
    // the calls in flight reach the cap.
    let mut config = engine_config();
    config.limits.max_waiters_per_requester = 2 * MAX_CALLS_IN_FLIGHT_PER_CONNECTION;
    let server = Server::start_with(config, TransportSettings::default(), "127.0.0.1:0").await;
    crate::fixtures::take_the_only_slot(&server, 1).await;
    let mut connection = Connection::open(server.addr).await;
    let wait = wait_request(1500, 1, 0).encode_to_vec();
    let waits = MAX_CALLS_IN_FLIGHT_PER_CONNECTION as u64;
    let mut burst = Vec::new();
    for seq_no in 0..waits {
        burst.extend(daemon_request(
            Method::WaitForStartingTask,
            seq_no,
            &wait,
            Some(5000),
        ));
    }
    // One more long poll, the last request of the connection.
    let last = daemon_request(Method::WaitForStartingTask, waits, &wait, Some(5000));
    let line_end = last.windows(2).position(|pair| pair == b"\r\n").unwrap() + 2;
    burst.extend(&last[..line_end]);
    burst.extend(b"Connection: close\r\n");
    burst.extend(&last[line_end..]);
    // Never read: nothing follows `Connection: close`.
    let config = pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    };
    burst.extend(daemon_request(
        Method::GetConfig,
        waits + 1,
        &config.encode_to_vec(),
        None,
    ));
    connection.send(&burst).await;

    let mut overloaded = Vec::new();
    let mut no_quota = 0;
    for _ in 0..=waits {
        let response = connection.read_response().await;
        match (response.status, response.header("rpc-error-code")) {
            (503, Some("11")) => overloaded.push(response.header("rpc-seqno").map(str::to_owned)),
            (429, Some("1001")) => no_quota += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(overloaded, vec![Some(waits.to_string())]);
    assert_eq!(no_quota, waits);
    connection.expect_closed().await;
    server.stop().await;
}

/// RFC 9112 (6.3): a `Content-Length` that is not one decimal number makes
/// the request's end unknowable, and a proxy that read another value would
/// take the rest for the next request (request smuggling). Such a request
/// is answered 400 and its connection closed, on the daemons' `http+pb` as
/// hyper does on every other connection. What follows (here a second,
/// smuggled request) is never read as a request.
async fn refused_and_closed_as_in_hyper(values: &[&str]) {
    let server = Server::start().await;
    // The daemons' connection (Rpc-SeqNo), then hyper's (a Host, no
    // Rpc-SeqNo) with the same head.
    for (path, first_header) in [("http+pb", "Rpc-SeqNo: 1"), ("hyper", "Host: x")] {
        let head = |length: &str| {
            format!("POST /rpc/{SERVICE}.GetConfig HTTP/1.1\r\n{first_header}\r\n{length}\r\n")
        };
        let lengths: String = values
            .iter()
            .map(|value| format!("Content-Length: {value}\r\n"))
            .collect();
        let request = head(&lengths) + "abc" + &head("Content-Length: 0\r\n");
        let mut connection = Connection::open(server.addr).await;
        let response = connection
            .read_response_while_sending(request.as_bytes())
            .await;
        assert_eq!(response.status, 400, "{values:?} on {path}");
        connection.expect_closed().await;
    }
    server.stop().await;
}

#[tokio::test]
async fn two_different_content_lengths_are_400_and_close() {
    refused_and_closed_as_in_hyper(&["3", "4"]).await;
}

#[tokio::test]
async fn a_content_length_list_of_different_values_is_400_and_closes() {
    refused_and_closed_as_in_hyper(&["3, 4"]).await;
}

#[tokio::test]
async fn a_content_length_with_a_plus_sign_is_400_and_closes() {
    refused_and_closed_as_in_hyper(&["+3"]).await;
}

#[tokio::test]
async fn a_content_length_with_a_minus_sign_is_400_and_closes() {
    refused_and_closed_as_in_hyper(&["-3"]).await;
}

#[tokio::test]
async fn a_content_length_with_a_letter_is_400_and_closes() {
    refused_and_closed_as_in_hyper(&["3a"]).await;
}

#[tokio::test]
async fn a_content_length_with_a_space_inside_is_400_and_closes() {
    refused_and_closed_as_in_hyper(&["3 4"]).await;
}

#[tokio::test]
async fn a_hexadecimal_content_length_is_400_and_closes() {
    refused_and_closed_as_in_hyper(&["0x3"]).await;
}

#[tokio::test]
async fn an_empty_content_length_is_400_and_closes() {
    refused_and_closed_as_in_hyper(&[""]).await;
}

#[tokio::test]
async fn a_content_length_past_64_bits_is_400_and_closes() {
    refused_and_closed_as_in_hyper(&["18446744073709551616"]).await;
}
