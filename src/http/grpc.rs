//! gRPC and gRPC-Web unary, on the Connect path
//! (`/yadcc.scheduler.SchedulerService/<Method>`) and told apart from Connect
//! by `Content-Type`, as connect-go does. They share the dispatcher, the body
//! limit, the deadline rule and the error table of the other dialects; only
//! the framing differs:
//!
//! - gRPC (`application/grpc`, `+proto`, `+json`), over HTTP/2: one
//!   length-prefixed message each way, the outcome in HTTP/2 trailers
//!   (`grpc-status`, percent-encoded `grpc-message`). Errors are
//!   "trailers-only": the status rides in the headers of an empty answer.
//! - gRPC-Web (`application/grpc-web`, `+proto`, `+json`), over HTTP/1.1 or
//!   HTTP/2: the same message frame, then the trailers as a frame of their own
//!   (flag 0x80), so browsers, which cannot read trailers, get the status.
//! - gRPC-Web text (`application/grpc-web-text`, `+proto`): the gRPC-Web body,
//!   base64-encoded both ways.
//!
//! Every gRPC answer has HTTP status 200; the outcome is `grpc-status`, the
//! Connect code of the error table by its gRPC number.

use std::{
    collections::VecDeque,
    convert::Infallible,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::Body,
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header, request::Parts},
    response::Response,
};
use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use hyper::body::{Body as HttpBody, Frame, SizeHint};

use super::handler::{self, Decision, Dialect};
use crate::rpc::{
    error::{ApiError, ErrorKind},
    state::AppState,
};
use crate::{pb::Encoding, protocol::Protocol};

/// The gRPC deadline header: at most 8 digits and a unit (`200m`).
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
/// How the messages of this call are compressed (flag 1 in a frame).
pub const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
/// Which message compressions this server reads.
pub const GRPC_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("grpc-accept-encoding");
/// The call's outcome, a gRPC status number.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The outcome for people, percent-encoded.
pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

/// Length of the prefix of every message: a flags byte and a big-endian u32 length.
const PREFIX_LEN: usize = 5;
/// Flag bit of a compressed message.
const FLAG_COMPRESSED: u8 = 0x01;
/// Flag bit of a gRPC-Web trailer frame.
const FLAG_TRAILERS: u8 = 0x80;

/// The three framings served here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcFlavour {
    /// gRPC over HTTP/2, outcome in trailers.
    Grpc,
    /// gRPC-Web, outcome in a trailer frame.
    Web,
    /// gRPC-Web, the whole body base64-encoded.
    WebText,
}

impl GrpcFlavour {
    /// The protocol its calls are recorded under.
    pub fn protocol(self) -> Protocol {
        match self {
            GrpcFlavour::Grpc => Protocol::Grpc,
            GrpcFlavour::Web | GrpcFlavour::WebText => Protocol::GrpcWeb,
        }
    }
}

/// A request's framing and message encoding, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcFormat {
    pub framing: GrpcFlavour,
    pub encoding: Encoding,
    /// The answer's `Content-Type`: the request's own.
    pub content_type: &'static str,
}

/// The content types served, each with what it selects.
pub const CONTENT_TYPES: &[(&str, GrpcFlavour, Encoding)] = &[
    ("application/grpc", GrpcFlavour::Grpc, Encoding::Binary),
    (
        "application/grpc+proto",
        GrpcFlavour::Grpc,
        Encoding::Binary,
    ),
    ("application/grpc+json", GrpcFlavour::Grpc, Encoding::Json),
    ("application/grpc-web", GrpcFlavour::Web, Encoding::Binary),
    (
        "application/grpc-web+proto",
        GrpcFlavour::Web,
        Encoding::Binary,
    ),
    (
        "application/grpc-web+json",
        GrpcFlavour::Web,
        Encoding::Json,
    ),
    (
        "application/grpc-web-text",
        GrpcFlavour::WebText,
        Encoding::Binary,
    ),
    (
        "application/grpc-web-text+proto",
        GrpcFlavour::WebText,
        Encoding::Binary,
    ),
];

/// The media type of a request, lowercase, without parameters.
fn essence(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next()?.trim().to_ascii_lowercase();
    Some(essence)
}

/// Whether a request on the Connect path is a gRPC or gRPC-Web call. Any
/// `application/grpc*` type is, so that an unsupported sub-type (`+thrift`)
/// is refused in gRPC terms, which its client can read.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    essence(headers).is_some_and(|essence| essence.starts_with("application/grpc"))
}

impl GrpcFormat {
    /// How to answer a request whose type is not served: as gRPC-Web if it
    /// looks like gRPC-Web (a browser cannot read trailers), else gRPC.
    fn fallback(headers: &HeaderMap) -> Self {
        let web =
            essence(headers).is_some_and(|essence| essence.starts_with("application/grpc-web"));
        let (content_type, framing) = if web {
            ("application/grpc-web+proto", GrpcFlavour::Web)
        } else {
            ("application/grpc+proto", GrpcFlavour::Grpc)
        };
        GrpcFormat {
            framing,
            encoding: Encoding::Binary,
            content_type,
        }
    }

    pub fn from_headers(headers: &HeaderMap) -> Result<Self, ApiError> {
        let essence = essence(headers).unwrap_or_default();
        CONTENT_TYPES
            .iter()
            .find(|(content_type, ..)| *content_type == essence)
            .map(|&(content_type, framing, encoding)| GrpcFormat {
                framing,
                encoding,
                content_type,
            })
            .ok_or_else(|| {
                let served: Vec<&str> = CONTENT_TYPES.iter().map(|(name, ..)| *name).collect();
                ApiError::new(
                    ErrorKind::UnsupportedMediaType,
                    format!(
                        "content type {essence:?} is not served; use one of {}",
                        served.join(", ")
                    ),
                )
            })
    }
}

/// A failure before any RPC was found (an unknown service), answered in the
/// request's gRPC framing.
pub fn error_response(headers: &HeaderMap, error: ApiError) -> Response {
    let format =
        GrpcFormat::from_headers(headers).unwrap_or_else(|_| GrpcFormat::fallback(headers));
    respond(format, Err(error))
}

/// gRPC and gRPC-Web as a protocol of the seam; the `Content-Type` tells
/// which.
#[derive(Debug, Clone, Copy)]
pub struct Grpc;

impl Dialect for Grpc {
    /// The framing and encoding of the answer: the request's, or the
    /// fallback for a type this server does not serve.
    type AnswerForm = GrpcFormat;

    fn decide(&self, headers: &HeaderMap) -> Decision<GrpcFormat> {
        let format = GrpcFormat::from_headers(headers);
        let answer = format
            .as_ref()
            .map_or_else(|_| GrpcFormat::fallback(headers), |format| *format);
        Decision {
            protocol: answer.framing.protocol(),
            encoding: answer.encoding,
            answer,
            timeout: headers
                .get(GRPC_TIMEOUT)
                .map(|value| parse_timeout(value.as_bytes()))
                .transpose(),
            checked: format.map(drop),
            post_only: "gRPC calls are POSTs",
        }
    }

    /// The one message of the body, within the body limit.
    async fn message(
        &self,
        answer: &GrpcFormat,
        state: &AppState,
        head: &Parts,
        body: Body,
    ) -> Result<Bytes, ApiError> {
        let max_message = state.settings.max_body_bytes;
        let raw_limit = raw_body_limit(answer.framing, max_message);
        let body = handler::read_body(head, body, state, raw_limit).await?;
        let body = match answer.framing {
            GrpcFlavour::WebText => decode_text(&body)?,
            GrpcFlavour::Grpc | GrpcFlavour::Web => body,
        };
        let range = unary_message(&body, max_message, &head.headers)?;
        Ok(body.slice(range))
    }

    fn respond(&self, answer: GrpcFormat, outcome: Result<Bytes, ApiError>) -> Response {
        respond(answer, outcome)
    }
}

/// The largest body that can hold one message of `max_message` bytes.
fn raw_body_limit(framing: GrpcFlavour, max_message: usize) -> usize {
    let framed = max_message.saturating_add(PREFIX_LEN);
    match framing {
        GrpcFlavour::Grpc | GrpcFlavour::Web => framed,
        GrpcFlavour::WebText => framed.div_ceil(3).saturating_mul(4),
    }
}

/// The one message of a unary request body: exactly one frame, uncompressed,
/// within the size limit.
fn unary_message(
    body: &[u8],
    max_message: usize,
    headers: &HeaderMap,
) -> Result<std::ops::Range<usize>, ApiError> {
    let Some((prefix, rest)) = body.split_first_chunk::<PREFIX_LEN>() else {
        return Err(ApiError::malformed(
            "a unary gRPC request carries exactly one length-prefixed message; the body has none",
        ));
    };
    let [flags, length @ ..] = *prefix;
    let length = u32::from_be_bytes(length) as usize;
    if length > max_message {
        return Err(ApiError::new(
            ErrorKind::PayloadTooLarge,
            format!("message of {length} bytes is larger than the {max_message}-byte limit"),
        ));
    }
    if flags & FLAG_COMPRESSED != 0 {
        return Err(compressed_message(headers));
    }
    if flags != 0 {
        return Err(ApiError::malformed(format!(
            "message flags {flags:#04x} are not defined for requests"
        )));
    }
    match rest.len().cmp(&length) {
        std::cmp::Ordering::Less => Err(ApiError::malformed(format!(
            "the message prefix announces {length} bytes, the body holds {}",
            rest.len()
        ))),
        std::cmp::Ordering::Greater => Err(ApiError::malformed(
            "a unary gRPC request carries exactly one message; the body holds more",
        )),
        std::cmp::Ordering::Equal => Ok(PREFIX_LEN..body.len()),
    }
}

/// The gRPC rule for a compressed message this server cannot read: without a
/// `grpc-encoding` it is the client's bug (INTERNAL); with one, that
/// compression is not implemented here (UNIMPLEMENTED).
fn compressed_message(headers: &HeaderMap) -> ApiError {
    match headers.get(GRPC_ENCODING) {
        Some(encoding) if !encoding.as_bytes().eq_ignore_ascii_case(b"identity") => ApiError::new(
            ErrorKind::CompressionNotSupported,
            format!("grpc-encoding {encoding:?} is not supported; send messages uncompressed"),
        ),
        _ => ApiError::new(
            ErrorKind::Internal,
            "the message is flagged compressed but grpc-encoding names no compression",
        ),
    }
}

/// Reads a `grpc-timeout` value: 1 to 8 digits, then H, M, S, m, u or n.
pub fn parse_timeout(value: &[u8]) -> Result<Duration, ApiError> {
    let malformed = || {
        ApiError::malformed(format!(
            "grpc-timeout {:?} must be 1 to 8 digits and a unit (H, M, S, m, u, n)",
            String::from_utf8_lossy(value)
        ))
    };
    let (&unit, digits) = value.split_last().ok_or_else(malformed)?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(malformed());
    }
    let amount: u64 = digits
        .iter()
        .fold(0, |total, digit| total * 10 + u64::from(digit - b'0'));
    Ok(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return Err(malformed()),
    })
}

/// A gRPC-Web text body: base64, possibly several padded chunks one after
/// another (a client may encode each frame on its own).
pub fn decode_text(body: &[u8]) -> Result<Bytes, ApiError> {
    let mut decoded = Vec::with_capacity(body.len() / 4 * 3);
    let compact: Vec<u8> = body
        .iter()
        .copied()
        .filter(|byte| !byte.is_ascii_whitespace())
        .collect();
    // Walk by index: removing each chunk from the front would copy the rest
    // every time, quadratic in a body of many tiny chunks (`AA==AA==...`).
    let mut start = 0;
    while start < compact.len() {
        let rest = &compact[start..];
        // A chunk ends after its padding, or at the end of the body.
        let end = rest
            .iter()
            .position(|&byte| byte == b'=')
            .map_or(rest.len(), |first_pad| {
                first_pad
                    + rest[first_pad..]
                        .iter()
                        .take_while(|&&byte| byte == b'=')
                        .count()
            });
        base64::engine::general_purpose::STANDARD
            .decode_vec(&rest[..end], &mut decoded)
            .map_err(|error| {
                ApiError::malformed(format!("gRPC-Web text body is not base64: {error}"))
            })?;
        start += end;
    }
    Ok(Bytes::from(decoded))
}

/// One length-prefixed frame.
pub fn encode_frame(flags: u8, payload: &[u8], into: &mut BytesMut) {
    into.reserve(PREFIX_LEN + payload.len());
    into.put_slice(&prefix(flags, payload.len()));
    into.put_slice(payload);
}

/// The Connect codes and their gRPC numbers (the two protocols name the
/// same codes).
pub const CODES: [(&str, u32); 16] = [
    ("canceled", 1),
    ("unknown", 2),
    ("invalid_argument", 3),
    ("deadline_exceeded", 4),
    ("not_found", 5),
    ("already_exists", 6),
    ("permission_denied", 7),
    ("resource_exhausted", 8),
    ("failed_precondition", 9),
    ("aborted", 10),
    ("out_of_range", 11),
    ("unimplemented", 12),
    ("internal", 13),
    ("unavailable", 14),
    ("data_loss", 15),
    ("unauthenticated", 16),
];

/// The gRPC number of a Connect code of the error table.
pub fn grpc_code(connect_code: &str) -> u32 {
    CODES
        .iter()
        .find(|(name, _)| *name == connect_code)
        // A code the table does not use yet: say so rather than guess.
        .map_or(2, |&(_, number)| number)
}

/// The Connect code of a gRPC status number; `unknown` for one gRPC does not
/// define.
pub fn connect_code(grpc_code: u32) -> &'static str {
    CODES
        .iter()
        .find(|(_, number)| *number == grpc_code)
        .map_or("unknown", |&(name, _)| name)
}

/// `grpc-message` is percent-encoded: everything outside printable ASCII,
/// and `%` itself.
pub fn percent_encode(message: &str) -> String {
    let mut encoded = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The outcome as trailer fields: `grpc-status`, and `grpc-message` on failure.
fn status_fields(outcome: Result<(), &ApiError>) -> HeaderMap {
    let mut fields = HeaderMap::new();
    match outcome {
        Ok(()) => {
            fields.insert(GRPC_STATUS, HeaderValue::from(0u32));
        }
        Err(error) => {
            let code = grpc_code(error.kind.wire().connect_code);
            fields.insert(GRPC_STATUS, HeaderValue::from(code));
            if let Ok(message) = HeaderValue::from_str(&percent_encode(&error.message)) {
                fields.insert(GRPC_MESSAGE, message);
            }
        }
    }
    fields
}

/// A gRPC-Web trailer frame: the fields as HTTP/1 header lines.
pub fn encode_trailer_frame(fields: &HeaderMap, into: &mut BytesMut) {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.extend_from_slice(name.as_str().as_bytes());
        block.push(b':');
        block.extend_from_slice(value.as_bytes());
        block.extend_from_slice(b"\r\n");
    }
    encode_frame(FLAG_TRAILERS, &block, into);
}

fn respond(format: GrpcFormat, outcome: Result<Bytes, ApiError>) -> Response {
    let mut builder = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, format.content_type)
        .header(GRPC_ACCEPT_ENCODING, "identity");
    let fields = status_fields(outcome.as_ref().map(|_| ()));
    let body = match format.framing {
        GrpcFlavour::Grpc => match outcome {
            Ok(payload) => Body::new(Chunks {
                chunks: [prefix(0, payload.len()), payload].into(),
                trailers: Some(fields),
            }),
            // Trailers-only: the status in the headers of an empty answer.
            Err(_) => {
                if let Some(headers) = builder.headers_mut() {
                    headers.extend(fields);
                }
                Body::empty()
            }
        },
        GrpcFlavour::Web => {
            let mut trailer = BytesMut::new();
            encode_trailer_frame(&fields, &mut trailer);
            let chunks = match outcome {
                Ok(payload) => [prefix(0, payload.len()), payload, trailer.freeze()].into(),
                Err(_) => [trailer.freeze()].into(),
            };
            Body::new(Chunks {
                chunks,
                trailers: None,
            })
        }
        GrpcFlavour::WebText => {
            let mut frames = BytesMut::new();
            if let Ok(payload) = &outcome {
                encode_frame(0, payload, &mut frames);
            }
            encode_trailer_frame(&fields, &mut frames);
            Body::from(base64::engine::general_purpose::STANDARD.encode(&frames))
        }
    };
    builder.body(body).unwrap_or_else(|_| {
        // Only reachable if a header above were invalid; they are constants.
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        response
    })
}

/// The prefix of a message frame of `length` bytes.
fn prefix(flags: u8, length: usize) -> Bytes {
    let mut prefix = BytesMut::with_capacity(PREFIX_LEN);
    prefix.put_u8(flags);
    // Answers are bounded far below 4 GiB (limits on every list); saturate
    // rather than wrap if that ever changed.
    prefix.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    prefix.freeze()
}

/// An answer's body as the pieces it is made of (a frame's prefix, then the
/// payload as it is, which may be shared by every caller), then trailers:
/// nothing is copied into a body of its own.
#[derive(Debug)]
struct Chunks {
    chunks: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
}

impl HttpBody for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(chunk) = self.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        Poll::Ready(
            self.trailers
                .take()
                .map(|fields| Ok(Frame::trailers(fields))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.chunks.iter().map(|chunk| chunk.len() as u64).sum())
    }
}

#[cfg(test)]
mod tests;
