//! Prometheus exposition at `GET /metrics`, in the format the scraper asks
//! for ([`exposition`]: OpenMetrics 1.0, or the classic text 0.0.4 that
//! promtool reads). Request counters and latency histograms are recorded by
//! [`crate::rpc`] for every protocol, in its terms ([`Method`], [`Encoding`],
//! [`CallEnd`]); the cluster's state is read from the engine snapshot at
//! scrape time, so there is no second copy of it to drift; `process_*`
//! ([`process`]) and `yadcc_scheduler_build_info` describe the process.
//!
//! To add a family: register it in [`Metrics::new`] on `ours` (the
//! `yadcc_scheduler_` prefix), or add a [`Collector`] for figures read at
//! scrape time; docs/endpoints.md's metrics table lists every family.

mod exposition;
mod process;
mod tenants;

use std::{fmt, sync::OnceLock, time::Duration};

use axum::{
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric, text::encode},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::{Histogram, exponential_buckets},
        info::Info,
    },
    registry::Registry,
};

pub use exposition::{
    Format, OPENMETRICS_CONTENT_TYPE, PROMETHEUS_TEXT_CONTENT_TYPE, to_prometheus_text,
};

use crate::{
    build_info,
    engine::{ClusterTotals, Counters, Scheduler},
    ha::Leadership,
    pb::{self, Encoding, Method},
    protocol::{ConnectionKind, Protocol},
};

/// The prefix of every family of the scheduler's own.
pub const PREFIX: &str = "yadcc_scheduler";

/// The caps a connection can be refused for (`net` passes them to
/// [`Metrics::connection_refused`]); their series exist from the start, at 0,
/// so a rate over them is defined before the first refusal.
/// `evicted_stranger`: a connection that proved no token, closed near the
/// global cap to make room for a new one. `connection_buffers`: a
/// connection closed before its first request because what it held did not
/// fit the budget for connection buffers (`edge::buffers`).
pub const CONNECTION_CAPS: [&str; 4] = [
    "max_connections",
    "max_connections_per_ip",
    "evicted_stranger",
    "connection_buffers",
];

/// How a call ended, as its metrics tell endings apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    /// Answered with the response message.
    Answered,
    /// Failed: `http_status` is the error table's (the `code` label on every
    /// protocol), `status` the scheduler's `Status` when it was one.
    Failed {
        http_status: u16,
        status: Option<pb::Status>,
    },
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    protocol: &'static str,
    method: &'static str,
    encoding: &'static str,
    code: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabels {
    protocol: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: u32,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    protocol: &'static str,
    method: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

type HistogramFamily = Family<LatencyLabels, Histogram, fn() -> Histogram>;

const METHODS: usize = Method::ALL.len();
const PROTOCOLS: usize = Protocol::ALL.len();
const ENCODINGS: usize = 2;

/// The series every answered call writes, per protocol, method and
/// encoding (latency: per protocol and method), looked up in their families once, at first use: a family lookup
/// hashes the whole label set under a lock, once per call and series.
/// Filled lazily so the exposition lists only series that were used.
struct Resolved {
    answered: [OnceLock<Counter>; PROTOCOLS * METHODS * ENCODINGS],
    latency: [OnceLock<Histogram>; PROTOCOLS * METHODS],
}

impl Default for Resolved {
    fn default() -> Self {
        Self {
            answered: [const { OnceLock::new() }; PROTOCOLS * METHODS * ENCODINGS],
            latency: [const { OnceLock::new() }; PROTOCOLS * METHODS],
        }
    }
}

/// The registry and the families the transport writes to.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily,
    grant_wait: Family<OutcomeLabels, Histogram, fn() -> Histogram>,
    connections_accepted: Family<ProtocolLabels, Counter>,
    connections_open: Family<ProtocolLabels, Gauge>,
    connections_refused: Family<ReasonLabels, Counter>,
    config_reload_failures: Counter,
    resolved: Resolved,
}

/// An open connection, counted in `connections_open` until dropped.
#[derive(Debug)]
pub struct OpenConnection {
    gauge: Gauge,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~13 s: heartbeats are sub-millisecond, long polls last seconds.
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Metrics {
    pub fn new(engine: Scheduler) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(process::ProcessCollector));
        let ours = registry.sub_registry_with_prefix(PREFIX);
        ours.register(
            "build",
            "The running binary: its version and the commit it was built from",
            Info::new(BuildLabels {
                version: build_info::VERSION,
                commit: build_info::COMMIT,
            }),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: HistogramFamily = Family::new_with_constructor(latency_histogram);
        ours.register(
            "rpc_requests",
            "RPC calls by protocol, method, body encoding and outcome (the error table's HTTP status, 200 for success, on every protocol)",
            requests.clone(),
        );
        ours.register(
            "rpc_duration_seconds",
            "RPC latency by protocol and method (WaitForStartingTask includes its wait for quota)",
            latency.clone(),
        );
        let grant_wait: Family<OutcomeLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        ours.register(
            "grant_wait_seconds",
            "Time WaitForStartingTask callers waited, by outcome (granted, no_quota, error)",
            grant_wait.clone(),
        );
        let connections_accepted = Family::<ProtocolLabels, Counter>::default();
        ours.register(
            "connections_accepted",
            "Connections served, by the protocol their first bytes chose",
            connections_accepted.clone(),
        );
        let connections_open = Family::<ProtocolLabels, Gauge>::default();
        ours.register(
            "connections_open",
            "Connections open now, by protocol",
            connections_open.clone(),
        );
        let connections_refused = Family::<ReasonLabels, Counter>::default();
        for reason in CONNECTION_CAPS {
            drop(connections_refused.get_or_create(&ReasonLabels { reason }));
        }
        ours.register(
            "connections_refused",
            "Connections closed at accept, by the cap they were over (max_connections, max_connections_per_ip)",
            connections_refused.clone(),
        );
        let config_reload_failures = Counter::default();
        ours.register(
            "config_reload_failures",
            "Reloads of --tenants_file that failed (the running configuration stayed)",
            config_reload_failures.clone(),
        );
        ours.register_collector(Box::new(tenants::TenantCollector {
            engine: engine.clone(),
        }));
        ours.register_collector(Box::new(EngineCollector { engine }));
        Self {
            registry,
            requests,
            latency,
            grant_wait,
            connections_accepted,
            connections_open,
            connections_refused,
            config_reload_failures,
            resolved: Resolved::default(),
        }
    }

    /// The families of transport security ([`crate::security`]).
    pub fn register_security(&mut self, counters: &crate::security::SecurityCounters) {
        counters.register(self.registry.sub_registry_with_prefix(PREFIX));
    }

    /// Records one RPC call; `method` is None when the call named none this
    /// server has (labelled `unknown`).
    pub fn observe_rpc(
        &self,
        protocol: Protocol,
        method: Option<Method>,
        encoding: Encoding,
        end: CallEnd,
        elapsed: Duration,
    ) {
        let code = match end {
            CallEnd::Answered => 200,
            CallEnd::Failed { http_status, .. } => http_status,
        };
        let label = method.map_or("unknown", Method::name);
        let labels = || RequestLabels {
            protocol: protocol.label(),
            method: label,
            encoding: encoding.label(),
            code,
        };
        match (method, end) {
            (Some(known), CallEnd::Answered) => {
                let series =
                    (protocol as usize * METHODS + known as usize) * ENCODINGS + encoding as usize;
                self.resolved.answered[series]
                    .get_or_init(|| self.requests.get_or_create(&labels()).clone())
                    .inc();
            }
            _ => {
                self.requests.get_or_create(&labels()).inc();
            }
        }
        let seconds = elapsed.as_secs_f64();
        let latency_labels = || LatencyLabels {
            protocol: protocol.label(),
            method: label,
        };
        match method {
            Some(known) => self.resolved.latency[protocol as usize * METHODS + known as usize]
                .get_or_init(|| self.latency.get_or_create(&latency_labels()).clone())
                .observe(seconds),
            None => self
                .latency
                .get_or_create(&latency_labels())
                .observe(seconds),
        }
        if method == Some(Method::WaitForStartingTask) {
            let outcome = match end {
                CallEnd::Answered => "granted",
                CallEnd::Failed {
                    status: Some(pb::Status::NoQuotaAvailable),
                    ..
                } => "no_quota",
                CallEnd::Failed { .. } => "error",
            };
            self.grant_wait
                .get_or_create(&OutcomeLabels { outcome })
                .observe(seconds);
        }
    }

    /// Counts a connection whose protocol is known; it counts as open until
    /// the returned value is dropped.
    pub fn connection_opened(&self, kind: ConnectionKind) -> OpenConnection {
        let labels = ProtocolLabels {
            protocol: kind.label(),
        };
        self.connections_accepted.get_or_create(&labels).inc();
        let gauge = self.connections_open.get_or_create(&labels).clone();
        gauge.inc();
        OpenConnection { gauge }
    }

    /// The counter of failed `--tenants_file` reloads (the watcher counts).
    pub fn config_reload_failures(&self) -> Counter {
        self.config_reload_failures.clone()
    }

    /// Counts a connection closed at accept for being over `cap`.
    pub fn connection_refused(&self, cap: &'static str) {
        self.connections_refused
            .get_or_create(&ReasonLabels { reason: cap })
            .inc();
    }

    /// With a hot standby: whether this instance leads, elections won,
    /// lease renewal latency, time since the last change of role. Nothing
    /// for the only scheduler.
    pub fn register_leadership(&mut self, leadership: &Leadership) {
        let Some(stats) = leadership.stats() else {
            return;
        };
        let ours = self.registry.sub_registry_with_prefix(PREFIX);
        ours.register(
            "lease_renew_duration_seconds",
            "From sending an etcd lease renewal to its answer",
            stats.renew_latency.clone(),
        );
        ours.register_collector(Box::new(LeadershipCollector(leadership.clone())));
    }

    /// The exposition in `format`.
    pub fn encode(&self, format: Format) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        match format {
            Format::OpenMetrics => text,
            Format::PrometheusText => to_prometheus_text(&text),
        }
    }

    /// The answer to `GET /metrics` with this `Accept` header.
    pub fn render(&self, accept: Option<&HeaderValue>) -> Response {
        let format = Format::negotiate(accept);
        (
            [
                (header::CONTENT_TYPE, format.content_type()),
                // Caches between a scraper and the server must not hand a
                // text-format answer to an OpenMetrics scraper.
                (header::VARY, "accept"),
            ],
            self.encode(format),
        )
            .into_response()
    }
}

/// Reads the election's state at scrape time.
#[derive(Debug)]
struct LeadershipCollector(Leadership);

impl Collector for LeadershipCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let Some(stats) = self.0.stats() else {
            return Ok(());
        };
        write_gauge(
            &mut encoder,
            "leader",
            "1 while this instance is the elected leader and its lease certainly runs, else 0",
            i64::from(self.0.is_serving()),
        )?;
        write_gauge(
            &mut encoder,
            "taking_over",
            "1 while this standby serves daemons whose leader does not answer (it grants nothing until it wins), else 0",
            i64::from(self.0.role().is_taking_over()),
        )?;
        write_counter(
            &mut encoder,
            "elections_won",
            "Times this instance won the election",
            stats.elections_won.get(),
        )?;
        ConstGauge::new(stats.since_change().as_secs_f64()).encode(encoder.encode_descriptor(
            "seconds_since_leadership_change",
            "Seconds since this instance last became leader or stopped being one (or started)",
            None,
            MetricType::Gauge,
        )?)
    }
}

/// Reads the engine's snapshot at scrape time.
#[derive(Debug)]
struct EngineCollector {
    engine: Scheduler,
}

fn write_gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), fmt::Error> {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

fn write_counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), fmt::Error> {
    let counter = ConstCounter::new(value);
    counter.encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge_value(value: impl TryInto<i64>) -> i64 {
    value.try_into().unwrap_or(i64::MAX)
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let (totals, counters) = self.engine.totals();
        write_totals(&mut encoder, &totals)?;
        write_events(&mut encoder, &counters)?;
        write_waiter_refusals(&mut encoder, &counters)?;
        write_versions(&mut encoder, &self.engine)
    }
}

/// The cluster's gauges, from one pass over the servants.
fn write_totals(
    encoder: &mut DescriptorEncoder<'_>,
    totals: &ClusterTotals,
) -> Result<(), fmt::Error> {
    let gauges = [
        (
            "servants_up",
            "Live servants",
            gauge_value(totals.servants_up),
        ),
        (
            "servants_accepting",
            "Servants that accept tasks (not cordoned, a task limit above 0)",
            gauge_value(totals.servants_accepting),
        ),
        (
            "servants_cordoned",
            "Live servants an operator cordoned or is draining (not accepting)",
            gauge_value(totals.servants_cordoned),
        ),
        (
            "servants_ejected",
            "Servants out of rotation because their grants kept coming back at once",
            gauge_value(totals.servants_ejected),
        ),
        (
            "capacity",
            "Task slots the servants offer",
            gauge_value(totals.capacity),
        ),
        (
            "capacity_available",
            "Task slots free right now",
            gauge_value(totals.capacity_available),
        ),
        (
            "capacity_unavailable",
            "Task slots neither free nor running (load, memory, a cordon); running + capacity_available + capacity_unavailable = capacity + running_over_capacity",
            gauge_value(totals.capacity_unavailable),
        ),
        (
            "running_over_capacity",
            "Grants beyond the slots their servant offers now (it lowered its capacity)",
            gauge_value(totals.running_over_capacity),
        ),
        (
            "running",
            "Grants counted against servants, zombies included",
            gauge_value(totals.running),
        ),
        (
            "zombies",
            "Grants whose lease expired while the servant still runs them",
            gauge_value(totals.zombies),
        ),
        (
            "waiters",
            "WaitForStartingTask calls queued for quota",
            gauge_value(totals.waiters),
        ),
        ("grants", "Live grants", gauge_value(totals.grants)),
    ];
    for (name, help, value) in gauges {
        write_gauge(encoder, name, help, value)?;
    }
    Ok(())
}

/// The grants' life-cycle counters.
fn write_events(
    encoder: &mut DescriptorEncoder<'_>,
    counters: &Counters,
) -> Result<(), fmt::Error> {
    let events = [
        ("grants_issued", "Grants handed out", counters.grants_issued),
        (
            "renewals",
            "Grants renewed by KeepTaskAlive",
            counters.renewals,
        ),
        ("frees", "Grants given back by FreeTask", counters.frees),
        (
            "leases_expired",
            "Grants whose lease ran out (became zombies)",
            counters.leases_expired,
        ),
        (
            "zombies_reaped",
            "Zombies forgotten after their servant stopped listing them",
            counters.zombies_reaped,
        ),
        (
            "adoptions",
            "Running tasks adopted after a restart",
            counters.adoptions,
        ),
        (
            "adoptions_ended",
            "Adopted tasks that ended when their servant stopped listing them",
            counters.adoptions_ended,
        ),
        (
            "early_renewals",
            "Renewals after a restart of tasks no servant had reported yet",
            counters.early_renewals,
        ),
        (
            "renewals_refused",
            "Renewals refused: the grant belongs to another requester",
            counters.renewals_refused,
        ),
        (
            "frees_refused",
            "Frees skipped: the grant belongs to another requester",
            counters.frees_refused,
        ),
        (
            "servants_expired",
            "Servants removed after missing heartbeats",
            counters.servants_expired,
        ),
        (
            "no_quota",
            "WaitForStartingTask calls answered with no quota",
            counters.no_quota,
        ),
        (
            "broken_grants",
            "Immediate grants given back unlisted, far sooner than the farm's typical hold",
            counters.broken_grants,
        ),
        (
            "servant_ejections",
            "Servants taken out of rotation for broken grants",
            counters.ejections,
        ),
        (
            "servant_ejections_capped",
            "Ejections held back: the most servants that may be out at once were",
            counters.ejections_capped,
        ),
    ];
    for (name, help, value) in events {
        write_counter(encoder, name, help, value)?;
    }
    Ok(())
}

/// The waiter caps biting, named as their flags, like the connection caps.
fn write_waiter_refusals(
    encoder: &mut DescriptorEncoder<'_>,
    counters: &Counters,
) -> Result<(), fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "waiters_refused",
        "WaitForStartingTask calls answered no quota at once, by the cap that was full \
         (max_waiters, max_waiters_per_requester)",
        None,
        MetricType::Counter,
    )?;
    for (reason, value) in [
        ("max_waiters", counters.wait_refused_total_cap),
        (
            "max_waiters_per_requester",
            counters.wait_refused_requester_cap,
        ),
    ] {
        ConstCounter::new(value).encode(family.encode_family(&ReasonLabels { reason })?)?;
    }
    Ok(())
}

/// Daemon versions seen: rolling upgrades show here.
fn write_versions(
    encoder: &mut DescriptorEncoder<'_>,
    engine: &Scheduler,
) -> Result<(), fmt::Error> {
    let mut versions = std::collections::BTreeMap::<u32, i64>::new();
    for servant in engine.snapshot().servants {
        *versions.entry(servant.version).or_default() += 1;
    }
    let mut family = encoder.encode_descriptor(
        "servants_by_version",
        "Live servants by the daemon version they report",
        None,
        MetricType::Gauge,
    )?;
    for (version, count) in versions {
        ConstGauge::new(count).encode(family.encode_family(&VersionLabels { version })?)?;
    }
    Ok(())
}
