//! What people look at: the inspection API (JSON over the engine snapshot), a
//! server-side history ring, the static page from `web/`, embedded in the
//! binary, and the original scheduler's inspection dump at
//! `/inspect/vars/yadcc/task_dispatcher`. All of it is closed unless
//! `--inspect_credential` (HTTP basic auth) or `--debugging_no_inspect_auth`
//! opens it, as in the original; every answer carries the security headers.
//! Nothing here shows a token.

use std::{
    collections::{BTreeMap, VecDeque},
    net::IpAddr,
    sync::{Arc, Mutex, Weak},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    Json, Router,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
};
use base64::Engine as _;
use serde::{Serialize, Serializer};
use utoipa::ToSchema;

use crate::{
    engine::{self, NotAcceptingReason, Redacted, Scheduler, ServantPriority, TokenSet},
    pb,
    protocol::PeerProtocols,
};

/// One history sample per this interval.
pub const HISTORY_INTERVAL: Duration = Duration::from_secs(1);
/// How long one overview serves every page that asks.
pub const OVERVIEW_MAX_AGE: Duration = Duration::from_millis(1000);
/// Samples kept: one hour at one per second.
pub const HISTORY_CAPACITY: usize = 3600;

/// The dashboard's state: the engine it reads, the history ring and the
/// optional credential.
#[derive(Debug)]
pub struct Dashboard {
    engine: Scheduler,
    history: Mutex<History>,
    /// The last overview served, as JSON, and when it was built.
    overview_cache: Mutex<Option<(tokio::time::Instant, bytes::Bytes)>>,
    access: Access,
    /// The protocol of each peer's latest call.
    peer_protocols: Arc<PeerProtocols>,
}

/// Who may read the dashboard, `/api/v1/*` and `/inspect/*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum InspectAccess {
    /// Nobody (the original's default): answers say which flag opens them.
    #[default]
    Closed,
    /// HTTP basic auth with this `user:password` (`--inspect_credential`).
    Credential(Redacted<String>),
    /// Anyone who reaches the port (`--debugging_no_inspect_auth`, or the
    /// demo on loopback).
    Open,
}

/// [`InspectAccess`] ready for checking.
#[derive(Debug)]
enum Access {
    Closed,
    /// `user:password`, compared like tokens: in constant time.
    Credential(TokenSet),
    Open,
}

#[derive(Debug, Default)]
struct History {
    samples: VecDeque<HistorySample>,
    last_grants_issued: Option<(u64, tokio::time::Instant)>,
}

impl Dashboard {
    /// Creates the dashboard and starts its sampler, which stops when the
    /// dashboard is dropped. Must run inside a tokio runtime.
    pub fn start(
        engine: Scheduler,
        access: InspectAccess,
        peer_protocols: Arc<PeerProtocols>,
    ) -> Arc<Dashboard> {
        let dashboard = Arc::new(Dashboard {
            engine,
            history: Mutex::default(),
            overview_cache: Mutex::default(),
            access: match access {
                InspectAccess::Closed => Access::Closed,
                InspectAccess::Credential(credential) => {
                    Access::Credential(TokenSet::new([credential.0]))
                }
                InspectAccess::Open => Access::Open,
            },
            peer_protocols,
        });
        tokio::spawn(sample_forever(Arc::downgrade(&dashboard)));
        dashboard
    }

    /// Takes one history sample now.
    pub fn sample(&self) {
        let (totals, counters) = self.engine.totals();
        let now = tokio::time::Instant::now();
        let mut history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let issued = counters.grants_issued;
        let grants_per_second = match history.last_grants_issued {
            Some((before, at)) if now > at => {
                issued.saturating_sub(before) as f64 / (now - at).as_secs_f64()
            }
            _ => 0.0,
        };
        history.last_grants_issued = Some((issued, now));
        if history.samples.len() == HISTORY_CAPACITY {
            history.samples.pop_front();
        }
        history.samples.push_back(HistorySample {
            at_ms: unix_millis(SystemTime::now()),
            capacity: totals.capacity,
            capacity_available: totals.capacity_available,
            running: totals.running,
            waiters: totals.waiters as u64,
            grants_per_second,
        });
    }

    fn history(&self) -> HistoryView {
        let history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        HistoryView {
            interval_seconds: HISTORY_INTERVAL.as_secs(),
            samples: history.samples.iter().cloned().collect(),
        }
    }

    fn latest_grants_per_second(&self) -> f64 {
        let history = self.history.lock().unwrap_or_else(|p| p.into_inner());
        history
            .samples
            .back()
            .map_or(0.0, |sample| sample.grants_per_second)
    }

    /// [`Dashboard::overview`] as JSON, built at most once per
    /// [`OVERVIEW_MAX_AGE`]: a snapshot of a large cluster holds the engine
    /// lock for milliseconds, and every open page polls every two seconds.
    pub fn overview_json(&self) -> bytes::Bytes {
        let mut cache = self
            .overview_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let now = tokio::time::Instant::now();
        if let Some((built_at, json)) = cache.as_ref()
            && now.saturating_duration_since(*built_at) < OVERVIEW_MAX_AGE
        {
            return json.clone();
        }
        let json = bytes::Bytes::from(
            serde_json::to_vec(&self.overview()).unwrap_or_else(|_| b"{}".to_vec()),
        );
        *cache = Some((now, json.clone()));
        json
    }

    /// The whole picture in one document, so one poll refreshes the page.
    pub fn overview(&self) -> Overview {
        let snapshot = self.engine.snapshot();
        let now = SystemTime::now();
        let totals = &snapshot.totals;
        Overview {
            generated_at_ms: unix_millis(now),
            uptime_seconds: snapshot.uptime.as_secs(),
            totals: TotalsView {
                servants_up: totals.servants_up as u64,
                servants_accepting: totals.servants_accepting as u64,
                capacity: totals.capacity,
                capacity_available: totals.capacity_available,
                capacity_unavailable: totals.capacity_unavailable,
                running: totals.running,
                zombies: totals.zombies,
                waiters: totals.waiters as u64,
                grants: totals.grants as u64,
                grants_per_second: self.latest_grants_per_second(),
            },
            servants: snapshot
                .servants
                .iter()
                .map(|servant| ServantRow::new(servant, now))
                .collect(),
            grants: snapshot.grants.iter().map(GrantRow::from).collect(),
            running_tasks: self
                .engine
                .running_tasks()
                .iter()
                .map(|task| RunningTaskRow {
                    servant: task.servant.to_string(),
                    servant_task_id: task.servant_task_id,
                    grant_id: task.grant_id,
                    task_digest: task.task_digest.clone(),
                })
                .collect(),
            environments: snapshot
                .environments
                .iter()
                .map(|environment| EnvironmentRow {
                    digest: environment.digest.clone(),
                    servants: environment.servants as u64,
                    capacity_available: environment.capacity_available,
                    running: environment.running,
                    waiters: environment.waiters as u64,
                })
                .collect(),
            peer_protocols: self
                .peer_protocols
                .labels()
                .into_iter()
                .map(|(ip, label)| (ip, label.to_owned()))
                .collect(),
            requesters: snapshot
                .requesters
                .iter()
                .map(|requester| RequesterRow {
                    ip: requester.ip.to_string(),
                    grants_held: requester.grants_held,
                    waiting: requester.waiting,
                    grants_total: requester.grants_total,
                    refused_total: requester.refused_total,
                })
                .collect(),
        }
    }
}

async fn sample_forever(dashboard: Weak<Dashboard>) {
    let mut ticks = tokio::time::interval(HISTORY_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match dashboard.upgrade() {
            Some(dashboard) => dashboard.sample(),
            None => return,
        }
    }
}

fn unix_millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// 64-bit integers go out as strings: JavaScript numbers lose precision above 2^53.
fn as_string<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// Everything the dashboard shows, in one poll.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Overview {
    /// Wall-clock time of this document, milliseconds since the Unix epoch.
    pub generated_at_ms: u64,
    pub uptime_seconds: u64,
    pub totals: TotalsView,
    /// Servants in registration order.
    pub servants: Vec<ServantRow>,
    pub grants: Vec<GrantRow>,
    /// Tasks as the servants reported them in their latest heartbeat.
    pub running_tasks: Vec<RunningTaskRow>,
    pub environments: Vec<EnvironmentRow>,
    /// Peer IP address -> protocol of its latest call (`flare`, `http+pb`,
    /// `http`, `connect`, `grpc`, `grpc-web`), for the servants' and
    /// requesters' protocol column.
    pub peer_protocols: std::collections::BTreeMap<String, String>,
    /// Requesting machines (delegates by IP), sorted by IP.
    pub requesters: Vec<RequesterRow>,
}

/// Cluster totals.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TotalsView {
    pub servants_up: u64,
    /// Servants with a non-zero task limit.
    pub servants_accepting: u64,
    /// Task slots the servants offer.
    pub capacity: u64,
    /// Task slots free right now.
    pub capacity_available: u64,
    /// Task slots offered but unusable (load, memory, NAT, unverified).
    pub capacity_unavailable: u64,
    /// Grants counted against servants, zombies included.
    pub running: u64,
    pub zombies: u64,
    /// Calls queued for quota.
    pub waiters: u64,
    pub grants: u64,
    /// Grants handed out per second, over the last history interval.
    pub grants_per_second: f64,
}

/// Why a servant takes no task, in words.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReasonView {
    /// `NotAcceptingTaskReason` number.
    pub code: u32,
    /// Enum name without prefix, e.g. `BEHIND_NAT`.
    pub name: String,
    pub description: String,
}

impl ReasonView {
    fn new(reason: NotAcceptingReason, servant: &engine::ServantView) -> Self {
        let name = match reason {
            NotAcceptingReason::UserInstructed => "USER_INSTRUCTED".to_owned(),
            NotAcceptingReason::PoorMachine => "POOR_MACHINE".to_owned(),
            NotAcceptingReason::CgroupsPresent => "CGROUPS_PRESENT".to_owned(),
            NotAcceptingReason::BehindNat => "BEHIND_NAT".to_owned(),
            NotAcceptingReason::NotVerified => "NOT_VERIFIED".to_owned(),
            NotAcceptingReason::Other(code) => format!("REASON_{code}"),
        };
        let description = match reason {
            NotAcceptingReason::BehindNat => format!(
                "reported location {} differs from the observed {}",
                servant.reported_location, servant.observed_location
            ),
            other => other.describe().to_owned(),
        };
        Self {
            code: reason.code(),
            name,
            description,
        }
    }
}

/// One servant, with every field of the reference scheduler's dump.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServantRow {
    /// Observed IP and reported port: how the servant is identified.
    pub location: String,
    pub reported_location: String,
    pub version: u32,
    /// `DEDICATED` or `USER`.
    pub priority: &'static str,
    pub environments: Vec<String>,
    /// Task limit after every rule (0 when not accepting).
    pub max_tasks: u32,
    pub not_accepting_reason: Option<ReasonView>,
    pub num_processors: u32,
    pub current_load: u32,
    /// `min(capacity, processors - foreign load)`, 0 under the memory floor.
    pub capacity_available: u32,
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub total_memory_bytes: u64,
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub memory_available_bytes: u64,
    /// Grants counted against it, zombies included.
    pub running: u32,
    pub zombies: u32,
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub ever_assigned: u64,
    pub reported_running_tasks: u64,
    /// Calls queued for environments this servant offers.
    pub waiters: u64,
    pub discovered_at_ms: u64,
    pub expires_at_ms: u64,
    /// Sent its last heartbeat (`next_heartbeat_in_ms = 0`).
    pub leaving: bool,
}

impl ServantRow {
    fn new(servant: &engine::ServantView, now: SystemTime) -> Self {
        Self {
            location: servant.observed_location.to_string(),
            reported_location: servant.reported_location.to_string(),
            version: servant.version,
            priority: match servant.priority {
                ServantPriority::Dedicated => "DEDICATED",
                ServantPriority::User => "USER",
            },
            environments: servant.environments.clone(),
            max_tasks: servant.max_tasks,
            not_accepting_reason: servant
                .not_accepting_reason
                .map(|reason| ReasonView::new(reason, servant)),
            num_processors: servant.num_processors,
            current_load: servant.current_load,
            capacity_available: servant.capacity_available,
            total_memory_bytes: servant.total_memory,
            memory_available_bytes: servant.memory_available,
            running: servant.running,
            zombies: servant.zombies,
            ever_assigned: servant.ever_assigned,
            reported_running_tasks: servant.reported_running_tasks as u64,
            waiters: servant.waiters as u64,
            discovered_at_ms: unix_millis(
                now.checked_sub(servant.discovered_ago)
                    .unwrap_or(UNIX_EPOCH),
            ),
            expires_at_ms: unix_millis(now + servant.expires_in),
            leaving: servant.leaving,
        }
    }
}

/// One grant.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantRow {
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub id: u64,
    /// Requester IP; null for a task adopted after a restart.
    pub requester: Option<String>,
    pub servant: String,
    /// Compiler digest; null for an adopted task.
    pub environment: Option<String>,
    pub age_ms: u64,
    /// Zero for zombies.
    pub lease_left_ms: u64,
    pub prefetch: bool,
    pub zombie: bool,
    pub adopted: bool,
}

impl From<&engine::GrantView> for GrantRow {
    fn from(grant: &engine::GrantView) -> Self {
        Self {
            id: grant.id,
            requester: grant.requester.map(|ip: IpAddr| ip.to_string()),
            servant: grant.servant.to_string(),
            environment: grant.environment.clone(),
            age_ms: grant.age.as_millis() as u64,
            lease_left_ms: grant.lease_left.as_millis() as u64,
            prefetch: grant.prefetch,
            zombie: grant.zombie,
            adopted: grant.adopted,
        }
    }
}

/// A task as its servant reported it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunningTaskRow {
    pub servant: String,
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub servant_task_id: u64,
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub grant_id: u64,
    pub task_digest: String,
}

/// One requesting machine: what it holds, waits for, got and was refused.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequesterRow {
    pub ip: String,
    /// Grants it owns now (live and zombie).
    pub grants_held: u64,
    /// Its calls waiting for quota now.
    pub waiting: u64,
    /// Grants made to it since start.
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub grants_total: u64,
    /// Its renewals and frees of grants it does not own, refused since start.
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub refused_total: u64,
}

/// One compiler environment across the cluster.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentRow {
    pub digest: String,
    pub servants: u64,
    pub capacity_available: u64,
    pub running: u64,
    pub waiters: u64,
}

/// The history ring, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryView {
    pub interval_seconds: u64,
    pub samples: Vec<HistorySample>,
}

/// One history sample.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistorySample {
    pub at_ms: u64,
    pub capacity: u64,
    pub capacity_available: u64,
    pub running: u64,
    pub waiters: u64,
    pub grants_per_second: f64,
}

/// The framework's exposed-variables page, where the original serves its dump.
pub const INSPECT_VARS: &str = "/inspect/vars";
/// The original scheduler's inspection dump.
pub const TASK_DISPATCHER_PATH: &str = "/inspect/vars/yadcc/task_dispatcher";

/// The original scheduler's inspection dump, field for field: what scripts
/// written against `/inspect/vars/yadcc/task_dispatcher` read. Times are
/// `YYYY-MM-DD HH:MM:SS` in UTC (the original used its local time zone).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskDispatcherDump {
    /// Servants in registration order.
    pub servants: Vec<DumpServant>,
    /// Grants, keyed by grant id (decimal).
    pub tasks: BTreeMap<String, DumpTask>,
    pub servants_up: u64,
    /// Grants counted against servants, zombies included.
    pub running_tasks: u64,
    pub capacity: u64,
    pub capacity_available: u64,
    pub capacity_unavailable: u64,
}

/// One servant in the original's dump.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DumpServant {
    pub version: u32,
    /// Present when the observed and reported locations agree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Present (with `reported_location`) when they differ: behind NAT.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_location: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_location: Option<String>,
    pub discovered_at: String,
    pub expires_at: String,
    pub environments: Vec<String>,
    /// `SERVANT_PRIORITY_DEDICATED` or `SERVANT_PRIORITY_USER`.
    pub priority: String,
    /// Present when it takes tasks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tasks: Option<u32>,
    /// Present instead of `max_tasks` when it takes none, e.g.
    /// `NOT_ACCEPTING_TASK_REASON_BEHIND_NAT`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_accepting_task_reason: Option<String>,
    pub num_processors: u32,
    pub current_load: u32,
    pub capacity_available: u32,
    pub total_memory_mb: u64,
    pub memory_available_mb: u64,
    pub running_tasks: u32,
    pub ever_assigned_tasks: u64,
}

/// One grant in the original's dump.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DumpTask {
    /// The grant id (a JSON number, as in the original).
    pub task_id: u64,
    /// Empty for a task adopted after a restart.
    pub requestor_ip: String,
    /// Empty for a task adopted after a restart.
    pub compiler_digest: String,
    pub started_at: String,
    /// For a zombie, when its lease ended is not kept: the time of the dump.
    pub expires_at: String,
    pub prefetched_task: bool,
    pub servant_location: String,
    pub zombie: bool,
}

impl Dashboard {
    /// The original's dump, from one engine snapshot.
    pub fn task_dispatcher_dump(&self) -> TaskDispatcherDump {
        let snapshot = self.engine.snapshot();
        let now = SystemTime::now();
        let servants = snapshot
            .servants
            .iter()
            .map(|servant| {
                let (observed, reported) = (
                    servant.observed_location.to_string(),
                    servant.reported_location.to_string(),
                );
                let (location, observed_location, reported_location) = if observed == reported {
                    (Some(observed), None, None)
                } else {
                    (None, Some(observed), Some(reported))
                };
                let accepting = servant.max_tasks > 0;
                DumpServant {
                    version: servant.version,
                    location,
                    observed_location,
                    reported_location,
                    discovered_at: format_time(
                        now.checked_sub(servant.discovered_ago)
                            .unwrap_or(UNIX_EPOCH),
                    ),
                    expires_at: format_time(now + servant.expires_in),
                    environments: servant.environments.clone(),
                    priority: match servant.priority {
                        ServantPriority::Dedicated => pb::ServantPriority::Dedicated,
                        ServantPriority::User => pb::ServantPriority::User,
                    }
                    .as_str_name()
                    .to_owned(),
                    max_tasks: accepting.then_some(servant.max_tasks),
                    not_accepting_task_reason: (!accepting)
                        .then(|| reason_name(servant.not_accepting_reason)),
                    num_processors: servant.num_processors,
                    current_load: servant.current_load,
                    capacity_available: servant.capacity_available,
                    total_memory_mb: servant.total_memory >> 20,
                    memory_available_mb: servant.memory_available >> 20,
                    running_tasks: servant.running,
                    ever_assigned_tasks: servant.ever_assigned,
                }
            })
            .collect();
        let tasks = snapshot
            .grants
            .iter()
            .map(|grant| {
                let task = DumpTask {
                    task_id: grant.id,
                    requestor_ip: grant.requester.map(|ip| ip.to_string()).unwrap_or_default(),
                    compiler_digest: grant.environment.clone().unwrap_or_default(),
                    started_at: format_time(now.checked_sub(grant.age).unwrap_or(UNIX_EPOCH)),
                    expires_at: format_time(now + grant.lease_left),
                    prefetched_task: grant.prefetch,
                    servant_location: grant.servant.to_string(),
                    zombie: grant.zombie,
                };
                (grant.id.to_string(), task)
            })
            .collect();
        let totals = &snapshot.totals;
        TaskDispatcherDump {
            servants,
            tasks,
            servants_up: totals.servants_up as u64,
            running_tasks: totals.running,
            capacity: totals.capacity,
            capacity_available: totals.capacity_available,
            capacity_unavailable: totals.capacity_unavailable,
        }
    }
}

/// The protobuf enum name the original printed; a code the proto does not
/// know is shown as its number.
fn reason_name(reason: Option<NotAcceptingReason>) -> String {
    let code = reason.map_or(0, |reason| reason.code());
    i32::try_from(code)
        .ok()
        .and_then(|code| pb::NotAcceptingTaskReason::try_from(code).ok())
        .map_or_else(
            || format!("NOT_ACCEPTING_TASK_REASON_{code}"),
            |known| known.as_str_name().to_owned(),
        )
}

/// `YYYY-MM-DD HH:MM:SS` in UTC, the original's format.
fn format_time(at: SystemTime) -> String {
    let seconds = at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let (days, of_day) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// The Gregorian date `days` after 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// The original scheduler's inspection dump (same path, same fields).
#[utoipa::path(get, path = "/inspect/vars/yadcc/task_dispatcher", tag = "inspection",
    responses((status = 200, description = "The dump", body = TaskDispatcherDump),
              (status = 401, description = "Basic auth required (--inspect_credential)"),
              (status = 403, description = "Closed: start with --inspect_credential or --debugging_no_inspect_auth")))]
async fn task_dispatcher(State(dashboard): State<Arc<Dashboard>>) -> Json<TaskDispatcherDump> {
    Json(dashboard.task_dispatcher_dump())
}

/// The exposed variables under `yadcc`, as the framework nests them.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct YadccVars {
    pub task_dispatcher: TaskDispatcherDump,
}

/// Every exposed variable, as the framework nests them.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InspectVars {
    pub yadcc: YadccVars,
}

/// All exposed variables (only the dump, here).
#[utoipa::path(get, path = "/inspect/vars", tag = "inspection",
    responses((status = 200, description = "Every exposed variable", body = InspectVars),
              (status = 401, description = "Basic auth required (--inspect_credential)"),
              (status = 403, description = "Closed: start with --inspect_credential or --debugging_no_inspect_auth")))]
async fn inspect_vars(State(dashboard): State<Arc<Dashboard>>) -> Json<InspectVars> {
    Json(InspectVars {
        yadcc: YadccVars {
            task_dispatcher: dashboard.task_dispatcher_dump(),
        },
    })
}

/// The exposed variables under `yadcc`.
#[utoipa::path(get, path = "/inspect/vars/yadcc", tag = "inspection",
    responses((status = 200, description = "The variables under yadcc", body = YadccVars),
              (status = 401, description = "Basic auth required (--inspect_credential)"),
              (status = 403, description = "Closed: start with --inspect_credential or --debugging_no_inspect_auth")))]
async fn inspect_vars_yadcc(State(dashboard): State<Arc<Dashboard>>) -> Json<YadccVars> {
    Json(YadccVars {
        task_dispatcher: dashboard.task_dispatcher_dump(),
    })
}

/// Behind the same access check as the real pages, so a closed scheduler
/// does not tell which inspection pages exist.
async fn no_such_inspection_page(request: Request) -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!(
            "no inspection page at {}; the scheduler's dump is at {TASK_DISPATCHER_PATH}\n",
            request.uri().path()
        ),
    )
        .into_response()
}

/// Cluster overview: totals, servants, grants, running tasks, environments.
#[utoipa::path(get, path = "/api/v1/overview", tag = "dashboard",
    responses((status = 200, description = "The cluster now", body = Overview),
              (status = 401, description = "Basic auth required (--inspect_credential)"),
              (status = 403, description = "Closed: start with --inspect_credential or --debugging_no_inspect_auth")))]
async fn overview(State(dashboard): State<Arc<Dashboard>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        dashboard.overview_json(),
    )
        .into_response()
}

/// One sample per second for the last hour.
#[utoipa::path(get, path = "/api/v1/history", tag = "dashboard",
    responses((status = 200, description = "History, oldest first", body = HistoryView),
              (status = 401, description = "Basic auth required (--inspect_credential)"),
              (status = 403, description = "Closed: start with --inspect_credential or --debugging_no_inspect_auth")))]
async fn history(State(dashboard): State<Arc<Dashboard>>) -> Json<HistoryView> {
    Json(dashboard.history())
}

/// The dashboard's part of the OpenAPI document.
#[derive(utoipa::OpenApi)]
#[openapi(
    paths(overview, history, inspect_vars, inspect_vars_yadcc, task_dispatcher),
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
        HistorySample
    )),
    tags(
        (name = "dashboard", description = "The dashboard's JSON. Closed unless --inspect_credential (basic auth) or --debugging_no_inspect_auth is given."),
        (name = "inspection", description = "The original scheduler's inspection dump, same path and fields. Closed like the dashboard."),
    )
)]
pub struct DashboardApi;

const INDEX_HTML: &str = include_str!("../web/index.html");
const APP_JS: &str = include_str!("../web/app.js");
const STYLE_CSS: &str = include_str!("../web/style.css");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

/// The dashboard's `Content-Security-Policy`: its own scripts, styles and
/// JSON only, never framed. The page has no inline script or style attribute
/// (the browser test runs it under this policy).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// Headers on every answer of the dashboard and the inspection API, refusals
/// included.
pub const SECURITY_HEADERS: [(&str, &str); 4] = [
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
];

/// `/`, its assets, `/api/v1/*` and `/inspect/*`, behind [`InspectAccess`].
pub fn router<S>(dashboard: Arc<Dashboard>) -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
        .route("/api/v1/overview", get(overview))
        .route("/api/v1/history", get(history))
        .route(INSPECT_VARS, get(inspect_vars))
        .route(&format!("{INSPECT_VARS}/yadcc"), get(inspect_vars_yadcc))
        .route(TASK_DISPATCHER_PATH, get(task_dispatcher))
        .route("/inspect", get(no_such_inspection_page))
        .route("/inspect/{*rest}", get(no_such_inspection_page))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&dashboard),
            require_access,
        ))
        .layer(middleware::from_fn(security_headers))
        .with_state(dashboard)
}

async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// Why a request was refused, in words that name the flag to pass.
const CLOSED_MESSAGE: &str = "inspection pages are closed: start the scheduler with \
     --inspect_credential=USER:PASSWORD (HTTP basic auth) or, on a trusted network, \
     --debugging_no_inspect_auth\n";
const CREDENTIAL_MESSAGE: &str =
    "credentials required: HTTP basic auth with the USER:PASSWORD given to --inspect_credential\n";

async fn require_access(
    State(dashboard): State<Arc<Dashboard>>,
    request: Request,
    next: Next,
) -> Response {
    let expected = match &dashboard.access {
        Access::Open => return next.run(request).await,
        Access::Closed => {
            return (
                StatusCode::FORBIDDEN,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                CLOSED_MESSAGE,
            )
                .into_response();
        }
        Access::Credential(expected) => expected,
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(basic_credentials);
    if presented.is_some_and(|presented| expected.accepts_token(&presented)) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        [
            (
                header::WWW_AUTHENTICATE,
                "Basic realm=\"yadcc scheduler\", charset=\"UTF-8\"",
            ),
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
        ],
        CREDENTIAL_MESSAGE,
    )
        .into_response()
}

/// `user:password` from an `Authorization` value. The scheme name is
/// case-insensitive (RFC 9110), so `basic` and `BASIC` work too.
fn basic_credentials(value: &str) -> Option<String> {
    let (scheme, encoded) = value.trim_start().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    String::from_utf8(decoded).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_the_original_printed_them() {
        assert_eq!(format_time(UNIX_EPOCH), "1970-01-01 00:00:00");
        // 2024-02-29 (leap day) 13:05:09 UTC.
        let leap_day = UNIX_EPOCH + Duration::from_secs(1_709_211_909);
        assert_eq!(format_time(leap_day), "2024-02-29 13:05:09");
        let new_year = UNIX_EPOCH + Duration::from_secs(1_767_225_599);
        assert_eq!(format_time(new_year), "2025-12-31 23:59:59");
    }

    #[test]
    fn the_basic_scheme_is_matched_without_regard_to_case() {
        let encoded = base64::engine::general_purpose::STANDARD.encode("ops:pw");
        for scheme in ["Basic", "basic", "BASIC", "bAsIc"] {
            assert_eq!(
                basic_credentials(&format!("{scheme} {encoded}")).as_deref(),
                Some("ops:pw"),
                "{scheme}"
            );
        }
        assert_eq!(basic_credentials(&format!("Bearer {encoded}")), None);
        assert_eq!(basic_credentials("Basic !!!"), None);
    }

    #[test]
    fn unknown_reasons_keep_their_number() {
        assert_eq!(
            reason_name(Some(NotAcceptingReason::BehindNat)),
            "NOT_ACCEPTING_TASK_REASON_BEHIND_NAT"
        );
        assert_eq!(reason_name(None), "NOT_ACCEPTING_TASK_REASON_UNKNOWN");
        assert_eq!(
            reason_name(Some(NotAcceptingReason::Other(4242))),
            "NOT_ACCEPTING_TASK_REASON_4242"
        );
    }
}
