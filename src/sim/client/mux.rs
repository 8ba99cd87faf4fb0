//! One connection carrying many calls at once (flare, http+pb), answers
//! matched by id in whatever order they come.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use tokio::{
    io::AsyncWriteExt,
    net::{
        TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::{mpsc, oneshot},
    task::AbortHandle,
};

use super::{CallError, decode_answer, fill, lock};
use crate::sim::wire::{Outcome, Protocol};

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

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;
    use crate::{
        pb::Method,
        sim::{client::connect, wire},
    };

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
