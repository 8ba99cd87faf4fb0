//! What the daemons' two protocols share on one connection: a buffered
//! reader with the edge's timeouts, one writer task that writes answers in the
//! order calls finish, and the cap on calls in flight.

use std::{io, sync::Arc, time::Duration};

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch},
    task::{JoinHandle, JoinSet},
};

use crate::limits::MAX_CALLS_IN_FLIGHT_PER_CONNECTION;

/// Read granularity while waiting for a head. A daemon's heartbeat frame is
/// about 1.3 KB, so one read takes a whole call; larger bodies are read to
/// their declared length. Every idle connection keeps about this much
/// buffered, and ten thousand servants at 8 KiB each held ~60 MiB more
/// resident memory in P3 (BENCHMARKS.md) for no speed.
const READ_CHUNK: usize = 2 * 1024;
/// Answers waiting for the writer; a caller that stops reading fills this,
/// then the call tasks wait, then the reader stops taking requests.
const ANSWER_QUEUE: usize = 256;
/// The writer gathers queued answers into one write up to this size.
const WRITE_BATCH: usize = 256 * 1024;

/// The read side: the socket and what was read from it but not yet used.
#[derive(Debug)]
pub struct Reader {
    read: OwnedReadHalf,
    pub buf: BytesMut,
}

impl Reader {
    pub fn new(read: OwnedReadHalf, already_read: BytesMut) -> Self {
        Self {
            read,
            buf: already_read,
        }
    }

    /// Reads once; Ok(0) at end of stream.
    pub async fn read_more(&mut self) -> io::Result<usize> {
        self.buf.reserve(READ_CHUNK);
        self.read.read_buf(&mut self.buf).await
    }

    /// Reads until `len` bytes are buffered; false at end of stream first.
    pub async fn fill_to(&mut self, len: usize) -> io::Result<bool> {
        if self.buf.len() < len {
            self.buf.reserve(len - self.buf.len());
        }
        while self.buf.len() < len {
            if self.read.read_buf(&mut self.buf).await? == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// How long, and how many bytes, a refused request's unread rest is drained
/// after its answer, so closing does not reset the connection (and destroy
/// the answer) while the client is still sending.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 8 << 20;

impl Reader {
    /// Reads and drops what the client still sends, for a short while.
    pub async fn linger(mut self) {
        let _ = tokio::time::timeout(LINGER, async {
            let mut drained = 0;
            while drained < LINGER_BYTES {
                self.buf.clear();
                match self.read_more().await {
                    Ok(0) | Err(_) => return,
                    Ok(read) => drained += read,
                }
            }
        })
        .await;
    }
}

/// Why the reader stopped waiting for the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Bytes of a request are buffered.
    Request,
    /// The client closed its side, or the socket failed.
    Closed,
    /// Nothing in flight and no byte for the idle timeout.
    Idle,
    /// The server is shutting down.
    Stopping,
}

/// The calls one connection has in flight.
#[derive(Debug, Clone)]
struct InFlight {
    slots: Arc<Semaphore>,
}

impl Default for InFlight {
    fn default() -> Self {
        Self {
            slots: Arc::new(Semaphore::new(MAX_CALLS_IN_FLIGHT_PER_CONNECTION)),
        }
    }
}

impl InFlight {
    /// A slot for one more call, or None at the cap.
    pub fn start(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.available_permits() == MAX_CALLS_IN_FLIGHT_PER_CONNECTION
    }
}

/// One daemon connection's life, the same for both daemon protocols: read
/// requests, run each call in its own task, let the one writer send answers
/// as calls finish; when the caller leaves, drop its calls; when the server
/// stops or the line idles, let the calls in flight finish and drain.
#[derive(Debug)]
pub struct Connection {
    pub reader: Reader,
    /// Where calls send their encoded answers, in the order they finish.
    pub answers: mpsc::Sender<Bytes>,
    writer: JoinHandle<()>,
    in_flight: InFlight,
    calls: JoinSet<()>,
}

impl Connection {
    /// `already_read`: what the listener read to recognise the protocol.
    pub fn open(stream: TcpStream, already_read: BytesMut, write_timeout: Duration) -> Self {
        let (read, write) = stream.into_split();
        let (answers, writer) = spawn_writer(write, write_timeout);
        Self {
            reader: Reader::new(read, already_read),
            answers,
            writer,
            in_flight: InFlight::default(),
            calls: JoinSet::new(),
        }
    }

    /// Waits for the next request. On [`Next::Closed`] the caller is gone:
    /// its calls' answers have nowhere to go, and a grant made for it would
    /// only wait to expire, so its calls and the writer are stopped here.
    pub async fn next_request(
        &mut self,
        idle_timeout: Duration,
        stop: &mut watch::Receiver<bool>,
    ) -> Next {
        while self.calls.try_join_next().is_some() {}
        let next = next_request(&mut self.reader, idle_timeout, &self.in_flight, stop).await;
        if next == Next::Closed {
            self.calls.abort_all();
            self.writer.abort();
        }
        next
    }

    /// A place for one more call, or None at the connection's cap of calls
    /// in flight (the protocol then answers "overloaded" at once).
    pub fn call_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.in_flight.start()
    }

    /// Runs `call` in its own task, holding its place until it is done.
    pub fn spawn_call(
        &mut self,
        slot: OwnedSemaphorePermit,
        call: impl Future<Output = ()> + Send + 'static,
    ) {
        self.calls.spawn(async move {
            let _slot = slot;
            call.await;
        });
    }

    /// The stream cannot be trusted any more: close without answering.
    pub fn abandon(self) {
        self.writer.abort();
    }

    /// Lets the calls in flight finish and their answers go out (the writer
    /// ends once every call has dropped its sender), then gives the reader
    /// back for whatever the protocol still does with the socket.
    pub async fn finish(self) -> Reader {
        let Self {
            reader,
            answers,
            writer,
            mut calls,
            ..
        } = self;
        drop(answers);
        while calls.join_next().await.is_some() {}
        let _ = writer.await;
        reader
    }
}

/// Waits for the first byte of the next request. The idle timeout only
/// closes a connection with nothing in flight: a daemon's long poll may
/// legitimately keep the line quiet.
async fn next_request(
    reader: &mut Reader,
    idle_timeout: Duration,
    in_flight: &InFlight,
    stop: &mut watch::Receiver<bool>,
) -> Next {
    if !reader.buf.is_empty() {
        return Next::Request;
    }
    loop {
        if *stop.borrow() {
            return Next::Stopping;
        }
        tokio::select! {
            read = reader.read_more() => {
                return match read {
                    Ok(0) | Err(_) => Next::Closed,
                    Ok(_) => Next::Request,
                };
            }
            () = tokio::time::sleep(idle_timeout) => {
                if in_flight.is_empty() {
                    return Next::Idle;
                }
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return Next::Stopping;
                }
            }
        }
    }
}

/// Starts the connection's one writer. Answers are written in the order they
/// are queued, that is as their calls finish. The writer ends when every
/// sender is gone (after writing what was queued), or when a write makes no
/// progress for `write_timeout` (a client that stops reading).
fn spawn_writer(
    mut write: OwnedWriteHalf,
    write_timeout: Duration,
) -> (mpsc::Sender<Bytes>, JoinHandle<()>) {
    let (answers, mut queue) = mpsc::channel::<Bytes>(ANSWER_QUEUE);
    let task = tokio::spawn(async move {
        let mut batch = BytesMut::new();
        while let Some(first) = queue.recv().await {
            let bytes = match queue.try_recv() {
                Err(_) => first,
                Ok(second) => {
                    batch.extend_from_slice(&first);
                    batch.extend_from_slice(&second);
                    while batch.len() < WRITE_BATCH {
                        let Ok(next) = queue.try_recv() else { break };
                        batch.extend_from_slice(&next);
                    }
                    batch.split().freeze()
                }
            };
            match tokio::time::timeout(write_timeout, write.write_all(&bytes)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return,
            }
        }
        let _ = write.shutdown().await;
    });
    (answers, task)
}
