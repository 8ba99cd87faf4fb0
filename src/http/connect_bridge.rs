//! The standard gRPC services for tools (server reflection, health), served
//! by tonic, on all three protocols of the scheduler's own RPCs, as
//! connect-go's grpcreflect and grpchealth answer them: gRPC as tonic serves
//! it, gRPC-Web through tonic-web, and Connect here, so that Connect tools
//! with their defaults (`buf curl URL`, whose reflection is a Connect bidi
//! stream) work as gRPC tools do.
//!
//! A Connect call becomes a gRPC call of the same method, and the answer is
//! turned back:
//!
//! - streaming (`application/connect+proto`): a Connect envelope is gRPC's
//!   length-prefixed message, so both bodies stream through unchanged (a bidi
//!   stream stays one, over HTTP/2); the gRPC status becomes the
//!   end-of-stream envelope (flag 0x02, `{"error": {"code", "message"}}`),
//!   always with HTTP 200;
//! - unary (`application/proto`): the bare message is framed for gRPC, the
//!   answer's one message unframed; a failure is the Connect code's HTTP
//!   status with a JSON `{"code", "message"}` body.
//!
//! These services carry binary protobuf only (their messages have no JSON
//! mapping here): a JSON Connect call is refused with 415 and the types
//! that work, as connect-go refuses a codec it lacks. Whether a method is
//! unary or streaming comes from its descriptor, as connect-go knows it from
//! its handler.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::LazyLock,
    task::{Context, Poll},
};

use axum::{
    body::{Body, HttpBody},
    extract::Request,
    http::{HeaderMap, HeaderName, HeaderValue, Method as HttpMethod, StatusCode, Version, header},
    response::{IntoResponse, Response},
};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http_body_util::{BodyExt, Limited};
use prost_reflect::DescriptorPool;
use serde_json::{Value, json};
use tower::{Layer, Service, ServiceExt};

use super::grpc::{GRPC_MESSAGE, GRPC_STATUS, connect_code, encode_frame};

/// The largest unary request message read; these services' requests are a
/// name or two (`{"service": ""}`, a symbol to look up).
pub const MAX_UNARY_MESSAGE_BYTES: usize = 64 * 1024;

/// Media types of the two kinds of Connect call, binary protobuf.
const UNARY_PROTO: &str = "application/proto";
const STREAMING_PROTO: &str = "application/connect+proto";
/// How the Connect media types start (`application/connect+json`...).
const STREAMING_PREFIX: &str = "application/connect+";
/// The Connect unary media types other than binary protobuf.
const UNARY_OTHER: [&str; 1] = ["application/json"];

const CONNECT_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("connect-protocol-version");
const CONNECT_CONTENT_ENCODING: HeaderName = HeaderName::from_static("connect-content-encoding");
/// Connect's request headers, which mean nothing to the gRPC service.
const CONNECT_HEADERS: [&str; 5] = [
    "connect-protocol-version",
    "connect-timeout-ms",
    "connect-content-encoding",
    "connect-accept-encoding",
    "accept-encoding",
];

/// Flag of the last envelope of a Connect stream: the outcome, as JSON.
const FLAG_END_STREAM: u8 = 0x02;
/// Flags byte and big-endian length before every message.
const PREFIX_LEN: usize = 5;

/// The descriptors of the services behind the bridge, for each method's
/// kind (unary or streaming).
static DESCRIPTORS: LazyLock<DescriptorPool> = LazyLock::new(|| {
    let mut pool = DescriptorPool::new();
    for set in [
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ] {
        // Sets compiled into tonic's crates: failing here is a build defect.
        pool.decode_file_descriptor_set(set)
            .expect("tonic's descriptor sets decode");
    }
    pool
});

/// Serves `service` (a tonic-generated gRPC server) over gRPC, gRPC-Web and
/// Connect.
pub fn bridged<S>(service: S) -> ConnectBridge<tonic_web::GrpcWebService<S>> {
    ConnectBridge {
        inner: tonic_web::GrpcWebLayer::new().layer(service),
    }
}

/// [`bridged`]'s service: Connect calls translated, the rest passed on.
#[derive(Debug, Clone)]
pub struct ConnectBridge<S> {
    inner: S,
}

/// A Connect call's kind, from its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Unary,
    Streaming,
}

impl Kind {
    fn of(media_type: &str) -> Option<Self> {
        if media_type.starts_with(STREAMING_PREFIX) {
            Some(Kind::Streaming)
        } else if media_type == UNARY_PROTO || UNARY_OTHER.contains(&media_type) {
            Some(Kind::Unary)
        } else {
            None
        }
    }

    /// The one media type of this kind the bridge serves.
    fn served(self) -> &'static str {
        match self {
            Kind::Unary => UNARY_PROTO,
            Kind::Streaming => STREAMING_PROTO,
        }
    }
}

/// A Connect error: its code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ConnectError {
    code: &'static str,
    message: String,
}

impl ConnectError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    fn json(&self) -> Value {
        json!({ "code": self.code, "message": self.message })
    }
}

impl<S, B> Service<Request> for ConnectBridge<S>
where
    S: Service<Request, Response = http::Response<B>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Each call drives a clone of the inner service to readiness.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let media_type = essence(request.headers());
            let Some(kind) = media_type.as_deref().and_then(Kind::of) else {
                // gRPC, gRPC-Web and anything else: the tonic side answers.
                let response = inner.oneshot(request).await?;
                return Ok(response.map(Body::new));
            };
            let media_type = media_type.as_deref().unwrap_or_default();
            Ok(match refusal(&request, kind, media_type) {
                None => serve(inner, request, kind).await,
                Some(refusal) => refusal,
            })
        })
    }
}

/// The media type of a request, lowercase, without parameters.
fn essence(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(value.split(';').next()?.trim().to_ascii_lowercase())
}

/// The answer to a call that fails the checks connect-go makes before a call
/// reaches its handler (the HTTP method, the procedure, the media type for
/// its kind, the protocol version, the compression); `None` when it passes.
fn refusal(request: &Request, kind: Kind, media_type: &str) -> Option<Response> {
    if request.method() != HttpMethod::POST {
        let mut refusal = error_response(
            Kind::Unary,
            &ConnectError::new(
                "unimplemented",
                format!(
                    "{} is not allowed; Connect calls are POSTs",
                    request.method()
                ),
            ),
        );
        *refusal.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        refusal
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return Some(refusal);
    }
    let path = request.uri().path();
    let Some(method) = path
        .strip_prefix('/')
        .and_then(|path| path.split_once('/'))
        .and_then(|(service, method)| {
            DESCRIPTORS
                .get_service_by_name(service)?
                .methods()
                .find(|candidate| candidate.name() == method)
        })
    else {
        let mut refusal = error_response(
            Kind::Unary,
            &ConnectError::new(
                "unimplemented",
                format!("no procedure {}", crate::edge::echo(path)),
            ),
        );
        *refusal.status_mut() = StatusCode::NOT_FOUND;
        return Some(refusal);
    };
    let wanted = if method.is_client_streaming() || method.is_server_streaming() {
        Kind::Streaming
    } else {
        Kind::Unary
    };
    if kind != wanted || media_type != kind.served() {
        let mut refusal = (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "{} takes {} (binary protobuf only), not {media_type}\n",
                method.full_name(),
                wanted.served()
            ),
        )
            .into_response();
        refusal.headers_mut().insert(
            HeaderName::from_static("accept-post"),
            HeaderValue::from_static(wanted.served()),
        );
        return Some(refusal);
    }
    if let Some(version) = request.headers().get(CONNECT_PROTOCOL_VERSION)
        && version != "1"
    {
        return Some(error_response(
            kind,
            &ConnectError::new(
                "invalid_argument",
                format!(
                    "connect-protocol-version must be \"1\", not {:?}",
                    crate::edge::echo_bytes(version.as_bytes())
                ),
            ),
        ));
    }
    let encoding = match kind {
        Kind::Unary => header::CONTENT_ENCODING,
        Kind::Streaming => CONNECT_CONTENT_ENCODING,
    };
    if let Some(compression) = request.headers().get(&encoding)
        && compression != "identity"
    {
        return Some(error_response(
            kind,
            &ConnectError::new(
                "unimplemented",
                format!(
                    "{encoding} {:?} is not supported; send messages uncompressed",
                    crate::edge::echo_bytes(compression.as_bytes())
                ),
            ),
        ));
    }
    None
}

/// One admitted Connect call, through the gRPC service.
async fn serve<S, B>(inner: S, request: Request, kind: Kind) -> Response
where
    S: Service<Request, Response = http::Response<B>, Error = Infallible>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut parts, body) = request.into_parts();
    for name in CONNECT_HEADERS {
        parts.headers.remove(name);
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc+proto"),
    );
    parts
        .headers
        .insert(header::TE, HeaderValue::from_static("trailers"));
    // gRPC is HTTP/2; tonic-web hands on only what claims to be.
    parts.version = Version::HTTP_2;
    let body = match kind {
        Kind::Streaming => body,
        Kind::Unary => match Limited::new(body, MAX_UNARY_MESSAGE_BYTES).collect().await {
            Ok(message) => Body::from(frame(0, &message.to_bytes())),
            Err(error) => {
                let error = if error.is::<http_body_util::LengthLimitError>() {
                    ConnectError::new(
                        "resource_exhausted",
                        format!(
                            "the message is larger than the {MAX_UNARY_MESSAGE_BYTES}-byte limit"
                        ),
                    )
                } else {
                    ConnectError::new("invalid_argument", format!("reading the body: {error}"))
                };
                return error_response(kind, &error);
            }
        },
    };
    let Ok(response) = inner.oneshot(Request::from_parts(parts, body)).await;
    match kind {
        Kind::Streaming => streaming_answer(response),
        Kind::Unary => unary_answer(response).await,
    }
}

/// The gRPC outcome in `fields` (trailers, or the headers of a
/// trailers-only answer), if they carry one.
fn outcome(fields: &HeaderMap) -> Option<Result<(), ConnectError>> {
    let status: u32 = fields.get(GRPC_STATUS)?.to_str().ok()?.parse().ok()?;
    if status == 0 {
        return Some(Ok(()));
    }
    let message = fields
        .get(GRPC_MESSAGE)
        .map(|value| percent_decode(value.as_bytes()))
        .unwrap_or_default();
    Some(Err(ConnectError::new(connect_code(status), message)))
}

fn missing_status() -> ConnectError {
    ConnectError::new("internal", "the gRPC service ended without a grpc-status")
}

/// A Connect stream: the gRPC body's messages as they come, then the
/// end-of-stream envelope with the outcome.
fn streaming_answer<B>(response: http::Response<B>) -> Response
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = response.into_parts();
    let stream = match outcome(&parts.headers) {
        // Trailers-only: the outcome is all there is.
        Some(outcome) => {
            let end = end_stream(outcome);
            futures_util::stream::once(async move { Ok::<_, Infallible>(end) }).left_stream()
        }
        None => futures_util::stream::unfold(Some(Box::pin(body)), |body| async move {
            let mut body = body?;
            let envelope = match body.frame().await {
                None => end_stream(Err(missing_status())),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => return Some((Ok(data), Some(body))),
                    Err(frame) => end_stream(
                        frame
                            .trailers_ref()
                            .and_then(outcome)
                            .unwrap_or_else(|| Err(missing_status())),
                    ),
                },
                Some(Err(error)) => end_stream(Err(ConnectError::new(
                    "internal",
                    format!("the gRPC service failed: {}", error.into()),
                ))),
            };
            Some((Ok(envelope), None))
        })
        .right_stream(),
    };
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, STREAMING_PROTO)
        .body(Body::from_stream(stream))
        .expect("a valid response head")
}

/// The end-of-stream envelope of `outcome`.
fn end_stream(outcome: Result<(), ConnectError>) -> Bytes {
    let message = match outcome {
        Ok(()) => json!({}),
        Err(error) => json!({ "error": error.json() }),
    };
    frame(FLAG_END_STREAM, message.to_string().as_bytes())
}

/// A Connect unary answer from the whole gRPC answer: its one message, or
/// the failure.
async fn unary_answer<B>(response: http::Response<B>) -> Response
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = response.into_parts();
    let answer = async {
        if let Some(outcome) = outcome(&parts.headers) {
            outcome?;
        }
        let collected = body.collect().await.map_err(|error| {
            ConnectError::new(
                "internal",
                format!("the gRPC service failed: {}", error.into()),
            )
        })?;
        collected
            .trailers()
            .and_then(outcome)
            .unwrap_or_else(|| Err(missing_status()))?;
        only_message(collected.to_bytes())
    };
    match answer.await {
        Ok(message) => (
            [(header::CONTENT_TYPE, HeaderValue::from_static(UNARY_PROTO))],
            message,
        )
            .into_response(),
        Err(error) => error_response(Kind::Unary, &error),
    }
}

/// The one message of a successful unary gRPC answer.
fn only_message(body: Bytes) -> Result<Bytes, ConnectError> {
    let malformed = || ConnectError::new("internal", "the gRPC answer is not one message");
    let prefix = body.get(..PREFIX_LEN).ok_or_else(malformed)?;
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if prefix[0] != 0 || body.len() != PREFIX_LEN + length {
        return Err(malformed());
    }
    Ok(body.slice(PREFIX_LEN..))
}

/// A failure before or instead of an answer, as the call's kind reports one.
fn error_response(kind: Kind, error: &ConnectError) -> Response {
    match kind {
        Kind::Unary => (
            http_status(error.code),
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            error.json().to_string(),
        )
            .into_response(),
        Kind::Streaming => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(STREAMING_PROTO),
            )],
            end_stream(Err(error.clone())),
        )
            .into_response(),
    }
}

/// The HTTP status of a Connect unary failure, as the Connect protocol
/// defines it.
fn http_status(code: &str) -> StatusCode {
    StatusCode::from_u16(match code {
        "canceled" => 499,
        "invalid_argument" | "failed_precondition" | "out_of_range" => 400,
        "deadline_exceeded" => 504,
        "not_found" => 404,
        "already_exists" | "aborted" => 409,
        "permission_denied" => 403,
        "resource_exhausted" => 429,
        "unimplemented" => 501,
        "unavailable" => 503,
        "unauthenticated" => 401,
        _ => 500,
    })
    .expect("statuses in range")
}

/// One length-prefixed message (a gRPC frame, a Connect envelope).
fn frame(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = BytesMut::new();
    encode_frame(flags, payload, &mut out);
    out.freeze()
}

/// `grpc-message` is percent-encoded; a malformed escape stays as it is.
fn percent_decode(encoded: &[u8]) -> String {
    let mut decoded = Vec::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some((&byte, after)) = rest.split_first() {
        let escaped = (byte == b'%')
            .then(|| after.get(..2))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(value) => {
                decoded.push(value);
                rest = &after[2..];
            }
            None => {
                decoded.push(byte);
                rest = after;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::grpc::percent_encode;

    #[test]
    fn grpc_messages_decode_as_they_were_encoded() {
        for message in ["plain", "100% sure", "naïve\r\nline", "%zz stays"] {
            assert_eq!(percent_decode(percent_encode(message).as_bytes()), message);
        }
        assert_eq!(percent_decode(b"%zz%4"), "%zz%4");
    }

    #[test]
    fn every_method_behind_the_bridge_has_a_kind() {
        let method = |service: &str, name: &str| {
            DESCRIPTORS
                .get_service_by_name(service)
                .unwrap()
                .methods()
                .find(|method| method.name() == name)
                .unwrap()
        };
        assert!(!method("grpc.health.v1.Health", "Check").is_server_streaming());
        assert!(method("grpc.health.v1.Health", "Watch").is_server_streaming());
        for version in ["v1", "v1alpha"] {
            let info = method(
                &format!("grpc.reflection.{version}.ServerReflection"),
                "ServerReflectionInfo",
            );
            assert!(info.is_client_streaming() && info.is_server_streaming());
        }
    }

    #[test]
    fn failures_have_the_connect_protocols_statuses() {
        assert_eq!(http_status("not_found"), StatusCode::NOT_FOUND);
        assert_eq!(http_status("unimplemented"), StatusCode::NOT_IMPLEMENTED);
        assert_eq!(http_status("unavailable"), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(http_status("unknown"), StatusCode::INTERNAL_SERVER_ERROR);
        let envelope = end_stream(Err(ConnectError::new("not_found", "no such service")));
        assert_eq!(envelope[0], FLAG_END_STREAM);
        let end: Value = serde_json::from_slice(&envelope[PREFIX_LEN..]).unwrap();
        assert_eq!(end["error"]["code"], "not_found");
    }
}
