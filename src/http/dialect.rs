//! The two route styles an RPC arrives in over HTTP, each served as a
//! dialect of the seam ([`super::handler::Dialect`]):
//!
//! - `http+pb`, as the yadcc daemons' framework writes it:
//!   `POST /rpc/yadcc.scheduler.SchedulerService.<Method>`, `Rpc-SeqNo` echoed,
//!   `Rpc-Timeout` in milliseconds, errors as non-200 with `Rpc-Error-Code`.
//! - Connect unary: `POST /yadcc.scheduler.SchedulerService/<Method>`,
//!   `Connect-Timeout-Ms`, errors as a JSON `{"code","message"}` body.
//!
//! Both always answer with a `Content-Length` (the route carries no
//! compression layer), in the HTTP form of the error table
//! ([`crate::rpc::error`]). The daemons' own `http+pb` connections
//! ([`crate::daemon::http_pb`]) check and answer through the same code, and
//! their calls are labelled the same: `http+pb` is the route's wire, on
//! whichever server it arrives.

use std::time::Duration;

use axum::{
    body::Body,
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
};
use bytes::Bytes;

use super::handler::{self, Decision, Dialect};
use crate::rpc::{
    codec::BodyFormat,
    error::{ApiError, ErrorKind},
    state::AppState,
};
use crate::{
    grammar,
    pb::{Encoding, Method, Service},
    protocol::Protocol,
};

/// Header carrying the numeric error code on the `http+pb` wire.
pub const RPC_ERROR_CODE: HeaderName = HeaderName::from_static("rpc-error-code");
/// Header carrying a one-line human reason on the `http+pb` wire.
pub const RPC_ERROR_REASON: HeaderName = HeaderName::from_static("rpc-error-reason");

/// Sequence number header of `http+pb`; echoed so pipelined answers can be matched.
pub const RPC_SEQ_NO: HeaderName = HeaderName::from_static("rpc-seqno");
/// `http+pb` deadline, in milliseconds.
pub const RPC_TIMEOUT: HeaderName = HeaderName::from_static("rpc-timeout");
/// Connect deadline, in milliseconds.
pub const CONNECT_TIMEOUT_MS: HeaderName = HeaderName::from_static("connect-timeout-ms");
/// The `WWW-Authenticate` of a call of the operators' service without a token.
pub const BEARER_CHALLENGE: &str = "Bearer realm=\"yadcc-admin\"";

/// Which of the two route styles (paths, headers, error form) a request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteStyle {
    HttpPb,
    Connect,
}

impl RouteStyle {
    fn timeout_header(self) -> HeaderName {
        match self {
            RouteStyle::HttpPb => RPC_TIMEOUT,
            RouteStyle::Connect => CONNECT_TIMEOUT_MS,
        }
    }

    /// A request without `Content-Type` is taken as binary protobuf.
    fn default_format(self) -> BodyFormat {
        let media_type = match self {
            RouteStyle::HttpPb => "application/x-protobuf",
            RouteStyle::Connect => "application/proto",
        };
        BodyFormat {
            encoding: Encoding::Binary,
            media_type,
        }
    }
}

/// `yadcc.scheduler.SchedulerService.Heartbeat` (the `http+pb` path's last
/// segment) to its method. The daemons' framework looks the whole name up,
/// so any name it does not know, another service's too, is an unknown
/// method (10), as there.
pub fn resolve_full_name(full_name: &str) -> Result<Method, ApiError> {
    Method::from_full_name(full_name).ok_or_else(|| {
        ApiError::new(
            ErrorKind::MethodNotFound,
            format!(
                "Method [{full_name}] is not recognized; this server implements {}",
                served()
            ),
        )
    })
}

/// The services this server implements, for people.
fn served() -> String {
    let names: Vec<&str> = Service::ALL
        .iter()
        .map(|service| service.full_name())
        .collect();
    names.join(" and ")
}

/// The `Rpc-SeqNo` to echo: the request's, when it is a sequence number
/// (an invalid one fails the call and is not echoed).
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

/// A method of `service` on the Connect, gRPC and gRPC-Web path.
pub fn resolve(service: Service, method: &str) -> Result<Method, ApiError> {
    service.method(method).ok_or_else(|| {
        ApiError::new(
            ErrorKind::MethodNotFound,
            format!(
                "{} has no method {:?}",
                service.full_name(),
                crate::edge::echo(method)
            ),
        )
    })
}

impl RouteStyle {
    /// The path of `method` in this route style.
    pub fn path(self, method: Method) -> &'static str {
        match self {
            RouteStyle::HttpPb => method.rpc_path(),
            RouteStyle::Connect => method.connect_path(),
        }
    }

    /// The protocol this route style's calls are recorded under.
    pub fn protocol(self) -> Protocol {
        match self {
            RouteStyle::HttpPb => Protocol::HttpPb,
            RouteStyle::Connect => Protocol::Connect,
        }
    }
}

/// How a route style's answer is written: the request's media type, and for
/// `http+pb` the `Rpc-SeqNo` it echoes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteAnswer {
    pub media_type: &'static str,
    pub seq_no: Option<HeaderValue>,
}

impl Dialect for RouteStyle {
    type AnswerForm = RouteAnswer;

    /// `Rpc-SeqNo`, `Content-Type`, `Content-Encoding`, then the deadline
    /// header, in that order.
    fn decide(&self, headers: &HeaderMap) -> Decision<RouteAnswer> {
        let style = *self;
        let format = BodyFormat::from_headers(headers, style.default_format());
        let checked = (|| {
            if style == RouteStyle::HttpPb
                && let Some(seq_no) = headers.get(RPC_SEQ_NO)
            {
                check_seq_no(seq_no)?;
            }
            format.as_ref().map_err(Clone::clone)?;
            reject_content_encoding(headers)
        })();
        Decision {
            protocol: style.protocol(),
            encoding: format
                .as_ref()
                .map_or(Encoding::Binary, |format| format.encoding),
            answer: RouteAnswer {
                media_type: format
                    .as_ref()
                    .map_or("application/octet-stream", |format| format.media_type),
                seq_no: match style {
                    RouteStyle::HttpPb => echoed_seq_no(headers),
                    RouteStyle::Connect => None,
                },
            },
            timeout: timeout(headers, style.timeout_header()),
            checked,
            post_only: "RPCs are called with POST",
        }
    }

    async fn message(
        &self,
        _answer: &RouteAnswer,
        state: &AppState,
        head: &Parts,
        body: Body,
    ) -> Result<Bytes, ApiError> {
        handler::read_body(head, body, state, state.settings.max_body_bytes).await
    }

    fn respond(&self, answer: RouteAnswer, outcome: Result<Bytes, ApiError>) -> Response {
        let mut response = answer_parts(outcome, answer.media_type).into_response();
        if let Some(seq_no) = answer.seq_no {
            response.headers_mut().insert(RPC_SEQ_NO, seq_no);
        }
        response
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
            let mut headers = error_headers(&error);
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

/// The headers every HTTP answer of an error carries (`Rpc-Error-Code`,
/// `Rpc-Error-Reason`, `Allow`), on hyper's path and on the daemons'
/// out-of-order `http+pb` alike.
pub fn error_headers(error: &ApiError) -> HeaderMap {
    let wire = error.kind.wire();
    let mut headers = HeaderMap::new();
    headers.insert(RPC_ERROR_CODE, HeaderValue::from(wire.rpc_code));
    if let Ok(reason) = HeaderValue::from_str(&header_safe(&error.message)) {
        headers.insert(RPC_ERROR_REASON, reason);
    }
    if error.kind == ErrorKind::MethodNotAllowed {
        headers.insert(header::ALLOW, HeaderValue::from_static("POST"));
    }
    if error.kind == ErrorKind::Unauthenticated {
        headers.insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(BEARER_CHALLENGE),
        );
    }
    headers
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.kind.wire().http_status;
        let mut headers = error_headers(&self);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        (status, headers, self.json_body()).into_response()
    }
}

/// Header values end at CR or LF, and the `http+pb` client reads them raw:
/// keep one line of printable ASCII.
fn header_safe(text: &str) -> String {
    const MAX_REASON: usize = 512;
    text.chars()
        .map(|c| match c {
            '\r' | '\n' | '\t' => ' ',
            c if c.is_ascii() && !c.is_ascii_control() => c,
            _ => '?',
        })
        .take(MAX_REASON)
        .collect()
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

/// The deadline a dialect's header asks for, in milliseconds.
fn timeout(headers: &HeaderMap, name: HeaderName) -> Result<Option<Duration>, ApiError> {
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
    Ok(Some(Duration::from_millis(millis)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_lose_line_breaks_and_non_ascii() {
        assert_eq!(header_safe("a\r\nb\tc"), "a  b c");
        assert_eq!(header_safe("naïve"), "na?ve");
    }

    #[test]
    fn method_not_allowed_names_post() {
        let response = ApiError::new(ErrorKind::MethodNotAllowed, "use POST").into_response();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers()[header::ALLOW], "POST");
        assert_eq!(response.headers()[RPC_ERROR_CODE], "5");
    }
}
