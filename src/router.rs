//! The router: which path goes where, and the layers around it. Wiring
//! only, at the crate root so that every import points down: an RPC path
//! picks its dialect (as connect-go picks a protocol handler) and hands it
//! to the one seam ([`crate::http::handler`]); the other handlers live with their
//! part ([`crate::http::reflection`], [`crate::http::health`], [`crate::http::operations`],
//! [`crate::dashboard`], [`crate::openapi`]).

use std::{net::SocketAddr, sync::Arc};

use tower_http::cors::{AllowOrigin, CorsLayer};

use axum::{
    Router,
    extract::{ConnectInfo, DefaultBodyLimit, Path, Request, State},
    http::{HeaderName, HeaderValue},
    response::{IntoResponse, Response},
    routing::{any, get},
};

use crate::{
    dashboard,
    http::{
        access_log::AccessLogLayer,
        dialect::{self, RouteStyle},
        grpc::{self, Grpc},
        handler, health, operations, rebinding, reflection,
    },
    openapi, pb,
    rpc::{
        error::{ApiError, ErrorKind},
        state::AppState,
    },
};

/// Builds the whole application. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`: handlers read the
/// peer address.
pub fn app(state: AppState) -> Router {
    let mut rpc = Router::new().route(
        &format!("{}{{full_name}}", pb::RPC_PATH_PREFIX),
        any(rpc_path),
    );
    for service in pb::Service::ALL {
        rpc = rpc.route(
            &format!("/{}/{{method}}", service.full_name()),
            any(
                move |State(state): State<AppState>,
                      ConnectInfo(peer): ConnectInfo<SocketAddr>,
                      Path(method): Path<String>,
                      request: Request| {
                    service_path(state, service, peer, method, request)
                },
            ),
        );
    }
    let rpc = rpc
        // The dialect reads the body itself, with the configured limit and a
        // clear error; no compression layer, so answers keep Content-Length.
        .layer(DefaultBodyLimit::disable())
        .merge(reflection::router())
        .merge(health::router(state.readiness.clone()));
    // Browsers calling Connect or gRPC-Web from another origin.
    let rpc = match cors_layer(&state.settings.cors_allowed_origins) {
        Some(cors) => rpc.layer(cors),
        None => rpc,
    };

    let operations = Router::new()
        .route("/healthz", get(operations::healthz))
        .route("/readyz", get(operations::readyz))
        .route("/metrics", get(operations::metrics))
        // Between instances only (signed with their shared secret).
        .route(
            crate::ha::failsafe::PATH,
            axum::routing::post(operations::failsafe),
        );

    // Compression suits the dashboard's large JSON and never touches RPCs.
    let people = dashboard::router(Arc::clone(&state.dashboard))
        .layer(tower_http::compression::CompressionLayer::new());

    Router::new()
        .merge(rpc)
        .merge(operations)
        .merge(people)
        .merge(openapi::router())
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(
            state.settings.security.allowed_hosts.clone(),
            rebinding::refuse_rebinding,
        ))
        .layer(AccessLogLayer::new(state.settings.access_log))
        .with_state(state)
}

/// `POST /rpc/<full service name>.<Method>`: `http+pb`.
async fn rpc_path(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(full_name): Path<String>,
    request: Request,
) -> Response {
    let method = dialect::resolve_full_name(&full_name);
    handler::serve(&state, &RouteStyle::HttpPb, method, peer, request).await
}

/// `POST /<service>/<Method>` (`/yadcc.scheduler.SchedulerService/Heartbeat`):
/// Connect, unless the `Content-Type` says gRPC or gRPC-Web.
async fn service_path(
    state: AppState,
    service: pb::Service,
    peer: SocketAddr,
    method: String,
    request: Request,
) -> Response {
    let method = dialect::resolve(service, &method);
    if grpc::is_grpc(request.headers()) {
        handler::serve(&state, &Grpc, method, peer, request).await
    } else {
        handler::serve(&state, &RouteStyle::Connect, method, peer, request).await
    }
}

async fn fallback(request: Request) -> Response {
    let error = ApiError::new(
        ErrorKind::ServiceNotFound,
        format!(
            "no route for {} {}; RPCs live under {} and /{}/ (/{}/ for operators)",
            request.method(),
            request.uri().path(),
            pb::RPC_PATH_PREFIX,
            pb::SCHEDULER_SERVICE,
            pb::ADMIN_SERVICE,
        ),
    );
    if grpc::is_grpc(request.headers()) {
        grpc::error_response(request.headers(), error)
    } else {
        error.into_response()
    }
}

/// CORS for browser clients of Connect and gRPC-Web: the request headers
/// those protocols send, and the response headers their clients must read
/// (a browser hides every other one).
fn cors_layer(origins: &[HeaderValue]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow_origin = if origins.iter().any(|origin| origin == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().cloned())
    };
    let names = |names: &[&'static str]| -> Vec<HeaderName> {
        names
            .iter()
            .map(|name| HeaderName::from_static(name))
            .collect()
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow_origin)
            .allow_methods([axum::http::Method::POST])
            .allow_headers(names(&[
                "content-type",
                "connect-protocol-version",
                "connect-timeout-ms",
                "connect-content-encoding",
                "connect-accept-encoding",
                "grpc-timeout",
                "grpc-encoding",
                "grpc-accept-encoding",
                "x-grpc-web",
                "x-user-agent",
                "rpc-seqno",
                "rpc-timeout",
            ]))
            .expose_headers(names(&[
                "grpc-status",
                "grpc-message",
                "grpc-status-details-bin",
                "grpc-encoding",
                "grpc-accept-encoding",
                "connect-content-encoding",
                "rpc-error-code",
                "rpc-error-reason",
                "rpc-seqno",
            ]))
            .max_age(std::time::Duration::from_secs(2 * 60 * 60)),
    )
}
