//! The daemons' connections, served the way their framework's server does:
//! every call on a connection is answered as soon as it is done, matched by
//! id, and calls that wait (long polls) wait concurrently, so a long poll
//! never delays a heartbeat.
//!
//! One connection loop ([`serve`]) for both daemon protocols; each is a
//! [`Framing`], which only reads requests and writes answers:
//!
//! - [`flare`]: the binary protocol (`flare://`), frames starting `CPRF`
//!   with a proto2 `RpcMeta` ([`flare::frame`]: the bytes).
//! - [`http_pb`]: the daemons' `http+pb` (requests carrying `Rpc-SeqNo`),
//!   answered out of order with `Rpc-SeqNo` echoed.
//! - [`conn`]: the reader, the answers' way to the socket ([`QueuedAnswer`]: a
//!   head and a payload shared by every caller), calls in flight.
//!
//! The rules are the loop's, the same for both: which calls get a task, the
//! "overloaded" answer at the cap of calls in flight, no new call read while
//! the queued answers exceed their bound ([`crate::edge::answer_queue_bound`]),
//! closing after an answer, idle time, stalled writers (in `conn`) and
//! shutdown. Every call ends in [`crate::rpc::call`] like every other
//! protocol's.

pub mod conn;
pub mod flare;
pub mod http_pb;

use std::{
    future::ready,
    net::SocketAddr,
    sync::atomic::{AtomicU64, Ordering},
};

use bytes::{Bytes, BytesMut};
use tokio::{net::TcpStream, sync::watch};

pub use self::conn::QueuedAnswer;
use self::conn::{Connection, Next, Reader};
use crate::{
    edge::{ConnectionBudget, MAX_DROPPED_IN_A_ROW, Proof, Reservation},
    pb::Method,
    rpc::{
        self,
        error::{ApiError, ErrorKind},
        state::AppState,
    },
};

/// Target of this module's diagnostics (closed connections and why).
const LOG: &str = "yadcc_scheduler::daemon";

/// How one daemon protocol reads requests off its connection and writes
/// their answers. A framing is made per connection, so what it learns about
/// its peer (what the peer accepts, who it is) may live in it.
pub trait Framing: Send + 'static {
    /// What an answer needs from its request (a correlation id, a sequence
    /// number and media type), carried to the task that answers it.
    type Reply: Send + 'static;

    /// Reads the next request, head and body, with its bytes already
    /// buffered or arriving. `Err` closes the connection without an answer:
    /// after a request it cannot read, the stream cannot be trusted.
    fn read_request(
        &mut self,
        reader: &mut Reader,
        state: &AppState,
        peer: SocketAddr,
    ) -> impl Future<Output = Result<Incoming<Self::Reply>, String>> + Send;

    /// The answer to a call: the framing's head and the payload, as it is
    /// (never copied: it may be shared by every caller).
    fn answer(reply: Self::Reply, outcome: Result<rpc::EncodedAnswer, ApiError>) -> QueuedAnswer;
}

/// What [`Framing::read_request`] read.
pub enum Incoming<R> {
    /// A call for the scheduler.
    Call(Request<R>),
    /// A request the framing answered itself (`http+pb`: one for another
    /// endpoint, which the router served).
    Answered { answer: QueuedAnswer, then: After },
    /// A message the framing read and dropped, unanswered, as the daemons'
    /// framework drops it (`flare`: a frame without `request_meta`).
    Dropped,
}

/// One call as a daemon framing read it.
pub struct Request<R> {
    pub call: rpc::Call,
    /// The method, or the framing's refusal of the request.
    pub method: Result<Method, ApiError>,
    pub body: Bytes,
    /// The body's share of the budget for buffered bodies, given back once
    /// the call is answered.
    pub budget: Option<Reservation>,
    pub reply: R,
    pub then: After,
}

/// What the connection does once a request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Reads the next request.
    ReadOn,
    /// Closes: no request follows (`Connection: close`, HTTP/1.0).
    Close,
    /// Closes, the request's body unread: what the client still sends is
    /// read and dropped for a moment, so that closing does not reset the
    /// connection (and destroy the answer) while it is still sending.
    Drain,
}

/// Numbers daemon connections, for [`rpc::Call::connection`].
static CONNECTIONS: AtomicU64 = AtomicU64::new(1);

/// Serves one daemon connection with `framing`. `already_read` holds the
/// bytes the listener read to recognise the protocol; `stop` turns true when
/// the server stops. Every call on it names the connection: a daemon is its
/// connection when callers take turns for quota (and under the waiter cap),
/// so daemons behind one NAT address are told apart; the grants they receive
/// still belong to their address and token. `proof` is the connection's
/// standing, marked by its first call that proves a token.
pub async fn serve<F: Framing>(
    mut framing: F,
    state: AppState,
    stream: TcpStream,
    peer: SocketAddr,
    already_read: BytesMut,
    stop: watch::Receiver<bool>,
    proof: Proof,
) {
    let edge = state.settings.edge.clone();
    let connection_id = CONNECTIONS.fetch_add(1, Ordering::Relaxed);
    let budget = ConnectionBudget::new(&state.body_budget, peer.ip(), proof.clone());
    let mut connection = Connection::for_daemon(stream, already_read, &edge, budget, stop);
    let mut drain = false;
    loop {
        match connection.next_request().await {
            Next::Request => {}
            Next::Idle | Next::Stopping => break,
            Next::Closed => return,
        }
        let request = match framing
            .read_request(&mut connection.reader, &state, peer)
            .await
        {
            Ok(Incoming::Call(mut request)) => {
                connection.useful();
                request.call.connection = Some(connection_id);
                request.call.proof = Some(proof.clone());
                request
            }
            Ok(Incoming::Dropped) => {
                // Not activity: a connection sending only these is idle,
                // and one sending a burst of them is closed at once.
                if connection.dropped() {
                    tracing::debug!(
                        target: LOG,
                        %peer,
                        "closing the connection: {MAX_DROPPED_IN_A_ROW} dropped frames in a row"
                    );
                    connection.abandon();
                    return;
                }
                continue;
            }
            Ok(Incoming::Answered { answer, then }) => {
                connection.useful();
                if connection.answers.send(answer).await.is_err() {
                    connection.abandon();
                    return;
                }
                if then != After::ReadOn {
                    break;
                }
                continue;
            }
            Err(reason) => {
                tracing::debug!(target: LOG, %peer, "closing the connection: {reason}");
                connection.abandon();
                return;
            }
        };
        let then = request.then;
        drain |= then == After::Drain;
        let answered_here = if !may_wait(&request.method) {
            Some(answer::<F>(&state, request).await)
        } else if let Some(slot) = connection.call_slot() {
            let state = state.clone();
            let answers = connection.answers.clone();
            connection.spawn_call(slot, async move {
                let _ = answers.send(answer::<F>(&state, request).await).await;
            });
            None
        } else {
            let overloaded = ApiError::new(
                ErrorKind::Overloaded,
                "too many calls in flight on this connection",
            );
            let refused = Request {
                method: Err(overloaded),
                body: Bytes::new(),
                ..request
            };
            Some(answer::<F>(&state, refused).await)
        };
        if let Some(answer) = answered_here
            && connection.answers.send(answer).await.is_err()
        {
            // The peer read nothing for the write timeout, or the socket
            // failed: its calls' answers have nowhere to go.
            connection.abandon();
            return;
        }
        if then != After::ReadOn {
            break;
        }
    }
    let reader = connection.finish().await;
    if drain {
        reader.linger().await;
    }
}

/// Whether a call may wait for something other than the CPU (a long poll
/// waiting for quota). Only such calls get a task of their own; every other
/// call is answered on the connection's reader before it reads on, which
/// saves a task and a hand-over per call and delays nothing that a task
/// would not.
fn may_wait(method: &Result<Method, ApiError>) -> bool {
    matches!(method, Ok(Method::WaitForStartingTask))
}

/// Runs a call and writes its answer in the framing's form; the body's
/// share of the budget is given back once the call is answered.
async fn answer<F: Framing>(state: &AppState, request: Request<F::Reply>) -> QueuedAnswer {
    let Request {
        call,
        method,
        body,
        budget,
        reply,
        then: _,
    } = request;
    let outcome = rpc::call(state, &call, method, ready(Ok(body))).await;
    drop(budget);
    F::answer(reply, outcome)
}
