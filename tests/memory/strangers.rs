//! Issue 29's attacks by strangers (clients that never completed a call
//! with a valid token) on the real binary: connections that do nothing
//! useful, a flood that fills the connection table, and echoes of huge
//! values. A legitimate daemon from another address is served throughout.

use std::time::{Duration, Instant};

use prost::Message;
use tokio::{io::AsyncWriteExt, task::JoinSet};
use yadcc_pb as pb;
use yadcc_sim::{
    client::{SerialConn, connect},
    wire::{self, Wire},
};

use crate::{
    cluster::{ATTACKER, LEGITIMATE, ip},
    legitimate::Legitimate,
    support::{
        Binary, Connection, Method, SERVICE, USER_TOKEN, closed_within, flare_frame,
        flare_request_uncompressed, heartbeat, heavy, http_client, servant_location,
    },
};

/// The HTTP/2 client preface and an empty SETTINGS frame: a connection
/// that says "HTTP/2" and then nothing.
const H2_PREFACE_AND_SETTINGS: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// A flare frame the server reads and drops: a response's meta, no
/// `request_meta`.
fn dropped_frame(id: u64) -> Vec<u8> {
    let meta = pb::flare::rpc::RpcMeta {
        request_meta: None,
        ..wire::daemon_request_meta(id, format!("{SERVICE}.GetConfig"), Duration::from_secs(2))
    };
    flare_frame(&meta, &[], &[])
}

#[tokio::test]
async fn connections_that_do_nothing_useful_are_closed_while_a_daemon_is_served() {
    let _alone = heavy().await;
    let header_read_timeout = Duration::from_secs(1);
    let binary = tokio::task::spawn_blocking(|| Binary::start(&["--header_read_timeout=1s"], None))
        .await
        .expect("start the binary");
    let mut daemon = Legitimate::Flare.connect(binary.addr).await;
    daemon.call().await.expect("a heartbeat before");

    let mut closing = JoinSet::new();
    for index in 0..300 {
        let mut stream = connect(Some(ip(ATTACKER)), binary.addr)
            .await
            .expect("connect");
        let (what, bytes) = if index % 10 == 0 {
            // A burst of frames the server drops: closed at once, before
            // any timeout.
            let burst: Vec<u8> = (0..10).flat_map(dropped_frame).collect();
            ("dropped frames", burst)
        } else {
            ("an HTTP/2 preface", H2_PREFACE_AND_SETTINGS.to_vec())
        };
        stream.write_all(&bytes).await.expect("write");
        closing.spawn(async move { (what, closed_within(stream, Duration::from_secs(8)).await) });
    }
    let started = Instant::now();
    let mut worst = Duration::ZERO;
    while started.elapsed() < header_read_timeout * 2 {
        let sent = Instant::now();
        daemon.call().await.expect("the daemon is served meanwhile");
        worst = worst.max(sent.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut latest = Duration::ZERO;
    while let Some(closed) = closing.join_next().await {
        let (what, closed) = closed.expect("a watcher");
        let after = closed.unwrap_or_else(|| panic!("{what}: still open after 8 s"));
        if what == "dropped frames" {
            assert!(
                after < header_read_timeout,
                "{what}: closed after {after:?}"
            );
        }
        latest = latest.max(after);
    }
    println!(
        "strangers: 270 HTTP/2 prefaces and 30 bursts of dropped frames all closed within {} ms; \
         the daemon's worst heartbeat {} ms",
        latest.as_millis(),
        worst.as_millis()
    );
    assert!(worst < Duration::from_secs(1), "worst heartbeat {worst:?}");
}

#[tokio::test]
async fn strangers_cannot_fill_the_connection_table() {
    let _alone = heavy().await;
    // 200 places, 100 per address: three attacking addresses want 300.
    let binary = tokio::task::spawn_blocking(|| Binary::start(&["--max_connections=200"], None))
        .await
        .expect("start the binary");
    let mut proved = Legitimate::Flare.connect(binary.addr).await;
    proved.call().await.expect("the daemon proves its token");

    let running_tasks = flare_request_uncompressed(1, Method::GetRunningTasks, 2000, &[]);
    let mut strangers = Vec::new();
    let mut served = 0;
    for attacker in [ATTACKER, "127.0.0.3", "127.0.0.4"] {
        for _ in 0..100 {
            let Ok(mut connection) =
                SerialConn::connect(Some(ip(attacker)), binary.addr, Wire::Flare).await
            else {
                continue;
            };
            // An open call, no token: the connection proves nothing.
            if connection.exchange(&running_tasks).await.is_ok() {
                served += 1;
            }
            strangers.push(connection);
        }
    }
    // A daemon arriving now, and the one that proved its token before, are
    // both served.
    let sent = Instant::now();
    let mut newcomer = Legitimate::Flare.connect(binary.addr).await;
    newcomer
        .call()
        .await
        .expect("a new daemon is admitted, not refused");
    let newcomer_latency = sent.elapsed();
    for _ in 0..5 {
        proved
            .call()
            .await
            .expect("a proved connection is never evicted");
    }
    println!(
        "strangers: 300 stranger connections on a 200-place table ({served} served a call); \
         a new daemon answered in {} ms, the proved one kept",
        newcomer_latency.as_millis()
    );
    assert!(served >= 200, "strangers were admitted too: {served}");
    assert!(newcomer_latency < Duration::from_secs(1));
    drop(strangers);
}

#[tokio::test]
async fn a_clients_huge_values_come_back_cut() {
    let _alone = heavy().await;
    let binary = tokio::task::spawn_blocking(|| Binary::start(&[], None))
        .await
        .expect("start the binary");
    let huge_location = format!("{}:8335", "1".repeat(3_000_000));
    let request = pb::HeartbeatRequest {
        location: huge_location.clone(),
        ..heartbeat(&servant_location(LEGITIMATE, 8335), 8)
    }
    .encode_to_vec();
    let response = http_client()
        .post(format!("http://{}/rpc/{SERVICE}.Heartbeat", binary.addr))
        .header("content-type", "application/x-protobuf")
        .body(request.clone())
        .send()
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    let reason = response
        .headers()
        .get("rpc-error-reason")
        .map(|value| value.len())
        .unwrap_or_default();
    let body = response.bytes().await.expect("the body");
    assert_eq!(
        status,
        400,
        "{:?}",
        String::from_utf8_lossy(&body[..body.len().min(300)])
    );
    assert!(
        reason > 0 && reason <= 1024,
        "rpc-error-reason of {reason} bytes"
    );
    assert!(body.len() <= 2048, "a body of {} bytes", body.len());
    assert!(
        String::from_utf8_lossy(&body).contains("(3000005 bytes)"),
        "the cut value says its length"
    );

    // The same location and a 100 KB method name over flare.
    let mut flare = Connection::open_from(binary.addr, Some(ip(LEGITIMATE))).await;
    flare
        .send(&flare_request_uncompressed(
            1,
            Method::Heartbeat,
            2000,
            &request,
        ))
        .await;
    let answer = flare.read_flare().await;
    assert_ne!(answer.status(), 0);
    assert!(
        answer.frame.len() <= 2048,
        "a {}-byte answer",
        answer.frame.len()
    );
    let meta = wire::daemon_request_meta(
        2,
        format!("{SERVICE}.{}", "X".repeat(100_000)),
        Duration::from_secs(2),
    );
    let config = pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    }
    .encode_to_vec();
    flare.send(&flare_frame(&meta, &config, &[])).await;
    let answer = flare.read_flare().await;
    assert!(
        answer.description().contains("(100033 bytes)"),
        "{}",
        answer.description()
    );
    assert!(
        answer.frame.len() <= 2048,
        "a {}-byte answer",
        answer.frame.len()
    );
}

#[tokio::test]
async fn partial_heads_from_one_address_hold_no_more_than_its_share_of_connection_buffers() {
    // Held for 30 s unless the budget closes them first.
    let flags = vec!["--header_read_timeout=30s".to_owned()];
    partial_payloads_from_one_address(flags, crate::attacks::partial_head(), "heads").await;
}

/// 400 connections from one address, each sending `payload` (64,000 bytes
/// of something unfinished) to a scheduler started with `flags`: at most
/// the address's share of the connection buffers stays held, the rest are
/// closed within 5 s, and a daemon on another address is served meanwhile.
async fn partial_payloads_from_one_address(flags: Vec<String>, payload: Vec<u8>, what: &str) {
    let _alone = heavy().await;
    let binary = tokio::task::spawn_blocking(move || {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Binary::start(&flags, None)
    })
    .await
    .expect("start the binary");
    let rss_before = binary.rss_kib();
    let mut watching = JoinSet::new();
    for _ in 0..400 {
        let mut stream = connect(Some(ip(ATTACKER)), binary.addr)
            .await
            .expect("connect");
        if stream.write_all(&payload).await.is_err() {
            continue;
        }
        watching.spawn(closed_within(stream, Duration::from_secs(5)));
    }
    // A daemon on another address is served meanwhile, on a new connection
    // (plaintext flare, on the same port when TLS is on).
    let mut daemon = Legitimate::Flare.connect(binary.addr).await;
    daemon
        .call()
        .await
        .unwrap_or_else(|error| panic!("a heartbeat beside the partial {what}: {error}"));
    let grown_mib = binary.rss_kib().saturating_sub(rss_before) / 1024;
    let mut closed = 0;
    while let Some(watched) = watching.join_next().await {
        closed += usize::from(watched.expect("a watcher").is_some());
    }
    println!(
        "strangers: 400 partial 64 KB {what} from one address: {closed} closed within 5 s, \
         the server grew by {grown_mib} MiB"
    );
    // An address's share is an eighth of the 128 MiB budget: about 16 MiB,
    // some 120 payloads of 64 KB charged twice. A handshake's bytes are
    // charged to the connection until its first request, as a head's are.
    let share = yadcc_scheduler::edge::CONNECTION_BUFFERS_BYTES
        / yadcc_scheduler::edge::buffers::BUFFERS_ADDRESS_SHARE_DIVISOR;
    let held = 400 - closed;
    assert!(
        held * 64_000 <= share,
        "{held} partial {what} held, over the address's share"
    );
    assert!(closed >= 200, "only {closed} closed");
}

/// A self-signed certificate and key in a directory of the test's own.
pub fn tls_files(test: &str) -> (std::path::PathBuf, Vec<String>) {
    let dir = std::env::temp_dir().join(format!("yadcc-memory-tls-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory");
    let key = rcgen::KeyPair::generate().expect("a key");
    let certificate = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .and_then(|params| params.self_signed(&key))
        .expect("a certificate");
    std::fs::write(dir.join("cert.pem"), certificate.pem()).expect("cert.pem");
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).expect("key.pem");
    let flags = vec![
        format!("--tls_cert_file={}", dir.join("cert.pem").display()),
        format!("--tls_key_file={}", dir.join("key.pem").display()),
        "--header_read_timeout=30s".to_owned(),
    ];
    (dir, flags)
}

#[tokio::test]
async fn partial_tls_handshakes_from_one_address_hold_no_more_than_its_share_of_connection_buffers()
{
    let (dir, flags) = tls_files("one-address");
    let hello = crate::attacks::partial_client_hello();
    partial_payloads_from_one_address(flags, hello, "TLS ClientHellos").await;
    let _ = std::fs::remove_dir_all(&dir);
}
