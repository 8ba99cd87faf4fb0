//! The one entry every protocol calls: the HTTP dialects (hyper), the daemons'
//! out-of-order `http+pb` and the binary `flare` protocol all hand over a
//! method, an encoding, the body and what they know about the caller, and get
//! back the encoded answer or an [`ApiError`] to write in their own wire form
//! (each form is a column of [`ErrorKind::wire`]). Metrics, the access log and
//! the per-peer protocol record happen here, once, for every protocol.
//!
//! The call core below every transport: it imports none of them. Beside the
//! entry: [`state`] (what every transport takes), [`error`] (the one error
//! table), [`codec`] and [`json`] (bytes <-> messages), [`compression`]
//! (the binary protocol's compressions, both ways), [`running_tasks`] (the
//! one owner of the `GetRunningTasks` answer).

pub mod codec;
pub mod compression;
pub mod error;
pub mod json;
pub mod running_tasks;
pub mod state;

use std::{future::Future, net::IpAddr, time::Duration};

use bytes::Bytes;
use tokio::time::Instant;

use self::{
    compression::{Accepted, Algorithm},
    error::{ApiError, ErrorKind},
    state::AppState,
};
use crate::{
    admin::Credentials,
    edge::Proof,
    logging::{AccessLog, SLOW_CALL},
    metrics::CallEnd,
    pb::{self, Encoding, Method, Service},
    protocol::Protocol,
    security::Surface,
    service::CallContext,
};

/// Target of the access log: a line per call on every protocol, as
/// `--access_log` says ([`crate::logging::AccessLog`]).
pub const ACCESS_LOG: &str = "yadcc_scheduler::access";

/// Longest deadline a caller may ask for; longer values are clamped, since no
/// call legitimately takes longer than the longest wait plus transfer time.
pub const MAX_DEADLINE: Duration = Duration::from_secs(600);

/// A body that its connection's allowance and the global budget for
/// buffered requests cannot hold now.
pub fn budget_exhausted() -> ApiError {
    ApiError::new(
        ErrorKind::Overloaded,
        "the server is buffering too many request bytes; retry later",
    )
}

/// Why an admin token was refused unread.
const PLAINTEXT_ADMIN_TOKEN: &str = "the admin token is accepted over HTTPS only (this \
     scheduler has --tls_cert_file); plain HTTP is refused except from loopback or with \
     --allow_plaintext_inspection";

/// What a refusal from a slowed address block adds to its message.
fn slowed_message(left: Duration) -> String {
    format!(
        "too many failed credentials from this address: wrong ones are answered after {} s \
         for {} s more",
        crate::security::SLOWED_ANSWER.as_secs(),
        left.as_secs() + u64::from(left.subsec_nanos() > 0)
    )
}

/// A body that did not arrive within the body-read timeout.
pub fn body_too_slow(timeout: Duration) -> ApiError {
    ApiError::new(
        ErrorKind::DeadlineExceeded,
        format!(
            "the body did not arrive within the body-read timeout ({} ms)",
            timeout.as_millis()
        ),
    )
}

/// What the transport knows about one call before running it.
#[derive(Debug, Clone)]
pub struct Call {
    pub protocol: Protocol,
    pub encoding: Encoding,
    /// The caller's address (the socket's, or a trusted proxy's client).
    pub peer: IpAddr,
    /// When the caller stops waiting: `timeout` of the flare meta,
    /// `Rpc-Timeout`, `Connect-Timeout-Ms`.
    pub deadline: Option<Instant>,
    /// When the transport started on the call, for the latency it reports.
    pub started: Instant,
    /// The daemon connection the call came on (`flare`, `http+pb`): a daemon
    /// is its connection when callers take turns for quota. None for every
    /// other protocol, whose callers are their address.
    pub connection: Option<u64>,
    /// The compressions the caller inflates in an answer (the binary
    /// protocol's `acceptable_compression_algorithms`); none elsewhere.
    pub accepts: Accepted,
    /// What the caller presents to the operators' service (`Authorization`);
    /// none on the daemons' binary protocol.
    pub credentials: Credentials,
    /// The standing of the connection the call came on, marked once a call
    /// proves a token ([`proves_a_token`]); None without a connection.
    pub proof: Option<Proof>,
}

/// A call's encoded answer: the payload, compressed with `compression` if
/// the caller accepts it and the payload is large
/// ([`compression::compress_answer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedAnswer {
    pub payload: Bytes,
    pub compression: Option<Algorithm>,
}

impl EncodedAnswer {
    /// An uncompressed answer.
    pub fn plain(payload: Bytes) -> EncodedAnswer {
        EncodedAnswer {
            payload,
            compression: None,
        }
    }
}

impl Call {
    /// A call the transport `started` on, whose caller asked for an answer
    /// within `timeout`: the one place a deadline is clamped to
    /// [`MAX_DEADLINE`].
    pub fn new(
        protocol: Protocol,
        encoding: Encoding,
        peer: IpAddr,
        timeout: Option<Duration>,
        started: Instant,
    ) -> Self {
        Call {
            protocol,
            encoding,
            peer,
            deadline: timeout.map(|timeout| started + timeout.min(MAX_DEADLINE)),
            started,
            connection: None,
            accepts: Accepted::NONE,
            credentials: Credentials::NONE,
            proof: None,
        }
    }
}

/// Runs one call and records it. `method` carries the transport's checks
/// (unknown method, malformed headers); `body` is awaited under the caller's
/// deadline, so a client stalling mid-body gets its timeout answer.
pub async fn call(
    state: &AppState,
    call: &Call,
    method: Result<Method, ApiError>,
    body: impl Future<Output = Result<Bytes, ApiError>>,
) -> Result<EncodedAnswer, ApiError> {
    let named = method.as_ref().ok().copied();
    let outcome = async {
        let method = method?;
        // A standby takes no call (its daemons go to the leader through the
        // load balancer); nor does a leader whose lease may have run out.
        if let Some(refused) = not_served_here(state, method) {
            return Err(refused);
        }
        let ctx = CallContext {
            peer: call.peer,
            connection: call.connection,
            deadline: call
                .deadline
                .filter(|_| call.protocol.answers_no_quota_before_deadline()),
        };
        let run = async {
            let body = body.await?;
            dispatch(state, method, call, &body, &ctx).await
        };
        let answer = match call.deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, run)
                .await
                .unwrap_or_else(|_| {
                    Err(ApiError::new(
                        ErrorKind::DeadlineExceeded,
                        format!("{method} did not finish before the caller's deadline"),
                    ))
                }),
            None => run.await,
        };
        // A call held while this instance stepped down (a long poll, say)
        // failed for that reason, whatever the engine answered on its way
        // out (its servants expired, its queue emptied): "not served here",
        // as every call of a standby.
        answer.map_err(|error| not_served_here(state, method).unwrap_or(error))
    }
    .await;
    let outcome = match outcome {
        Err(mut error)
            if error.kind == ErrorKind::Scheduler(pb::Status::AccessDenied)
                && named.is_some_and(|method| method.service() == Service::Scheduler) =>
        {
            // Rule "guessing costs time", for a daemon's or a user's token
            // as for every credential.
            if let Some(left) = state
                .security
                .wrong_credential(Surface::RpcToken, call.peer)
                .await
            {
                error.message = format!("{}; {}", error.message, slowed_message(left));
            }
            Err(error)
        }
        other => other,
    };
    if let Some(proof) = &call.proof
        && proves_a_token(named, &outcome)
    {
        proof.mark();
    }
    record(state, call, named, outcome.as_ref().err());
    outcome
}

/// Rule "a connection proves itself": a call that needs a token (every
/// method but the open `GetRunningTasks`) and completed, or was told there
/// is no quota (said only after the token is checked). A connection that
/// never did so is a stranger at the edge (evicted first near the
/// connection cap, its buffered bytes bounded: [`crate::edge::Proof`]).
pub fn proves_a_token(method: Option<Method>, outcome: &Result<EncodedAnswer, ApiError>) -> bool {
    match method {
        None | Some(Method::GetRunningTasks) => false,
        Some(_) => match outcome {
            Ok(_) => true,
            Err(error) => error.kind == ErrorKind::Scheduler(pb::Status::NoQuotaAvailable),
        },
    }
}

/// "Overloaded" (code 11) when this instance does not serve now: a
/// standby, or a leader whose lease may have run out.
fn not_served_here(state: &AppState, method: Method) -> Option<ApiError> {
    let standby = state.leadership.refusal()?;
    Some(ApiError::new(
        ErrorKind::Overloaded,
        format!("{method}: not served here: {standby}"),
    ))
}

/// Records a finished call: metrics, access log, the peer's protocol.
/// `method` is None when the call named no method of this server.
pub fn record(state: &AppState, call: &Call, method: Option<Method>, error: Option<&ApiError>) {
    let elapsed = call.started.elapsed();
    let kind = error.map(|error| error.kind);
    let end = match kind {
        None => CallEnd::Answered,
        Some(kind) => CallEnd::Failed {
            http_status: kind.wire().http_status.as_u16(),
            status: kind.status(),
        },
    };
    state
        .metrics
        .observe_rpc(call.protocol, method, call.encoding, end, elapsed);
    state.peer_protocols.record(call.peer, call.protocol);
    log_call(state, call, method, kind, elapsed);
}

/// What an access line is limited by: one a second per protocol, method and
/// outcome (a slow success is an outcome of its own).
pub type AccessKind = (Protocol, Option<Method>, Option<ErrorKind>);

/// The access line of a finished call, as `--access_log` says: every call,
/// or only failures and slow calls (a caller told "no quota" did not fail:
/// it is how a wait ends), at most one line a second per kind.
fn log_call(
    state: &AppState,
    call: &Call,
    method: Option<Method>,
    kind: Option<ErrorKind>,
    elapsed: Duration,
) {
    let mode = state.settings.access_log;
    if mode == AccessLog::Off || !tracing::enabled!(target: ACCESS_LOG, tracing::Level::INFO) {
        return;
    }
    let failed =
        kind.is_some_and(|kind| kind != ErrorKind::Scheduler(pb::Status::NoQuotaAvailable));
    let slow = elapsed > SLOW_CALL && method != Some(Method::WaitForStartingTask);
    let left_out = match mode {
        AccessLog::All => 0,
        _ if !failed && !slow => return,
        _ => match state.access_lines.admit((call.protocol, method, kind)) {
            Some(left_out) => left_out,
            None => return,
        },
    };
    let wire = kind.map(ErrorKind::wire);
    tracing::info!(
        target: ACCESS_LOG,
        protocol = call.protocol.label(),
        rpc = method.map_or("unknown", Method::name),
        encoding = call.encoding.label(),
        peer = %call.peer,
        status = wire.map_or(200, |wire| wire.http_status.as_u16()),
        code = wire.map_or(0, |wire| wire.rpc_code),
        latency_us = elapsed.as_micros() as u64,
        left_out,
        "call"
    );
}

/// Decodes the request, calls the service, encodes the response (and
/// compresses it, if the caller accepts that and it is large).
pub async fn dispatch(
    state: &AppState,
    method: Method,
    call: &Call,
    body: &[u8],
    ctx: &CallContext,
) -> Result<EncodedAnswer, ApiError> {
    use codec::{decode, encode};
    if method.service() == Service::Admin {
        return dispatch_admin(state, method, call, body).await;
    }
    let service = &state.service;
    let encoding = call.encoding;
    let encoded = match method {
        Method::Heartbeat => encode(encoding, &service.heartbeat(decode(encoding, body)?, ctx)?),
        Method::GetConfig => encode(encoding, &service.get_config(decode(encoding, body)?, ctx)?),
        Method::WaitForStartingTask => encode(
            encoding,
            &service
                .wait_for_starting_task(decode(encoding, body)?, ctx)
                .await?,
        ),
        Method::KeepTaskAlive => encode(
            encoding,
            &service
                .keep_task_alive(decode(encoding, body)?, ctx)
                .await?,
        ),
        Method::FreeTask => encode(
            encoding,
            &service.free_task(decode(encoding, body)?, ctx).await?,
        ),
        // Every daemon asks for the same list every second: one owner
        // builds, encodes and compresses it once per version.
        Method::GetRunningTasks => {
            let request = decode(encoding, body)?;
            return state
                .running_tasks
                .encoded(service, request, ctx, encoding, call.accepts)
                .await;
        }
        Method::CordonServant
        | Method::UncordonServant
        | Method::DrainServant
        | Method::ListServantStates
        | Method::ListAuditEvents => unreachable!("dispatched to dispatch_admin above"),
    }?;
    let (compression, payload) = compression::compress_answer(Bytes::from(encoded), call.accepts);
    Ok(EncodedAnswer {
        payload,
        compression,
    })
}

/// The operators' service: the caller is authenticated before its request
/// is decoded (rule "order of checks"), and its answers are small, never
/// compressed.
async fn dispatch_admin(
    state: &AppState,
    method: Method,
    call: &Call,
    body: &[u8],
) -> Result<EncodedAnswer, ApiError> {
    use codec::{decode, encode};
    let admin = &state.admin;
    let credentials = &call.credentials;
    let security = &state.security;
    // Rule "credentials over TLS", as for the inspection credential: a
    // token sent in clear from afar is refused unread (never an oracle).
    if credentials.presents_token()
        && security
            .settings
            .refuses_plaintext_credential(credentials.over_tls(), call.peer)
    {
        return Err(ApiError::new(
            ErrorKind::Scheduler(pb::Status::AccessDenied),
            PLAINTEXT_ADMIN_TOKEN,
        ));
    }
    let caller = match admin
        .operators()
        .authenticate(credentials, call.peer, call.protocol)
    {
        Ok(caller) => caller,
        Err(refused) => {
            let mut error = ApiError::from(refused);
            if credentials.presents_token()
                && let Some(left) = security
                    .wrong_credential(Surface::AdminToken, call.peer)
                    .await
            {
                error.message = format!("{}; {}", error.message, slowed_message(left));
            }
            return Err(error);
        }
    };
    let encoding = call.encoding;
    let encoded = match method {
        Method::CordonServant => encode(
            encoding,
            &admin
                .cordon_servant(decode(encoding, body)?, &caller)
                .await?,
        ),
        Method::UncordonServant => encode(
            encoding,
            &admin
                .uncordon_servant(decode(encoding, body)?, &caller)
                .await?,
        ),
        Method::DrainServant => encode(
            encoding,
            &admin
                .drain_servant(decode(encoding, body)?, &caller)
                .await?,
        ),
        Method::ListServantStates => encode(
            encoding,
            &admin.list_servant_states(decode(encoding, body)?, &caller),
        ),
        Method::ListAuditEvents => encode(
            encoding,
            &admin.list_audit_events(decode(encoding, body)?, &caller),
        ),
        _ => unreachable!("{method} is the scheduler's"),
    }?;
    Ok(EncodedAnswer::plain(Bytes::from(encoded)))
}
