//! Long polls: they block nobody else, leave cleanly when the client goes,
//! and are answered when the server shuts down.

use std::time::Duration;

use prost::Message;
use tokio::time::Instant;
use yadcc_pb as pb;

use crate::{
    fixtures::{eventually, saturated_server},
    support::*,
};

/// Starts a long `WaitForStartingTask` on its own connection and returns
/// once the engine has queued it.
async fn queue_a_wait(server: &Server) -> Connection {
    let mut waiting = Connection::open(server.addr).await;
    waiting
        .send(&daemon_request(
            Method::WaitForStartingTask,
            1,
            &wait_request(8000, 1, 0).encode_to_vec(),
            None,
        ))
        .await;
    assert!(eventually(|| server.engine.snapshot().totals.waiters == 1).await);
    waiting
}

#[tokio::test]
async fn a_long_poll_does_not_block_other_connections() {
    let server = saturated_server().await;
    let _waiting = queue_a_wait(&server).await;

    let started = Instant::now();
    let config = call_http_pb(
        server.addr,
        Method::GetConfig,
        &pb::GetConfigRequest {
            token: USER_TOKEN.into(),
        },
    )
    .await;
    assert_eq!(config.status, 200);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "served while another call waits (8 s): {:?}",
        started.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_freed_slot_goes_to_the_waiting_call() {
    let server = Server::start().await;
    register_servant(&server, 8335, 1).await;
    let first: pb::WaitForStartingTaskResponse = call_http_pb(
        server.addr,
        Method::WaitForStartingTask,
        &wait_request(0, 1, 0),
    )
    .await
    .decode();
    let mut waiting = queue_a_wait(&server).await;
    let freed = call_http_pb(
        server.addr,
        Method::FreeTask,
        &pb::FreeTaskRequest {
            token: USER_TOKEN.into(),
            task_grant_ids: vec![first.grants[0].task_grant_id],
        },
    )
    .await;
    assert_eq!(freed.status, 200);
    let response = waiting.read_response().await;
    assert_eq!(response.status, 200);
    let second: pb::WaitForStartingTaskResponse = response.decode();
    assert_eq!(second.grants.len(), 1);
    assert_ne!(
        second.grants[0].task_grant_id,
        first.grants[0].task_grant_id
    );
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_disconnects_leaves_the_queue_without_leaking_a_grant() {
    let server = saturated_server().await;
    let waiting = queue_a_wait(&server).await;
    drop(waiting);
    assert!(
        eventually(|| server.engine.snapshot().totals.waiters == 0).await,
        "the abandoned wait left the queue"
    );
    assert_eq!(
        server.engine.snapshot().totals.grants,
        1,
        "no grant was made for the gone client"
    );
    server.stop().await;
}

#[tokio::test]
async fn rpc_timeout_shortens_a_long_poll_to_a_no_quota_answer_in_time() {
    let server = saturated_server().await;
    let started = Instant::now();
    let mut connection = Connection::open(server.addr).await;
    connection
        .send(&daemon_request(
            Method::WaitForStartingTask,
            5,
            &wait_request(8000, 1, 0).encode_to_vec(),
            Some(300),
        ))
        .await;
    let response = connection.read_response().await;
    assert_eq!(response.status, 429);
    assert_eq!(response.header("rpc-error-code"), Some("1001"));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "answered near the caller's 300 ms deadline, well before the 8 s wait: {:?}",
        started.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn shutdown_answers_waiting_calls() {
    let server = saturated_server().await;
    let mut waiting = queue_a_wait(&server).await;
    let started = Instant::now();
    let stopping = tokio::spawn(server.stop());
    let response = waiting.read_response().await;
    assert_eq!(
        response.status, 429,
        "answered with no quota rather than cut off"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(waiting);
    stopping.await.expect("server drained");
}
