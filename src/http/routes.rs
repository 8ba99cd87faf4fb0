//! The router: which path goes where, and the layers around it.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Instant,
};

use axum::{
    Router,
    extract::{ConnectInfo, DefaultBodyLimit, Request, State},
    http::{HeaderMap, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{any, get},
};

use super::{
    codec::EncodedCache,
    dialect,
    error::{ApiError, ErrorKind},
};
use crate::{
    dashboard::{self, Dashboard},
    engine::Scheduler,
    metrics::Metrics,
    pb,
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
    /// `user:password` guarding the dashboard and inspection API; None: open.
    pub inspect_credential: Option<String>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            trusted_proxies: Vec::new(),
            inspect_credential: None,
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

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted_proxies
            .iter()
            .any(|proxy| proxy.to_canonical() == ip)
    }
}

/// Everything a handler may need. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub service: SchedulerService,
    pub settings: Arc<HttpSettings>,
    pub metrics: Arc<Metrics>,
    pub dashboard: Arc<Dashboard>,
    /// `GetRunningTasks` answers, encoded once per list and encoding.
    pub running_tasks_encoded: Arc<EncodedCache<pb::GetRunningTasksResponse>>,
}

impl AppState {
    /// Must run inside a tokio runtime (the dashboard starts its sampler).
    pub fn new(engine: Scheduler, settings: HttpSettings) -> Self {
        Self {
            metrics: Arc::new(Metrics::new(engine.clone())),
            dashboard: Dashboard::start(engine.clone(), settings.inspect_credential.clone()),
            service: SchedulerService::new(engine),
            settings: Arc::new(settings),
            running_tasks_encoded: Arc::default(),
        }
    }
}

/// Builds the whole application. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`: handlers read the
/// peer address.
pub fn app(state: AppState) -> Router {
    let rpc = Router::new()
        .route("/rpc/{full_name}", any(dialect::http_pb))
        .route(
            &format!("/{}/{{method}}", crate::pb::SCHEDULER_SERVICE),
            any(dialect::connect),
        )
        // The dialect reads the body itself, with the configured limit and a
        // clear error; no compression layer, so answers keep Content-Length.
        .layer(DefaultBodyLimit::disable());

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
        .merge(crate::openapi::router())
        .fallback(fallback)
        .layer(middleware::from_fn(log_request))
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

async fn fallback(request: Request) -> ApiError {
    ApiError::new(
        ErrorKind::ServiceNotFound,
        format!(
            "no route for {} {}; RPCs live under /rpc/ and /{}/",
            request.method(),
            request.uri().path(),
            crate::pb::SCHEDULER_SERVICE
        ),
    )
}

/// One line per request. The path and status only: bodies and headers (which
/// carry tokens) never reach the log.
async fn log_request(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(peer)| *peer);
    let response = next.run(request).await;
    tracing::info!(
        target: "yadcc_scheduler::access",
        %method,
        path,
        peer = peer.map(|peer| peer.to_string()).unwrap_or_default(),
        status = response.status().as_u16(),
        latency_us = started.elapsed().as_micros() as u64,
        "request"
    );
    response
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

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
