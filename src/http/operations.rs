//! The endpoints for load balancers and monitoring, documented where they are
//! served: `#[utoipa::path]` on each handler, gathered by [`OperationsApi`]
//! for the OpenAPI document.

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};

use crate::{readiness::NotReady, rpc::state::AppState};

/// A failsafe leader's question from another instance of the hot standby
/// (`crate::ha::failsafe`): not for clients, so not in the API document.
/// 404 without `--ha_failsafe_secret_file`, 403 for a question not signed
/// with the shared secret, stale or replayed.
pub async fn failsafe(State(state): State<AppState>, body: String) -> Response {
    match state.leadership.failsafe_answer(&body) {
        None => StatusCode::NOT_FOUND.into_response(),
        Some(Ok(answer)) => answer.into_response(),
        Some(Err(why)) => (StatusCode::FORBIDDEN, format!("{why}\n")).into_response(),
    }
}

/// The process is up.
///
/// Liveness: `200` as long as the process answers HTTP, also while it drains.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Up", content_type = "text/plain", body = String, example = "ok\n")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready to take calls: not shutting down, and not a hot standby.
///
/// Readiness, for load balancers: `503` once a shutdown began, and on a hot
/// standby (`standby, leader is NAME`). The gRPC health service
/// (`grpc.health.v1.Health`) reports the same readiness.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", content_type = "text/plain", body = String, example = "ready\n"),
        (status = 503, description = "Shutting down, or a standby", content_type = "text/plain", body = String, example = "shutting down\n"),
    ))]
pub async fn readyz(State(state): State<AppState>, headers: HeaderMap) -> Response {
    // A balancer's check, not another instance's probe of its leader.
    if headers
        .get(header::USER_AGENT)
        .is_none_or(|agent| agent != crate::ha::probe::PROBE_USER_AGENT)
    {
        state.leadership.readiness_checked();
    }
    match state.readiness.current() {
        // A leader resumed past its lease (SIGSTOP, a paused VM) is not
        // ready from its first instant, before the election task has run:
        // the balancer must not send it daemons back.
        Ok(()) if state.leadership.is_serving() => "ready\n".into_response(),
        // Which instance leads is the election's to say.
        Ok(()) | Err(NotReady::Standby) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", state.leadership.current().describe()),
        )
            .into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", reason.describe()),
        )
            .into_response(),
    }
}

/// Prometheus metrics: the classic text format (0.0.4) by default, OpenMetrics
/// 1.0 when `Accept` prefers `application/openmetrics-text`.
///
/// Calls by protocol, method, encoding and outcome, latencies, connections,
/// the process, and the cluster as the engine sees it.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Metrics of the process, the gateway and the engine",
        content(
            (String = "text/plain; version=0.0.4; charset=utf-8"),
            (String = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        ))))]
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    state.metrics.render(headers.get(header::ACCEPT))
}

/// The operations endpoints' part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(healthz, readyz, metrics),
    tags((name = "operations", description = "Health, readiness and metrics, for load balancers and monitoring.")),
)]
pub struct OperationsApi;
