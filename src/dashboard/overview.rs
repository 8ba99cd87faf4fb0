//! The dashboard's JSON: everything the page shows in one document
//! (`/api/v1/overview`), built from one engine snapshot and shared by every
//! page that polls within [`OVERVIEW_MAX_AGE`].

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use axum::{
    extract::State,
    http::{HeaderValue, header},
    response::{IntoResponse, Response},
};
use serde::{Serialize, Serializer};
use utoipa::ToSchema;

use super::{Dashboard, access::Refusals};
use crate::engine::{self, NotAcceptingReason, ServantPriority};

/// What the dashboard shows of a grant id (rule "grant ids"): an id is a
/// capability (whoever renews an adopted grant first owns it), and every
/// viewer sees this page. The first 12 hex digits of the SHA-256 of its
/// decimal digits, as the admin tokens' fingerprints: an owner finds its
/// grant with `printf %s "$ID" | sha256sum | cut -c1-12`; reversing one
/// costs about 2^53 hashes, far longer than a grant lives.
pub fn grant_fingerprint(id: u64) -> String {
    crate::admin::fingerprint(&id.to_string())
}

/// How long one overview serves every page that asks.
pub const OVERVIEW_MAX_AGE: Duration = Duration::from_millis(1000);

impl Dashboard {
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
            crate::pb::json_answer(&self.overview()).unwrap_or_else(|_| b"{}\n".to_vec()),
        );
        *cache = Some((now, json.clone()));
        json
    }

    /// The whole picture in one document, so one poll refreshes the page:
    /// every count from one engine snapshot, every rate from the latest
    /// history sample.
    pub fn overview(&self) -> Overview {
        let snapshot = self.engine.snapshot();
        let now = SystemTime::now();
        let totals = &snapshot.totals;
        let rates = self
            .history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .rates()
            .clone();
        Overview {
            generated_at_ms: unix_millis(now),
            uptime_seconds: snapshot.uptime.as_secs(),
            rate_window_seconds: rates.window_seconds,
            leadership: self
                .leadership
                .stats()
                .map(|_| self.leadership.current().describe()),
            totals: TotalsView {
                servants_up: totals.servants_up as u64,
                servants_accepting: totals.servants_accepting as u64,
                servants_cordoned: totals.servants_cordoned as u64,
                capacity: totals.capacity,
                capacity_available: totals.capacity_available,
                capacity_unavailable: totals.capacity_unavailable,
                running_over_capacity: totals.running_over_capacity,
                running: totals.running,
                zombies: totals.zombies,
                waiters: totals.waiters as u64,
                grants: totals.grants as u64,
                grants_per_second: rates.total,
            },
            servants: snapshot
                .servants
                .iter()
                .map(|servant| ServantRow::new(servant, now))
                .collect(),
            grants: snapshot.grants.iter().map(GrantRow::from).collect(),
            cordons: snapshot.cordons.iter().map(CordonRow::from).collect(),
            running_tasks: self
                .engine
                .running_tasks()
                .iter()
                .map(|task| RunningTaskRow {
                    servant: task.servant.to_string(),
                    servant_task_id: task.servant_task_id,
                    grant_id: grant_fingerprint(task.grant_id),
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
                    waiting_requesters: requester.waiting_requesters,
                    grants_total: requester.grants_total,
                    grants_per_second: rates.by_machine.get(&requester.ip).copied().unwrap_or(0.0),
                    refused_total: requester.refused_total,
                    wait_cap_refusals: requester.wait_cap_refusals,
                })
                .collect(),
        }
    }
}

pub(super) fn unix_millis(at: SystemTime) -> u64 {
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
    /// Seconds since start, or since this instance last won the election.
    pub uptime_seconds: u64,
    /// The rates (`totals.grantsPerSecond`, each requester's
    /// `grantsPerSecond`) are grants made over this many seconds, ending at
    /// the latest history sample: 10 once the scheduler has run that long,
    /// less before, 0 until its second sample.
    pub rate_window_seconds: f64,
    /// With a hot standby (`--ha_etcd_endpoints`): `leader`, or
    /// `standby, leader is NAME`. Absent for the only scheduler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leadership: Option<String>,
    pub totals: TotalsView,
    /// Servants in registration order.
    pub servants: Vec<ServantRow>,
    pub grants: Vec<GrantRow>,
    /// Servant locations operators took out of rotation (registered or
    /// not), by location.
    pub cordons: Vec<CordonRow>,
    /// Tasks as the servants reported them in their latest heartbeat.
    pub running_tasks: Vec<RunningTaskRow>,
    pub environments: Vec<EnvironmentRow>,
    /// Peer IP address -> protocol of its latest call (`flare`, `http+pb`,
    /// `http`, `connect`, `grpc`, `grpc-web`), for the servants' and
    /// requesters' protocol column.
    pub peer_protocols: BTreeMap<String, String>,
    /// Requesting machines (delegates by IP), sorted by IP.
    pub requesters: Vec<RequesterRow>,
}

/// Cluster totals.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TotalsView {
    pub servants_up: u64,
    /// Servants with a non-zero task limit that no operator cordoned.
    pub servants_accepting: u64,
    /// Servants up that an operator cordoned or is draining.
    pub servants_cordoned: u64,
    /// Task slots the servants offer.
    pub capacity: u64,
    /// Task slots free right now.
    pub capacity_available: u64,
    /// Task slots neither free nor running (load, memory, a cordon):
    /// `running + capacityAvailable + capacityUnavailable = capacity +
    /// runningOverCapacity`.
    pub capacity_unavailable: u64,
    /// Grants beyond the slots their servant offers now.
    pub running_over_capacity: u64,
    /// Grants counted against servants, zombies included.
    pub running: u64,
    pub zombies: u64,
    /// Calls queued for quota.
    pub waiters: u64,
    pub grants: u64,
    /// Grants handed out per second, over `rateWindowSeconds`.
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
    /// Taken out of rotation by an operator: no new task goes there.
    pub cordon: Option<CordonRow>,
    /// Typical time its immediate grants were held before being freed, in
    /// milliseconds: how soon it turns a compile around, which orders it
    /// within its tier (rule "observed speed"). Null while too few came back
    /// recently, or with `--place_by_observed_speed=false`.
    pub typical_grant_ms: Option<u64>,
    /// Taken out of rotation because its grants kept coming back at once
    /// (`--eject_broken_servants`), or back on trial; null in rotation.
    pub ejection: Option<EjectionRow>,
}

/// A servant rule "broken servants" took out of rotation, or is trying again.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EjectionRow {
    /// `ejected`, or `on_trial` (one grant at a time after an ejection).
    #[schema(pattern = "^(ejected|on_trial)$")]
    pub state: &'static str,
    /// When the ejection ends (at the servant's next heartbeat after it).
    pub until_ms: Option<u64>,
    /// Ejections counting towards the next one's length.
    pub ejections: u32,
    /// The evidence of the latest ejection.
    pub why: String,
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
            cordon: servant.cordon.as_ref().map(CordonRow::from),
            typical_grant_ms: servant
                .typical_grant
                .map(|held| u64::try_from(held.as_millis()).unwrap_or(u64::MAX)),
            ejection: match servant.outlier.state() {
                "in_rotation" => None,
                state => Some(EjectionRow {
                    state,
                    until_ms: servant
                        .outlier
                        .ejected_for
                        .map(|left| unix_millis(now + left)),
                    ejections: servant.outlier.ejections,
                    why: servant
                        .outlier
                        .last_evidence
                        .map(|e| e.to_string())
                        .unwrap_or_default(),
                }),
            },
        }
    }
}

/// A location an operator cordoned or drained.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CordonRow {
    /// As the servant reports it.
    pub location: String,
    /// `cordoned`, `draining` (tasks still run there) or `drained`.
    #[schema(pattern = "^(cordoned|draining|drained)$")]
    pub state: &'static str,
    pub reason: String,
    /// Who acted (`token:` and the admin token's fingerprint).
    pub by: String,
    /// When, in milliseconds since the Unix epoch.
    pub since_ms: u64,
    /// Grants there (zombies included).
    pub running: u32,
    /// Whether a servant is registered there now.
    pub registered: bool,
}

impl From<&engine::CordonView> for CordonRow {
    fn from(view: &engine::CordonView) -> Self {
        Self {
            location: view.location.to_string(),
            state: view.state.label(),
            reason: view.cordon.reason.clone(),
            by: view.cordon.by.clone(),
            since_ms: view.cordon.since_unix_ms,
            running: view.running,
            registered: view.registered,
        }
    }
}

/// One grant.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantRow {
    /// The id's fingerprint ([`grant_fingerprint`]), never the id.
    #[schema(pattern = "^[0-9a-f]{12}$")]
    pub id: String,
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
            id: grant_fingerprint(grant.id),
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
    /// The fingerprint of the grant's id ([`grant_fingerprint`]).
    #[schema(pattern = "^[0-9a-f]{12}$")]
    pub grant_id: String,
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
    /// Of its requesters, those with calls waiting now: each daemon
    /// connection counts (an office behind one NAT address has many), a
    /// JSON, Connect or gRPC caller counts as its address.
    pub waiting_requesters: u64,
    /// Grants made to it since start.
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub grants_total: u64,
    /// Grants it received per second, over the overview's `rateWindowSeconds`.
    pub grants_per_second: f64,
    /// Its renewals and frees of grants it does not own, refused since start.
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub refused_total: u64,
    /// Its `WaitForStartingTask` calls answered no quota at once since
    /// start because a waiter cap was full (`--max_waiters_per_requester`,
    /// `--max_waiters`): non-zero when a cap bites.
    #[serde(serialize_with = "as_string")]
    #[schema(value_type = String, pattern = "^[0-9]+$")]
    pub wait_cap_refusals: u64,
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

/// Cluster overview: totals, servants, grants, running tasks, environments.
///
/// What the dashboard shows, as one JSON object: cluster totals, every live
/// servant, grant and environment, each requesting machine, and the protocol
/// of each peer's latest call. Costs O(cluster): poll it every second or so.
#[utoipa::path(get, path = "/api/v1/overview", tag = "dashboard",
    responses((status = 200, description = "The cluster now", body = Overview),
              Refusals))]
pub(super) async fn overview(State(dashboard): State<Arc<Dashboard>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        dashboard.overview_json(),
    )
        .into_response()
}
