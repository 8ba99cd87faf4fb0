//! The seam every RPC protocol over HTTP plugs into, as connect-go's
//! `protocolHandler`: a dialect ([`Dialect`]) says what a request's
//! head means (encoding, deadline, its own checks, how to answer) and how
//! its body carries the message; [`serve`] does the rest once for all of
//! them: the head checks in one order, the caller's address, the call, the
//! answer. `http+pb` and Connect are [`super::dialect`]'s, gRPC and
//! gRPC-Web [`super::grpc`]'s; the routes pick one per request.

use std::{future::Future, net::SocketAddr, time::Duration};

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderMap, HeaderValue, Method as HttpMethod, header, request::Parts},
    response::Response,
};
use bytes::Bytes;
use tokio::time::Instant;

use super::access_log::CallLogged;
use crate::{
    admin::Credentials,
    edge::{ConnectionBudget, QueuedAnswers},
    grammar,
    pb::{Encoding, Method},
    protocol::Protocol,
    rpc::{
        self,
        error::{ApiError, ErrorKind},
        state::AppState,
    },
};

/// How one RPC protocol over HTTP reads a request and writes its answer.
pub trait Dialect: Sync {
    /// How an answer is written (media type, framing, what it echoes), known
    /// from the head even when the head is refused.
    type AnswerForm: Send;

    /// What the request's head says, before any check fails it.
    fn decide(&self, headers: &HeaderMap) -> Decision<Self::AnswerForm>;

    /// The request message, read from the body; `head` is the request's
    /// (its headers, and the connection's budget among its extensions).
    fn message(
        &self,
        answer: &Self::AnswerForm,
        state: &AppState,
        head: &Parts,
        body: Body,
    ) -> impl Future<Output = Result<Bytes, ApiError>> + Send;

    /// The HTTP answer of an outcome.
    fn respond(&self, answer: Self::AnswerForm, outcome: Result<Bytes, ApiError>) -> Response;
}

/// What a dialect decides about a request from its head.
#[derive(Debug)]
pub struct Decision<A> {
    /// The label the call is recorded under.
    pub protocol: Protocol,
    pub encoding: Encoding,
    pub answer: A,
    /// The deadline the caller asks for, before [`rpc::Call::new`] clamps it.
    pub timeout: Result<Option<Duration>, ApiError>,
    /// The dialect's own checks of the head (content type, its headers), in
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
/// method, a call another site's page could make ([`super::cors`]), the
/// dialect's own checks, the deadline. The first failure is the call's
/// error. `peer` is the socket's address; the caller may be a trusted
/// proxy's client. `authority` is HTTP/2's `:authority` (else `Host` is read).
pub fn check_head<P: Dialect>(
    state: &AppState,
    dialect: &P,
    http_method: &HttpMethod,
    method: Result<Method, ApiError>,
    headers: &HeaderMap,
    authority: Option<&str>,
    peer: SocketAddr,
) -> CheckedHead<P::AnswerForm> {
    let started = Instant::now();
    let decision = dialect.decide(headers);
    let mut call = rpc::Call::new(
        decision.protocol,
        decision.encoding,
        state.settings.client_ip(peer, headers),
        decision.timeout.as_ref().ok().copied().flatten(),
        started,
    );
    call.credentials = Credentials::from_headers(headers);
    let method = (|| {
        if http_method != HttpMethod::POST {
            return Err(ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!("{http_method} is not allowed; {}", decision.post_only),
            ));
        }
        let method = method?;
        let authority = authority.or_else(|| {
            headers
                .get(header::HOST)
                .and_then(|host| host.to_str().ok())
        });
        super::cors::refuse_cross_site(headers, authority, &state.settings.cors_allowed_origins)?;
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

/// Serves one RPC over HTTP in `dialect`.
pub async fn serve<P: Dialect>(
    state: &AppState,
    dialect: &P,
    method: Result<Method, ApiError>,
    peer: SocketAddr,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let authority = parts.uri.authority().map(|authority| authority.as_str());
    let mut head = check_head(
        state,
        dialect,
        &parts.method,
        method,
        &parts.headers,
        authority,
        peer,
    );
    head.call.credentials =
        std::mem::take(&mut head.call.credentials).with_certificate_from(&parts.extensions);
    head.call.proof = parts
        .extensions
        .get::<ConnectionBudget>()
        .map(|budget| budget.proof().clone());
    let queued = parts.extensions.get::<QueuedAnswers>();
    let message = async {
        // A connection whose answers are not being taken (HTTP/2 streams
        // whose window stays shut) runs no new call until they are: the
        // stream waits here, within its caller's deadline, its body unread.
        if let Some(queued) = queued {
            queued.room().await;
        }
        dialect.message(&head.answer, state, &parts, body).await
    };
    // Never compressed: only the binary protocol's callers say what they inflate.
    let outcome = rpc::call(state, &head.call, head.method, message)
        .await
        .map(|answer| answer.payload);
    let mut response = dialect.respond(head.answer, outcome);
    response.extensions_mut().insert(CallLogged);
    response
}

/// Reads a body of at most `limit` bytes within the body-read timeout and
/// the budget for buffered requests: the connection's (the listener puts a
/// [`ConnectionBudget`] in every request's extensions), else the global one.
pub async fn read_body(
    head: &Parts,
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
    // hyper has refused a malformed length already.
    let values = head.headers.get_all(header::CONTENT_LENGTH);
    let declared = grammar::content_length(values.iter().map(HeaderValue::as_bytes))
        .ok()
        .flatten();
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(too_large());
    }
    let declared = declared.map_or(0, |length| length as usize);
    let reservation = match head.extensions.get::<ConnectionBudget>() {
        Some(connection) => connection.reserve(declared),
        None => state.body_budget.reserve(declared),
    };
    let mut reservation = reservation.ok_or_else(rpc::budget_exhausted)?;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::{extract::ConnectInfo, http::StatusCode};
    use tower::ServiceExt;

    use super::*;
    use crate::{
        edge::ANSWER_QUEUE_FLOOR,
        engine::{self, Scheduler},
        rpc::state::TransportSettings,
    };

    #[tokio::test(start_paused = true)]
    async fn a_call_waits_while_its_connections_answers_exceed_the_bound() {
        let engine = Scheduler::new(engine::Config {
            user_tokens: engine::TokenSet::new(["u"]),
            ..engine::Config::default()
        });
        let state = AppState::new(engine, TransportSettings::default());
        let router = crate::app(state);
        let queued = QueuedAnswers::default();
        for _ in 0..4 {
            queued.add(ANSWER_QUEUE_FLOOR / 4);
        }
        queued.add(1);
        let mut request = Request::post("/yadcc.scheduler.SchedulerService/GetConfig")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"token":"u"}"#))
            .unwrap();
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([10, 0, 0, 1], 5000))));
        request.extensions_mut().insert(queued.clone());
        let mut answer = tokio::spawn(router.oneshot(request));
        let waited = tokio::time::timeout(Duration::from_secs(5), &mut answer).await;
        assert!(
            waited.is_err(),
            "no call runs while the answers exceed the bound"
        );
        queued.remove(1);
        let answer = tokio::time::timeout(Duration::from_secs(5), answer)
            .await
            .expect("the call runs once there is room")
            .unwrap()
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
    }
}
