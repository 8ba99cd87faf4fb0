//! How a simulated daemon reaches the scheduler, the way a stock one does:
//! one [`Endpoint`] per machine, shared by its servant and delegate roles,
//! with a pool of at most two connections. On `flare://` and `http+pb` every
//! connection carries many calls at once and answers are matched by id
//! ([`Mux`]); each call has the daemon's own client timeout
//! ([`wire::client_timeout`]), which is also sent as its deadline. A broken
//! connection fails the calls on it and is replaced by the next call. JSON
//! goes as a script sends it: one call at a time per connection
//! ([`SerialConn`]).

use std::{
    collections::HashMap,
    fmt, io,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use serde::{Serialize, de::DeserializeOwned};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpSocket, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::{Semaphore, mpsc, oneshot},
    task::AbortHandle,
    time::Instant,
};

use super::{
    stats::{Call, Stats},
    wire::{self, Answer, Outcome, Protocol, WireError},
};
use crate::pb::{self, Method};

/// Why a call failed.
#[derive(Debug, Clone)]
pub enum CallError {
    /// The connection could not be opened.
    Connect(String),
    /// The connection broke (or the server closed it) before the answer.
    Io(String),
    /// No answer within the call's client timeout.
    Timeout,
    /// The server answered with a non-zero status: a yadcc `Status` (1000 and
    /// up) or a framework code.
    Rpc { code: i32, description: String },
    /// An HTTP error without `Rpc-Error-Code`.
    Http { status: u16 },
    /// The answer's message did not decode.
    Decode(String),
    /// The server's bytes were not a well-formed answer; the connection is closed.
    Protocol(String),
}

impl CallError {
    /// A short label for error tallies.
    pub fn kind(&self) -> String {
        match self {
            CallError::Connect(_) => "connect".to_owned(),
            CallError::Io(_) => "io".to_owned(),
            CallError::Timeout => "timeout".to_owned(),
            CallError::Rpc { code, .. } => match pb::Status::try_from(*code) {
                Ok(status) if *code >= 1000 => {
                    format!("rpc_{code}_{}", status.as_str_name().to_ascii_lowercase())
                }
                _ => format!("rpc_{code}"),
            },
            CallError::Http { status } => format!("http_{status}"),
            CallError::Decode(_) => "decode".to_owned(),
            CallError::Protocol(_) => "protocol".to_owned(),
        }
    }

    /// `STATUS_NO_QUOTA_AVAILABLE`: the cluster was busy, not a failure.
    pub fn is_no_quota(&self) -> bool {
        matches!(self, CallError::Rpc { code, .. } if *code == pb::Status::NoQuotaAvailable as i32)
    }

    fn from_outcome(outcome: Outcome) -> Result<Bytes, CallError> {
        match outcome {
            Outcome::Ok(body) => Ok(body),
            Outcome::Failed { code, description } => Err(CallError::Rpc { code, description }),
            Outcome::Http { status } => Err(CallError::Http { status }),
        }
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Connect(error) => write!(f, "cannot connect: {error}"),
            CallError::Io(error) => write!(f, "connection failed: {error}"),
            CallError::Timeout => f.write_str("timed out"),
            CallError::Rpc { code, description } => write!(f, "status {code} {description}"),
            CallError::Http { status } => write!(f, "HTTP {status} without Rpc-Error-Code"),
            CallError::Decode(error) => write!(f, "cannot decode the answer: {error}"),
            CallError::Protocol(error) => write!(f, "bad answer: {error}"),
        }
    }
}

impl std::error::Error for CallError {}

impl From<WireError> for CallError {
    fn from(error: WireError) -> CallError {
        CallError::Protocol(error.to_string())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Opens a TCP connection to `target`, from `local` (port chosen by the
/// kernel) when given.
pub async fn connect(local: Option<IpAddr>, target: SocketAddr) -> io::Result<TcpStream> {
    let socket = if target.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }?;
    if let Some(local) = local {
        socket.bind(SocketAddr::new(local, 0))?;
    }
    let stream = socket.connect(target).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Takes one answer of `protocol` off the front of `buffer`.
fn decode_answer(protocol: Protocol, buffer: &mut BytesMut) -> Result<Option<Answer>, WireError> {
    match protocol {
        Protocol::Flare => wire::decode_flare_answer(buffer),
        Protocol::HttpPb | Protocol::Json => wire::decode_http_answer(buffer),
    }
}

/// Reads more bytes; an error when the server closed the connection.
async fn fill(stream: &mut (impl AsyncReadExt + Unpin), buffer: &mut BytesMut) -> io::Result<()> {
    if buffer.capacity() - buffer.len() < 1024 {
        buffer.reserve(8192);
    }
    if stream.read_buf(buffer).await? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    Ok(())
}

/// A connection with one call in flight at a time: written request, then its
/// answer. What scripts do, and what the P1 hammer uses so every protocol
/// costs the client the same.
#[derive(Debug)]
pub struct SerialConn {
    stream: TcpStream,
    buffer: BytesMut,
    protocol: Protocol,
    closed: bool,
}

impl SerialConn {
    pub async fn connect(
        local: Option<IpAddr>,
        target: SocketAddr,
        protocol: Protocol,
    ) -> io::Result<SerialConn> {
        Ok(SerialConn {
            stream: connect(local, target).await?,
            buffer: BytesMut::with_capacity(8192),
            protocol,
            closed: false,
        })
    }

    /// False once the server said `Connection: close` or an exchange failed.
    pub fn is_reusable(&self) -> bool {
        !self.closed
    }

    /// Writes `request` (a whole encoded request) and reads one answer.
    pub async fn exchange(&mut self, request: &[u8]) -> Result<Answer, CallError> {
        let result = self.exchange_inner(request).await;
        match &result {
            Ok(answer) if !answer.close => {}
            _ => self.closed = true,
        }
        result
    }

    async fn exchange_inner(&mut self, request: &[u8]) -> Result<Answer, CallError> {
        self.stream
            .write_all(request)
            .await
            .map_err(|error| CallError::Io(error.to_string()))?;
        loop {
            if let Some(answer) = decode_answer(self.protocol, &mut self.buffer)? {
                return Ok(answer);
            }
            fill(&mut self.stream, &mut self.buffer)
                .await
                .map_err(|error| CallError::Io(error.to_string()))?;
        }
    }
}

/// Where the answer of one call in flight goes.
type Waiter = oneshot::Sender<Result<Outcome, CallError>>;

/// What a multiplexed connection's reader, writer and callers share.
#[derive(Debug, Default)]
struct MuxState {
    pending: Mutex<HashMap<u64, Waiter>>,
    broken: AtomicBool,
}

impl MuxState {
    /// The connection is done: every call still waiting fails with `error`.
    fn fail_all(&self, error: &CallError) {
        self.broken.store(true, Relaxed);
        let waiters: Vec<Waiter> = lock(&self.pending).drain().map(|(_, w)| w).collect();
        for waiter in waiters {
            let _ = waiter.send(Err(error.clone()));
        }
    }
}

/// One connection carrying many calls at once (flare, http+pb): callers queue
/// encoded requests to its one writer task; its reader task hands each answer
/// to the call with the same id, in whatever order they come.
#[derive(Debug)]
pub struct Mux {
    outgoing: mpsc::UnboundedSender<Bytes>,
    state: Arc<MuxState>,
    next_id: AtomicU64,
    tasks: [AbortHandle; 2],
}

impl Drop for Mux {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Removes a call from the pending table however its future ends (answered,
/// timed out, or dropped by a stopping simulation).
struct PendingGuard<'a> {
    state: &'a MuxState,
    id: u64,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        lock(&self.state.pending).remove(&self.id);
    }
}

impl Mux {
    /// Starts the reader and writer of `stream`.
    pub fn start(stream: TcpStream, protocol: Protocol) -> Mux {
        let (read, write) = stream.into_split();
        let state = Arc::new(MuxState::default());
        let (outgoing, incoming) = mpsc::unbounded_channel();
        let reader = tokio::spawn(read_loop(read, protocol, state.clone())).abort_handle();
        let writer = tokio::spawn(write_loop(write, incoming, state.clone())).abort_handle();
        Mux {
            outgoing,
            state,
            next_id: AtomicU64::new(1),
            tasks: [reader, writer],
        }
    }

    pub fn is_broken(&self) -> bool {
        self.state.broken.load(Relaxed)
    }

    /// Calls in flight on this connection.
    pub fn in_flight(&self) -> usize {
        lock(&self.state.pending).len()
    }

    /// Sends one request, built by `encode` for the id given, and waits at most
    /// `timeout` for its answer. A late answer is dropped, as daemons do.
    pub async fn call(
        &self,
        timeout: Duration,
        encode: impl FnOnce(u64) -> Bytes,
    ) -> Result<Outcome, CallError> {
        let id = self.next_id.fetch_add(1, Relaxed);
        let (sender, receiver) = oneshot::channel();
        lock(&self.state.pending).insert(id, sender);
        let _guard = PendingGuard {
            state: &self.state,
            id,
        };
        if self.is_broken() || self.outgoing.send(encode(id)).is_err() {
            return Err(CallError::Io("connection closed".to_owned()));
        }
        match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(CallError::Io("connection closed".to_owned())),
            Err(_) => Err(CallError::Timeout),
        }
    }
}

async fn read_loop(mut read: OwnedReadHalf, protocol: Protocol, state: Arc<MuxState>) {
    let mut buffer = BytesMut::with_capacity(16 << 10);
    let error = 'connection: loop {
        loop {
            match decode_answer(protocol, &mut buffer) {
                Ok(Some(answer)) => {
                    let Some(id) = answer.id else {
                        // A daemon drops such an answer and its call times
                        // out; failing the connection says why at once.
                        break 'connection CallError::Protocol(
                            "answer without Rpc-SeqNo".to_owned(),
                        );
                    };
                    let waiter = lock(&state.pending).remove(&id);
                    if let Some(waiter) = waiter {
                        let _ = waiter.send(Ok(answer.outcome));
                    }
                    if answer.close {
                        break 'connection CallError::Io(
                            "the server closed the connection".to_owned(),
                        );
                    }
                }
                Ok(None) => break,
                Err(error) => break 'connection error.into(),
            }
        }
        if let Err(error) = fill(&mut read, &mut buffer).await {
            break CallError::Io(error.to_string());
        }
    };
    state.fail_all(&error);
}

/// Requests taken off the queue per write: calls queued together go out in one
/// `write`, as a busy daemon's would.
const WRITE_BATCH: usize = 64;

async fn write_loop(
    mut write: OwnedWriteHalf,
    mut incoming: mpsc::UnboundedReceiver<Bytes>,
    state: Arc<MuxState>,
) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    let mut joined = BytesMut::new();
    while incoming.recv_many(&mut batch, WRITE_BATCH).await > 0 {
        let written = if let [one] = &batch[..] {
            write.write_all(one).await
        } else {
            joined.clear();
            for request in &batch {
                joined.extend_from_slice(request);
            }
            write.write_all(&joined).await
        };
        batch.clear();
        if let Err(error) = written {
            state.fail_all(&CallError::Io(error.to_string()));
            return;
        }
    }
    let _ = write.shutdown().await;
}

/// Connections one daemon keeps to its scheduler (flare's and http+pb's pool).
pub const DAEMON_MAX_CONNECTIONS: usize = 2;

/// JSON calls one machine may have in flight at once (one connection each).
const JSON_MAX_CONNECTIONS: usize = 16;

/// How one simulated machine reaches the scheduler: its own source address,
/// its protocol, its connection pool, and where to record what happened.
#[derive(Debug)]
pub struct Endpoint {
    target: SocketAddr,
    local: Option<IpAddr>,
    protocol: Protocol,
    stats: Arc<Stats>,
    max_connections: usize,
    muxes: Mutex<Vec<Arc<Mux>>>,
    /// One connection is opened at a time.
    opening: tokio::sync::Mutex<()>,
    serial_idle: Mutex<Vec<SerialConn>>,
    serial_slots: Semaphore,
}

impl Endpoint {
    /// A daemon's endpoint: at most [`DAEMON_MAX_CONNECTIONS`] connections.
    pub fn new(
        target: SocketAddr,
        local: Option<IpAddr>,
        protocol: Protocol,
        stats: Arc<Stats>,
    ) -> Endpoint {
        Endpoint::with_max_connections(target, local, protocol, stats, DAEMON_MAX_CONNECTIONS)
    }

    /// An endpoint allowed `max_connections` multiplexed connections.
    pub fn with_max_connections(
        target: SocketAddr,
        local: Option<IpAddr>,
        protocol: Protocol,
        stats: Arc<Stats>,
        max_connections: usize,
    ) -> Endpoint {
        Endpoint {
            target,
            local,
            protocol,
            stats,
            max_connections: max_connections.max(1),
            muxes: Mutex::new(Vec::new()),
            opening: tokio::sync::Mutex::new(()),
            serial_idle: Mutex::new(Vec::new()),
            serial_slots: Semaphore::new(JSON_MAX_CONNECTIONS),
        }
    }

    /// The source address of this machine's connections.
    pub fn local_ip(&self) -> Option<IpAddr> {
        self.local
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Live multiplexed connections now.
    pub fn connections(&self) -> usize {
        lock(&self.muxes)
            .iter()
            .filter(|mux| !mux.is_broken())
            .count()
    }

    /// Calls `rpc` with the daemon's timeout for it, records the outcome
    /// (success latency, no quota, or error by kind) and decodes the answer.
    pub async fn call<Req, Resp>(&self, rpc: Method, request: &Req) -> Result<Resp, CallError>
    where
        Req: prost::Message + Serialize,
        Resp: prost::Message + Default + DeserializeOwned,
    {
        let timeout = wire::client_timeout(rpc);
        let result = match self.protocol {
            Protocol::Json => {
                let body = serde_json::to_vec(request)
                    .map_err(|error| CallError::Decode(error.to_string()));
                match body {
                    Ok(body) => self.call_serial(rpc, &body, timeout).await,
                    Err(error) => Err(error),
                }
            }
            Protocol::Flare | Protocol::HttpPb => {
                let payload = request.encode_to_vec();
                self.call_mux(rpc, &payload, timeout).await
            }
        };
        let result = result.and_then(|(body, latency)| {
            let decoded = match self.protocol {
                Protocol::Json => serde_json::from_slice::<Resp>(&body)
                    .map_err(|error| CallError::Decode(error.to_string())),
                Protocol::Flare | Protocol::HttpPb => {
                    Resp::decode(body).map_err(|error| CallError::Decode(error.to_string()))
                }
            };
            decoded.map(|answer| (answer, latency))
        });
        let call = Call::Rpc(rpc);
        match &result {
            Ok((_, latency)) => self.stats.record_ok(call, *latency),
            Err(error) if error.is_no_quota() => self.stats.record_no_quota(call),
            Err(error) => self.stats.record_error(call, &error.kind()),
        }
        result.map(|(answer, _)| answer)
    }

    /// One call on a shared connection; the latency runs from queueing the
    /// request to its answer (opening a connection excluded).
    async fn call_mux(
        &self,
        rpc: Method,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<(Bytes, Duration), CallError> {
        let deadline = Instant::now() + timeout;
        let mux = tokio::time::timeout_at(deadline, self.mux())
            .await
            .map_err(|_| CallError::Timeout)??;
        let started = Instant::now();
        let protocol = self.protocol;
        let outcome = mux
            .call(deadline.saturating_duration_since(started), |id| {
                let mut out = BytesMut::with_capacity(payload.len() + 160);
                match protocol {
                    Protocol::Flare => {
                        wire::encode_flare_request(&mut out, id, rpc, timeout, payload);
                    }
                    Protocol::HttpPb | Protocol::Json => {
                        wire::encode_http_pb_request(&mut out, id, rpc, timeout, payload);
                    }
                }
                out.freeze()
            })
            .await?;
        let latency = started.elapsed();
        CallError::from_outcome(outcome).map(|body| (body, latency))
    }

    /// A connection for the next call: the least busy one, unless every one is
    /// busy and the pool has room, then a new one.
    async fn mux(&self) -> Result<Arc<Mux>, CallError> {
        if let Some(mux) = self.pick(false) {
            return Ok(mux);
        }
        let _opening = self.opening.lock().await;
        if let Some(mux) = self.pick(false) {
            return Ok(mux);
        }
        match connect(self.local, self.target).await {
            Ok(stream) => {
                let mux = Arc::new(Mux::start(stream, self.protocol));
                lock(&self.muxes).push(mux.clone());
                self.stats.events.connections_opened.fetch_add(1, Relaxed);
                Ok(mux)
            }
            Err(error) => match self.pick(true) {
                Some(mux) => Ok(mux),
                None => Err(CallError::Connect(error.to_string())),
            },
        }
    }

    /// The least busy live connection; `None` if a new one should be opened
    /// instead (none yet, or all busy and room for one more) unless `any`.
    fn pick(&self, any: bool) -> Option<Arc<Mux>> {
        let mut muxes = lock(&self.muxes);
        let before = muxes.len();
        muxes.retain(|mux| !mux.is_broken());
        let lost = (before - muxes.len()) as u64;
        if lost > 0 {
            self.stats.events.connections_lost.fetch_add(lost, Relaxed);
        }
        let least = muxes.iter().min_by_key(|mux| mux.in_flight())?;
        (any || least.in_flight() == 0 || muxes.len() >= self.max_connections)
            .then(|| least.clone())
    }

    /// One JSON call on a connection of its own.
    async fn call_serial(
        &self,
        rpc: Method,
        body: &[u8],
        timeout: Duration,
    ) -> Result<(Bytes, Duration), CallError> {
        let deadline = Instant::now() + timeout;
        let _slot = tokio::time::timeout_at(deadline, self.serial_slots.acquire())
            .await
            .map_err(|_| CallError::Timeout)?
            .map_err(|_| CallError::Io("endpoint closed".to_owned()))?;
        let pooled = lock(&self.serial_idle).pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => {
                let conn = tokio::time::timeout_at(
                    deadline,
                    SerialConn::connect(self.local, self.target, self.protocol),
                )
                .await
                .map_err(|_| CallError::Timeout)?
                .map_err(|error| CallError::Connect(error.to_string()))?;
                self.stats.events.connections_opened.fetch_add(1, Relaxed);
                conn
            }
        };
        let mut request = BytesMut::with_capacity(body.len() + 160);
        wire::encode_json_request(&mut request, &self.target.to_string(), rpc, body);
        let started = Instant::now();
        let answer = tokio::time::timeout_at(deadline, conn.exchange(&request))
            .await
            .map_err(|_| CallError::Timeout)??;
        let latency = started.elapsed();
        if conn.is_reusable() {
            lock(&self.serial_idle).push(conn);
        }
        CallError::from_outcome(answer.outcome).map(|body| (body, latency))
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    #[test]
    fn error_kinds_name_scheduler_statuses() {
        let rpc = |code| CallError::Rpc {
            code,
            description: String::new(),
        };
        assert_eq!(rpc(1003).kind(), "rpc_1003_status_access_denied");
        assert_eq!(rpc(10).kind(), "rpc_10");
        assert!(rpc(1001).is_no_quota());
        assert!(!rpc(1003).is_no_quota());
        assert_eq!(CallError::Http { status: 502 }.kind(), "http_502");
    }

    /// A server that answers the second request before the first: the
    /// multiplexed client gives each caller its own answer.
    #[tokio::test]
    async fn answers_out_of_order_reach_their_calls() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buffer = BytesMut::new();
            let mut ids = Vec::new();
            while ids.len() < 2 {
                fill(&mut stream, &mut buffer).await.unwrap();
                while let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8(buffer.split_to(at + 4).to_vec()).unwrap();
                    let id = head
                        .lines()
                        .find_map(|line| line.strip_prefix("Rpc-SeqNo: "))
                        .unwrap()
                        .to_owned();
                    ids.push(id);
                }
            }
            for (id, body) in [(&ids[1], "second"), (&ids[0], "first!")] {
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nRpc-SeqNo: {id}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                stream.write_all(answer.as_bytes()).await.unwrap();
            }
            // Then the server goes away: later calls fail, not hang.
            drop(stream);
        });
        let mux = Mux::start(connect(None, addr).await.unwrap(), Protocol::HttpPb);
        let request = |rpc: Method| {
            move |id| {
                let mut out = BytesMut::new();
                wire::encode_http_pb_request(&mut out, id, rpc, Duration::from_secs(2), b"");
                out.freeze()
            }
        };
        let (first, second) = tokio::join!(
            mux.call(Duration::from_secs(5), request(Method::WaitForStartingTask)),
            mux.call(Duration::from_secs(5), request(Method::Heartbeat)),
        );
        assert_eq!(first.unwrap(), Outcome::Ok(Bytes::from_static(b"first!")));
        assert_eq!(second.unwrap(), Outcome::Ok(Bytes::from_static(b"second")));
        server.await.unwrap();
        let after = mux
            .call(Duration::from_secs(5), request(Method::GetConfig))
            .await;
        assert!(matches!(after, Err(CallError::Io(_))), "{after:?}");
        assert!(mux.is_broken());
        assert_eq!(mux.in_flight(), 0);
    }

    /// Answers a flare request frame the way the framework's server does:
    /// echoing its correlation id, status 0, the given payload.
    fn flare_answer(correlation_id: u64, payload: &[u8]) -> Vec<u8> {
        use prost::Message as _;
        let meta = pb::flare::rpc::RpcMeta {
            correlation_id,
            method_type: pb::flare::rpc::MethodType::Single as i32,
            response_meta: Some(pb::flare::rpc::RpcResponseMeta::default()),
            ..pb::flare::rpc::RpcMeta::default()
        }
        .encode_to_vec();
        let mut frame = wire::FLARE_MAGIC.to_vec();
        for size in [meta.len(), payload.len(), 0] {
            frame.extend_from_slice(&(size as u32).to_le_bytes());
        }
        frame.extend_from_slice(&meta);
        frame.extend_from_slice(payload);
        frame
    }

    /// A flare server answering every call at once, except long polls, which
    /// it holds `hold`; each connection is closed after `calls_per_connection`
    /// answers. Returns its address and the number of connections accepted.
    async fn fake_flare_server(
        hold: Duration,
        calls_per_connection: usize,
    ) -> (SocketAddr, Arc<AtomicU64>) {
        use prost::Message as _;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Relaxed);
                tokio::spawn(async move {
                    let (mut read, write) = stream.into_split();
                    let write = Arc::new(tokio::sync::Mutex::new(write));
                    let mut buffer = BytesMut::new();
                    let mut answered = Vec::new();
                    while answered.len() < calls_per_connection {
                        if fill(&mut read, &mut buffer).await.is_err() {
                            return;
                        }
                        while buffer.len() >= 16 {
                            let size = |at: usize| {
                                u32::from_le_bytes(buffer[at..at + 4].try_into().unwrap()) as usize
                            };
                            let length = 16 + size(4) + size(8) + size(12);
                            if buffer.len() < length {
                                break;
                            }
                            let frame = buffer.split_to(length);
                            let meta = pb::flare::rpc::RpcMeta::decode(
                                &frame[16..16 + size_of_meta(&frame)],
                            )
                            .unwrap();
                            let method = meta.request_meta.unwrap().method_name;
                            let delay = if method.ends_with("WaitForStartingTask") {
                                hold
                            } else {
                                Duration::ZERO
                            };
                            let write = write.clone();
                            answered.push(tokio::spawn(async move {
                                tokio::time::sleep(delay).await;
                                let answer = flare_answer(meta.correlation_id, &[]);
                                let _ = write.lock().await.write_all(&answer).await;
                            }));
                        }
                    }
                    for answer in answered {
                        let _ = answer.await;
                    }
                    // Dropping both halves closes the connection.
                });
            }
        });
        (addr, accepted)
    }

    fn size_of_meta(frame: &[u8]) -> usize {
        u32::from_le_bytes(frame[4..8].try_into().unwrap()) as usize
    }

    /// A daemon's pool: a long poll and many short calls at once use at most
    /// two connections, short calls are not held behind the long poll, and a
    /// connection the server closes is replaced by the next call.
    #[tokio::test]
    async fn the_pool_keeps_two_connections_and_reconnects() {
        let (addr, accepted) = fake_flare_server(Duration::from_millis(800), 8).await;
        let stats = Arc::new(Stats::default());
        let endpoint = Endpoint::new(addr, None, Protocol::Flare, stats.clone());
        let free = pb::FreeTaskRequest::default();
        let wait = pb::WaitForStartingTaskRequest::default();
        let long_poll =
            endpoint.call::<_, pb::WaitForStartingTaskResponse>(Method::WaitForStartingTask, &wait);
        let short_calls = async {
            let started = Instant::now();
            let calls =
                (0..6).map(|_| endpoint.call::<_, pb::FreeTaskResponse>(Method::FreeTask, &free));
            let results = futures_util::future::join_all(calls).await;
            (results, started.elapsed())
        };
        let (long, (short, short_took)) = tokio::join!(long_poll, short_calls);
        assert!(long.is_ok(), "{long:?}");
        assert!(short.iter().all(Result::is_ok), "{short:?}");
        assert!(short_took < Duration::from_millis(500), "{short_took:?}");
        assert_eq!(accepted.load(Relaxed), 2);
        assert_eq!(stats.events.connections_opened.load(Relaxed), 2);

        // 7 answers so far over two connections of 8 each: a few more calls
        // reach the limit, the server closes, and later calls reconnect.
        for _ in 0..12 {
            let result = endpoint
                .call::<_, pb::FreeTaskResponse>(Method::FreeTask, &free)
                .await;
            if let Err(error) = result {
                // A call racing the close may see it; the next one reconnects.
                assert!(matches!(error, CallError::Io(_)), "{error:?}");
            }
        }
        assert!(accepted.load(Relaxed) > 2, "reconnected");
        assert!(stats.events.connections_lost.load(Relaxed) > 0);
        assert!(endpoint.connections() <= DAEMON_MAX_CONNECTIONS);
        let last = endpoint
            .call::<_, pb::FreeTaskResponse>(Method::FreeTask, &free)
            .await;
        assert!(last.is_ok(), "{last:?}");
    }

    /// A silent server: the call ends at its timeout and leaves nothing behind.
    #[tokio::test]
    async fn unanswered_calls_time_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mux = Mux::start(connect(None, addr).await.unwrap(), Protocol::Flare);
        let _accepted = listener.accept().await.unwrap();
        let result = mux
            .call(Duration::from_millis(50), |id| {
                let mut out = BytesMut::new();
                wire::encode_flare_request(&mut out, id, Method::Heartbeat, Duration::ZERO, b"");
                out.freeze()
            })
            .await;
        assert!(matches!(result, Err(CallError::Timeout)), "{result:?}");
        assert_eq!(mux.in_flight(), 0);
        assert!(!mux.is_broken());
    }
}
