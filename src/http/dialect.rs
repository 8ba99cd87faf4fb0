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

use axum::{
    body::Body,
    extract::{ConnectInfo, Path, Request, State},
    http::{HeaderMap, HeaderName, HeaderValue, Method as HttpMethod, StatusCode, header},
    response::{IntoResponse, Response},
};
use tokio::time::Instant;

use super::{
    codec::{BodyFormat, Encoding},
    error::{ApiError, ErrorKind},
    routes::AppState,
};
use crate::{pb::SCHEDULER_SERVICE, protocol::Protocol, rpc, service::Method};

/// Sequence number header of `http+pb`; echoed so pipelined answers can be matched.
pub const RPC_SEQ_NO: HeaderName = HeaderName::from_static("rpc-seqno");
/// `http+pb` deadline, in milliseconds.
pub const RPC_TIMEOUT: HeaderName = HeaderName::from_static("rpc-timeout");
/// Connect deadline, in milliseconds.
pub const CONNECT_TIMEOUT_MS: HeaderName = HeaderName::from_static("connect-timeout-ms");

/// Longest deadline a caller may ask for; longer values are clamped, since no
/// call legitimately takes longer than the longest wait plus transfer time.
const MAX_DEADLINE: Duration = Duration::from_secs(600);

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
    let seq_no = request.headers().get(RPC_SEQ_NO).cloned();
    let method = full_name
        .rsplit_once('.')
        .ok_or_else(|| not_found(ErrorKind::ServiceNotFound, &full_name))
        .and_then(|(service, method)| resolve(service, method));
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

fn resolve(service: &str, method: &str) -> Result<Method, ApiError> {
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
    /// The protocol label this dialect's calls are recorded under.
    pub fn protocol(self) -> Protocol {
        match self {
            Dialect::HttpPb => Protocol::Http,
            Dialect::Connect => Protocol::Connect,
        }
    }
}

/// Marks a response whose call [`rpc::record`] already logged, so the
/// router's access log does not write a second line for it.
#[derive(Debug, Clone, Copy)]
pub struct CallLogged;

async fn serve(
    state: &AppState,
    dialect: Dialect,
    method: Result<Method, ApiError>,
    peer: SocketAddr,
    request: Request,
) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let format = BodyFormat::from_headers(&parts.headers, dialect.default_format());
    let deadline = deadline(&parts.headers, dialect.timeout_header(), started);
    let call = rpc::Call {
        protocol: dialect.protocol(),
        encoding: format
            .as_ref()
            .map_or(Encoding::Binary, |format| format.encoding),
        peer: state.settings.client_ip(peer, &parts.headers),
        deadline: deadline.as_ref().ok().copied().flatten(),
        started,
    };
    let checked = (|| {
        if parts.method != HttpMethod::POST {
            return Err(ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!("{} is not allowed; RPCs are called with POST", parts.method),
            ));
        }
        let method = method?;
        format.as_ref().map_err(Clone::clone)?;
        reject_content_encoding(&parts.headers)?;
        deadline.as_ref().map_err(Clone::clone)?;
        Ok(method)
    })();
    let body = read_body(&parts.headers, body, state.settings.max_body_bytes);
    let mut response = match rpc::call(state, &call, checked, body).await {
        Ok(payload) => {
            let media_type = format.map_or("application/octet-stream", |format| format.media_type);
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, HeaderValue::from_static(media_type))],
                payload,
            )
                .into_response()
        }
        Err(error) => error.into_response(),
    };
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
    let millis: u64 = value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| {
            ApiError::malformed(format!("{name} must be a whole number of milliseconds"))
        })?;
    Ok(Some(
        started + Duration::from_millis(millis).min(MAX_DEADLINE),
    ))
}

async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<bytes::Bytes, ApiError> {
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
    axum::body::to_bytes(body, limit).await.map_err(|error| {
        let length_limited = std::error::Error::source(&error)
            .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
        if length_limited {
            too_large()
        } else {
            ApiError::malformed(format!("cannot read the body: {error}"))
        }
    })
}
