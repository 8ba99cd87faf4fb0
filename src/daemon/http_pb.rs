//! The daemons' `http+pb` as a daemon connection's [`Framing`]: requests
//! pipelined on one connection, each answered as soon as its call is done,
//! carrying the request's `Rpc-SeqNo`, always with `Content-Length`. Heads
//! are parsed with `httparse`; the checks, status codes, headers and bodies
//! are those of the general HTTP path ([`crate::http::dialect`]), so a call
//! answers the same on both.

use std::net::SocketAddr;

use axum::{
    Router,
    body::Body,
    http::{HeaderMap, HeaderName, HeaderValue, Method as HttpMethod, StatusCode, header},
};
use bytes::{BufMut, Bytes, BytesMut};
use tokio::time::Instant;
use tower::ServiceExt;

use super::{
    After, Framing, Incoming, Request,
    conn::{QueuedAnswer, Reader},
};
use crate::{
    edge::{self, ConnectionBudget},
    grammar,
    http::{
        connection::ConnectionFacts,
        dialect::{self, RPC_SEQ_NO, RouteAnswer, RouteStyle},
        handler,
    },
    pb::RPC_PATH_PREFIX,
    rpc::{
        self,
        error::{ApiError, ErrorKind},
        state::AppState,
    },
};

/// Headers a request may carry at most (the daemons send four).
const MAX_HEADERS: usize = 64;
/// Largest request head accepted.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// The daemons' `http+pb` framing of one connection.
#[derive(Debug)]
pub struct HttpPb {
    /// Serves the requests on the connection that are not daemon calls.
    router: Router,
}

impl HttpPb {
    pub fn new(router: Router) -> Self {
        Self { router }
    }
}

impl Framing for HttpPb {
    /// The request's media type and `Rpc-SeqNo`.
    type Reply = RouteAnswer;

    async fn read_request(
        &mut self,
        reader: &mut Reader,
        state: &AppState,
        peer: SocketAddr,
    ) -> Result<Incoming<RouteAnswer>, String> {
        read_request(reader, state, peer, &self.router).await
    }

    fn answer(reply: RouteAnswer, outcome: Result<rpc::EncodedAnswer, ApiError>) -> QueuedAnswer {
        // Never compressed: only the binary protocol's callers say what they
        // inflate.
        let outcome = outcome.map(|answer| answer.payload);
        let (status, headers, payload) = dialect::answer_parts(outcome, reply.media_type);
        write_answer(status, &headers, reply.seq_no.as_ref(), payload)
    }
}

/// The head of a request for the router.
struct Plain {
    method: HttpMethod,
    uri: String,
    headers: HeaderMap,
}

/// Serves a request that is not a daemon call through the router and
/// writes its answer whole, with `Content-Length`.
async fn route_plain(
    router: &Router,
    plain: Plain,
    body: Bytes,
    peer: SocketAddr,
    budget: &ConnectionBudget,
) -> QueuedAnswer {
    let request = axum::http::Request::builder()
        .method(plain.method)
        .uri(plain.uri)
        .body(Body::from(body));
    let mut request = match request {
        Ok(request) => request,
        Err(error) => {
            let error = ApiError::malformed(format!("unusable request line: {error}"));
            let (status, headers, payload) = dialect::answer_parts(Err(error), "application/json");
            return write_answer(status, &headers, None, payload);
        }
    };
    *request.headers_mut() = plain.headers;
    // Plaintext (TLS is served by hyper); the connection's answers are
    // written in order by its writer, which bounds them itself.
    ConnectionFacts {
        peer,
        budget: budget.clone(),
        queued: None,
        over_tls: false,
        certificate: None,
    }
    .mark(&mut request);
    let response = match router.clone().oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let mut headers = parts.headers;
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::TRANSFER_ENCODING);
    write_answer(parts.status, &headers, None, body)
}

/// A parsed head, owned.
struct Head {
    len: usize,
    method: Result<HttpMethod, String>,
    path: String,
    headers: Result<HeaderMap, String>,
    http10: bool,
}

fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut slots);
    let len = match request.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(error) => return Err(format!("unparsable request head: {error}")),
    };
    let method = HttpMethod::from_bytes(request.method.unwrap_or("").as_bytes())
        .map_err(|_| "bad method".to_owned());
    let mut headers = HeaderMap::with_capacity(request.headers.len());
    let mut bad_header = None;
    for slot in request.headers.iter() {
        match (
            HeaderName::from_bytes(slot.name.as_bytes()),
            HeaderValue::from_bytes(slot.value),
        ) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => bad_header = Some(format!("malformed header {:?}", slot.name)),
        }
    }
    Ok(Some(Head {
        len,
        method,
        path: request.path.unwrap_or("").to_owned(),
        headers: bad_header.map_or(Ok(headers), Err),
        http10: request.version == Some(0),
    }))
}

/// Reads one request: its head within the header-read timeout, then its
/// body within the body-read timeout. A request refused after its head is
/// answered like any failed call, and the connection closed (its body
/// unread).
async fn read_request(
    reader: &mut Reader,
    state: &AppState,
    peer: SocketAddr,
    router: &Router,
) -> Result<Incoming<RouteAnswer>, String> {
    let edge = &state.settings.edge;
    let head_deadline = Instant::now() + edge.header_read_timeout;
    let mut scan = HeadScan::default();
    let head = loop {
        let oversized = reader.buf.len() > MAX_HEAD_BYTES;
        if scan.worth_parsing(&reader.buf) || oversized {
            match parse_head(&reader.buf)? {
                Some(head) => break head,
                None if oversized => return Err("request head too large".to_owned()),
                None => {}
            }
        }
        match tokio::time::timeout_at(head_deadline, reader.read_more()).await {
            Ok(Ok(0)) => return Err("closed mid-head".to_owned()),
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Err(format!("read failed: {error}")),
            Err(_) => return Err("the request head did not arrive in time".to_owned()),
        }
    };
    let headers = head.headers?;
    let http_method = head.method?;
    let close = head.http10
        || headers
            .get(header::CONNECTION)
            .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"close"));
    let then = if close { After::Close } else { After::ReadOn };
    let path = head.path.split('?').next().unwrap_or("");
    let method = match path.strip_prefix(RPC_PATH_PREFIX) {
        Some(full_name) => dialect::resolve_full_name(full_name),
        None => Err(ApiError::new(
            ErrorKind::ServiceNotFound,
            format!(
                "no route for {} {}; RPCs live under {RPC_PATH_PREFIX}",
                edge::echo(http_method.as_str()),
                edge::echo(path)
            ),
        )),
    };
    let checked = handler::check_head(
        state,
        &RouteStyle::HttpPb,
        &http_method,
        method,
        &headers,
        None,
        peer,
    );
    let reply = checked.answer;
    let daemon_call = path.starts_with(RPC_PATH_PREFIX) && reply.seq_no.is_some();
    let plain = (!daemon_call).then(|| Plain {
        method: http_method.clone(),
        uri: head.path.clone(),
        headers: headers.clone(),
    });
    // From here on, a refusal is answered like any failed call, then the
    // connection is closed (its body was not read).
    let refused = |error: ApiError, reply: RouteAnswer| {
        Ok(Incoming::Call(Request {
            call: checked.call.clone(),
            method: Err(error),
            body: Bytes::new(),
            budget: None,
            reply,
            then: After::Drain,
        }))
    };
    if headers.contains_key(header::TRANSFER_ENCODING) {
        let error =
            ApiError::malformed("chunked bodies are not supported here; send Content-Length");
        return refused(error, reply);
    }
    let values = headers.get_all(header::CONTENT_LENGTH);
    let length = match grammar::content_length(values.iter().map(HeaderValue::as_bytes)) {
        Ok(length) => length.unwrap_or(0),
        Err(bad) => return refused(ApiError::malformed(bad.to_string()), reply),
    };
    let limit = state.settings.max_body_bytes;
    if length > limit as u64 {
        let error = ApiError::new(
            ErrorKind::PayloadTooLarge,
            format!("body is larger than the {limit}-byte limit"),
        );
        return refused(error, reply);
    }
    let length = length as usize;
    let Some(budget) = reader.budget.reserve(length) else {
        return refused(rpc::budget_exhausted(), reply);
    };
    let end = head.len + length;
    match tokio::time::timeout(edge.body_read_timeout, reader.fill_to(end)).await {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) | Ok(Err(_)) => return Err("closed mid-body".to_owned()),
        Err(_) => return refused(rpc::body_too_slow(edge.body_read_timeout), reply),
    }
    let body = reader.buf.split_to(end).freeze().slice(head.len..);
    if let Some(plain) = plain {
        // Not a daemon call: a client that also uses this connection for
        // other endpoints. The router answers it, as on any connection.
        let answer = route_plain(router, plain, body, peer, &reader.budget).await;
        drop(budget);
        return Ok(Incoming::Answered { answer, then });
    }
    Ok(Incoming::Call(Request {
        call: checked.call,
        method: checked.method,
        body,
        budget: Some(budget),
        reply,
        then,
    }))
}

/// An HTTP/1.1 answer, with `Content-Length` and the echoed `Rpc-SeqNo`:
/// the head written here, the body as it is.
fn write_answer(
    status: StatusCode,
    headers: &HeaderMap,
    seq_no: Option<&HeaderValue>,
    body: Bytes,
) -> QueuedAnswer {
    let mut head = BytesMut::with_capacity(128);
    head.put_slice(b"HTTP/1.1 ");
    head.put_slice(status.as_str().as_bytes());
    head.put_u8(b' ');
    head.put_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    head.put_slice(b"\r\n");
    let mut line = |name: &[u8], value: &[u8]| {
        head.put_slice(name);
        head.put_slice(b": ");
        head.put_slice(value);
        head.put_slice(b"\r\n");
    };
    if let Some(seq_no) = seq_no {
        line(RPC_SEQ_NO.as_str().as_bytes(), seq_no.as_bytes());
    }
    for (name, value) in headers {
        line(name.as_str().as_bytes(), value.as_bytes());
    }
    line(b"content-length", body.len().to_string().as_bytes());
    head.put_slice(b"\r\n");
    QueuedAnswer::new(head.freeze(), body)
}

/// When a request head still arriving is worth parsing again. Parsing from
/// the start on every read would make a head trickled byte by byte cost
/// quadratic CPU; instead it is parsed when an end of head arrives (`\n\n`
/// or `\n\r\n`: every ending httparse accepts contains one) and whenever
/// the buffer has doubled since the last parse, so a malformed head is still
/// refused early. Each byte is scanned once and the parses add up to linear
/// work.
#[derive(Debug, Default)]
pub struct HeadScan {
    scanned: usize,
    parsed_len: usize,
}

impl HeadScan {
    pub fn worth_parsing(&mut self, buf: &[u8]) -> bool {
        // An ending may start up to two bytes before the new ones.
        let from = self.scanned.saturating_sub(2).min(buf.len());
        let ended = buf[from..].windows(2).enumerate().any(|(at, pair)| {
            pair == b"\n\n" || (pair == b"\n\r" && buf.get(from + at + 2) == Some(&b'\n'))
        });
        self.scanned = buf.len();
        let worth = ended || buf.len() >= 2 * self.parsed_len;
        if worth {
            self.parsed_len = buf.len();
        }
        worth
    }
}

/// Whether a complete request head is a daemon's `http+pb` call: a path under
/// `/rpc/` and an `Rpc-SeqNo` header. The listener asks this of a
/// connection's first request.
pub fn is_daemon_request(head: &[u8]) -> Option<bool> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut slots);
    match request.parse(head) {
        Ok(httparse::Status::Complete(_)) => Some(
            request
                .path
                .is_some_and(|path| path.starts_with(RPC_PATH_PREFIX))
                && request
                    .headers
                    .iter()
                    .any(|slot| slot.name.eq_ignore_ascii_case(RPC_SEQ_NO.as_str())),
        ),
        Ok(httparse::Status::Partial) => None,
        Err(_) => Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `head` `step` bytes at a time the way the read loops do; returns
    /// how many parses ran and the length at which the parse decided.
    fn trickle(head: &[u8], step: usize) -> (usize, Option<usize>) {
        let mut scan = HeadScan::default();
        let mut parses = 0;
        let mut end = 0;
        while end < head.len() {
            end = (end + step).min(head.len());
            if scan.worth_parsing(&head[..end]) {
                parses += 1;
                if is_daemon_request(&head[..end]).is_some() {
                    return (parses, Some(end));
                }
            }
        }
        (parses, None)
    }

    #[test]
    fn a_trickled_head_is_parsed_a_logarithmic_number_of_times() {
        let start = "POST /rpc/yadcc.scheduler.SchedulerService/Heartbeat HTTP/1.1\r\n\
                     Rpc-SeqNo: 1\r\nX-Filler: ";
        for ending in ["\r\n\r\n", "\n\n", "\r\n\n", "\n\r\n"] {
            let head = format!("{start}{}{ending}", "a".repeat(12_000));
            for step in [1, 2, 3, 7] {
                let (parses, decided_at) = trickle(head.as_bytes(), step);
                assert_eq!(decided_at, Some(head.len()), "{ending:?} by {step}");
                // Byte by byte this was one parse per byte (12k here).
                assert!(parses <= 20, "{parses} parses for {ending:?} by {step}");
            }
        }
        // A bare request line is a whole head too.
        let bare = b"GET / HTTP/1.1\r\n\r\n";
        assert_eq!(trickle(bare, 1).1, Some(bare.len()));
    }

    #[test]
    fn a_malformed_trickled_head_is_still_refused_early() {
        let garbage = format!("GET / HTTP/1.1\r\nBad\0Name: x{}", "a".repeat(12_000));
        let error_at = garbage.find('\0').unwrap() + 1;
        let (_, decided_at) = trickle(garbage.as_bytes(), 1);
        let decided_at = decided_at.expect("refused before the end of head");
        assert!(decided_at < 2 * error_at, "refused at {decided_at}");
    }
}
