//! The listener: accepts connections under the caps, reads each connection's
//! first bytes to decide its protocol, and serves it; stops gracefully.
//!
//! - `CPRF`: the daemons' binary protocol ([`crate::daemon::flare`]).
//! - An HTTP/1 request under `/rpc/` carrying `Rpc-SeqNo`: the daemons'
//!   `http+pb`, answered out of order ([`crate::daemon::http_pb`]).
//! - A TLS handshake (first byte 0x16), with `--tls_cert_file`: decrypted
//!   ([`tls`]), then hyper, HTTP/2 or HTTP/1.1 as ALPN chose.
//! - Anything else (curl, browsers, Connect, h2c `PRI `): hyper, HTTP/1.1 and
//!   HTTP/2, serving the axum router, the sniffed bytes replayed first.
//!
//! From a `--trusted_proxies` address, a PROXY protocol header (v1 or v2,
//! [`proxy`]) may come first: the connection is then the named client's.
//!
//! Over the global cap (derived from the file-descriptor limit) or the
//! per-address cap, a connection is accepted and closed at once, so it never
//! waits in the backlog and never costs anyone else a descriptor.

pub mod answers;
pub mod io;
pub mod proxy;
pub mod strangers;
pub mod streams;
pub mod tls;

use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::Router;
use bytes::BytesMut;
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore, watch},
    task::JoinSet,
    time::Instant,
};
use tower::ServiceExt;

use self::{
    answers::AnswerTracker,
    io::{Activity, Rewind},
    strangers::Strangers,
    streams::{Streams, Verdict},
    tls::{Secured, Tls},
};
use crate::{
    daemon::{
        self,
        flare::{Flare, frame::MAGIC},
        http_pb::{self, HeadScan, HttpPb, MAX_HEAD_BYTES},
    },
    edge::{
        self, BufferCharge, ConnectionBudget, ConnectionBuffers, EdgeSettings, Proof,
        QueuedAnswers, buffers::PENDING_HTTP2_BYTES,
    },
    http::connection::ConnectionFacts,
    protocol::ConnectionKind,
    readiness::NotReady,
    rpc::state::AppState,
};

const LOG: &str = "yadcc_scheduler::net";

/// The HTTP/2 prior-knowledge preface starts so.
const H2_PREFACE_START: &[u8; 4] = b"PRI ";
/// hyper's read buffer per HTTP/1 connection; bounds what one connection
/// holds before its body is handed over.
const HYPER_MAX_BUF: usize = 64 * 1024;
/// Answer bytes hyper's HTTP/2 buffers per stream before it stops taking
/// more from the answer (hyper's default is 400 KiB): with answers handed
/// over in 64 KiB slices, a stream whose peer does not read holds at most
/// about this much beyond its share of the connection's queued answers.
const HTTP2_SEND_BUFFER: usize = 256 * 1024;
/// Pause after an accept error (e.g. out of descriptors) before retrying.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// Which server a connection's first bytes hand it to: one of the daemons'
/// framings, or hyper for every other protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectionServer {
    Flare,
    DaemonHttp,
    /// A TLS handshake: HTTPS when TLS is configured, else hyper's 400.
    Tls,
    Hyper,
}

/// Serves `router` (and the daemons' protocols over `state`) on `listener`
/// until `shutdown` resolves, then stops accepting, lets connections finish
/// their calls for at most the shutdown grace, and returns. Whoever resolves
/// `shutdown` should also shut the engine down, which answers waiting long
/// polls.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    state: AppState,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let edge = state.settings.edge.clone();
    let cap = edge.connection_cap();
    let per_ip_cap = edge.connection_cap_per_ip(cap);
    tracing::info!(
        target: LOG,
        "connection caps: {cap} in all, {per_ip_cap} per address"
    );
    if edge.max_connections_per_ip.is_none() && per_ip_cap < 2 * 1000 {
        tracing::warn!(
            target: LOG,
            "{per_ip_cap} connections per address: an office of 1,000 daemons behind one \
             NAT address (2,000 connections) would be cut off; raise the descriptor limit \
             (ulimit -Hn) or --max_connections_per_ip"
        );
    }
    let tls = match &state.settings.security.tls {
        None => None,
        Some(files) => Some(
            Tls::start(files, state.security.counters.clone(), &state.reloads)
                .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidInput, error))?,
        ),
    };
    let shared = Arc::new(Listener {
        tls,
        hyper: hyper_builder(&edge),
        router,
        state,
        per_ip: Mutex::default(),
        per_ip_cap,
        strangers: Arc::default(),
        buffers: ConnectionBuffers::new(edge::CONNECTION_BUFFERS_BYTES),
        eviction_headroom: edge::eviction_headroom(cap),
        edge,
    });
    let slots = Arc::new(Semaphore::new(cap));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    if let Some((admitted, charge)) = admit(&shared, &slots, peer) {
                        let shared = Arc::clone(&shared);
                        let stopping = stopping.clone();
                        let proof = Proof::stranger();
                        let seat = shared.strangers.seat(proof.clone());
                        connections.spawn(async move {
                            let _admitted = admitted;
                            tokio::select! {
                                () = serve_connection(shared, stream, peer, stopping, proof, charge) => {}
                                // Dropping the connection's future closes it.
                                () = seat.evicted() => {
                                    tracing::debug!(
                                        target: LOG,
                                        %peer,
                                        "closed: evicted near the connection cap, no token proved"
                                    );
                                }
                            }
                        });
                    }
                }
                Err(error) => {
                    // Out of descriptors (or a connection reset before
                    // accept): keep serving the connections we have.
                    tracing::warn!(target: LOG, "accept failed: {error}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
    drop(listener);
    // Before the drain: probes (`/readyz`, gRPC health) on connections still
    // open say so while they finish.
    shared.state.readiness.set_not_ready(NotReady::ShuttingDown);
    let _ = stop.send(true);
    let grace = shared.edge.shutdown_grace;
    let drained = tokio::time::timeout(grace, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            target: LOG,
            "{} connections still open after the {} ms shutdown grace; closing them",
            connections.len(),
            grace.as_millis()
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// What every connection of the listener shares.
struct Listener {
    state: AppState,
    router: Router,
    edge: EdgeSettings,
    hyper: auto::Builder<TokioExecutor>,
    /// `--tls_cert_file`'s; None: a TLS handshake gets hyper's 400.
    tls: Option<Tls>,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    /// Open connections from one address block at most.
    per_ip_cap: usize,
    /// The connections that proved no token yet, evicted first.
    strangers: Arc<Strangers>,
    /// What connections hold before their first request.
    buffers: ConnectionBuffers,
    /// Free places under the global cap below which a new connection
    /// evicts the oldest stranger.
    eviction_headroom: usize,
}

fn hyper_builder(edge: &EdgeSettings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(edge.header_read_timeout)
        .max_buf_size(HYPER_MAX_BUF);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(edge.http2_max_concurrent_streams)
        .keep_alive_interval(edge::HTTP2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(edge::HTTP2_KEEP_ALIVE_TIMEOUT)
        .max_send_buf_size(HTTP2_SEND_BUFFER);
    builder
}

/// A connection's place under the caps, given back when it closes.
struct Admitted {
    _slot: OwnedSemaphorePermit,
    shared: Arc<Listener>,
    /// The address block counted under the per-address cap; None for a
    /// trusted proxy.
    counted_ip: Option<IpAddr>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let Some(ip) = self.counted_ip else {
            return;
        };
        let mut per_ip = self.shared.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = per_ip.get_mut(&ip) {
            *count -= 1;
            if *count == 0 {
                per_ip.remove(&ip);
            }
        }
    }
}

/// A place under both caps, or None (the stream is then dropped: closed).
/// A trusted reverse proxy carries everyone behind it, so the per-address
/// cap does not apply to it (the global cap still does). Near the global
/// cap, each new connection evicts the oldest that proved no token, so the
/// places free never run out while strangers hold them.
fn admit(
    shared: &Arc<Listener>,
    slots: &Arc<Semaphore>,
    peer: SocketAddr,
) -> Option<(Admitted, BufferCharge)> {
    let metrics = &shared.state.metrics;
    if slots.available_permits() <= shared.eviction_headroom && shared.strangers.evict_oldest() {
        metrics.connection_refused("evicted_stranger");
    }
    let Ok(slot) = Arc::clone(slots).try_acquire_owned() else {
        metrics.connection_refused("max_connections");
        return None;
    };
    let ip = peer.ip().to_canonical();
    let counted_ip = if shared.state.settings.is_trusted(ip) {
        None
    } else {
        let block = edge::address_block(ip);
        let mut per_ip = shared.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        let count = per_ip.entry(block).or_insert(0);
        if *count >= shared.per_ip_cap {
            drop(per_ip);
            metrics.connection_refused("max_connections_per_ip");
            return None;
        }
        *count += 1;
        Some(block)
    };
    let admitted = Admitted {
        _slot: slot,
        shared: Arc::clone(shared),
        counted_ip,
    };
    let Some(charge) = shared.buffers.admit(ip) else {
        metrics.connection_refused("connection_buffers");
        return None;
    };
    Some((admitted, charge))
}

async fn serve_connection(
    shared: Arc<Listener>,
    mut stream: TcpStream,
    mut peer: SocketAddr,
    stopping: watch::Receiver<bool>,
    proof: Proof,
    charge: BufferCharge,
) {
    let _ = stream.set_nodelay(true);
    let mut first = BytesMut::with_capacity(1024);
    let from_proxy = shared.state.settings.is_trusted(peer.ip().to_canonical());
    let sniffed = tokio::time::timeout(shared.edge.header_read_timeout, async {
        if from_proxy {
            peer = read_proxy_header(&mut stream, &mut first)
                .await?
                .unwrap_or(peer);
        }
        sniff(&mut stream, &mut first, &charge).await
    })
    .await;
    let server = match sniffed {
        Ok(Some(server)) => server,
        // Closed, or nothing recognisable in time: a half-sent request.
        Ok(None) | Err(_) => return,
    };
    let state = shared.state.clone();
    // A hot standby closes daemon connections at once unless it takes over
    // from a leader that does not answer, and those it held when it stopped
    // leading or taking over: daemons reconnect through the load balancer.
    let leadership = &state.leadership;
    if server != ConnectionServer::Hyper && !leadership.admits_daemons().await {
        return;
    }
    if matches!(
        server,
        ConnectionServer::Flare | ConnectionServer::DaemonHttp
    ) {
        // Every frame's body is in the body budget from its header on.
        charge.release();
    }
    match server {
        ConnectionServer::Flare => {
            let _open = state.metrics.connection_opened(ConnectionKind::Flare);
            let serve = daemon::serve(Flare, state.clone(), stream, peer, first, stopping, proof);
            leadership.while_serving_daemons(serve).await;
        }
        ConnectionServer::DaemonHttp => {
            let _open = state.metrics.connection_opened(ConnectionKind::DaemonHttp);
            let framing = HttpPb::new(shared.router.clone());
            let serve = daemon::serve(framing, state.clone(), stream, peer, first, stopping, proof);
            leadership.while_serving_daemons(serve).await;
        }
        ConnectionServer::Tls if shared.tls.is_some() => {
            let _open = state.metrics.connection_opened(ConnectionKind::Http);
            tls::serve(&shared, stream, peer, first, stopping, proof, charge).await;
        }
        ConnectionServer::Hyper | ConnectionServer::Tls => {
            let _open = state.metrics.connection_opened(ConnectionKind::Http);
            if first.starts_with(H2_PREFACE_START) && !charge.grow_by(PENDING_HTTP2_BYTES) {
                shared
                    .state
                    .metrics
                    .connection_refused("connection_buffers");
                return;
            }
            let activity = Activity::new();
            let io = Rewind::new(first.freeze(), stream, activity.clone()).charged(charge.clone());
            serve_hyper(&shared, io, activity, None, peer, stopping, (proof, charge)).await;
        }
    }
}

/// Reads a trusted proxy's PROXY header, if one comes, and takes it out of
/// `buf`: Some(the client it names), Some(None) without one, None if the
/// peer closed first or sent a header that does not parse.
async fn read_proxy_header(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
) -> Option<Option<SocketAddr>> {
    loop {
        match proxy::parse(buf) {
            proxy::Header::Absent => return Some(None),
            proxy::Header::Present { len, client } => {
                let _ = buf.split_to(len);
                return Some(client);
            }
            proxy::Header::Invalid => {
                tracing::debug!(target: LOG, "closed: a PROXY header that does not parse");
                return None;
            }
            proxy::Header::Incomplete => {}
        }
        buf.reserve(proxy::MAX_HEADER_BYTES);
        match stream.read_buf(buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// Reads until the connection's server is known; None if the peer closed first.
async fn sniff(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    charge: &BufferCharge,
) -> Option<ConnectionServer> {
    let mut scan = HeadScan::default();
    loop {
        // The first four bytes decide alone and cost nothing; after them only
        // a head worth parsing again can change the answer.
        let worth_classifying =
            buf.len() <= 4 || buf.len() > MAX_HEAD_BYTES || scan.worth_parsing(buf);
        if worth_classifying && let Some(server) = classify(buf) {
            return Some(server);
        }
        if buf.len() > MAX_HEAD_BYTES {
            // Let hyper answer an oversized head.
            return Some(ConnectionServer::Hyper);
        }
        buf.reserve(4096);
        if !charge.grow_to(edge::buffers::PENDING_CONNECTION_BYTES + buf.capacity()) {
            return None;
        }
        match stream.read_buf(buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// The server the bytes so far decide, or None when more are needed.
fn classify(buf: &[u8]) -> Option<ConnectionServer> {
    let prefix = &buf[..buf.len().min(4)];
    if buf.len() < 4 && (MAGIC.starts_with(prefix) || H2_PREFACE_START.starts_with(prefix)) {
        return None;
    }
    if prefix == MAGIC {
        return Some(ConnectionServer::Flare);
    }
    if prefix == H2_PREFACE_START {
        return Some(ConnectionServer::Hyper);
    }
    if prefix.first() == Some(&tls::HANDSHAKE_RECORD) {
        return Some(ConnectionServer::Tls);
    }
    match http_pb::is_daemon_request(buf) {
        None => None,
        Some(true) => Some(ConnectionServer::DaemonHttp),
        Some(false) => Some(ConnectionServer::Hyper),
    }
}

/// Serves hyper on `io`, whose bytes `activity` stamps.
async fn serve_hyper<S>(
    shared: &Listener,
    io: S,
    activity: Activity,
    secured: Option<Secured>,
    peer: SocketAddr,
    mut stopping: watch::Receiver<bool>,
    // The connection's standing, and what it is charged until its first
    // request.
    (proof, charge): (Proof, BufferCharge),
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let streams = Streams::new();
    let io = TokioIo::new(io);
    let router = shared.router.clone();
    // Every request (every HTTP/2 stream) of the connection buffers its body
    // within the connection's one allowance, and every answer is counted
    // until hyper has taken it.
    let queued = QueuedAnswers::default();
    let answers = AnswerTracker::new(queued.clone());
    let facts = ConnectionFacts {
        peer,
        budget: ConnectionBudget::new(&shared.state.body_budget, peer.ip(), proof),
        queued: Some(queued),
        over_tls: secured.is_some(),
        certificate: secured.and_then(|secured| secured.certificate),
    };
    let service = {
        let answers = Arc::clone(&answers);
        let streams = streams.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            // From its first request on, the connection's bytes are bodies
            // (the body budget's) or the next heads of a known client.
            charge.release();
            let open = streams.open();
            facts.mark(&mut request);
            let router = router.clone();
            let answers = Arc::clone(&answers);
            async move {
                let response = router
                    .oneshot(request)
                    .await
                    .unwrap_or_else(|never| match never {});
                Ok::<_, Infallible>(response.map(|body| open.until_sent(answers.track(body))))
            }
        })
    };
    let connection = shared.hyper.serve_connection_with_upgrades(io, service);
    tokio::pin!(connection);
    let idle_timeout = shared.edge.idle_timeout;
    let header_read_timeout = shared.edge.header_read_timeout;
    let write_timeout = shared.edge.body_read_timeout;
    let period = idle_timeout.min(write_timeout).min(header_read_timeout) / 4;
    let mut check = tokio::time::interval_at(Instant::now() + period, period);
    let mut closing = false;
    // When a connection told to close for idling must be gone: a peer
    // that never acknowledges the GOAWAY does not keep it open.
    let mut close_by = None;
    loop {
        tokio::select! {
            _ = connection.as_mut() => return,
            changed = stopping.changed(), if !closing => {
                if changed.is_err() || *stopping.borrow() {
                    closing = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
            _ = check.tick() => {
                // An answer nobody takes (an HTTP/2 window kept shut, a
                // peer that stopped reading) is given up with its connection:
                // hyper offers no way to reset a single stream from here.
                let stalled = answers.stalled_for().max(activity.write_blocked_for());
                if stalled >= write_timeout {
                    tracing::debug!(
                        target: LOG,
                        %peer,
                        "closing the connection: an answer made no progress for {} ms",
                        stalled.as_millis()
                    );
                    return;
                }
                if close_by.is_some_and(|by| Instant::now() >= by) {
                    return;
                }
                match streams.verdict(header_read_timeout, idle_timeout) {
                    Verdict::Serving => {}
                    // Nothing to finish: a preface, PINGs or a half head.
                    Verdict::NoRequest => {
                        tracing::debug!(
                            target: LOG,
                            %peer,
                            "closed: no complete request within the header-read timeout"
                        );
                        return;
                    }
                    Verdict::Idle if close_by.is_none() => {
                        closing = true;
                        connection.as_mut().graceful_shutdown();
                        close_by = Some(Instant::now() + header_read_timeout);
                    }
                    Verdict::Idle => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
