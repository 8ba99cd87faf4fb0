//! What people look at: the inspection API (JSON over the engine snapshot), a
//! server-side history ring, the static page from `web/`, embedded in the
//! binary, and the original scheduler's inspection dump at
//! `/inspect/vars/yadcc/task_dispatcher`. All of it is closed unless
//! `--inspect_credential` (HTTP basic auth) or `--debugging_no_inspect_auth`
//! opens it, as in the original; every answer carries the security headers.
//! Nothing here shows a token.
//!
//! - `access.rs`: who may read ([`InspectAccess`]) and the check in front of
//!   every route.
//! - `assets.rs`: the page and its ES modules, embedded from one list that
//!   also routes them, and the security headers.
//! - `history.rs`: the ring of one sample per second for the chart, and the
//!   grant rates (in all and per machine) over the last 10 s.
//! - `overview.rs`: the dashboard's JSON (`/api/v1/overview`).
//! - `tenants.rs`: the Tenants view (`/api/v1/tenants`) and the tenants'
//!   grant rates, sampled with the history.
//! - `vars.rs`: the original's dump under `/inspect/vars`.

mod access;
mod assets;
mod history;
mod overview;
mod tenants;
mod vars;

use std::sync::{Arc, Mutex, Weak};

use axum::{Router, middleware, routing::get};

use crate::{engine::Scheduler, ha::Leadership, protocol::PeerProtocols, security::Security};

/// A page's JSON, as `application/json` ending with a newline, as every JSON
/// answer of the server does ([`crate::pb::json_answer`]).
pub(crate) struct JsonAnswer<T>(pub T);

impl<T: serde::Serialize> axum::response::IntoResponse for JsonAnswer<T> {
    fn into_response(self) -> axum::response::Response {
        match crate::pb::json_answer(&self.0) {
            Ok(bytes) => (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                bytes,
            )
                .into_response(),
            Err(error) => (
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot encode JSON: {error}\n"),
            )
                .into_response(),
        }
    }
}

pub use access::InspectAccess;
pub use assets::{ASSETS, Asset, CONTENT_SECURITY_POLICY, SECURITY_HEADERS};
pub use history::{HISTORY_CAPACITY, HISTORY_INTERVAL, HistorySample, HistoryView, RATE_WINDOW};
pub use overview::{
    EnvironmentRow, GrantRow, OVERVIEW_MAX_AGE, Overview, ReasonView, RequesterRow, RunningTaskRow,
    ServantRow, TotalsView, grant_fingerprint,
};
pub use tenants::{TenantRow, TenantsView};
pub use vars::{
    DumpServant, DumpTask, INSPECT_VARS, InspectVars, TASK_DISPATCHER_PATH, TaskDispatcherDump,
    YadccVars,
};

/// The dashboard's state: the engine it reads, the history ring and the
/// optional credential.
#[derive(Debug)]
pub struct Dashboard {
    engine: Scheduler,
    history: Mutex<history::History>,
    tenant_rates: Mutex<tenants::TenantRates>,
    /// The last overview served, as JSON, and when it was built.
    overview_cache: Mutex<Option<(tokio::time::Instant, bytes::Bytes)>>,
    access: access::Access,
    /// The protocol of each peer's latest call.
    peer_protocols: Arc<PeerProtocols>,
    /// Leader or standby, shown with a hot standby.
    leadership: Leadership,
    /// The plaintext rule, the guessing limit and the failure counters.
    security: Security,
}

impl Dashboard {
    /// Creates the dashboard and starts its sampler, which stops when the
    /// dashboard is dropped. Must run inside a tokio runtime.
    pub fn start(
        engine: Scheduler,
        access: InspectAccess,
        peer_protocols: Arc<PeerProtocols>,
        leadership: Leadership,
        security: Security,
    ) -> Arc<Dashboard> {
        let dashboard = Arc::new(Dashboard {
            engine,
            history: Mutex::default(),
            tenant_rates: Mutex::default(),
            overview_cache: Mutex::default(),
            access: access::Access::from(access),
            peer_protocols,
            leadership,
            security,
        });
        // The first sample now, before any call is served: grants made
        // before the first sample would never count in a rate.
        dashboard.sample();
        tokio::spawn(sample_forever(Arc::downgrade(&dashboard)));
        dashboard
    }

    /// Takes one history sample now, and the grant rates with it.
    pub fn sample(&self) {
        let (totals, counters) = self.engine.totals();
        let requesters = self.engine.requesters();
        self.history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(&totals, counters.grants_issued, &requesters);
        let tenants = self.engine.tenants();
        self.tenant_rates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(tokio::time::Instant::now(), &tenants);
    }
}

async fn sample_forever(dashboard: Weak<Dashboard>) {
    let mut ticks = tokio::time::interval(HISTORY_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate, and `start` took that sample.
    ticks.tick().await;
    loop {
        ticks.tick().await;
        match dashboard.upgrade() {
            Some(dashboard) => dashboard.sample(),
            None => return,
        }
    }
}

/// The dashboard's part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(
        overview::overview,
        history::history,
        tenants::tenants,
        vars::inspect_vars,
        vars::inspect_vars_yadcc,
        vars::task_dispatcher
    ),
    components(schemas(
        InspectVars,
        YadccVars,
        TaskDispatcherDump,
        DumpServant,
        DumpTask,
        Overview,
        RequesterRow,
        TotalsView,
        ReasonView,
        ServantRow,
        GrantRow,
        RunningTaskRow,
        EnvironmentRow,
        HistoryView,
        HistorySample,
        TenantsView,
        TenantRow
    )),
    tags(
        (name = "dashboard", description = "The dashboard's JSON. Closed unless --inspect_credential (basic auth) or --debugging_no_inspect_auth is given."),
        (name = "inspection", description = "The original scheduler's inspection dump, same path and fields. Closed like the dashboard."),
    )
)]
pub struct DashboardApi;

/// `/`, its assets, `/api/v1/*` and `/inspect/*`, behind [`InspectAccess`],
/// every answer with the security headers.
pub fn router<S>(dashboard: Arc<Dashboard>) -> Router<S> {
    assets::routes()
        .route("/api/v1/overview", get(overview::overview))
        .route("/api/v1/history", get(history::history))
        .route("/api/v1/tenants", get(tenants::tenants))
        .merge(vars::routes())
        .layer(middleware::from_fn_with_state(
            Arc::clone(&dashboard),
            access::require_access,
        ))
        .layer(middleware::from_fn(assets::security_headers))
        .with_state(dashboard)
}
