//! How a simulated daemon reaches the scheduler, the way a stock one does:
//! one [`Endpoint`] per machine, shared by its servant and delegate roles,
//! with a pool of at most two connections. On `flare://` and `http+pb` every
//! connection carries many calls at once and answers are matched by id
//! ([`Mux`]); each call has the daemon's own client timeout
//! ([`wire::client_timeout`]), which is also sent as its deadline. A broken
//! connection fails the calls on it and is replaced by the next call. JSON
//! goes as a script sends it: one call at a time per connection
//! ([`SerialConn`]), which is also the raw connection the integration tests
//! write their requests on and read whole answers from.
//!
//! A call is either awaited ([`Endpoint::call`]) or given a continuation
//! ([`Endpoint::send`], what the simulated cluster uses): the continuation
//! runs on the connection's reader with the [`Reply`], so thousands of
//! machines need no task per call. [`settle`] records a finished call in the
//! [`Stats`] and decodes its answer.

mod endpoint;
mod json;
mod mux;
mod serial;

use std::{
    fmt, io,
    net::{IpAddr, SocketAddr},
    sync::{Mutex, MutexGuard, PoisonError},
};

use bytes::{Bytes, BytesMut};
use tokio::{
    io::AsyncReadExt,
    net::{TcpSocket, TcpStream},
};

pub use self::{
    endpoint::{DAEMON_MAX_CONNECTIONS, Deadlines, Endpoint, Expiry},
    mux::{Mux, Then},
    serial::SerialConn,
};
use super::{
    stats::{Call, Stats},
    wire::{self, Compression, Outcome, StreamAnswer, StreamError, Wire},
};
use yadcc_pb::{self as pb, Method};

/// A successful answer as it came off the wire.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The response message as it came: compressed if `compression` says so.
    pub message: Bytes,
    pub compression: Compression,
    /// The whole answer on the wire: frame (or HTTP head) and message.
    pub answer_bytes: usize,
    /// From writing the request to reading the whole answer.
    pub latency: std::time::Duration,
}

impl Reply {
    /// The message, inflated if it came compressed.
    pub fn inflated(&self) -> Result<Bytes, CallError> {
        self.compression
            .inflate_message(&self.message)
            .map_err(CallError::Decode)
    }
}

/// Records a finished call of `rpc` (success with its latency and bytes, no
/// quota, or an error by kind, a message that does not decode included) and
/// decodes its answer.
pub fn settle<R: prost::Message + Default>(
    stats: &Stats,
    rpc: Method,
    result: Result<Reply, CallError>,
) -> Result<R, CallError> {
    let decoded = result.and_then(|reply| {
        let message = reply.inflated()?;
        let answer =
            R::decode(message.as_ref()).map_err(|error| CallError::Decode(error.to_string()))?;
        Ok((answer, reply, message.len()))
    });
    match decoded {
        Ok((answer, reply, message_bytes)) => {
            record_reply(stats, rpc, &reply, message_bytes);
            Ok(answer)
        }
        Err(error) => {
            record_failure(stats, rpc, &error);
            Err(error)
        }
    }
}

/// Records a successful call whose message is `message_bytes` long inflated.
pub fn record_reply(stats: &Stats, rpc: Method, reply: &Reply, message_bytes: usize) {
    let call = Call::Rpc(rpc);
    stats.record_ok(call, reply.latency);
    stats.record_bytes(
        call,
        reply.answer_bytes,
        message_bytes,
        reply.compression != Compression::None,
    );
}

/// Records a failed call: no quota (a busy cluster, not an error) or an
/// error by kind.
pub fn record_failure(stats: &Stats, rpc: Method, error: &CallError) {
    if error.is_no_quota() {
        stats.record_no_quota(Call::Rpc(rpc));
    } else {
        stats.record_error(Call::Rpc(rpc), &error.kind());
    }
}

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

    pub(crate) fn from_outcome(outcome: Outcome) -> Result<Bytes, CallError> {
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

impl From<StreamError> for CallError {
    fn from(error: StreamError) -> CallError {
        CallError::Protocol(error.to_string())
    }
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
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
fn decode_answer(
    protocol: Wire,
    buffer: &mut BytesMut,
) -> Result<Option<StreamAnswer>, StreamError> {
    match protocol {
        Wire::Flare => wire::decode_flare_answer(buffer),
        Wire::HttpPb | Wire::Json => wire::decode_http_answer(buffer),
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

#[cfg(test)]
mod tests {
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
}
