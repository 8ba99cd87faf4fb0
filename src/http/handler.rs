//! The seam every RPC protocol over HTTP plugs into, as connect-go's
//! `protocolHandler`: a protocol ([`RpcProtocol`]) says what a request's
//! head means (encoding, deadline, its own checks, how to answer) and how
//! its body carries the message; [`serve`] does the rest once for all of
//! them: the head checks in one order, the caller's address, the call, the
//! answer. `http+pb` and Connect are [`super::dialect`]'s, gRPC and
//! gRPC-Web [`super::grpc`]'s; the routes pick one per request.

use std::{future::Future, net::SocketAddr, time::Duration};

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderMap, Method as HttpMethod, header},
    response::Response,
};
use bytes::Bytes;
use tokio::time::Instant;

use super::access_log::CallLogged;
use crate::{
    pb::{Encoding, Method},
    protocol::CallProtocol,
    rpc::{
        self,
        error::{ApiError, ErrorKind},
        state::AppState,
    },
};

/// One RPC protocol over HTTP.
pub trait RpcProtocol: Sync {
    /// How an answer is written (media type, framing, what it echoes), known
    /// from the head even when the head is refused.
    type Answer: Send;

    /// What the request's head says, before any check fails it.
    fn decide(&self, headers: &HeaderMap) -> Decision<Self::Answer>;

    /// The request message, read from the body.
    fn message(
        &self,
        answer: &Self::Answer,
        state: &AppState,
        headers: &HeaderMap,
        body: Body,
    ) -> impl Future<Output = Result<Bytes, ApiError>> + Send;

    /// The HTTP answer of an outcome.
    fn respond(&self, answer: Self::Answer, outcome: Result<Bytes, ApiError>) -> Response;
}

/// What a protocol decides about a request from its head.
#[derive(Debug)]
pub struct Decision<A> {
    /// The label the call is recorded under.
    pub protocol: CallProtocol,
    pub encoding: Encoding,
    pub answer: A,
    /// The deadline the caller asks for, before [`rpc::Call::new`] clamps it.
    pub timeout: Result<Option<Duration>, ApiError>,
    /// The protocol's own checks of the head (content type, its headers), in
    /// its order: the first failure.
    pub checked: Result<(), ApiError>,
    /// What a verb other than POST is told (after "GET is not allowed; ").
    pub post_only: &'static str,
}

/// A request's head, checked: the call as [`rpc::call`] takes it, and how
/// to answer it.
#[derive(Debug)]
pub struct CheckedHead<A> {
    pub call: rpc::Call,
    pub method: Result<Method, ApiError>,
    pub answer: A,
}

/// Checks a request's head, the same for every protocol: the verb, the
/// method, the protocol's own checks, the deadline. The first failure is the
/// call's error. `peer` is the socket's address; the caller may be a
/// trusted proxy's client.
pub fn check_head<P: RpcProtocol>(
    state: &AppState,
    protocol: &P,
    http_method: &HttpMethod,
    method: Result<Method, ApiError>,
    headers: &HeaderMap,
    peer: SocketAddr,
) -> CheckedHead<P::Answer> {
    let started = Instant::now();
    let decision = protocol.decide(headers);
    let call = rpc::Call::new(
        decision.protocol,
        decision.encoding,
        state.settings.client_ip(peer, headers),
        decision.timeout.as_ref().ok().copied().flatten(),
        started,
    );
    let method = (|| {
        if http_method != HttpMethod::POST {
            return Err(ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!("{http_method} is not allowed; {}", decision.post_only),
            ));
        }
        let method = method?;
        decision.checked?;
        decision.timeout?;
        Ok(method)
    })();
    CheckedHead {
        call,
        method,
        answer: decision.answer,
    }
}

/// Serves one RPC over HTTP in `protocol`.
pub async fn serve<P: RpcProtocol>(
    state: &AppState,
    protocol: &P,
    method: Result<Method, ApiError>,
    peer: SocketAddr,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let head = check_head(state, protocol, &parts.method, method, &parts.headers, peer);
    let message = protocol.message(&head.answer, state, &parts.headers, body);
    let outcome = rpc::call(state, &head.call, head.method, message).await;
    let mut response = protocol.respond(head.answer, outcome);
    response.extensions_mut().insert(CallLogged);
    response
}

/// Reads a body of at most `limit` bytes within the body-read timeout and
/// the global budget for large bodies.
pub async fn read_body(
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
