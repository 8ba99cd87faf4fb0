//! The router: which path goes where, and the layers around it.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use futures_util::future::{BoxFuture, Either};
use tower::{Layer, Service};
use tower_http::cors::{AllowOrigin, CorsLayer};

use axum::{
    Router,
    extract::{ConnectInfo, DefaultBodyLimit, Request, State},
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::{any, get},
};

use super::{
    codec::EncodedCache,
    dialect,
    error::{ApiError, ErrorKind},
    grpc, reflection,
};
use crate::{
    dashboard::{self, Dashboard},
    engine::Scheduler,
    limits::{BodyBudget, EdgeSettings},
    metrics::Metrics,
    pb,
    protocol::PeerProtocols,
    rpc::ACCESS_LOG,
    service::SchedulerService,
};

/// Default body limit, the original framework's message size limit.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Transport settings fixed at start.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Peers whose `X-Forwarded-For` is believed. Empty: the socket address is the caller.
    pub trusted_proxies: Vec<IpAddr>,
    /// Who may read the dashboard, `/api/v1/*` and `/inspect/*` (default: nobody).
    pub inspect: dashboard::InspectAccess,
    /// Timeouts, connection caps and the budget for buffered bodies.
    pub edge: EdgeSettings,
    /// Origins whose browser pages may call the RPCs (CORS); `*` for any.
    /// Empty: no cross-origin calls.
    pub cors_allowed_origins: Vec<HeaderValue>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            trusted_proxies: Vec::new(),
            inspect: dashboard::InspectAccess::Closed,
            edge: EdgeSettings::default(),
            cors_allowed_origins: Vec::new(),
        }
    }
}

impl HttpSettings {
    /// The caller's address. Self-avoidance and NAT detection depend on it, so a
    /// forwarded address is believed only from a proxy the operator named: the
    /// rightmost `X-Forwarded-For` entry that is not itself a trusted proxy.
    pub fn client_ip(&self, peer: SocketAddr, headers: &HeaderMap) -> IpAddr {
        let peer_ip = peer.ip().to_canonical();
        if !self.is_trusted(peer_ip) {
            return peer_ip;
        }
        let forwarded: Vec<IpAddr> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .filter_map(|hop| hop.trim().parse::<IpAddr>().ok())
            .map(|ip| ip.to_canonical())
            .collect();
        forwarded
            .into_iter()
            .rev()
            .find(|ip| !self.is_trusted(*ip))
            .unwrap_or(peer_ip)
    }

    /// Whether `ip` is a reverse proxy the operator named (`--trusted_proxies`).
    pub(crate) fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted_proxies
            .iter()
            .any(|proxy| proxy.to_canonical() == ip)
    }
}

/// Everything a handler may need, behind one `Arc`: axum clones the state
/// for every request, and one reference count is cheaper than six.
#[derive(Debug, Clone)]
pub struct AppState(Arc<AppParts>);

/// What [`AppState`] holds.
#[derive(Debug)]
pub struct AppParts {
    pub service: SchedulerService,
    pub settings: HttpSettings,
    pub metrics: Metrics,
    pub dashboard: Arc<Dashboard>,
    /// The protocol of each peer's latest call (shown by the dashboard).
    pub peer_protocols: Arc<PeerProtocols>,
    /// Bytes buffered for large request bodies, on every protocol.
    pub body_budget: BodyBudget,
    /// `GetRunningTasks` answers, encoded once per list and encoding.
    pub running_tasks_encoded: EncodedCache<pb::GetRunningTasksResponse>,
}

impl std::ops::Deref for AppState {
    type Target = AppParts;

    fn deref(&self) -> &AppParts {
        &self.0
    }
}

impl AppState {
    /// Must run inside a tokio runtime (the dashboard starts its sampler).
    pub fn new(engine: Scheduler, settings: HttpSettings) -> Self {
        let peer_protocols = Arc::new(PeerProtocols::default());
        Self(Arc::new(AppParts {
            metrics: Metrics::new(engine.clone()),
            dashboard: Dashboard::start(
                engine.clone(),
                settings.inspect.clone(),
                Arc::clone(&peer_protocols),
            ),
            peer_protocols,
            body_budget: BodyBudget::new(settings.edge.max_buffered_body_bytes),
            service: SchedulerService::new(engine),
            settings,
            running_tasks_encoded: EncodedCache::default(),
        }))
    }
}

/// Builds the whole application. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`: handlers read the
/// peer address.
pub fn app(state: AppState) -> Router {
    let rpc = Router::new()
        .route(
            &format!("{}{{full_name}}", pb::RPC_PATH_PREFIX),
            any(dialect::http_pb),
        )
        .route(
            &format!("/{}/{{method}}", pb::SCHEDULER_SERVICE),
            any(grpc::connect_or_grpc),
        )
        // The dialect reads the body itself, with the configured limit and a
        // clear error; no compression layer, so answers keep Content-Length.
        .layer(DefaultBodyLimit::disable())
        .merge(reflection::router());
    // Browsers calling Connect or gRPC-Web from another origin.
    let rpc = match cors_layer(&state.settings.cors_allowed_origins) {
        Some(cors) => rpc.layer(cors),
        None => rpc,
    };

    let operations = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics));

    // Compression suits the dashboard's large JSON and never touches RPCs.
    let people = dashboard::router(Arc::clone(&state.dashboard))
        .layer(tower_http::compression::CompressionLayer::new());

    Router::new()
        .merge(rpc)
        .merge(operations)
        .merge(people)
        .merge(crate::openapi::router(matches!(
            state.settings.inspect,
            dashboard::InspectAccess::Credential(_)
        )))
        .fallback(fallback)
        .layer(AccessLogLayer)
        .with_state(state)
}

/// The process is up.
async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready to take calls: not shutting down.
async fn readyz(State(state): State<AppState>) -> Response {
    if state.service.engine().is_shutting_down() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    } else {
        "ready\n".into_response()
    }
}

async fn metrics(State(state): State<AppState>) -> Response {
    state.metrics.render()
}

async fn fallback(request: Request) -> Response {
    let error = ApiError::new(
        ErrorKind::ServiceNotFound,
        format!(
            "no route for {} {}; RPCs live under {} and /{}/",
            request.method(),
            request.uri().path(),
            pb::RPC_PATH_PREFIX,
            pb::SCHEDULER_SERVICE
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

/// Logs one line per request: method, path, peer, status, latency. Never
/// bodies or headers, which carry tokens. RPC calls are logged by
/// [`crate::rpc::record`] with their protocol and outcome, and skipped here. A plain layer rather than
/// `middleware::from_fn`, so that with the access log filtered out a request
/// pays nothing for it (no boxed future, no clone of the inner service).
#[derive(Debug, Clone, Copy)]
struct AccessLogLayer;

impl<S> Layer<S> for AccessLogLayer {
    type Service = AccessLog<S>;

    fn layer(&self, inner: S) -> AccessLog<S> {
        AccessLog { inner }
    }
}

#[derive(Debug, Clone)]
struct AccessLog<S> {
    inner: S,
}

impl<S> Service<Request> for AccessLog<S>
where
    S: Service<Request, Response = Response>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        if !tracing::enabled!(target: ACCESS_LOG, tracing::Level::INFO) {
            return Either::Left(self.inner.call(request));
        }
        let started = Instant::now();
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let peer = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| *peer);
        let response = self.inner.call(request);
        Either::Right(Box::pin(async move {
            let response = response.await?;
            if response.extensions().get::<dialect::CallLogged>().is_some() {
                return Ok(response);
            }
            tracing::info!(
                target: ACCESS_LOG,
                %method,
                path,
                peer = peer.map(|peer| peer.to_string()).unwrap_or_default(),
                status = response.status().as_u16(),
                latency_us = started.elapsed().as_micros() as u64,
                "request"
            );
            Ok(response)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_addresses_are_believed_only_from_trusted_proxies() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            HeaderValue::from_static("1.1.1.1, 10.0.0.7, 10.0.0.2"),
        );
        let peer: SocketAddr = "10.0.0.1:5000".parse().unwrap();

        let untrusting = HttpSettings::default();
        assert_eq!(untrusting.client_ip(peer, &headers), peer.ip());

        let trusting = HttpSettings {
            trusted_proxies: vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()],
            ..HttpSettings::default()
        };
        assert_eq!(
            trusting.client_ip(peer, &headers),
            "10.0.0.7".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn ipv4_mapped_peers_are_plain_ipv4() {
        let peer: SocketAddr = "[::ffff:10.1.2.3]:80".parse().unwrap();
        assert_eq!(
            HttpSettings::default().client_ip(peer, &HeaderMap::new()),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
    }
}
