//! A small HTTP/1.1 client that writes requests byte for byte as the yadcc
//! daemons' `http+pb` client does: `POST /rpc/<service>.<Method>`, no `Host`
//! header, `Rpc-SeqNo`, `Content-Type`, `Content-Length`, keep-alive.
//!
//! Each simulated machine connects from its own loopback address (127.x.y.z),
//! so the scheduler sees distinct peers, exactly as on a real network.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use serde::{Serialize, de::DeserializeOwned};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
    sync::Semaphore,
};

use super::stats::{Call, Stats};
use crate::{http::codec::Encoding, pb, service::Method};

/// Why a call failed.
#[derive(Debug)]
pub enum CallError {
    /// The connection could not be opened.
    Connect(io::Error),
    /// Reading or writing failed, or the peer closed the connection.
    Io(io::Error),
    /// No complete answer within the call's timeout.
    Timeout,
    /// A non-200 answer carrying `Rpc-Error-Code` (a scheduler `Status` or a
    /// framework code below 1000).
    Rpc { status: u16, code: u32 },
    /// A non-200 answer without `Rpc-Error-Code`.
    Http { status: u16 },
    /// The answer's body did not decode.
    Decode(String),
    /// The answer was not well-formed HTTP/1.1 as this client expects it.
    Protocol(String),
}

impl CallError {
    /// A short label for error tallies.
    pub fn kind(&self) -> String {
        match self {
            CallError::Connect(_) => "connect".to_owned(),
            CallError::Io(_) => "io".to_owned(),
            CallError::Timeout => "timeout".to_owned(),
            CallError::Rpc { code, .. } => match pb::Status::try_from(*code as i32) {
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
        matches!(self, CallError::Rpc { code, .. } if *code == pb::Status::NoQuotaAvailable as u32)
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Connect(error) => write!(f, "cannot connect: {error}"),
            CallError::Io(error) => write!(f, "connection failed: {error}"),
            CallError::Timeout => f.write_str("timed out"),
            CallError::Rpc { status, code } => write!(f, "HTTP {status}, Rpc-Error-Code {code}"),
            CallError::Http { status } => write!(f, "HTTP {status} without Rpc-Error-Code"),
            CallError::Decode(error) => write!(f, "cannot decode the answer: {error}"),
            CallError::Protocol(error) => write!(f, "bad HTTP answer: {error}"),
        }
    }
}

impl std::error::Error for CallError {}

/// The request path of an RPC.
pub fn rpc_path(method: Method) -> String {
    format!("/rpc/{}.{}", pb::SCHEDULER_SERVICE, method.name())
}

/// The media type the daemons' framework uses for an encoding.
pub fn media_type(encoding: Encoding) -> &'static str {
    match encoding {
        Encoding::Binary => "application/x-protobuf",
        Encoding::Json => "application/json",
    }
}

/// Encodes a request body.
pub fn encode<T: prost::Message + Serialize>(encoding: Encoding, message: &T) -> Vec<u8> {
    match encoding {
        Encoding::Binary => message.encode_to_vec(),
        // pbjson's Serialize cannot fail for generated messages.
        Encoding::Json => serde_json::to_vec(message).unwrap_or_default(),
    }
}

/// Decodes an answer body.
pub fn decode<T: prost::Message + Default + DeserializeOwned>(
    encoding: Encoding,
    body: &[u8],
) -> Result<T, CallError> {
    match encoding {
        Encoding::Binary => T::decode(body).map_err(|error| CallError::Decode(error.to_string())),
        Encoding::Json => {
            serde_json::from_slice(body).map_err(|error| CallError::Decode(error.to_string()))
        }
    }
}

/// The parts of an answer this client uses. The body is in the connection's
/// buffer; see [`Conn::body`].
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub status: u16,
    pub rpc_error_code: Option<u32>,
    body_start: usize,
    body_end: usize,
    close: bool,
}

/// One keep-alive HTTP/1.1 connection.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    read: Vec<u8>,
    /// Bytes of `read` belonging to answers already returned.
    consumed: usize,
    write: Vec<u8>,
    seq_no: u64,
    closed: bool,
}

/// Opens a connection to `target`, from `local` (port chosen by the kernel)
/// when given.
pub async fn connect(local: Option<IpAddr>, target: SocketAddr) -> io::Result<Conn> {
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
    Ok(Conn {
        stream,
        read: Vec::new(),
        consumed: 0,
        write: Vec::new(),
        seq_no: 0,
        closed: false,
    })
}

/// Position of the blank line ending the head, if present.
fn find_head_end(buffer: &[u8]) -> Option<usize> {
    buffer.windows(4).position(|window| window == b"\r\n\r\n")
}

impl Conn {
    /// False once the server said `Connection: close` or the connection failed.
    pub fn is_reusable(&self) -> bool {
        !self.closed
    }

    /// Sends one request and reads its answer.
    pub async fn exchange(
        &mut self,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<Answer, CallError> {
        let result = self.exchange_inner(path, content_type, body).await;
        if result.is_err() {
            self.closed = true;
        }
        result
    }

    async fn exchange_inner(
        &mut self,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<Answer, CallError> {
        if self.consumed > 0 {
            self.read.drain(..self.consumed);
            self.consumed = 0;
        }
        self.seq_no += 1;
        self.write.clear();
        use std::io::Write as _;
        // Writing into a Vec cannot fail.
        let _ = write!(
            self.write,
            "POST {path} HTTP/1.1\r\nRpc-SeqNo: {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
            self.seq_no,
            body.len()
        );
        self.write.extend_from_slice(body);
        self.stream
            .write_all(&self.write)
            .await
            .map_err(CallError::Io)?;

        let mut searched = 0;
        let head_end = loop {
            if let Some(at) = find_head_end(&self.read[searched..]) {
                break searched + at;
            }
            searched = self.read.len().saturating_sub(3);
            self.fill().await?;
        };
        let answer = self.parse_head(head_end)?;
        while self.read.len() < answer.body_end {
            self.fill().await?;
        }
        self.consumed = answer.body_end;
        if answer.close {
            self.closed = true;
        }
        Ok(answer)
    }

    /// The body of `answer`, valid until the next exchange.
    pub fn body(&self, answer: &Answer) -> &[u8] {
        &self.read[answer.body_start..answer.body_end]
    }

    async fn fill(&mut self) -> Result<(), CallError> {
        if self.read.capacity() - self.read.len() < 1024 {
            self.read.reserve(4096);
        }
        let read = self
            .stream
            .read_buf(&mut self.read)
            .await
            .map_err(CallError::Io)?;
        if read == 0 {
            return Err(CallError::Io(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )));
        }
        Ok(())
    }

    fn parse_head(&self, head_end: usize) -> Result<Answer, CallError> {
        let head = std::str::from_utf8(&self.read[..head_end])
            .map_err(|_| CallError::Protocol("head is not text".to_owned()))?;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or_else(|| CallError::Protocol(format!("status line {status_line:?}")))?;
        let mut length = None;
        let mut rpc_error_code = None;
        let mut close = false;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse::<usize>().ok();
            } else if name.eq_ignore_ascii_case("rpc-error-code") {
                rpc_error_code = value.parse::<u32>().ok();
            } else if name.eq_ignore_ascii_case("connection") {
                close = value.eq_ignore_ascii_case("close");
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                return Err(CallError::Protocol(
                    "chunked answer to a unary call".to_owned(),
                ));
            }
        }
        let length = length
            .ok_or_else(|| CallError::Protocol("answer without Content-Length".to_owned()))?;
        let body_start = head_end + 4;
        Ok(Answer {
            status,
            rpc_error_code,
            body_start,
            body_end: body_start + length,
            close,
        })
    }
}

/// How one simulated machine reaches the scheduler: its own source address, a
/// small pool of keep-alive connections (a delegate long-polls on one while
/// renewing on another), the encoding, and where to record what happened.
#[derive(Debug)]
pub struct Endpoint {
    target: SocketAddr,
    local: Option<IpAddr>,
    encoding: Encoding,
    stats: Arc<Stats>,
    idle: Mutex<Vec<Conn>>,
    slots: Semaphore,
    timeout: Duration,
}

/// Longest a call (other than a long poll, which adds its wait) may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl Endpoint {
    /// At most `max_connections` calls are in flight at once; more wait their turn.
    pub fn new(
        target: SocketAddr,
        local: Option<IpAddr>,
        encoding: Encoding,
        stats: Arc<Stats>,
        max_connections: usize,
    ) -> Endpoint {
        Endpoint {
            target,
            local,
            encoding,
            stats,
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(max_connections.max(1)),
            timeout: CALL_TIMEOUT,
        }
    }

    /// The source address of this machine's connections.
    pub fn local_ip(&self) -> Option<IpAddr> {
        self.local
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Calls `method`, records the outcome in the stats (success latency, no
    /// quota, or error by kind) and returns the decoded answer.
    pub async fn call<Req, Resp>(&self, method: Method, request: &Req) -> Result<Resp, CallError>
    where
        Req: prost::Message + Serialize,
        Resp: prost::Message + Default + DeserializeOwned,
    {
        self.call_with_timeout(method, request, self.timeout).await
    }

    /// [`Endpoint::call`] with an explicit timeout (long polls).
    pub async fn call_with_timeout<Req, Resp>(
        &self,
        method: Method,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError>
    where
        Req: prost::Message + Serialize,
        Resp: prost::Message + Default + DeserializeOwned,
    {
        let body = encode(self.encoding, request);
        let call = Call::Rpc(method);
        let result = self
            .exchange(
                &rpc_path(method),
                media_type(self.encoding),
                &body,
                timeout,
                |body| decode::<Resp>(self.encoding, body),
            )
            .await;
        match &result {
            Ok((_, latency)) => self.stats.record_ok(call, *latency),
            Err(error) if error.is_no_quota() => self.stats.record_no_quota(call),
            Err(error) => self.stats.record_error(call, &error.kind()),
        }
        result.map(|(answer, _)| answer)
    }

    /// One exchange on a pooled connection; `read` turns a 200 body into the
    /// answer. Returns the answer and the latency (request written to answer
    /// read, connection set-up excluded).
    async fn exchange<T>(
        &self,
        path: &str,
        content_type: &str,
        body: &[u8],
        timeout: Duration,
        read: impl FnOnce(&[u8]) -> Result<T, CallError>,
    ) -> Result<(T, Duration), CallError> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| CallError::Protocol("endpoint closed".to_owned()))?;
        let pooled = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => tokio::time::timeout(timeout, connect(self.local, self.target))
                .await
                .map_err(|_| CallError::Timeout)?
                .map_err(CallError::Connect)?,
        };
        let started = Instant::now();
        let answer = tokio::time::timeout(timeout, conn.exchange(path, content_type, body))
            .await
            .map_err(|_| CallError::Timeout)??;
        let latency = started.elapsed();
        let result = if answer.status == 200 {
            read(conn.body(&answer)).map(|value| (value, latency))
        } else if let Some(code) = answer.rpc_error_code {
            Err(CallError::Rpc {
                status: answer.status,
                code,
            })
        } else {
            Err(CallError::Http {
                status: answer.status,
            })
        };
        if conn.is_reusable() {
            self.idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_name_scheduler_statuses() {
        assert_eq!(
            CallError::Rpc {
                status: 500,
                code: 1003
            }
            .kind(),
            "rpc_1003_status_access_denied"
        );
        assert_eq!(
            CallError::Rpc {
                status: 404,
                code: 10
            }
            .kind(),
            "rpc_10"
        );
        assert!(
            CallError::Rpc {
                status: 500,
                code: 1001
            }
            .is_no_quota()
        );
        assert_eq!(CallError::Http { status: 502 }.kind(), "http_502");
    }

    #[test]
    fn paths_and_media_types_are_the_daemons() {
        assert_eq!(
            rpc_path(Method::Heartbeat),
            "/rpc/yadcc.scheduler.SchedulerService.Heartbeat"
        );
        assert_eq!(media_type(Encoding::Json), "application/json");
    }
}
