//! The original scheduler's inspection dump, at the framework's
//! exposed-variables path, so scripts written against it keep working.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{SystemTime, UNIX_EPOCH},
};

use axum::{
    Router,
    extract::{Path, Request, State},
    http::{StatusCode, Uri, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::{Dashboard, JsonAnswer, access::Refusals};
use crate::{
    engine::{NotAcceptingReason, ServantPriority},
    pb,
};

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
///
/// Servants and tasks with the original's field names, so scripts written
/// against the original keep working; times are UTC. As under the original's
/// framework, a trailing slash is the same page, and a path below it answers
/// one field: `/inspect/vars/yadcc/task_dispatcher/servants_up` is the number
/// alone (`text/plain`), `.../tasks/<id>` that task (JSON).
#[utoipa::path(get, path = "/inspect/vars/yadcc/task_dispatcher", tag = "inspection",
    responses((status = 200, description = "The dump", body = TaskDispatcherDump),
              Refusals))]
pub(super) async fn task_dispatcher(
    State(dashboard): State<Arc<Dashboard>>,
) -> JsonAnswer<TaskDispatcherDump> {
    JsonAnswer(dashboard.task_dispatcher_dump())
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

impl Dashboard {
    /// Every exposed variable (only the dump, here).
    fn inspect_vars(&self) -> InspectVars {
        InspectVars {
            yadcc: YadccVars {
                task_dispatcher: self.task_dispatcher_dump(),
            },
        }
    }
}

/// All exposed variables (only the dump, here).
///
/// The framework's variable tree, as the original exposed it: the dump
/// nested under `yadcc.task_dispatcher`.
#[utoipa::path(get, path = "/inspect/vars", tag = "inspection",
    responses((status = 200, description = "Every exposed variable", body = InspectVars),
              Refusals))]
pub(super) async fn inspect_vars(
    State(dashboard): State<Arc<Dashboard>>,
) -> JsonAnswer<InspectVars> {
    JsonAnswer(dashboard.inspect_vars())
}

/// The exposed variables under `yadcc`.
///
/// The dump nested under `task_dispatcher`, as the original exposed it.
#[utoipa::path(get, path = "/inspect/vars/yadcc", tag = "inspection",
    responses((status = 200, description = "The variables under yadcc", body = YadccVars),
              Refusals))]
pub(super) async fn inspect_vars_yadcc(
    State(dashboard): State<Arc<Dashboard>>,
) -> JsonAnswer<YadccVars> {
    JsonAnswer(dashboard.inspect_vars().yadcc)
}

/// Any other path under `/inspect/vars/`, read as the original's framework
/// reads it: see [`var_at`]. An object or array is answered as JSON, any
/// other value as `text/plain` (a string without quotes), as there.
async fn inspect_var(
    State(dashboard): State<Arc<Dashboard>>,
    path: Option<Path<String>>,
    uri: Uri,
) -> Response {
    let vars = match serde_json::to_value(dashboard.inspect_vars()) {
        Ok(vars) => vars,
        Err(error) => {
            tracing::error!("the inspection dump does not serialise: {error}");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    let below = path.map(|Path(path)| path).unwrap_or_default();
    match var_at(&vars, &below) {
        Some(value @ (Value::Object(_) | Value::Array(_))) => JsonAnswer(value).into_response(),
        Some(Value::String(text)) => plain_text(StatusCode::OK, text.clone()),
        Some(scalar) => plain_text(StatusCode::OK, scalar.to_string()),
        None => no_such_page(uri.path()),
    }
}

/// The value at `path` below `vars`: empty segments (a trailing or doubled
/// slash) are skipped, each other segment names a member of the object above
/// (or, beyond the original, an array element by index). `None` when a
/// segment names nothing, or the value is `null`, as the original's 404.
fn var_at<'a>(vars: &'a Value, path: &str) -> Option<&'a Value> {
    let mut value = vars;
    for segment in path.split('/').filter(|segment| !segment.is_empty()) {
        value = match value {
            Value::Object(members) => members.get(segment)?,
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    (!value.is_null()).then_some(value)
}

fn plain_text(status: StatusCode, text: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

fn no_such_page(path: &str) -> Response {
    plain_text(
        StatusCode::NOT_FOUND,
        format!(
            "no inspection page at {path}; the scheduler's dump is at {TASK_DISPATCHER_PATH}\n"
        ),
    )
}

/// Behind the same access check as the real pages, so a closed scheduler
/// does not tell which inspection pages exist.
async fn no_such_inspection_page(request: Request) -> Response {
    no_such_page(request.uri().path())
}

/// The dump at its path, the framework's nesting above it, any path below
/// `/inspect/vars/`, and a clear 404 for any other inspection page.
pub(super) fn routes() -> Router<Arc<Dashboard>> {
    Router::new()
        .route(INSPECT_VARS, get(inspect_vars))
        .route(&format!("{INSPECT_VARS}/yadcc"), get(inspect_vars_yadcc))
        .route(TASK_DISPATCHER_PATH, get(task_dispatcher))
        .route(&format!("{INSPECT_VARS}/"), get(inspect_var))
        .route(&format!("{INSPECT_VARS}/{{*path}}"), get(inspect_var))
        .route("/inspect", get(no_such_inspection_page))
        .route("/inspect/{*rest}", get(no_such_inspection_page))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
    fn a_path_below_names_members_and_ignores_empty_segments() {
        let vars = serde_json::json!({
            "yadcc": {"task_dispatcher": {
                "servants_up": 2,
                "servants": [{"location": "10.0.0.1:8335"}],
                "tasks": {},
                "gone": null,
            }}
        });
        let dump = &vars["yadcc"]["task_dispatcher"];
        assert_eq!(var_at(&vars, ""), Some(&vars));
        assert_eq!(var_at(&vars, "yadcc/task_dispatcher/"), Some(dump));
        assert_eq!(var_at(&vars, "//yadcc//task_dispatcher"), Some(dump));
        assert_eq!(
            var_at(&vars, "yadcc/task_dispatcher/servants_up"),
            Some(&serde_json::json!(2))
        );
        assert_eq!(
            var_at(&vars, "yadcc/task_dispatcher/servants/0/location"),
            Some(&serde_json::json!("10.0.0.1:8335"))
        );
        for missing in [
            "nothing",
            "yadcc/task_dispatcher/servants/1",
            "yadcc/task_dispatcher/servants/first",
            "yadcc/task_dispatcher/servants_up/more",
            "yadcc/task_dispatcher/gone",
        ] {
            assert_eq!(var_at(&vars, missing), None, "{missing}");
        }
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
