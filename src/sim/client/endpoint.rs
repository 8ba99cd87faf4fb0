//! How one simulated machine reaches the scheduler: its own source address,
//! its protocol, a pool of at most two shared connections (or, for JSON, a
//! connection per call in flight), and where to record what happened.

use std::{
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, atomic::Ordering::Relaxed},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use serde::{Serialize, de::DeserializeOwned};
use tokio::{sync::Semaphore, time::Instant};

use super::{CallError, Mux, SerialConn, connect, lock};
use crate::{
    pb::Method,
    sim::{
        stats::{Call, Stats},
        wire::{self, Protocol},
    },
};

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
    use std::sync::atomic::AtomicU64;

    use tokio::{io::AsyncWriteExt, net::TcpListener};

    use super::*;
    use crate::{pb, sim::client::fill};

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
}
