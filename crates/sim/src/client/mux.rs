//! One connection carrying many calls at once (flare, http+pb), answers
//! matched by id in whatever order they come.
//!
//! Nothing runs per call: the caller writes its request straight onto the
//! socket (behind bytes still queued, if the socket was full; a flusher task
//! drains those), and the connection's one reader task runs each call's
//! continuation with its answer. A call that gets no answer is ended by
//! whoever watches its deadline ([`Mux::expire`]).

use std::{
    collections::HashMap,
    io,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::{Buf, BytesMut};
use tokio::{
    net::{
        TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::oneshot,
    task::AbortHandle,
    time::Instant,
};

use super::{CallError, Reply, fill, lock};
use yadcc_pb::Method;

use crate::{
    stats::{ConnectionLoss, Stats},
    wire::{self, Compression, FlareRequests, Outcome, Wire},
};

/// What happens with a call's answer, or with the error that ended it. It
/// runs on the connection's reader (or wherever the call ended), so it must
/// not block.
pub type Then = Box<dyn FnOnce(Result<Reply, CallError>) + Send>;

/// A read buffer for the usual small answers; one grown for a large answer
/// (a cluster's task list) is given back once that answer is read.
const READ_BUFFER_BYTES: usize = 4 << 10;
const KEPT_READ_BUFFER_BYTES: usize = 16 << 10;

struct Pending {
    started: Instant,
    then: Then,
}

/// Bytes written while the socket was full, in order.
struct Outgoing {
    queued: BytesMut,
    /// A flusher task owns draining `queued`.
    flushing: bool,
    flusher: Option<AbortHandle>,
}

struct Shared {
    write: OwnedWriteHalf,
    outgoing: Mutex<Outgoing>,
    pending: Mutex<HashMap<u64, Pending>>,
    /// `pending.len()`, read without the lock by whoever picks a connection.
    in_flight: AtomicUsize,
    /// When the last call was sent (or the connection opened), as
    /// milliseconds since `opened`.
    last_sent_ms: AtomicU64,
    opened: Instant,
    broken: AtomicBool,
    /// Where a loss with calls waiting is recorded.
    stats: Arc<Stats>,
    next_id: AtomicU64,
    protocol: Wire,
    requests: Arc<FlareRequests>,
}

impl Shared {
    /// Registers call `id`; the only way into `pending`.
    fn insert(&self, id: u64, call: Pending) {
        let mut pending = lock(&self.pending);
        pending.insert(id, call);
        self.in_flight.store(pending.len(), Relaxed);
    }

    /// Takes call `id` out, if it is still waiting; the only way out of
    /// `pending` but for [`Shared::fail_all`].
    fn remove(&self, id: u64) -> Option<Pending> {
        let mut pending = lock(&self.pending);
        let call = pending.remove(&id);
        self.in_flight.store(pending.len(), Relaxed);
        call
    }

    /// The connection is done: every call still waiting fails with `error`.
    fn fail_all(&self, error: &CallError) {
        self.broken.store(true, Relaxed);
        let waiting: Vec<Pending> = {
            let mut pending = lock(&self.pending);
            self.in_flight.store(0, Relaxed);
            pending.drain().map(|(_, call)| call).collect()
        };
        if !waiting.is_empty() {
            self.stats.record_connection_loss(ConnectionLoss {
                opened: self.opened.into_std(),
                lost: std::time::Instant::now(),
                calls: waiting.len(),
            });
        }
        for call in waiting {
            (call.then)(Err(error.clone()));
        }
    }

    /// Ends call `id` with `result`, if it is still waiting.
    fn finish(&self, id: u64, result: impl FnOnce(Duration) -> Result<Reply, CallError>) {
        if let Some(call) = self.remove(id) {
            (call.then)(result(call.started.elapsed()));
        }
    }

    /// Writes what is queued; true when all of it went out.
    fn write_queued(&self, outgoing: &mut Outgoing) -> io::Result<bool> {
        while !outgoing.queued.is_empty() {
            match self.write.try_write(&outgoing.queued) {
                Ok(written) => outgoing.queued.advance(written),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(error) => return Err(error),
            }
        }
        Ok(true)
    }
}

/// One connection carrying many calls at once (flare, http+pb).
pub struct Mux {
    shared: Arc<Shared>,
    reader: AbortHandle,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux")
            .field("protocol", &self.shared.protocol)
            .field("in_flight", &self.in_flight())
            .field("broken", &self.is_broken())
            .finish()
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        self.reader.abort();
        if let Some(flusher) = lock(&self.shared.outgoing).flusher.take() {
            flusher.abort();
        }
    }
}

impl Mux {
    /// Starts the reader of `stream`; flare requests are framed by `requests`.
    pub fn start(
        stream: TcpStream,
        protocol: Wire,
        requests: Arc<FlareRequests>,
        stats: Arc<Stats>,
    ) -> Mux {
        let (read, write) = stream.into_split();
        let shared = Arc::new(Shared {
            write,
            outgoing: Mutex::new(Outgoing {
                queued: BytesMut::new(),
                flushing: false,
                flusher: None,
            }),
            pending: Mutex::default(),
            in_flight: AtomicUsize::new(0),
            last_sent_ms: AtomicU64::new(0),
            opened: Instant::now(),
            broken: AtomicBool::new(false),
            stats,
            next_id: AtomicU64::new(1),
            protocol,
            requests,
        });
        let reader = tokio::spawn(read_loop(read, shared.clone())).abort_handle();
        Mux { shared, reader }
    }

    pub fn is_broken(&self) -> bool {
        self.shared.broken.load(Relaxed)
    }

    /// Calls in flight on this connection.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Relaxed)
    }

    /// When the last call was sent on it (or it opened).
    pub fn last_sent(&self) -> Instant {
        let shared = &self.shared;
        shared.opened + Duration::from_millis(shared.last_sent_ms.load(Relaxed))
    }

    /// Sends a call of `rpc` carrying `payload` (the encoded request
    /// message); `then` runs with its answer, or with the error that ends the
    /// connection. Returns the call's id, for [`Mux::expire`]; gives `then`
    /// back if the connection is already broken (nothing was sent).
    pub fn submit(&self, rpc: Method, payload: &[u8], then: Then) -> Result<u64, Then> {
        let shared = &self.shared;
        let id = shared.next_id.fetch_add(1, Relaxed);
        let mut outgoing = lock(&shared.outgoing);
        if self.is_broken() {
            return Err(then);
        }
        let started = Instant::now();
        let since_opened = started.duration_since(shared.opened).as_millis() as u64;
        shared.last_sent_ms.store(since_opened, Relaxed);
        // Registered before a byte is written, so the fastest answer finds it.
        shared.insert(id, Pending { started, then });
        if self.is_broken() {
            // The reader failed every call just now; this one, unless it
            // was failed with them, goes back to the caller.
            return match shared.remove(id) {
                Some(call) => Err(call.then),
                None => Ok(id),
            };
        }
        match shared.protocol {
            Wire::Flare => shared
                .requests
                .encode(&mut outgoing.queued, id, rpc, payload),
            Wire::HttpPb | Wire::Json => wire::encode_http_pb_request(
                &mut outgoing.queued,
                id,
                rpc,
                wire::client_timeout(rpc),
                payload,
            ),
        }
        if outgoing.flushing {
            return Ok(id);
        }
        match shared.write_queued(&mut outgoing) {
            Ok(true) => {}
            Ok(false) => {
                outgoing.flushing = true;
                outgoing.flusher = Some(tokio::spawn(flush(shared.clone())).abort_handle());
            }
            Err(error) => {
                drop(outgoing);
                shared.fail_all(&CallError::Io(error.to_string()));
            }
        }
        Ok(id)
    }

    /// Ends call `id` with [`CallError::Timeout`] if it is still unanswered; a
    /// later answer is dropped, as daemons do.
    pub fn expire(&self, id: u64) {
        self.shared.finish(id, |_| Err(CallError::Timeout));
    }

    /// One call, awaited: its answer, or an error after at most `timeout`.
    pub async fn call(
        &self,
        rpc: Method,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Reply, CallError> {
        let (sender, receiver) = oneshot::channel();
        let then: Then = Box::new(move |result| {
            let _ = sender.send(result);
        });
        let Ok(id) = self.submit(rpc, payload, then) else {
            return Err(CallError::Io("connection closed".to_owned()));
        };
        match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(CallError::Io("connection closed".to_owned())),
            Err(_) => {
                self.expire(id);
                Err(CallError::Timeout)
            }
        }
    }
}

/// Drains what was queued while the socket was full.
async fn flush(shared: Arc<Shared>) {
    loop {
        let writable = shared.write.writable().await;
        let mut outgoing = lock(&shared.outgoing);
        let written = writable.and_then(|()| shared.write_queued(&mut outgoing));
        match written {
            Ok(false) => continue,
            Ok(true) => {
                outgoing.flushing = false;
                outgoing.flusher = None;
                return;
            }
            Err(error) => {
                drop(outgoing);
                shared.fail_all(&CallError::Io(error.to_string()));
                return;
            }
        }
    }
}

async fn read_loop(mut read: OwnedReadHalf, shared: Arc<Shared>) {
    let mut buffer = BytesMut::with_capacity(READ_BUFFER_BYTES);
    let error = 'connection: loop {
        loop {
            match take_answer(shared.protocol, &mut buffer) {
                Ok(Some(answer)) => {
                    let Some(id) = answer.id else {
                        // A daemon drops such an answer and its call times
                        // out; failing the connection says why at once.
                        break 'connection CallError::Protocol(
                            "answer without Rpc-SeqNo".to_owned(),
                        );
                    };
                    let close = answer.close;
                    shared.finish(id, move |latency| {
                        answer.result.map(|(message, compression)| Reply {
                            message,
                            compression,
                            answer_bytes: answer.bytes,
                            latency,
                        })
                    });
                    if close {
                        break 'connection CallError::Io(
                            "the server closed the connection".to_owned(),
                        );
                    }
                }
                Ok(None) => break,
                Err(error) => break 'connection error,
            }
        }
        if buffer.is_empty() && buffer.capacity() > KEPT_READ_BUFFER_BYTES {
            buffer = BytesMut::with_capacity(READ_BUFFER_BYTES);
        }
        if let Err(error) = fill(&mut read, &mut buffer).await {
            break CallError::Io(error.to_string());
        }
    };
    shared.fail_all(&error);
}

/// One answer taken off the stream, before it meets its call.
struct Taken {
    id: Option<u64>,
    result: Result<(bytes::Bytes, Compression), CallError>,
    /// Bytes of the whole answer on the wire.
    bytes: usize,
    close: bool,
}

fn take_answer(protocol: Wire, buffer: &mut BytesMut) -> Result<Option<Taken>, CallError> {
    let before = buffer.len();
    match protocol {
        Wire::Flare => {
            let Some(response) = wire::decode_flare_response(buffer)? else {
                return Ok(None);
            };
            let result = match response.status() {
                0 => Ok((response.payload.clone(), response.compression)),
                code => Err(CallError::Rpc {
                    code,
                    description: response.description().to_owned(),
                }),
            };
            Ok(Some(Taken {
                id: Some(response.meta.correlation_id),
                result,
                bytes: response.frame.len(),
                close: false,
            }))
        }
        Wire::HttpPb | Wire::Json => {
            let Some(answer) = wire::decode_http_answer(buffer)? else {
                return Ok(None);
            };
            let result = match answer.outcome {
                Outcome::Ok(body) => Ok((body, Compression::None)),
                outcome => CallError::from_outcome(outcome).map(|body| (body, Compression::None)),
            };
            Ok(Some(Taken {
                id: answer.id,
                result,
                bytes: before - buffer.len(),
                close: answer.close,
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tokio::{io::AsyncWriteExt, net::TcpListener};

    use super::*;
    use crate::{client::connect, wire::DAEMON_ACCEPTABLE_COMPRESSION};

    async fn connected(addr: std::net::SocketAddr, protocol: Wire) -> Mux {
        let requests = Arc::new(FlareRequests::new(DAEMON_ACCEPTABLE_COMPRESSION));
        let stats = Arc::new(Stats::default());
        Mux::start(
            connect(None, addr).await.unwrap(),
            protocol,
            requests,
            stats,
        )
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
        let mux = connected(addr, Wire::HttpPb).await;
        let timeout = Duration::from_secs(5);
        let (first, second) = tokio::join!(
            mux.call(Method::WaitForStartingTask, b"", timeout),
            mux.call(Method::Heartbeat, b"", timeout),
        );
        let (first, second) = (first.unwrap(), second.unwrap());
        assert_eq!(first.message, Bytes::from_static(b"first!"));
        assert_eq!(second.message, Bytes::from_static(b"second"));
        assert!(first.answer_bytes > first.message.len());
        server.await.unwrap();
        let after = mux.call(Method::GetConfig, b"", timeout).await;
        assert!(matches!(after, Err(CallError::Io(_))), "{after:?}");
        assert!(mux.is_broken());
        assert_eq!(mux.in_flight(), 0);
    }

    /// A silent server: the call ends at its timeout and leaves nothing
    /// behind; an expired call's continuation runs once, with the timeout.
    #[tokio::test]
    async fn unanswered_calls_time_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mux = connected(addr, Wire::Flare).await;
        let _accepted = listener.accept().await.unwrap();
        let result = mux
            .call(Method::Heartbeat, b"", Duration::from_millis(50))
            .await;
        assert!(matches!(result, Err(CallError::Timeout)), "{result:?}");
        assert_eq!(mux.in_flight(), 0);
        assert!(!mux.is_broken());

        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        let then: Then = Box::new(move |result| {
            let _ = sender.send(result);
        });
        let Ok(id) = mux.submit(Method::GetConfig, b"", then) else {
            panic!("the connection is up");
        };
        assert_eq!(mux.in_flight(), 1);
        mux.expire(id);
        mux.expire(id);
        assert!(matches!(
            receiver.recv().await,
            Some(Err(CallError::Timeout))
        ));
        assert!(receiver.recv().await.is_none(), "ran once");
    }

    /// Requests far larger than the socket buffers: the ones written while
    /// the socket is full are queued and go out whole and in order.
    #[tokio::test]
    async fn requests_written_while_the_socket_is_full_go_out_whole_and_in_order() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mux = connected(addr, Wire::Flare).await;
        let (mut server, _) = listener.accept().await.unwrap();
        let payloads: Vec<Vec<u8>> = (0..4u8).map(|n| vec![n; 3 << 20]).collect();
        for payload in &payloads {
            assert!(
                mux.submit(Method::FreeTask, payload, Box::new(|_| {}))
                    .is_ok()
            );
        }
        assert!(lock(&mux.shared.outgoing).flushing, "the socket filled up");
        for (index, payload) in payloads.iter().enumerate() {
            let mut header = [0u8; 16];
            server.read_exact(&mut header).await.unwrap();
            assert_eq!(&header[..4], b"CPRF");
            let size = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
            let mut meta = vec![0; size(4) as usize];
            server.read_exact(&mut meta).await.unwrap();
            let mut body = vec![0; size(8) as usize];
            server.read_exact(&mut body).await.unwrap();
            assert_eq!(body, *payload, "request {index}");
        }
        assert_eq!(mux.in_flight(), 4);
        assert!(!lock(&mux.shared.outgoing).flushing, "drained");
    }
}
