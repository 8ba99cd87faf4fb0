//! The two ways an RPC arrives, served by the same dispatcher:
//!
//! - `http+pb`, as the yadcc daemons' framework writes it:
//!   `POST /rpc/yadcc.scheduler.SchedulerService.<Method>`, `Rpc-SeqNo` echoed,
//!   `Rpc-Timeout` in milliseconds, errors as non-200 with `Rpc-Error-Code`.
//! - Connect unary: `POST /yadcc.scheduler.SchedulerService/<Method>`,
//!   `Connect-Timeout-Ms`, errors as a JSON `{"code","message"}` body.
//!
//! Both always answer with a `Content-Length` (the route carries no
//! compression layer) and use the error table of [`super::error`].

use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;

use axum::{
    body::Body,
    extract::{ConnectInfo, Path, Request, State},
    http::{HeaderMap, HeaderName, HeaderValue, Method as HttpMethod, StatusCode, header},
    response::{IntoResponse, Response},
};
use tokio::time::Instant;

use super::{
    access_log::CallLogged,
    codec::BodyFormat,
    error::{ApiError, ErrorKind},
    state::AppState,
};
use crate::{
    grammar,
    pb::{Encoding, Method, SCHEDULER_SERVICE},
    protocol::Protocol,
    rpc,
};

/// Sequence number header of `http+pb`; echoed so pipelined answers can be matched.
pub const RPC_SEQ_NO: HeaderName = HeaderName::from_static("rpc-seqno");
/// `http+pb` deadline, in milliseconds.
pub const RPC_TIMEOUT: HeaderName = HeaderName::from_static("rpc-timeout");
/// Connect deadline, in milliseconds.
pub const CONNECT_TIMEOUT_MS: HeaderName = HeaderName::from_static("connect-timeout-ms");

/// Which framing a request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    HttpPb,
    Connect,
}

impl Dialect {
    fn timeout_header(self) -> HeaderName {
        match self {
            Dialect::HttpPb => RPC_TIMEOUT,
            Dialect::Connect => CONNECT_TIMEOUT_MS,
        }
    }

    /// A request without `Content-Type` is taken as binary protobuf.
    fn default_format(self) -> BodyFormat {
        let media_type = match self {
            Dialect::HttpPb => "application/x-protobuf",
            Dialect::Connect => "application/proto",
        };
        BodyFormat {
            encoding: Encoding::Binary,
            media_type,
        }
    }
}

/// `POST /rpc/<full service name>.<Method>`.
pub async fn http_pb(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(full_name): Path<String>,
    request: Request,
) -> Response {
    let seq_no = echoed_seq_no(request.headers());
    let method = resolve_full_name(&full_name);
    let mut response = serve(&state, Dialect::HttpPb, method, peer, request).await;
    if let Some(seq_no) = seq_no {
        response.headers_mut().insert(RPC_SEQ_NO, seq_no);
    }
    response
}

/// `POST /yadcc.scheduler.SchedulerService/<Method>` (Connect unary).
pub async fn connect(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(method): Path<String>,
    request: Request,
) -> Response {
    let method = resolve(SCHEDULER_SERVICE, &method);
    serve(&state, Dialect::Connect, method, peer, request).await
}

/// `yadcc.scheduler.SchedulerService.Heartbeat` (the `http+pb` path's last
/// segment) to its method. The daemons' framework looks the whole name up,
/// so any name it does not know, another service's too, is an unknown
/// method (10), as there.
pub fn resolve_full_name(full_name: &str) -> Result<Method, ApiError> {
    match full_name.rsplit_once('.') {
        Some((SCHEDULER_SERVICE, method)) => resolve(SCHEDULER_SERVICE, method),
        _ => Err(ApiError::new(
            ErrorKind::MethodNotFound,
            format!(
                "Method [{full_name}] is not recognized; this server implements {SCHEDULER_SERVICE}"
            ),
        )),
    }
}

/// The `Rpc-SeqNo` to echo: the request's, when it is a sequence number
/// (an invalid one fails the call in [`check_head`] and is not echoed).
pub fn echoed_seq_no(headers: &HeaderMap) -> Option<HeaderValue> {
    headers
        .get(RPC_SEQ_NO)
        .filter(|value| check_seq_no(value).is_ok())
        .cloned()
}

/// `Rpc-SeqNo` is the caller's decimal correlation id; anything else is refused
/// rather than echoed, since no answer to it could be matched.
fn check_seq_no(value: &HeaderValue) -> Result<(), ApiError> {
    value
        .to_str()
        .ok()
        .and_then(|text| grammar::header_integer(text, &grammar::SEQ_NO))
        .map(|_| ())
        .ok_or_else(|| {
            ApiError::malformed(format!(
                "{RPC_SEQ_NO} must be a decimal integer from {} to {}",
                grammar::SEQ_NO.start(),
                grammar::SEQ_NO.end()
            ))
        })
}

pub(super) fn resolve(service: &str, method: &str) -> Result<Method, ApiError> {
    if service != SCHEDULER_SERVICE {
        return Err(not_found(ErrorKind::ServiceNotFound, service));
    }
    Method::from_name(method).ok_or_else(|| {
        ApiError::new(
            ErrorKind::MethodNotFound,
            format!("{SCHEDULER_SERVICE} has no method {method:?}"),
        )
    })
}

fn not_found(kind: ErrorKind, name: &str) -> ApiError {
    ApiError::new(
        kind,
        format!("no service {name:?}; this server implements {SCHEDULER_SERVICE}"),
    )
}

impl Dialect {
    /// The path of `method` in this route style.
    pub fn path(self, method: Method) -> &'static str {
        match self {
            Dialect::HttpPb => method.rpc_path(),
            Dialect::Connect => method.connect_path(),
        }
    }

    /// The protocol label this dialect's calls are recorded under.
    pub fn protocol(self) -> Protocol {
        match self {
            Dialect::HttpPb => Protocol::Http,
            Dialect::Connect => Protocol::Connect,
        }
    }
}

/// A request's head, checked: the call as [`rpc::call`] takes it, and the
/// media type its answer will carry. Shared by hyper's routes and the daemons'
/// out-of-order `http+pb` server, so both check the same things in the same
/// order and answer the same way.
#[derive(Debug)]
pub struct CheckedHead {
    pub call: rpc::Call,
    pub method: Result<Method, ApiError>,
    pub media_type: &'static str,
}

/// Checks a request's head: verb, method, `Rpc-SeqNo`, `Content-Type`,
/// `Content-Encoding`, deadline header. The first failure is the call's error.
pub fn check_head(
    state: &AppState,
    dialect: Dialect,
    protocol: Protocol,
    http_method: &HttpMethod,
    method: Result<Method, ApiError>,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> CheckedHead {
    let started = Instant::now();
    let format = BodyFormat::from_headers(headers, dialect.default_format());
    let deadline = deadline(headers, dialect.timeout_header(), started);
    let call = rpc::Call {
        protocol,
        encoding: format
            .as_ref()
            .map_or(Encoding::Binary, |format| format.encoding),
        peer: state.settings.client_ip(peer, headers),
        deadline: deadline.as_ref().ok().copied().flatten(),
        started,
    };
    let media_type = format
        .as_ref()
        .map_or("application/octet-stream", |format| format.media_type);
    let method = (|| {
        if http_method != HttpMethod::POST {
            return Err(ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!("{http_method} is not allowed; RPCs are called with POST"),
            ));
        }
        let method = method?;
        if dialect == Dialect::HttpPb
            && let Some(seq_no) = headers.get(RPC_SEQ_NO)
        {
            check_seq_no(seq_no)?;
        }
        format.as_ref().map_err(Clone::clone)?;
        reject_content_encoding(headers)?;
        deadline.as_ref().map_err(Clone::clone)?;
        Ok(method)
    })();
    CheckedHead {
        call,
        method,
        media_type,
    }
}

/// Status, headers and body of an answer: the payload as `media_type`, or
/// the error's row of the table with its JSON body.
pub fn answer_parts(
    outcome: Result<Bytes, ApiError>,
    media_type: &'static str,
) -> (StatusCode, HeaderMap, Bytes) {
    match outcome {
        Ok(payload) => {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
            (StatusCode::OK, headers, payload)
        }
        Err(error) => {
            let mut headers = error.wire_headers();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            (
                error.kind.wire().http_status,
                headers,
                Bytes::from(error.json_body()),
            )
        }
    }
}

async fn serve(
    state: &AppState,
    dialect: Dialect,
    method: Result<Method, ApiError>,
    peer: SocketAddr,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let head = check_head(
        state,
        dialect,
        dialect.protocol(),
        &parts.method,
        method,
        &parts.headers,
        peer,
    );
    let body = read_body(&parts.headers, body, state);
    let outcome = rpc::call(state, &head.call, head.method, body).await;
    let mut response = answer_parts(outcome, head.media_type).into_response();
    response.extensions_mut().insert(CallLogged);
    response
}

/// Compressed request bodies are not supported; saying so beats a decode error.
fn reject_content_encoding(headers: &HeaderMap) -> Result<(), ApiError> {
    for name in [
        header::CONTENT_ENCODING,
        HeaderName::from_static("connect-content-encoding"),
    ] {
        if let Some(value) = headers.get(&name)
            && !value.as_bytes().eq_ignore_ascii_case(b"identity")
        {
            return Err(ApiError::new(
                ErrorKind::UnsupportedMediaType,
                format!("{name} {value:?} is not supported; send the body uncompressed"),
            ));
        }
    }
    Ok(())
}

fn deadline(
    headers: &HeaderMap,
    name: HeaderName,
    started: Instant,
) -> Result<Option<Instant>, ApiError> {
    let Some(value) = headers.get(&name) else {
        return Ok(None);
    };
    let range = grammar::TIMEOUT_MS;
    let millis = value
        .to_str()
        .ok()
        .and_then(|text| grammar::header_integer(text, &range))
        .ok_or_else(|| {
            ApiError::malformed(format!(
                "{name} must be a whole number of milliseconds from {} to {}",
                range.start(),
                range.end()
            ))
        })?;
    Ok(Some(
        started + Duration::from_millis(millis).min(rpc::MAX_DEADLINE),
    ))
}

/// Reads the body within the configured size, the body-read deadline and
/// the global budget for large bodies.
async fn read_body(headers: &HeaderMap, body: Body, state: &AppState) -> Result<Bytes, ApiError> {
    read_body_within(headers, body, state, state.settings.max_body_bytes).await
}

/// [`read_body`] with a size limit of the caller's: a framing around the
/// message (gRPC's prefix, base64) makes the body larger than the message.
pub(super) async fn read_body_within(
    headers: &HeaderMap,
    body: Body,
    state: &AppState,
    limit: usize,
) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let too_large = || {
        ApiError::new(
            ErrorKind::PayloadTooLarge,
            format!("body is larger than the {limit}-byte limit"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(too_large());
    }
    let declared = declared.map_or(0, |length| length as usize);
    let mut reservation = state
        .body_budget
        .reserve(declared)
        .ok_or_else(rpc::budget_exhausted)?;
    let read = async {
        let mut body = body;
        let mut collected = bytes::BytesMut::with_capacity(declared);
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|error| ApiError::malformed(format!("cannot read the body: {error}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if collected.len() + data.len() > limit {
                return Err(too_large());
            }
            if !reservation.grow_to(collected.len() + data.len()) {
                return Err(rpc::budget_exhausted());
            }
            collected.extend_from_slice(&data);
        }
        Ok(collected.freeze())
    };
    let timeout = state.settings.edge.body_read_timeout;
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| rpc::body_too_slow(timeout))?
}
