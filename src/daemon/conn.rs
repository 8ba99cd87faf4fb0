//! What the daemons' two protocols share on one connection: a buffered
//! reader with the edge's timeouts, answers written in the order calls finish
//! (by the finishing task when the socket takes them at once, else by the
//! connection's writer task), and the cap on calls in flight.

use std::{
    collections::VecDeque,
    io,
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

use crate::edge::{EdgeSettings, MAX_CALLS_IN_FLIGHT_PER_CONNECTION};

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
/// requests, run each call that may wait in its own task (the others on the
/// reader, see [`Connection::spawn_call`]), send answers as calls finish;
/// when the caller leaves, drop its calls; when the server stops or the line
/// idles, let the calls in flight finish and drain.
pub struct Connection {
    pub reader: Reader,
    /// Where calls send their encoded answers, in the order they finish.
    pub answers: Answers,
    writer: JoinHandle<()>,
    in_flight: InFlight,
    calls: JoinSet<()>,
    idle_timeout: Duration,
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
    /// same allowance a request's body gets.
    pub fn for_daemon(
        stream: TcpStream,
        already_read: BytesMut,
        edge: &EdgeSettings,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self::open(
            stream,
            already_read,
            edge.idle_timeout,
            edge.body_read_timeout,
            stop,
        )
    }

    /// `already_read`: what the listener read to recognise the protocol;
    /// `stop` turns true when the server stops.
    pub fn open(
        stream: TcpStream,
        already_read: BytesMut,
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
            reader: Reader::new(read, already_read),
            answers,
            writer,
            in_flight: InFlight::default(),
            calls: JoinSet::new(),
            idle_timeout,
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
        }
    }

    /// Waits for the next request. On [`Next::Closed`] the caller is gone:
    /// its calls' answers have nowhere to go, and a grant made for it would
    /// only wait to expire, so its calls and the writer are stopped here.
    pub async fn next_request(&mut self) -> Next {
        while self.calls.try_join_next().is_some() {}
        let next = self.wait_for_request().await;
        if next == Next::Closed {
            self.calls.abort_all();
            self.writer.abort();
        }
        next
    }

    /// Waits for the first byte of the next request. The idle timeout only
    /// closes a connection with nothing in flight: a daemon's long poll may
    /// legitimately keep the line quiet.
    async fn wait_for_request(&mut self) -> Next {
        if !self.reader.buf.is_empty() {
            return Next::Request;
        }
        let quiet_until = Instant::now() + self.idle_timeout;
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

    /// The stream cannot be trusted any more: close without answering.
    pub fn abandon(self) {
        self.writer.abort();
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
        let _ = writer.await;
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
pub struct Answers {
    outbox: Arc<Outbox>,
}

#[derive(Debug)]
struct Outbox {
    write: OwnedWriteHalf,
    queue: Mutex<Queue>,
    /// Wakes the writer task when answers are queued (or the connection finishes).
    work: Notify,
    /// Wakes senders waiting for room in a full queue.
    room: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    answers: VecDeque<Bytes>,
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

    fn break_off(&self, queue: &mut Queue) {
        queue.broken = true;
        queue.answers.clear();
        self.room.notify_waiters();
        self.work.notify_one();
    }
}

/// The connection can take no more answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Broken;

impl Answers {
    /// Sends one answer; waits while [`ANSWER_QUEUE`] answers are queued.
    pub async fn send(&self, mut answer: Bytes) -> Result<(), Broken> {
        let outbox = &*self.outbox;
        loop {
            let room = outbox.room.notified();
            tokio::pin!(room);
            {
                let mut queue = outbox.lock();
                if queue.broken {
                    return Err(Broken);
                }
                if !queue.writing {
                    match outbox.write.try_write(&answer) {
                        Ok(written) if written == answer.len() => return Ok(()),
                        Ok(written) => answer.advance(written),
                        Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                        Err(_) => {
                            outbox.break_off(&mut queue);
                            return Err(Broken);
                        }
                    }
                    queue.writing = true;
                    queue.answers.push_back(answer);
                    outbox.work.notify_one();
                    return Ok(());
                }
                if queue.answers.len() < ANSWER_QUEUE {
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
}

/// Starts the connection's writer task. It writes what senders queued, in
/// order; it ends when the connection finishes (after writing the queue), or
/// when a write makes no progress for `write_timeout` (a client that stops
/// reading).
fn spawn_writer(write: OwnedWriteHalf, write_timeout: Duration) -> (Answers, JoinHandle<()>) {
    let outbox = Arc::new(Outbox {
        write,
        queue: Mutex::new(Queue::default()),
        work: Notify::new(),
        room: Notify::new(),
    });
    let task = tokio::spawn(write_queued(Arc::clone(&outbox), write_timeout));
    (Answers { outbox }, task)
}

async fn write_queued(outbox: Arc<Outbox>, write_timeout: Duration) {
    let mut batch = BytesMut::new();
    loop {
        let next = {
            let mut queue = outbox.lock();
            if queue.broken {
                return;
            }
            match queue.answers.pop_front() {
                None => {
                    queue.writing = false;
                    if queue.finishing {
                        return;
                    }
                    None
                }
                Some(first) if queue.answers.is_empty() => Some(first),
                Some(first) => {
                    batch.extend_from_slice(&first);
                    while batch.len() < WRITE_BATCH {
                        let Some(next) = queue.answers.pop_front() else {
                            break;
                        };
                        batch.extend_from_slice(&next);
                    }
                    Some(batch.split().freeze())
                }
            }
        };
        let Some(bytes) = next else {
            outbox.work.notified().await;
            continue;
        };
        outbox.room.notify_waiters();
        if write_all(&outbox.write, &bytes, write_timeout)
            .await
            .is_err()
        {
            outbox.break_off(&mut outbox.lock());
            return;
        }
    }
}

/// Writes all of `bytes`; fails when the socket does, or takes nothing for
/// `stall_timeout`.
async fn write_all(
    write: &OwnedWriteHalf,
    mut bytes: &[u8],
    stall_timeout: Duration,
) -> io::Result<()> {
    while !bytes.is_empty() {
        match write.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => bytes = &bytes[written..],
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
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    /// A connection served here, and its caller's end of the socket.
    async fn pair(write_timeout: Duration) -> (Connection, TcpStream, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let caller = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (served, _) = listener.accept().await.unwrap();
        let (stop, stop_changes) = watch::channel(false);
        let connection = Connection::open(
            served,
            BytesMut::new(),
            Duration::from_secs(60),
            write_timeout,
            stop_changes,
        );
        (connection, caller, stop)
    }

    #[tokio::test]
    async fn answers_arrive_whole_in_the_order_sent_then_the_end_of_stream() {
        let (connection, mut caller, _stop) = pair(Duration::from_secs(10)).await;
        // Small answers the socket takes at once, and answers larger than its
        // buffer, which the writer task finishes while more queue behind them.
        let answers: Vec<Bytes> = (0..300u32)
            .map(|index| {
                let len = if index % 50 == 7 {
                    3 << 20
                } else {
                    40 + index as usize
                };
                Bytes::from(vec![(index % 251) as u8; len])
            })
            .collect();
        let expected: Vec<u8> = answers.iter().flat_map(|answer| answer.to_vec()).collect();
        let reading = tokio::spawn(async move {
            let mut received = Vec::new();
            caller.read_to_end(&mut received).await.unwrap();
            received
        });
        let senders: Vec<Answers> = (0..3).map(|_| connection.answers.clone()).collect();
        for (index, answer) in answers.into_iter().enumerate() {
            senders[index % 3].send(answer).await.unwrap();
        }
        drop(senders);
        connection.finish().await;
        let received = tokio::time::timeout(Duration::from_secs(30), reading)
            .await
            .expect("the end of stream follows the last answer")
            .unwrap();
        assert_eq!(received.len(), expected.len());
        assert!(received == expected, "answers arrived out of order or torn");
    }

    #[tokio::test]
    async fn a_caller_that_stops_reading_is_cut_off_after_the_write_timeout() {
        let (connection, _caller, _stop) = pair(Duration::from_millis(200)).await;
        let answer = Bytes::from(vec![1u8; 1 << 20]);
        let started = std::time::Instant::now();
        let mut sent = 0;
        let refused = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                if connection.answers.send(answer.clone()).await.is_err() {
                    return;
                }
                sent += 1;
            }
        })
        .await;
        assert!(refused.is_ok(), "still sending after {sent} MiB unread");
        assert!(
            started.elapsed() >= Duration::from_millis(200),
            "cut off only once a write made no progress for the timeout"
        );
        // Nothing more goes out on a connection that was cut off.
        assert_eq!(
            connection.answers.send(Bytes::from_static(b"x")).await,
            Err(Broken)
        );
    }
}
