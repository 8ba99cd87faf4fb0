//! Everything a request handler may need ([`AppState`]) and the transport
//! settings fixed at start ([`TransportSettings`]). Every transport (the daemons'
//! connections, the HTTP protocols) and [`crate::rpc`] take it; it knows
//! none of them.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use axum::http::{HeaderMap, HeaderValue};

use super::{
    AccessKind,
    running_tasks::{self, RunningTasksCache},
};
use crate::{
    admin::Admin,
    dashboard::{self, Dashboard},
    edge::{BodyBudget, EdgeSettings},
    engine::Scheduler,
    ha::Leadership,
    logging::{AccessLog, RateLimit},
    metrics::Metrics,
    protocol::PeerProtocols,
    readiness::Readiness,
    reload::Reloads,
    security::{Security, SecuritySettings},
    service::{SchedulerService, admin::AdminService},
};

/// Default body limit, the original framework's message size limit.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Transport settings fixed at start.
#[derive(Debug, Clone)]
pub struct TransportSettings {
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Largest `GetRunningTasks` answer (its encoding, before compression);
    /// a longer list is cut.
    pub max_running_tasks_bytes: usize,
    /// Peers whose `X-Forwarded-For` is believed. Empty: the socket address is the caller.
    pub trusted_proxies: Vec<IpAddr>,
    /// Who may read the dashboard, `/api/v1/*` and `/inspect/*` (default: nobody).
    pub inspect: dashboard::InspectAccess,
    /// Timeouts, connection caps and the budget for buffered bodies.
    pub edge: EdgeSettings,
    /// Origins whose browser pages may call the RPCs (CORS); `*` for any.
    /// Empty: no cross-origin calls.
    pub cors_allowed_origins: Vec<HeaderValue>,
    /// Which calls and requests the access log writes.
    pub access_log: AccessLog,
    /// TLS on the port and the rules for credentials over plain HTTP.
    pub security: SecuritySettings,
}

impl Default for TransportSettings {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_running_tasks_bytes: running_tasks::DEFAULT_MAX_ANSWER_BYTES,
            trusted_proxies: Vec::new(),
            inspect: dashboard::InspectAccess::Closed,
            edge: EdgeSettings::default(),
            cors_allowed_origins: Vec::new(),
            access_log: AccessLog::default(),
            security: SecuritySettings::default(),
        }
    }
}

impl TransportSettings {
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
/// for every request, and one reference count is cheaper than seven.
#[derive(Debug, Clone)]
pub struct AppState(Arc<AppParts>);

/// What [`AppState`] holds.
#[derive(Debug)]
pub struct AppParts {
    pub service: SchedulerService,
    /// The operators' service (closed unless `--admin_tokens`).
    pub admin: AdminService,
    pub settings: TransportSettings,
    pub metrics: Metrics,
    pub dashboard: Arc<Dashboard>,
    /// The protocol of each peer's latest call (shown by the dashboard).
    pub peer_protocols: Arc<PeerProtocols>,
    /// The global budget of buffered request bytes, beyond each
    /// connection's own allowance, on every protocol.
    pub body_budget: BodyBudget,
    /// `GetRunningTasks` answers, encoded once per list, encoding and
    /// compression.
    pub running_tasks: RunningTasksCache,
    /// Access lines of failed and slow calls, one a second per kind.
    pub access_lines: RateLimit<AccessKind>,
    /// Whether this instance serves (always, unless it is a hot standby).
    pub leadership: Leadership,
    /// Whether the scheduler takes calls (`/readyz`, gRPC health); the
    /// election's, so that a standby is not ready.
    pub readiness: Readiness,
    /// Failed credentials, the guessing limit, TLS's counters.
    pub security: Security,
    /// The files read again on SIGHUP and when they change (the one watcher
    /// runs while this state lives).
    pub reloads: Reloads,
}

impl std::ops::Deref for AppState {
    type Target = AppParts;

    fn deref(&self) -> &AppParts {
        &self.0
    }
}

impl AppState {
    /// The only scheduler. Must run inside a tokio runtime (the dashboard
    /// starts its sampler).
    pub fn new(engine: Scheduler, settings: TransportSettings) -> Self {
        Self::with_leadership(engine, settings, Leadership::solo())
    }

    /// One of several elected on etcd ([`crate::ha`]), or [`Leadership::solo`].
    pub fn with_leadership(
        engine: Scheduler,
        settings: TransportSettings,
        leadership: Leadership,
    ) -> Self {
        let admin = Admin::closed(engine.clone(), leadership.clone());
        Self::with_admin(engine, settings, leadership, admin)
    }

    /// With the operators' side `admin` (over the same engine).
    pub fn with_admin(
        engine: Scheduler,
        settings: TransportSettings,
        leadership: Leadership,
        admin: Admin,
    ) -> Self {
        let peer_protocols = Arc::new(PeerProtocols::default());
        let mut metrics = Metrics::new(engine.clone());
        metrics.register_leadership(&leadership);
        let security = Security::new(settings.security.clone());
        metrics.register_security(&security.counters);
        let reloads = Reloads::default();
        reloads.watch();
        Self(Arc::new(AppParts {
            reloads,
            metrics,
            dashboard: Dashboard::start(
                engine.clone(),
                settings.inspect.clone(),
                Arc::clone(&peer_protocols),
                leadership.clone(),
                security.clone(),
            ),
            security,
            peer_protocols,
            body_budget: {
                let servants = engine.servant_hosts();
                BodyBudget::with_servants(
                    settings.edge.max_buffered_body_bytes,
                    Arc::new(move |ip| servants.includes(ip)),
                )
            },
            service: SchedulerService::new(engine),
            admin: AdminService::new(admin),
            running_tasks: RunningTasksCache::new(settings.max_running_tasks_bytes),
            settings,
            access_lines: RateLimit::default(),
            readiness: leadership.readiness().clone(),
            leadership,
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

        let untrusting = TransportSettings::default();
        assert_eq!(untrusting.client_ip(peer, &headers), peer.ip());

        let trusting = TransportSettings {
            trusted_proxies: vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()],
            ..TransportSettings::default()
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
            TransportSettings::default().client_ip(peer, &HeaderMap::new()),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
    }
}
