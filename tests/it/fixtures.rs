//! Setups that several topics share (the server itself and its clients are
//! in `support`).

use std::time::Duration;

use tokio::time::Instant;
use yadcc_pb as pb;

use crate::support::*;

/// Registers a servant with a single slot on 127.0.0.1:8335 and takes that
/// slot, so the next `WaitForStartingTask` queues. `daemon_version` is the
/// servant's: a server with a version floor refuses older daemons.
pub async fn take_the_only_slot(server: &Server, daemon_version: u32) {
    let beat = pb::HeartbeatRequest {
        version: daemon_version,
        ..heartbeat(&servant_location("127.0.0.1", 8335), 1)
    };
    let registered = call_http_pb(server.addr, Method::Heartbeat, &beat).await;
    assert_eq!(
        registered.status,
        200,
        "{:?}",
        registered.header("rpc-error-reason")
    );
    let taken = acquire(server, 1, 0).await;
    assert_eq!(taken.grants.len(), 1, "the only slot is taken");
}

/// A server with default settings whose single slot is taken.
pub async fn saturated_server() -> Server {
    let server = Server::start().await;
    take_the_only_slot(&server, 1).await;
    server
}

/// Polls `condition` until it holds or `STEP` passes.
pub async fn eventually(condition: impl FnMut() -> bool) -> bool {
    eventually_within(STEP, condition).await
}

/// Polls `condition` until it holds or `limit` passes.
pub async fn eventually_within(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    condition()
}
