//! How one simulated machine reaches the scheduler: its own source address,
//! its protocol, a pool of at most two shared connections (or, for JSON, a
//! connection per call in flight), and where to record what happened.

use std::{
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, Weak, atomic::Ordering::Relaxed},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use tokio::{
    sync::{Semaphore, oneshot},
    time::Instant,
};

use super::{CallError, Mux, Reply, SerialConn, Then, connect, json, lock, settle};
use yadcc_pb::Method;

use crate::{
    stats::Stats,
    wire::{self, Compression, DAEMON_ACCEPTABLE_COMPRESSION, FlareRequests, Wire},
};

/// Connections one daemon keeps to its scheduler (flare's and http+pb's pool).
pub const DAEMON_MAX_CONNECTIONS: usize = 2;

/// JSON calls one machine may have in flight at once (one connection each).
const JSON_MAX_CONNECTIONS: usize = 16;

/// How long opening a connection may take; the calls waiting for it then fail.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The daemons' client closes a connection idle this long, before a server
/// would (flare-wire.md: the original closes idle ones after 60 s).
const DAEMON_IDLE_RECYCLE: Duration = Duration::from_secs(45);

/// When an unanswered call on a shared connection must end.
#[derive(Debug, Clone)]
pub struct Expiry {
    pub mux: Weak<Mux>,
    pub id: u64,
    pub at: Instant,
}

impl Expiry {
    /// Ends the call with a timeout if it is still unanswered.
    pub fn fire(&self) {
        if let Some(mux) = self.mux.upgrade() {
            mux.expire(self.id);
        }
    }
}

/// Who ends unanswered calls at their deadline: by default a timer task per
/// call; a simulated cluster hands them to its shards' timers instead.
pub type Deadlines = Arc<dyn Fn(Expiry) + Send + Sync>;

fn timer_task_per_call() -> Deadlines {
    Arc::new(|expiry: Expiry| {
        tokio::spawn(async move {
            tokio::time::sleep_until(expiry.at).await;
            expiry.fire();
        });
    })
}

/// Calls waiting for a connection to open.
struct Queued {
    rpc: Method,
    payload: Bytes,
    then: Then,
}

#[derive(Default)]
struct Pool {
    muxes: Vec<Arc<Mux>>,
    /// A connection is being opened.
    opening: bool,
    queued: Vec<Queued>,
}

struct Inner {
    target: SocketAddr,
    local: Option<IpAddr>,
    protocol: Wire,
    stats: Arc<Stats>,
    max_connections: usize,
    requests: Arc<FlareRequests>,
    deadlines: Deadlines,
    pool: Mutex<Pool>,
    serial_idle: Mutex<Vec<SerialConn>>,
    serial_slots: Semaphore,
}

/// How one simulated machine reaches the scheduler: its own source address,
/// its protocol, its connection pool, and where to record what happened.
/// Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("target", &self.inner.target)
            .field("local", &self.inner.local)
            .field("protocol", &self.inner.protocol)
            .field("connections", &self.connections())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// A daemon's endpoint: at most [`DAEMON_MAX_CONNECTIONS`] connections,
    /// every answer compression accepted.
    pub fn new(
        target: SocketAddr,
        local: Option<IpAddr>,
        protocol: Wire,
        stats: Arc<Stats>,
    ) -> Endpoint {
        Endpoint::with_max_connections(target, local, protocol, stats, DAEMON_MAX_CONNECTIONS)
    }

    /// An endpoint allowed `max_connections` multiplexed connections.
    pub fn with_max_connections(
        target: SocketAddr,
        local: Option<IpAddr>,
        protocol: Wire,
        stats: Arc<Stats>,
        max_connections: usize,
    ) -> Endpoint {
        let requests = Arc::new(FlareRequests::new(DAEMON_ACCEPTABLE_COMPRESSION));
        Endpoint::with_parts(
            target,
            local,
            protocol,
            stats,
            max_connections,
            requests,
            timer_task_per_call(),
        )
    }

    /// A daemon's endpoint whose flare requests are `requests` (shared by
    /// many machines; they say which answer compressions are accepted) and
    /// whose unanswered calls are ended by `deadlines`.
    pub fn with_parts(
        target: SocketAddr,
        local: Option<IpAddr>,
        protocol: Wire,
        stats: Arc<Stats>,
        max_connections: usize,
        requests: Arc<FlareRequests>,
        deadlines: Deadlines,
    ) -> Endpoint {
        Endpoint {
            inner: Arc::new(Inner {
                target,
                local,
                protocol,
                stats,
                max_connections: max_connections.max(1),
                requests,
                deadlines,
                pool: Mutex::default(),
                serial_idle: Mutex::new(Vec::new()),
                serial_slots: Semaphore::new(JSON_MAX_CONNECTIONS),
            }),
        }
    }

    /// The source address of this machine's connections.
    pub fn local_ip(&self) -> Option<IpAddr> {
        self.inner.local
    }

    pub fn protocol(&self) -> Wire {
        self.inner.protocol
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.inner.stats
    }

    /// Live multiplexed connections now.
    pub fn connections(&self) -> usize {
        lock(&self.inner.pool)
            .muxes
            .iter()
            .filter(|mux| !mux.is_broken())
            .count()
    }

    /// Closes every connection: calls still out are dropped unanswered.
    pub fn close(&self) {
        let (muxes, queued) = {
            let mut pool = lock(&self.inner.pool);
            (
                std::mem::take(&mut pool.muxes),
                std::mem::take(&mut pool.queued),
            )
        };
        drop((muxes, queued));
        lock(&self.inner.serial_idle).clear();
    }

    /// Calls `rpc` with the daemon's timeout for it, records the outcome
    /// (success latency, no quota, or error by kind) and decodes the answer.
    pub async fn call<Req, Resp>(&self, rpc: Method, request: &Req) -> Result<Resp, CallError>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let reply = self
            .call_raw(rpc, Bytes::from(request.encode_to_vec()))
            .await;
        settle(&self.inner.stats, rpc, reply)
    }

    /// Calls `rpc` with `payload` (the encoded request) and waits for the
    /// answer as it came, recording nothing.
    pub async fn call_raw(&self, rpc: Method, payload: Bytes) -> Result<Reply, CallError> {
        let (sender, receiver) = oneshot::channel();
        self.send(
            rpc,
            payload,
            Box::new(move |result| {
                let _ = sender.send(result);
            }),
        );
        receiver
            .await
            .unwrap_or_else(|_| Err(CallError::Io("connection closed".to_owned())))
    }

    /// Sends a call of `rpc` carrying `payload` (the binary request; JSON
    /// endpoints convert it) without waiting: `then` runs with the answer, or
    /// with the error or timeout that ended the call, exactly once. Records
    /// nothing ([`settle`] does). Must run inside a tokio runtime.
    pub fn send(&self, rpc: Method, payload: Bytes, then: Then) {
        match self.inner.protocol {
            Wire::Json => {
                let endpoint = self.clone();
                tokio::spawn(async move {
                    then(endpoint.call_json(rpc, &payload).await);
                });
            }
            Wire::Flare | Wire::HttpPb => self.send_shared(rpc, payload, then),
        }
    }

    /// A call on a shared connection: the least busy one; queued while one
    /// is opened for it ([`Endpoint::pick`]).
    fn send_shared(&self, rpc: Method, payload: Bytes, mut then: Then) {
        let inner = &self.inner;
        loop {
            let mux = {
                let mut pool = lock(&inner.pool);
                match self.pick(&mut pool) {
                    Some(mux) => mux,
                    None => {
                        pool.queued.push(Queued { rpc, payload, then });
                        self.open(&mut pool);
                        return;
                    }
                }
            };
            match self.submit_on(&mux, rpc, &payload, then) {
                Ok(()) => return,
                // It broke just now: the next pick leaves it out.
                Err(back) => then = back,
            }
        }
    }

    /// Sends the call on `mux`, its deadline watched; gives `then` back if
    /// the connection broke.
    fn submit_on(
        &self,
        mux: &Arc<Mux>,
        rpc: Method,
        payload: &[u8],
        then: Then,
    ) -> Result<(), Then> {
        let id = mux.submit(rpc, payload, then)?;
        (self.inner.deadlines)(Expiry {
            mux: Arc::downgrade(mux),
            id,
            at: Instant::now() + wire::client_timeout(rpc),
        });
        Ok(())
    }

    /// The connection for the next call: the least busy live one, unless it
    /// is busy and the pool has room, or there is none: then `None`, and a
    /// new one is being opened for the call, as a daemon's client does.
    /// Broken connections are left out, and idle ones recycled.
    fn pick(&self, pool: &mut Pool) -> Option<Arc<Mux>> {
        let now = Instant::now();
        let recycled = |mux: &Arc<Mux>| {
            mux.in_flight() == 0 && now.duration_since(mux.last_sent()) >= DAEMON_IDLE_RECYCLE
        };
        if pool
            .muxes
            .iter()
            .any(|mux| mux.is_broken() || recycled(mux))
        {
            let before = pool.muxes.len();
            pool.muxes.retain(|mux| !mux.is_broken());
            let lost = (before - pool.muxes.len()) as u64;
            let events = &self.inner.stats.events;
            events.connections_lost.fetch_add(lost, Relaxed);
            pool.muxes.retain(|mux| !recycled(mux));
        }
        let least = pool
            .muxes
            .iter()
            .map(|mux| (mux, mux.in_flight()))
            .min_by_key(|(_, in_flight)| *in_flight);
        match least {
            Some((mux, 0)) => Some(mux.clone()),
            Some((mux, _)) if pool.muxes.len() >= self.inner.max_connections => Some(mux.clone()),
            _ => {
                self.open(pool);
                None
            }
        }
    }

    /// Opens a connection in the background, unless one is being opened;
    /// then sends the calls queued for it, or fails them.
    fn open(&self, pool: &mut Pool) {
        if pool.opening {
            return;
        }
        pool.opening = true;
        let endpoint = self.clone();
        tokio::spawn(async move {
            let inner = &endpoint.inner;
            let connected =
                tokio::time::timeout(CONNECT_TIMEOUT, connect(inner.local, inner.target))
                    .await
                    .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
            let (opened, queued) = {
                let mut pool = lock(&inner.pool);
                pool.opening = false;
                let queued = std::mem::take(&mut pool.queued);
                let opened = match connected {
                    Ok(stream) => {
                        let mux = Mux::start(
                            stream,
                            inner.protocol,
                            inner.requests.clone(),
                            inner.stats.clone(),
                        );
                        let mux = Arc::new(mux);
                        pool.muxes.push(mux.clone());
                        inner.stats.events.connections_opened.fetch_add(1, Relaxed);
                        Ok(mux)
                    }
                    Err(error) => Err(CallError::Connect(error.to_string())),
                };
                (opened, queued)
            };
            let mut queued = queued.into_iter();
            match opened {
                Ok(mux) => {
                    // The connection was opened for the first of them: a
                    // connection nothing is sent on would be closed by the
                    // server as a half-sent request.
                    if let Some(first) = queued.next()
                        && let Err(then) =
                            endpoint.submit_on(&mux, first.rpc, &first.payload, first.then)
                    {
                        endpoint.send_shared(first.rpc, first.payload, then);
                    }
                    for call in queued {
                        endpoint.send_shared(call.rpc, call.payload, call.then);
                    }
                }
                Err(error) => {
                    for call in queued {
                        (call.then)(Err(error.clone()));
                    }
                }
            }
        });
    }

    /// One JSON call on a connection of its own.
    async fn call_json(&self, rpc: Method, binary: &[u8]) -> Result<Reply, CallError> {
        let inner = &self.inner;
        let deadline = Instant::now() + wire::client_timeout(rpc);
        let body = json::request(rpc, binary)?;
        let _slot = tokio::time::timeout_at(deadline, inner.serial_slots.acquire())
            .await
            .map_err(|_| CallError::Timeout)?
            .map_err(|_| CallError::Io("endpoint closed".to_owned()))?;
        let pooled = lock(&inner.serial_idle).pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => {
                let conn = tokio::time::timeout_at(
                    deadline,
                    SerialConn::connect(inner.local, inner.target, inner.protocol),
                )
                .await
                .map_err(|_| CallError::Timeout)?
                .map_err(|error| CallError::Connect(error.to_string()))?;
                inner.stats.events.connections_opened.fetch_add(1, Relaxed);
                conn
            }
        };
        let mut request = BytesMut::with_capacity(body.len() + 160);
        wire::encode_json_request(&mut request, &inner.target.to_string(), rpc, &body);
        let started = Instant::now();
        let answer = tokio::time::timeout_at(deadline, conn.exchange(&request))
            .await
            .map_err(|_| CallError::Timeout)??;
        let latency = started.elapsed();
        if conn.is_reusable() {
            lock(&inner.serial_idle).push(conn);
        }
        let body = CallError::from_outcome(answer.outcome)?;
        Ok(Reply {
            answer_bytes: body.len(),
            message: json::answer(rpc, &body)?,
            compression: Compression::None,
            latency,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use tokio::{io::AsyncWriteExt, net::TcpListener};

    use super::*;
    use yadcc_pb as pb;

    use crate::client::fill;

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
        let endpoint = Endpoint::new(addr, None, Wire::Flare, stats.clone());
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
}
