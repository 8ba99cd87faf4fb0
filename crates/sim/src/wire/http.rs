//! `http+pb` and JSON over HTTP/1.1. A daemon's `http+pb` request is
//! `POST /rpc/yadcc.scheduler.SchedulerService.<Method>` with `Rpc-SeqNo`,
//! `Rpc-Timeout`, `Content-Type: application/x-protobuf` and
//! `Content-Length`, nothing else (no `Host`); answers are matched by the
//! echoed `Rpc-SeqNo`. JSON goes with `Host` and `Content-Type:
//! application/json`, one call at a time per connection, as curl does.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use super::{FLARE_MAX_FRAME_BYTES, Outcome, StreamAnswer, StreamError};
use yadcc_pb::Method;

/// Appends an `http+pb` request exactly as a stock daemon writes it.
pub fn encode_http_pb_request(
    out: &mut BytesMut,
    seq_no: u64,
    rpc: Method,
    timeout: Duration,
    payload: &[u8],
) {
    encode_http_pb(out, rpc.rpc_path(), seq_no, Some(timeout), payload);
}

/// Appends an `http+pb` request to any path, with `Rpc-Timeout` only if a
/// timeout is given (a daemon always gives one; a test may not).
pub fn encode_http_pb(
    out: &mut BytesMut,
    path: &str,
    seq_no: u64,
    timeout: Option<Duration>,
    payload: &[u8],
) {
    let mut headers = Vec::with_capacity(3);
    headers.push(("Rpc-SeqNo", seq_no.to_string()));
    if let Some(timeout) = timeout {
        headers.push(("Rpc-Timeout", timeout.as_millis().to_string()));
    }
    headers.push(("Content-Type", "application/x-protobuf".to_owned()));
    encode_http_request(out, path, &headers, payload);
}

/// Appends a JSON request as a plain HTTP client (curl) writes it.
pub fn encode_json_request(out: &mut BytesMut, host: &str, rpc: Method, body: &[u8]) {
    encode_http_request(
        out,
        rpc.rpc_path(),
        &[
            ("Host", host.to_owned()),
            ("Content-Type", "application/json".to_owned()),
        ],
        body,
    );
}

/// Appends `POST path HTTP/1.1`, the headers, `Content-Length` and the body.
pub fn encode_http_request(
    out: &mut BytesMut,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) {
    use std::fmt::Write as _;
    let mut head = String::with_capacity(128);
    // Writing into a String cannot fail.
    let _ = write!(head, "POST {path} HTTP/1.1\r\n");
    for (name, value) in headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    let _ = write!(head, "Content-Length: {}\r\n\r\n", body.len());
    out.reserve(head.len() + body.len());
    out.put_slice(head.as_bytes());
    out.put_slice(body);
}

/// Headers an answer head may have; more is not an answer to a daemon.
const MAX_ANSWER_HEADERS: usize = 32;
/// Largest answer head this client accepts.
const MAX_ANSWER_HEAD_BYTES: usize = 16 << 10;

/// Where one whole HTTP/1.1 answer lies at the front of a buffer.
struct Parsed {
    status: u16,
    head_len: usize,
    body_len: usize,
    close: bool,
}

/// Parses the answer at the front of `buffer`, handing every header to
/// `visit`; `None` until the whole answer (head and body) is there. Daemons
/// need `Content-Length` on every answer (a chunked one is taken as a stream
/// and breaks the call), so one without it is an error.
fn parse_answer(
    buffer: &mut BytesMut,
    mut visit: impl FnMut(&str, &str) -> Result<(), StreamError>,
) -> Result<Option<Parsed>, StreamError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_ANSWER_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buffer) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buffer.len() > MAX_ANSWER_HEAD_BYTES => {
            return Err(StreamError::BadHttp("answer head too large".to_owned()));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(error) => return Err(StreamError::BadHttp(error.to_string())),
    };
    let status = response.code.unwrap_or(0);
    let mut length = None;
    let mut close = response.version == Some(0);
    for header in response.headers.iter() {
        let name = header.name;
        let value = std::str::from_utf8(header.value)
            .map_err(|_| StreamError::BadHttp(format!("header {name} is not text")))?
            .trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(header_number("Content-Length", value)?);
        } else if name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(StreamError::BadHttp(format!(
                "Transfer-Encoding: {value} on a unary answer"
            )));
        }
        visit(name, value)?;
    }
    let body_len =
        length.ok_or_else(|| StreamError::BadHttp("answer without Content-Length".to_owned()))?;
    let whole = head_len.saturating_add(body_len);
    if whole > FLARE_MAX_FRAME_BYTES {
        return Err(StreamError::TooLarge(whole));
    }
    if buffer.len() < whole {
        buffer.reserve(whole - buffer.len());
        return Ok(None);
    }
    Ok(Some(Parsed {
        status,
        head_len,
        body_len,
        close,
    }))
}

/// The number header `name` must carry.
fn header_number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, StreamError> {
    value
        .parse()
        .map_err(|_| StreamError::BadHttp(format!("{name}: {value:?}")))
}

/// Takes one HTTP/1.1 answer off the front of `buffer`, if it is all there,
/// as a daemon reads it: its `Rpc-SeqNo`, `Rpc-Error-Code` and reason.
pub fn decode_http_answer(buffer: &mut BytesMut) -> Result<Option<StreamAnswer>, StreamError> {
    let mut id = None;
    let mut code = None;
    let mut reason = String::new();
    let parsed = parse_answer(buffer, |name, value| {
        if name.eq_ignore_ascii_case("rpc-seqno") {
            id = Some(header_number("Rpc-SeqNo", value)?);
        } else if name.eq_ignore_ascii_case("rpc-error-code") {
            code = Some(header_number("Rpc-Error-Code", value)?);
        } else if name.eq_ignore_ascii_case("rpc-error-reason") {
            value.clone_into(&mut reason);
        }
        Ok(())
    })?;
    let Some(parsed) = parsed else {
        return Ok(None);
    };
    let answer = buffer.split_to(parsed.head_len + parsed.body_len).freeze();
    let outcome = match (parsed.status, code) {
        (200, None | Some(0)) => Outcome::Ok(answer.slice(parsed.head_len..)),
        (_, Some(code)) if code != 0 => Outcome::Failed {
            code,
            description: reason,
        },
        (status, _) => Outcome::Http { status },
    };
    Ok(Some(StreamAnswer {
        id,
        outcome,
        close: parsed.close,
    }))
}

/// One whole HTTP/1.1 answer with every header: what a test inspects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    /// Names and values as sent (values trimmed), in order.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
    /// The server will close the connection after this answer.
    pub close: bool,
}

impl HttpResponse {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// Takes one HTTP/1.1 answer off the front of `buffer`, if it is all there,
/// keeping every header. The same rules as [`decode_http_answer`].
pub fn decode_http_response(buffer: &mut BytesMut) -> Result<Option<HttpResponse>, StreamError> {
    let mut headers = Vec::new();
    let parsed = parse_answer(buffer, |name, value| {
        headers.push((name.to_owned(), value.to_owned()));
        Ok(())
    })?;
    let Some(parsed) = parsed else {
        return Ok(None);
    };
    let mut answer = buffer.split_to(parsed.head_len + parsed.body_len);
    Ok(Some(HttpResponse {
        status: parsed.status,
        headers,
        body: answer.split_off(parsed.head_len).freeze(),
        close: parsed.close,
    }))
}
