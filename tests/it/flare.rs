//! The daemons' binary protocol (`flare://`) over a real socket: the vectors
//! of flare-wire.md byte for byte, errors, bad frames, and calls on one
//! connection answered as each finishes.

use std::time::Duration;

use prost::Message;
use tokio::time::Instant;
use yadcc_engine as engine;
use yadcc_pb::{self as pb, flare::rpc::RpcMeta};
use yadcc_scheduler::rpc::state::TransportSettings;
use yadcc_sim::wire::{self, client_timeout};

use crate::{fixtures::saturated_server, support::*};

/// The Heartbeat request of flare-wire.md, as a stock daemon writes it.
const HEARTBEAT_VECTOR: &str = "
43 50 52 46 37 00 00 00 49 00 00 00 00 00 00 00
08 01 2a 31 12 2a 79 61 64 63 63 2e 73 63 68 65
64 75 6c 65 72 2e 53 63 68 65 64 75 6c 65 72 53
65 72 76 69 63 65 2e 48 65 61 72 74 62 65 61 74
20 d0 0f 30 3e 38 01 0a 11 31 39 32 2e 31 36 38
2e 31 2e 31 30 3a 38 33 33 35 18 04 20 02 32 12
0a 10 30 31 32 33 34 35 36 37 38 39 61 62 63 64
65 66 38 90 4e 50 08 58 14 6a 06 73 65 63 72 65
74 70 02 78 80 80 80 80 40 80 01 80 80 80 80 20";

/// The smallest success: an empty payload, correlation id 1.
const SMALLEST_SUCCESS: &str =
    "43 50 52 46 08 00 00 00 00 00 00 00 00 00 00 00 08 01 32 02 08 00 38 01";

/// Access denied (1003) exactly as the original sends it.
const ACCESS_DENIED: &str =
    "43 50 52 46 0b 00 00 00 00 00 00 00 00 00 00 00 08 01 32 05 08 eb 07 12 00 38 01";

fn hex(text: &str) -> Vec<u8> {
    text.split_whitespace()
        .map(|byte| u8::from_str_radix(byte, 16).expect("hex byte"))
        .collect()
}

/// A request meta of `full_method` as the daemons' framework writes it.
fn request_meta(id: u64, full_method: &str, timeout_ms: u64) -> RpcMeta {
    wire::daemon_request_meta(
        id,
        full_method.to_owned(),
        Duration::from_millis(timeout_ms),
    )
}

fn server_for_vectors() -> engine::Config {
    engine::Config {
        servant_tokens: engine::TokenSet::new(["secret"]),
        ..engine_config()
    }
}

#[tokio::test]
async fn the_documented_heartbeat_is_decoded_and_answered_in_the_documented_form() {
    let server = Server::start_with(
        server_for_vectors(),
        TransportSettings::default(),
        "127.0.0.1:0",
    )
    .await;
    let mut connection = Connection::open(server.addr).await;
    let request = hex(HEARTBEAT_VECTOR);
    assert_eq!(request.len(), 144);
    connection.send(&request).await;
    let answer = connection.read_flare().await;
    assert_eq!(answer.meta.correlation_id, 1);
    assert_eq!(answer.status(), 0);
    // Header, then exactly the meta bytes of the 55-byte vector, then the payload.
    let mut expected = hex("43 50 52 46 08 00 00 00");
    expected.extend_from_slice(&(answer.payload.len() as u32).to_le_bytes());
    expected.extend_from_slice(&hex("00 00 00 00 08 01 32 02 08 00 38 01"));
    expected.extend_from_slice(&answer.payload);
    assert_eq!(answer.frame, expected);
    let reply = pb::HeartbeatResponse::decode(answer.payload.clone()).expect("payload");
    assert!(
        !reply.acceptable_tokens.is_empty(),
        "the serving-daemon tokens"
    );
    assert!(reply.expired_tasks.is_empty());

    // Every field of the vector reached the engine.
    let snapshot = server.engine.snapshot();
    let servant = &snapshot.servants[0];
    assert_eq!(servant.reported_location.to_string(), "192.168.1.10:8335");
    assert_eq!(servant.version, 20);
    assert_eq!(servant.num_processors, 8);
    assert_eq!(servant.current_load, 2);
    assert_eq!(servant.total_memory, 16 << 30);
    assert_eq!(servant.memory_available, 8 << 30);
    assert_eq!(servant.environments, vec!["0123456789abcdef".to_owned()]);
    server.stop().await;
}

#[tokio::test]
async fn the_smallest_success_and_access_denied_are_byte_for_byte_the_originals() {
    let server = Server::start().await;
    let mut connection = Connection::open(server.addr).await;
    let free = pb::FreeTaskRequest {
        token: USER_TOKEN.into(),
        task_grant_ids: vec![],
    };
    assert_eq!(
        connection
            .flare_call(1, Method::FreeTask, &free)
            .await
            .frame,
        hex(SMALLEST_SUCCESS)
    );
    let denied = pb::FreeTaskRequest {
        token: "wrong".into(),
        task_grant_ids: vec![],
    };
    assert_eq!(
        connection
            .flare_call(1, Method::FreeTask, &denied)
            .await
            .frame,
        hex(ACCESS_DENIED)
    );
    // The connection is still usable after an error answer.
    assert_eq!(
        connection
            .flare_call(2, Method::FreeTask, &free)
            .await
            .status(),
        0
    );
    server.stop().await;
}

/// The meta bytes the original answers call 1 with, for a scheduler status
/// that carries `description`: correlation id, `response_meta` (status,
/// description), method type.
fn failure_meta(status: u16, description: &str) -> Vec<u8> {
    let mut status_varint = vec![(status as u8) | 0x80, (status >> 7) as u8];
    let mut response_meta = vec![0x08];
    response_meta.append(&mut status_varint);
    response_meta.extend([0x12, description.len() as u8]);
    response_meta.extend_from_slice(description.as_bytes());
    let mut meta = hex("08 01 32");
    meta.push(response_meta.len() as u8);
    meta.extend(response_meta);
    meta.extend(hex("38 01"));
    meta
}

/// `WaitForStartingTask`'s two outcomes the original describes: the frames
/// carry its words, byte for byte; other statuses stay without one.
#[tokio::test]
async fn no_quota_and_no_environment_carry_the_originals_descriptions() {
    let server = saturated_server().await;
    let mut connection = Connection::open(server.addr).await;
    let busy = wait_request(0, 1, 0);
    let nobody = pb::WaitForStartingTaskRequest {
        env_desc: Some(pb::EnvironmentDesc {
            compiler_digest: "nobody-offers-this".into(),
        }),
        ..wait_request(0, 1, 0)
    };
    for (request, status, description) in [
        (busy, 1001, "The compilation cloud is busy now."),
        (nobody, 1006, "No matched servant environment."),
    ] {
        let answer = connection
            .flare_call(1, Method::WaitForStartingTask, &request)
            .await;
        assert_eq!(answer.status(), status);
        assert_eq!(answer.description(), description);
        let meta = failure_meta(status as u16, description);
        let mut expected = hex("43 50 52 46");
        expected.extend((meta.len() as u32).to_le_bytes());
        expected.extend([0; 8]);
        expected.extend(meta);
        assert_eq!(answer.frame, expected, "{status}");
    }
    server.stop().await;
}

#[tokio::test]
async fn framework_errors_are_answered_and_the_connection_stays_usable() {
    let server = Server::start().await;
    let mut connection = Connection::open(server.addr).await;
    let config = pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    };

    let no_such_method = request_meta(7, &format!("{SERVICE}.NoSuchMethod"), 2000);
    connection
        .send(&flare_frame(&no_such_method, &config.encode_to_vec(), &[]))
        .await;
    let unknown = connection.read_flare().await;
    assert_eq!((unknown.meta.correlation_id, unknown.status()), (7, 10));
    assert_eq!(
        unknown.description(),
        format!("Method [{SERVICE}.NoSuchMethod] is not implemented.")
    );
    assert!(unknown.payload.is_empty());

    // The framework looks the whole name up: another service's method is an
    // unknown method too.
    let other_service = request_meta(8, "other.Service.GetConfig", 2000);
    connection
        .send(&flare_frame(&other_service, &config.encode_to_vec(), &[]))
        .await;
    let other = connection.read_flare().await;
    assert_eq!(other.status(), 10);
    assert_eq!(
        other.description(),
        "Method [other.Service.GetConfig] is not implemented."
    );

    connection
        .send(&flare_request(
            9,
            Method::GetConfig,
            2000,
            &[0x0a, 0x05, b'a'],
        ))
        .await;
    let unparsable = connection.read_flare().await;
    assert_eq!(
        (unparsable.meta.correlation_id, unparsable.status()),
        (9, 5)
    );

    // 0 is the framework's "unknown" compression: no algorithm to inflate
    // with (the algorithms it defines are tests/it/compression.rs').
    let unknown_compression = RpcMeta {
        compression_algorithm: Some(0),
        ..request_meta(10, &format!("{SERVICE}.GetConfig"), 2000)
    };
    connection
        .send(&flare_frame(
            &unknown_compression,
            &config.encode_to_vec(),
            &[],
        ))
        .await;
    let compressed = connection.read_flare().await;
    assert_eq!(
        (compressed.meta.correlation_id, compressed.status()),
        (10, 101)
    );

    // An attachment is consumed, not mistaken for the next frame.
    let with_attachment = request_meta(11, &format!("{SERVICE}.GetConfig"), 2000);
    connection
        .send(&flare_frame(
            &with_attachment,
            &config.encode_to_vec(),
            b"opaque bytes",
        ))
        .await;
    let answered = connection.read_flare().await;
    assert_eq!((answered.meta.correlation_id, answered.status()), (11, 0));
    let reply = pb::GetConfigResponse::decode(answered.payload.clone()).unwrap();
    assert!(!reply.serving_daemon_token.is_empty());
    server.stop().await;
}

/// The original's server drops a frame whose meta has no `request_meta`
/// ("Corrupted message") and reads on; so does this one.
#[tokio::test]
async fn a_frame_without_request_meta_is_dropped_and_the_connection_kept() {
    let server = Server::start().await;
    let mut connection = Connection::open(server.addr).await;
    let config = pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    };
    let no_request = RpcMeta {
        request_meta: None,
        ..request_meta(5, &format!("{SERVICE}.GetConfig"), 2000)
    };
    connection
        .send(&flare_frame(&no_request, &config.encode_to_vec(), b"att"))
        .await;
    let answered = connection.flare_call(6, Method::GetConfig, &config).await;
    assert_eq!(
        (answered.meta.correlation_id, answered.status()),
        (6, 0),
        "the dropped frame got no answer, the next call its own"
    );
    server.stop().await;
}

#[tokio::test]
async fn bad_magic_unparsable_meta_and_oversize_frames_close_the_connection() {
    let server = Server::start().await;

    // Bad magic after a good first frame (the first bytes chose the protocol).
    let mut connection = Connection::open(server.addr).await;
    let free = pb::FreeTaskRequest {
        token: USER_TOKEN.into(),
        task_grant_ids: vec![],
    };
    assert_eq!(
        connection
            .flare_call(1, Method::FreeTask, &free)
            .await
            .status(),
        0
    );
    connection
        .send(b"CPRX\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")
        .await;
    connection.expect_closed().await;

    // A meta that is not protobuf.
    let mut connection = Connection::open(server.addr).await;
    let mut frame = b"CPRF".to_vec();
    frame.extend_from_slice(&3u32.to_le_bytes());
    frame.extend_from_slice(&0u32.to_le_bytes());
    frame.extend_from_slice(&0u32.to_le_bytes());
    frame.extend_from_slice(&[0xff, 0xff, 0xff]);
    connection.send(&frame).await;
    connection.expect_closed().await;

    // Over 4 MiB announced: closed without waiting for the bytes.
    let mut connection = Connection::open(server.addr).await;
    let mut frame = b"CPRF".to_vec();
    frame.extend_from_slice(&16u32.to_le_bytes());
    frame.extend_from_slice(&((4 << 20) as u32).to_le_bytes());
    frame.extend_from_slice(&0u32.to_le_bytes());
    connection.send(&frame).await;
    connection.expect_closed().await;

    // Still serving everyone else.
    let mut connection = Connection::open(server.addr).await;
    assert_eq!(
        connection
            .flare_call(1, Method::FreeTask, &free)
            .await
            .status(),
        0
    );
    server.stop().await;
}

#[tokio::test]
async fn a_heartbeat_behind_a_long_poll_on_the_same_connection_is_answered_at_once() {
    let server = saturated_server().await;
    let mut connection = Connection::open(server.addr).await;
    let started = Instant::now();
    connection
        .send_flare_call(
            1,
            Method::WaitForStartingTask,
            10_000,
            &wait_request(3000, 1, 0),
        )
        .await;
    let heartbeat = heartbeat(&servant_location("127.0.0.1", 8335), 1);
    connection
        .send_flare_call(2, Method::Heartbeat, 2000, &heartbeat)
        .await;
    let first = connection.read_flare().await;
    assert_eq!((first.meta.correlation_id, first.status()), (2, 0));
    // Within a stock daemon's Heartbeat timeout, which the 3 s wait exceeds.
    assert!(
        started.elapsed() < client_timeout(Method::Heartbeat),
        "the heartbeat did not wait for the long poll: {:?}",
        started.elapsed()
    );
    // The long poll is still there, and answered "no quota" when its wait ends.
    let waited = connection.read_flare().await;
    assert_eq!((waited.meta.correlation_id, waited.status()), (1, 1001));
    assert!(started.elapsed() >= Duration::from_millis(2500));
    server.stop().await;
}

#[tokio::test]
async fn a_heartbeat_behind_a_long_poll_on_the_same_http_pb_connection_is_answered_at_once() {
    let server = saturated_server().await;
    let mut connection = Connection::open(server.addr).await;
    let started = Instant::now();
    let mut burst = daemon_request(
        Method::WaitForStartingTask,
        1,
        &wait_request(3000, 1, 0).encode_to_vec(),
        Some(10000),
    );
    let heartbeat = heartbeat(&servant_location("127.0.0.1", 8335), 1);
    burst.extend(daemon_request(
        Method::Heartbeat,
        2,
        &heartbeat.encode_to_vec(),
        Some(2000),
    ));
    connection.send(&burst).await;
    let first = connection.read_response().await;
    assert_eq!((first.header("rpc-seqno"), first.status), (Some("2"), 200));
    // Within a stock daemon's Heartbeat timeout, which the 3 s wait exceeds.
    assert!(
        started.elapsed() < client_timeout(Method::Heartbeat),
        "the heartbeat did not wait for the long poll: {:?}",
        started.elapsed()
    );
    let waited = connection.read_response().await;
    assert_eq!(waited.header("rpc-seqno"), Some("1"));
    assert_eq!(waited.header("rpc-error-code"), Some("1001"));
    server.stop().await;
}

#[tokio::test]
async fn the_meta_timeout_is_the_calls_deadline() {
    let server = saturated_server().await;
    let mut connection = Connection::open(server.addr).await;
    let started = Instant::now();
    connection
        .send_flare_call(
            3,
            Method::WaitForStartingTask,
            300,
            &wait_request(8000, 1, 0),
        )
        .await;
    let answer = connection.read_flare().await;
    assert_eq!((answer.meta.correlation_id, answer.status()), (3, 1001));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "answered near the caller's 300 ms timeout, well before the 8 s wait: {:?}",
        started.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn calls_over_the_in_flight_cap_are_answered_overloaded() {
    use yadcc_scheduler::edge::MAX_CALLS_IN_FLIGHT_PER_CONNECTION;
    let server = saturated_server().await;
    let mut connection = Connection::open(server.addr).await;
    let extra = 3;
    let total = MAX_CALLS_IN_FLIGHT_PER_CONNECTION + extra;
    let wait = wait_request(1500, 1, 0).encode_to_vec();
    let mut burst = Vec::new();
    for id in 0..total as u64 {
        burst.extend(flare_request(id, Method::WaitForStartingTask, 5000, &wait));
    }
    connection.send(&burst).await;
    let mut overloaded = Vec::new();
    let mut no_quota = 0;
    for _ in 0..total {
        let answer = connection.read_flare().await;
        match answer.status() {
            11 => overloaded.push(answer.meta.correlation_id),
            1001 => no_quota += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(overloaded.len(), extra, "{overloaded:?}");
    assert_eq!(no_quota, MAX_CALLS_IN_FLIGHT_PER_CONNECTION);
    server.stop().await;
}

#[tokio::test]
async fn shutdown_answers_a_waiting_flare_call_and_drains_its_connection() {
    let server = saturated_server().await;
    let mut connection = Connection::open(server.addr).await;
    connection
        .send_flare_call(
            4,
            Method::WaitForStartingTask,
            10_000,
            &wait_request(8000, 1, 0),
        )
        .await;
    let queued = Instant::now() + STEP;
    while server.engine.snapshot().totals.waiters == 0 {
        assert!(Instant::now() < queued, "the wait is queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let stopping = tokio::spawn(server.stop());
    let answer = connection.read_flare().await;
    assert_eq!((answer.meta.correlation_id, answer.status()), (4, 1001));
    connection.expect_closed().await;
    stopping.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "answered and drained at once, not after the 8 s wait: {:?}",
        started.elapsed()
    );
}
