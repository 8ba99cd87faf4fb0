//! What the daemons' two protocols share on one connection: a buffered
//! reader with the edge's timeouts, answers written in the order calls finish
//! (by the finishing task when the socket takes them at once, else by the
//! connection's writer task), and the cap on calls in flight. An [`QueuedAnswer`]
//! is a head and a payload written with one vectored write: the payload may
//! be shared by every caller (the encoded `GetRunningTasks` list) and is
//! never copied per caller.

use std::{
    collections::VecDeque,
    io::{self, IoSlice},
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::{Buf, Bytes, BytesMut};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::{Notify, OwnedSemaphorePermit, Semaphore, watch},
    task::{JoinHandle, JoinSet},
    time::{Instant, Sleep},
};

use crate::edge::{
    ConnectionBudget, EdgeSettings, MAX_CALLS_IN_FLIGHT_PER_CONNECTION, MAX_DROPPED_IN_A_ROW,
    answer_queue_bound,
};

/// Read granularity while waiting for a head. A daemon's heartbeat frame is
/// about 1.3 KB, so one read takes a whole call; larger bodies are read to
/// their declared length. Every idle connection keeps about this much
/// buffered, and ten thousand servants at 8 KiB each held ~60 MiB more
/// resident memory in P3 (BENCHMARKS.md) for no speed.
const READ_CHUNK: usize = 2 * 1024;
/// The writer gathers queued answers into one vectored write of at most this
/// many pieces (a head and a payload each).
const WRITE_PIECES: usize = 64;

/// One answer as it goes to the socket: the framing's head (a frame header
/// and meta; a status line and headers) and the payload. The payload may be
/// shared with every other caller of the same answer (the encoded
/// `GetRunningTasks` list): it is written from where it is, never copied into
/// a buffer of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueuedAnswer {
    pub head: Bytes,
    pub payload: Bytes,
}

impl QueuedAnswer {
    pub fn new(head: Bytes, payload: Bytes) -> Self {
        Self { head, payload }
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes on the wire, in one buffer (for tests and diagnostics).
    pub fn to_vec(&self) -> Vec<u8> {
        [&self.head[..], &self.payload[..]].concat()
    }

    /// Drops the first `written` bytes.
    fn advance(&mut self, written: usize) {
        let from_head = written.min(self.head.len());
        self.head.advance(from_head);
        self.payload.advance(written - from_head);
    }

    /// The pieces still to write, as slices for a vectored write.
    fn slices(&self) -> impl Iterator<Item = IoSlice<'_>> {
        [&self.head, &self.payload]
            .into_iter()
            .filter(|piece| !piece.is_empty())
            .map(|piece| IoSlice::new(piece))
    }
}

/// The read side: the socket, what was read from it but not yet used, and
/// the connection's share of the budget for buffered requests.
#[derive(Debug)]
pub struct Reader {
    read: OwnedReadHalf,
    pub buf: BytesMut,
    /// What a request's bytes are reserved from while they are buffered.
    pub budget: ConnectionBudget,
}

impl Reader {
    pub fn new(read: OwnedReadHalf, already_read: BytesMut, budget: ConnectionBudget) -> Self {
        Self {
            read,
            buf: already_read,
            budget,
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
    cap: usize,
}

impl Default for InFlight {
    fn default() -> Self {
        Self::new(MAX_CALLS_IN_FLIGHT_PER_CONNECTION)
    }
}

impl InFlight {
    fn new(cap: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(cap)),
            cap,
        }
    }

    /// A slot for one more call, or None at the cap.
    pub fn start(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.available_permits() == self.cap
    }
}

/// One daemon connection's life, the same for both daemon protocols: read
/// requests, run each call that may wait in its own task (the others on the
/// reader, see [`Connection::spawn_call`]), send answers as calls finish;
/// when the caller leaves, drop its calls; when the server stops or the line
/// idles, let the calls in flight finish and drain.
pub struct Connection {
    pub reader: Reader,
    /// Where calls send their encoded answers, in the order they finish.
    pub answers: AnswerSender,
    writer: WriterTask,
    in_flight: InFlight,
    calls: JoinSet<()>,
    idle_timeout: Duration,
    /// When the connection last read something it served (a call, or a
    /// request the framing answered): what the idle timeout counts from.
    /// Messages the framing drops do not move it.
    useful_at: Instant,
    /// Messages dropped since the last useful one.
    dropped_in_a_row: usize,
    /// Fires at the earliest moment the connection may have idled out. One
    /// timer for the connection's life, moved only when it fires: arming a
    /// fresh one per request cost a timer-wheel insert and removal per call.
    idle: Pin<Box<Sleep>>,
    stop: watch::Receiver<bool>,
    /// Ends when the server starts stopping. Kept for the connection's life,
    /// so waiting for a request does not register a new watcher each time.
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("reader", &self.reader)
            .field("calls", &self.calls.len())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// A daemon connection under the edge's limits: idle for
    /// `idle_timeout`; an answer that makes no progress for
    /// `body_read_timeout` (a daemon that stopped reading) is given up, the
    /// same allowance a request's body gets; requests buffered within
    /// `budget`.
    pub fn for_daemon(
        stream: TcpStream,
        already_read: BytesMut,
        edge: &EdgeSettings,
        budget: ConnectionBudget,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let mut connection = Self::open(
            stream,
            already_read,
            budget,
            edge.idle_timeout,
            edge.body_read_timeout,
            stop,
        );
        connection.in_flight = InFlight::new(edge.max_calls_in_flight_per_connection);
        connection
    }

    /// `already_read`: what the listener read to recognise the protocol;
    /// `stop` turns true when the server stops.
    pub fn open(
        stream: TcpStream,
        already_read: BytesMut,
        budget: ConnectionBudget,
        idle_timeout: Duration,
        write_timeout: Duration,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let (read, write) = stream.into_split();
        let (answers, writer) = spawn_writer(write, write_timeout);
        let mut stop_changes = stop.clone();
        let stopping = Box::pin(async move {
            // A dropped sender means the server is gone: stopping too.
            let _ = stop_changes.wait_for(|stop| *stop).await;
        });
        Self {
            stop,
            stopping,
            reader: Reader::new(read, already_read, budget),
            answers,
            writer: WriterTask(Some(writer)),
            in_flight: InFlight::default(),
            calls: JoinSet::new(),
            idle_timeout,
            useful_at: Instant::now(),
            dropped_in_a_row: 0,
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
        }
    }

    /// The request just read is served: the connection is not idle.
    pub fn useful(&mut self) {
        self.useful_at = Instant::now();
        self.dropped_in_a_row = 0;
    }

    /// The message just read was dropped unanswered; true when that makes
    /// [`MAX_DROPPED_IN_A_ROW`] in a row, and the connection should close.
    pub fn dropped(&mut self) -> bool {
        self.dropped_in_a_row += 1;
        self.dropped_in_a_row >= MAX_DROPPED_IN_A_ROW
    }

    /// Waits for the next request. On [`Next::Closed`] the caller is gone:
    /// its calls' answers have nowhere to go, and a grant made for it would
    /// only wait to expire, so its calls and the writer are stopped here.
    pub async fn next_request(&mut self) -> Next {
        while self.calls.try_join_next().is_some() {}
        let next = match self.wait_for_room().await {
            Some(next) => next,
            None => self.wait_for_request().await,
        };
        if next == Next::Closed {
            self.calls.abort_all();
            self.writer.abort();
        }
        next
    }

    /// While the answers queued exceed their bound, no new call is read:
    /// waits for room. Some(next) when the connection ends instead.
    async fn wait_for_room(&mut self) -> Option<Next> {
        tokio::select! {
            biased;
            room = self.answers.room() => room.err().map(|Broken| Next::Closed),
            () = self.stopping.as_mut() => Some(Next::Stopping),
        }
    }

    /// Waits for the first byte of the next request. The idle timeout only
    /// closes a connection with nothing in flight: a daemon's long poll may
    /// legitimately keep the line quiet.
    async fn wait_for_request(&mut self) -> Next {
        if !self.reader.buf.is_empty() {
            return Next::Request;
        }
        // From the last request served, not the last byte: a peer sending
        // only messages that are dropped idles out like a silent one.
        let quiet_until = self.useful_at + self.idle_timeout;
        loop {
            if *self.stop.borrow() {
                return Next::Stopping;
            }
            // Biased, the read first: the usual wake-up is the next request,
            // answered without polling the other two.
            tokio::select! {
                biased;
                read = self.reader.read_more() => {
                    return match read {
                        Ok(0) | Err(_) => Next::Closed,
                        Ok(_) => Next::Request,
                    };
                }
                () = self.stopping.as_mut() => return Next::Stopping,
                () = self.idle.as_mut() => {
                    let now = Instant::now();
                    if now < quiet_until {
                        self.idle.as_mut().reset(quiet_until);
                    } else if self.in_flight.is_empty() {
                        return Next::Idle;
                    } else {
                        self.idle.as_mut().reset(now + self.idle_timeout);
                    }
                }
            }
        }
    }

    /// A place for one more call, or None at the connection's cap of calls
    /// in flight (the protocol then answers "overloaded" at once).
    pub fn call_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.in_flight.start()
    }

    /// Runs `call` in its own task, holding its place until it is done.
    /// Only for calls that may wait: a call that cannot is cheaper run on the
    /// reader (no task, no hand-over) and delays the next request by no more
    /// than reading it would.
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

    /// The stream cannot be trusted any more, or its answers cannot be
    /// written: close without answering, and stop the calls in flight.
    pub fn abandon(self) {
        // Dropping stops the writer (`WriterTask`) and the calls (`JoinSet`).
    }

    /// Lets the calls in flight finish and their answers go out, then gives
    /// the reader back for whatever the protocol still does with the socket.
    pub async fn finish(self) -> Reader {
        let Self {
            reader,
            answers,
            writer,
            mut calls,
            ..
        } = self;
        while calls.join_next().await.is_some() {}
        answers.outbox.lock().finishing = true;
        answers.outbox.work.notify_one();
        writer.join().await;
        // Every other holder of the write side is gone: close it, so the
        // caller reads the answers and then the end of the stream.
        if let Ok(outbox) = Arc::try_unwrap(answers.outbox) {
            let mut write = outbox.write;
            let _ = write.shutdown().await;
        }
        reader
    }
}

/// Where a connection's answers go, in the order they are sent. The task that
/// finishes a call writes its answer to the socket itself when nothing is
/// queued before it (one non-blocking write, no hand-over to another task);
/// what the socket does not take at once is queued for the connection's
/// writer task, which writes the queue in order, gathered into large writes.
#[derive(Debug, Clone)]
pub struct AnswerSender {
    outbox: Arc<Outbox>,
}

#[derive(Debug)]
struct Outbox {
    write: OwnedWriteHalf,
    queue: Mutex<Queue>,
    /// Wakes the writer task when answers are queued (or the connection finishes).
    work: Notify,
    /// Wakes senders (and the reader) waiting for the queue to shrink under
    /// its bound.
    room: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    answers: VecDeque<QueuedAnswer>,
    /// Bytes of the answers queued or in the writer's hands, not written yet.
    bytes: usize,
    /// The largest answer queued on this connection, for the bound.
    largest: usize,
    /// The writer task owns the socket's write side: answers are queued or
    /// being written, so a new answer must queue behind them.
    writing: bool,
    /// The socket failed, or the caller stopped reading: nothing more is written.
    broken: bool,
    /// No answer follows: the writer ends once the queue is written.
    finishing: bool,
}

impl Outbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `bytes` of queued answers went out: room for more, perhaps.
    fn written(&self, bytes: usize) {
        let mut queue = self.lock();
        queue.bytes = queue.bytes.saturating_sub(bytes);
        if !queue.over_bound() {
            self.room.notify_waiters();
        }
    }

    fn break_off(&self, queue: &mut Queue) {
        queue.broken = true;
        queue.answers.clear();
        queue.bytes = 0;
        self.room.notify_waiters();
        self.work.notify_one();
    }
}

/// The connection can take no more answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broken;

impl AnswerSender {
    /// Sends one answer; first waits while the answers queued exceed the
    /// connection's bound ([`answer_queue_bound`]).
    pub async fn send(&self, mut answer: QueuedAnswer) -> Result<(), Broken> {
        let outbox = &*self.outbox;
        loop {
            let room = outbox.room.notified();
            tokio::pin!(room);
            {
                let mut queue = outbox.lock();
                if queue.broken {
                    return Err(Broken);
                }
                queue.largest = queue.largest.max(answer.len());
                if !queue.writing {
                    let slices: [IoSlice<'_>; 2] =
                        [IoSlice::new(&answer.head), IoSlice::new(&answer.payload)];
                    match outbox.write.try_write_vectored(&slices) {
                        Ok(written) if written == answer.len() => return Ok(()),
                        Ok(written) => answer.advance(written),
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                        Err(_) => {
                            outbox.break_off(&mut queue);
                            return Err(Broken);
                        }
                    }
                    queue.writing = true;
                    queue.bytes += answer.len();
                    queue.answers.push_back(answer);
                    outbox.work.notify_one();
                    return Ok(());
                }
                if !queue.over_bound() {
                    queue.bytes += answer.len();
                    queue.answers.push_back(answer);
                    return Ok(());
                }
                // Registered before the lock is released, so the writer's
                // next "room" cannot be missed.
                room.as_mut().enable();
            }
            room.await;
        }
    }

    /// Waits until the answers queued are within the connection's bound:
    /// the reader takes no new call before (its peer is not reading).
    pub async fn room(&self) -> Result<(), Broken> {
        let outbox = &*self.outbox;
        loop {
            let room = outbox.room.notified();
            tokio::pin!(room);
            {
                let queue = outbox.lock();
                if queue.broken {
                    return Err(Broken);
                }
                if !queue.over_bound() {
                    return Ok(());
                }
                room.as_mut().enable();
            }
            room.await;
        }
    }
}

impl Queue {
    fn over_bound(&self) -> bool {
        self.bytes > answer_queue_bound(self.largest)
    }
}

/// The writer task, stopped when the connection is dropped unfinished (a
/// standby closing the daemon connections it held): it owns the socket's
/// write side, so the socket would otherwise stay open, unserved.
struct WriterTask(Option<JoinHandle<()>>);

impl WriterTask {
    fn abort(&self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }

    /// Waits for it to write what is queued.
    async fn join(mut self) {
        if let Some(task) = self.0.take() {
            let _ = task.await;
        }
    }
}

impl Drop for WriterTask {
    fn drop(&mut self) {
        self.abort();
    }
}

/// Starts the connection's writer task. It writes what senders queued, in
/// order; it ends when the connection finishes (after writing the queue), or
/// when a write makes no progress for `write_timeout` (a client that stops
/// reading).
fn spawn_writer(write: OwnedWriteHalf, write_timeout: Duration) -> (AnswerSender, JoinHandle<()>) {
    let outbox = Arc::new(Outbox {
        write,
        queue: Mutex::new(Queue::default()),
        work: Notify::new(),
        room: Notify::new(),
    });
    let task = tokio::spawn(write_queued(Arc::clone(&outbox), write_timeout));
    (AnswerSender { outbox }, task)
}

async fn write_queued(outbox: Arc<Outbox>, write_timeout: Duration) {
    let mut batch = VecDeque::new();
    loop {
        {
            let mut queue = outbox.lock();
            if queue.broken {
                return;
            }
            while batch.len() < WRITE_PIECES / 2 {
                let Some(answer) = queue.answers.pop_front() else {
                    break;
                };
                batch.push_back(answer);
            }
            if batch.is_empty() {
                queue.writing = false;
                if queue.finishing {
                    return;
                }
            }
        }
        if batch.is_empty() {
            outbox.work.notified().await;
            continue;
        }
        if write_all(&outbox, &mut batch, write_timeout).await.is_err() {
            outbox.break_off(&mut outbox.lock());
            return;
        }
    }
}

/// Writes all of `answers` with vectored writes, counting each write off the
/// queue's bytes; fails when the socket does, or takes nothing for
/// `stall_timeout`.
async fn write_all(
    outbox: &Outbox,
    answers: &mut VecDeque<QueuedAnswer>,
    stall_timeout: Duration,
) -> io::Result<()> {
    let write = &outbox.write;
    while !answers.is_empty() {
        let mut slices = [IoSlice::new(&[]); WRITE_PIECES];
        let mut count = 0;
        for (slot, slice) in slices
            .iter_mut()
            .zip(answers.iter().flat_map(QueuedAnswer::slices))
        {
            *slot = slice;
            count += 1;
        }
        match write.try_write_vectored(&slices[..count]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(mut written) => {
                outbox.written(written);
                while let Some(front) = answers.front_mut() {
                    if written < front.len() {
                        front.advance(written);
                        break;
                    }
                    written -= front.len();
                    answers.pop_front();
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                tokio::time::timeout(stall_timeout, write.writable())
                    .await
                    .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))??;
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
