//! The endpoints for load balancers and monitoring, documented where they are
//! served: `#[utoipa::path]` on each handler, gathered by [`OperationsApi`]
//! for the OpenAPI document.

use axum::{
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};

use crate::rpc::state::AppState;

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Up", content_type = "text/plain", body = String, example = "ok\n")))]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready to take calls: not shutting down, and not a hot standby.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", content_type = "text/plain", body = String, example = "ready\n"),
        (status = 503, description = "Shutting down, or a standby", content_type = "text/plain", body = String, example = "shutting down\n"),
    ))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    if state.service.engine().is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    } else if let Some(standby) = state.leadership.refusal() {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{standby}\n")).into_response()
    } else {
        "ready\n".into_response()
    }
}

/// Prometheus metrics (OpenMetrics text format).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Metrics of the gateway and the engine",
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String)))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    state.metrics.render()
}

/// The operations endpoints' part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(healthz, readyz, metrics),
    tags((name = "operations", description = "Health, readiness and metrics, for load balancers and monitoring.")),
)]
pub struct OperationsApi;
