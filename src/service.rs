//! The six RPCs, transport-neutral: protobuf request in, protobuf response or
//! a scheduler [`RpcStatus`] out. This is the only place that translates
//! between wire messages and the engine's domain types, and the only place that
//! maps engine outcomes to the seed's `Status` codes. The operators' service
//! is [`admin`]'s.

use std::{net::IpAddr, time::Duration};

use prost::Message;
use tokio::time::Instant;

use crate::{
    engine::{self, Rejection, Scheduler},
    pb::{self, Method},
};

pub mod admin;

/// A scheduler-level failure: one of the seed's `Status` codes and a message
/// for people (never containing a token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcStatus {
    pub code: pb::Status,
    pub message: String,
}

impl RpcStatus {
    fn new(code: pb::Status, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<Rejection> for RpcStatus {
    fn from(rejection: Rejection) -> Self {
        let code = match &rejection {
            Rejection::AccessDenied => pb::Status::AccessDenied,
            Rejection::InvalidArgument(_) => pb::Status::InvalidArgument,
            Rejection::VersionTooOld { .. } => pb::Status::VersionTooOld,
            Rejection::EnvironmentNotAvailable { .. } => pb::Status::EnvironmentNotAvailable,
            Rejection::NoQuotaAvailable => pb::Status::NoQuotaAvailable,
        };
        match original_description(code) {
            Some(description) => Self::new(code, description),
            None => Self::new(code, rejection.to_string()),
        }
    }
}

/// The description the original scheduler sends with `status`, which
/// daemons print in their logs: only its two `WaitForStartingTask` outcomes
/// have one (the others go out with an empty description). Every protocol's
/// message for these two is this text; the binary protocol sends it, and
/// only it, as the original does.
pub fn original_description(status: pb::Status) -> Option<&'static str> {
    match status {
        pb::Status::NoQuotaAvailable => Some("The compilation cloud is busy now."),
        pb::Status::EnvironmentNotAvailable => Some("No matched servant environment."),
        _ => None,
    }
}

/// The scheduler `Status` codes each RPC can answer with besides success:
/// the [`Rejection`]s the engine's checks behind it return, as in the
/// reference scheduler. The OpenAPI document lists them per operation.
pub fn failure_statuses(method: Method) -> &'static [pb::Status] {
    use pb::Status::*;
    match method {
        Method::Heartbeat => &[AccessDenied, InvalidArgument, VersionTooOld],
        Method::GetConfig => &[AccessDenied],
        Method::WaitForStartingTask => &[
            AccessDenied,
            InvalidArgument,
            EnvironmentNotAvailable,
            NoQuotaAvailable,
        ],
        Method::KeepTaskAlive | Method::FreeTask => &[AccessDenied, InvalidArgument],
        // Open to anyone and without arguments to refuse.
        Method::GetRunningTasks => &[],
        // The operators' service: a token other than an admin token (no
        // token at all is `ErrorKind::Unauthenticated`, 401, with the same
        // status).
        Method::CordonServant | Method::UncordonServant | Method::DrainServant => {
            &[AccessDenied, InvalidArgument]
        }
        Method::ListServantStates | Method::ListAuditEvents => &[AccessDenied],
    }
}

/// What the transport knows about a call.
#[derive(Debug, Clone, Copy)]
pub struct CallContext {
    /// The caller's address as seen on the socket (or via a trusted proxy).
    pub peer: IpAddr,
    /// The daemon connection the call came on, if it came on one (`flare`,
    /// `http+pb`): such a daemon waits for quota as its connection, others
    /// as their address.
    pub connection: Option<u64>,
    /// When the caller stops waiting for an answer (`Rpc-Timeout`, `Connect-Timeout-Ms`).
    pub deadline: Option<Instant>,
}

/// Time kept back from the caller's deadline so that a "no quota" answer to a
/// long poll still reaches it before it gives up.
const DEADLINE_MARGIN: Duration = Duration::from_millis(50);

/// The scheduler service over one engine. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SchedulerService {
    engine: Scheduler,
}

/// A `GetRunningTasks` answer and the version of the engine's list it shows
/// ([`Scheduler::running_tasks_version`]).
#[derive(Debug, Clone, PartialEq)]
pub struct VersionedRunningTasks {
    pub version: u64,
    pub response: pb::GetRunningTasksResponse,
    /// Tasks of the list left out to keep the answer within its bound.
    pub left_out: usize,
}

impl SchedulerService {
    pub fn new(engine: Scheduler) -> Self {
        Self { engine }
    }

    /// The engine behind this service, for inspection and shutdown.
    pub fn engine(&self) -> &Scheduler {
        &self.engine
    }

    pub fn heartbeat(
        &self,
        request: pb::HeartbeatRequest,
        ctx: &CallContext,
    ) -> Result<pb::HeartbeatResponse, RpcStatus> {
        // Moved over unchecked: the engine checks in the reference's order
        // (token, version, location, ...), so an outsider learns nothing
        // about the validation rules.
        let heartbeat = engine::Heartbeat {
            token: request.token.into(),
            observed_ip: ctx.peer,
            location: request.location,
            next_heartbeat_in: millis(request.next_heartbeat_in_ms),
            version: request.version,
            num_processors: request.num_processors,
            current_load: request.current_load,
            priority: servant_priority(request.servant_priority),
            not_accepting_reason: engine::NotAcceptingReason::from_code(
                request.not_accepting_task_reason,
            ),
            capacity: request.capacity,
            total_memory: request.total_memory_in_bytes,
            memory_available: request.memory_available_in_bytes,
            environments: request
                .env_descs
                .into_iter()
                .map(|env| env.compiler_digest)
                .collect(),
            running_tasks: request
                .running_tasks
                .into_iter()
                .map(|task| engine::ReportedTask {
                    servant_task_id: task.servant_task_id,
                    grant_id: task.task_grant_id,
                    task_digest: task.task_digest,
                })
                .collect(),
        };
        let reply = self.engine.heartbeat(heartbeat)?;
        Ok(pb::HeartbeatResponse {
            acceptable_tokens: reply.acceptable_tokens,
            expired_tasks: reply.expired_grant_ids,
        })
    }

    pub fn get_config(
        &self,
        request: pb::GetConfigRequest,
        _ctx: &CallContext,
    ) -> Result<pb::GetConfigResponse, RpcStatus> {
        Ok(pb::GetConfigResponse {
            serving_daemon_token: self.engine.get_config(&request.token)?,
        })
    }

    pub async fn wait_for_starting_task(
        &self,
        request: pb::WaitForStartingTaskRequest,
        ctx: &CallContext,
    ) -> Result<pb::WaitForStartingTaskResponse, RpcStatus> {
        // A missing env_desc is an empty digest, which the engine refuses
        // after the token check.
        let environment = request
            .env_desc
            .map(|env| env.compiler_digest)
            .unwrap_or_default();
        // The engine checks the requested wait against its limit before it
        // cuts the wait to the caller's deadline.
        let answer_within = ctx.deadline.map(|deadline| {
            deadline
                .saturating_duration_since(Instant::now())
                .saturating_sub(DEADLINE_MARGIN)
        });
        let grants = self
            .engine
            .wait_for_starting_task(engine::GrantRequest {
                token: request.token.into(),
                requester_ip: ctx.peer,
                connection: ctx.connection,
                wait: millis(request.milliseconds_to_wait),
                answer_within,
                environment,
                immediate: request.immediate_reqs,
                prefetch: request.prefetch_reqs,
                lease: millis(request.next_keep_alive_in_ms),
                min_version: request.min_version,
            })
            .await?;
        Ok(pb::WaitForStartingTaskResponse {
            grants: grants
                .into_iter()
                .map(|grant| pb::StartingTaskGrant {
                    task_grant_id: grant.id,
                    servant_location: grant.servant.to_string(),
                })
                .collect(),
        })
    }

    pub async fn keep_task_alive(
        &self,
        request: pb::KeepTaskAliveRequest,
        ctx: &CallContext,
    ) -> Result<pb::KeepTaskAliveResponse, RpcStatus> {
        let statuses = self
            .engine
            .keep_alive_in_slices(
                &request.token,
                ctx.peer,
                &request.task_grant_ids,
                millis(request.next_keep_alive_in_ms),
            )
            .await?;
        Ok(pb::KeepTaskAliveResponse { statuses })
    }

    pub async fn free_task(
        &self,
        request: pb::FreeTaskRequest,
        ctx: &CallContext,
    ) -> Result<pb::FreeTaskResponse, RpcStatus> {
        self.engine
            .free_in_slices(&request.token, ctx.peer, &request.task_grant_ids)
            .await?;
        Ok(pb::FreeTaskResponse {})
    }

    /// Open to anyone, as in the reference: the request has no token field.
    ///
    /// Decision "grant ids stay behind a credential": a grant id lets its
    /// holder renew and free the task, so the open answer carries what a
    /// delegate needs to attach to a running compilation (servant location,
    /// the servant's task id, task digest) and `task_grant_id = 0`. Stock
    /// daemons read only those three fields. The ids stay visible to
    /// credentialed readers (dashboard, inspection).
    ///
    /// The whole list, as the original sends it, unless its encoding would
    /// pass `max_bytes`: then the longest prefix within it.
    pub fn get_running_tasks(
        &self,
        _request: pb::GetRunningTasksRequest,
        _ctx: &CallContext,
        max_bytes: usize,
    ) -> Result<VersionedRunningTasks, RpcStatus> {
        let (version, tasks) = self.engine.running_tasks_with_version();
        let (response, left_out) = running_tasks_response(&tasks, max_bytes);
        Ok(VersionedRunningTasks {
            version,
            response,
            left_out,
        })
    }

    /// The version of the list `GetRunningTasks` shows now: an answer built
    /// for it is still the answer.
    pub fn running_tasks_version(&self) -> u64 {
        self.engine.running_tasks_version()
    }
}

/// The open answer for `tasks`: the longest prefix whose encoding fits in
/// `max_bytes`, and how many tasks were left out.
fn running_tasks_response(
    tasks: &[engine::RunningTask],
    max_bytes: usize,
) -> (pb::GetRunningTasksResponse, usize) {
    let mut encoded = 0;
    let mut running_tasks = Vec::with_capacity(tasks.len());
    for task in tasks {
        let entry = pb::RunningTask {
            servant_task_id: task.servant_task_id,
            task_grant_id: 0,
            servant_location: task.servant.to_string(),
            task_digest: task.task_digest.clone(),
        };
        // A repeated field 1: one tag byte, the length, the message.
        let len = entry.encoded_len();
        encoded += 1 + prost::encoding::encoded_len_varint(len as u64) + len;
        if encoded > max_bytes {
            break;
        }
        running_tasks.push(entry);
    }
    let left_out = tasks.len() - running_tasks.len();
    (pb::GetRunningTasksResponse { running_tasks }, left_out)
}

fn millis(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms))
}

/// Old daemons send UNKNOWN, and values from the future are not ours to
/// interpret: both count as a user's machine, the lower priority.
fn servant_priority(raw: i32) -> engine::ServantPriority {
    match pb::ServantPriority::try_from(raw) {
        Ok(pb::ServantPriority::Dedicated) => engine::ServantPriority::Dedicated,
        _ => engine::ServantPriority::User,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer over its bound is cut to the longest prefix within it.
    #[test]
    fn the_running_tasks_answer_is_cut_to_its_bound() {
        let tasks: Vec<engine::RunningTask> = (0..100)
            .map(|i| engine::RunningTask {
                servant: "10.0.0.1:8335".parse().unwrap(),
                servant_task_id: i,
                grant_id: i + 1,
                task_digest: format!("{i:064x}"),
            })
            .collect();
        let (whole, left_out) = running_tasks_response(&tasks, usize::MAX);
        assert_eq!((whole.running_tasks.len(), left_out), (100, 0));
        let full = whole.encoded_len();
        assert_eq!(
            running_tasks_response(&tasks, full).1,
            0,
            "exactly full fits"
        );

        let limit = full / 2;
        let (cut, left_out) = running_tasks_response(&tasks, limit);
        let kept = cut.running_tasks.len();
        assert!(cut.encoded_len() <= limit);
        assert!(left_out > 0 && kept + left_out == 100);
        assert_eq!(cut.running_tasks[..], whole.running_tasks[..kept]);
        let one_more = running_tasks_response(&tasks[..=kept], usize::MAX).0;
        assert!(
            one_more.encoded_len() > limit,
            "the longest prefix that fits"
        );
    }

    /// Whatever an RPC is refused with is among the statuses documented
    /// for it: bad tokens, bad arguments and unknown environments, each.
    #[tokio::test(start_paused = true)]
    async fn refusals_are_among_each_rpcs_failure_statuses() {
        let service = SchedulerService::new(Scheduler::new(engine::Config {
            user_tokens: engine::TokenSet::new(["user"]),
            servant_tokens: engine::TokenSet::new(["servant"]),
            ..engine::Config::default()
        }));
        let ctx = CallContext {
            peer: "10.0.0.9".parse().unwrap(),
            connection: None,
            deadline: None,
        };
        let too_many = vec![1; engine::Limits::default().max_ids_per_request + 1];
        let mut refusals = Vec::new();
        for token in ["wrong", "servant"] {
            let heartbeat = pb::HeartbeatRequest {
                token: token.into(),
                location: "not a location".into(),
                ..Default::default()
            };
            refusals.push((
                Method::Heartbeat,
                service.heartbeat(heartbeat, &ctx).map(drop),
            ));
        }
        refusals.push((
            Method::GetConfig,
            service
                .get_config(
                    pb::GetConfigRequest {
                        token: "wrong".into(),
                    },
                    &ctx,
                )
                .map(drop),
        ));
        for token in ["wrong", "user"] {
            for environment in [None, Some("nobody-has-it")] {
                let wait = pb::WaitForStartingTaskRequest {
                    token: token.into(),
                    env_desc: environment.map(|digest| pb::EnvironmentDesc {
                        compiler_digest: digest.into(),
                    }),
                    immediate_reqs: 1,
                    next_keep_alive_in_ms: 10_000,
                    ..Default::default()
                };
                refusals.push((
                    Method::WaitForStartingTask,
                    service.wait_for_starting_task(wait, &ctx).await.map(drop),
                ));
            }
            let keep = pb::KeepTaskAliveRequest {
                token: token.into(),
                task_grant_ids: too_many.clone(),
                next_keep_alive_in_ms: 10_000,
            };
            refusals.push((
                Method::KeepTaskAlive,
                service.keep_task_alive(keep, &ctx).await.map(drop),
            ));
            let free = pb::FreeTaskRequest {
                token: token.into(),
                task_grant_ids: too_many.clone(),
            };
            refusals.push((
                Method::FreeTask,
                service.free_task(free, &ctx).await.map(drop),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (method, outcome) in refusals {
            let refused = outcome.expect_err(method.name());
            assert!(
                failure_statuses(method).contains(&refused.code),
                "{method} answered {refused:?}, not among its failure statuses"
            );
            seen.insert((method, refused.code));
        }
        // Each RPC met every kind of refusal tried on it, not one repeatedly.
        assert!(seen.len() >= 8, "{seen:?}");
        assert!(
            service
                .get_running_tasks(pb::GetRunningTasksRequest {}, &ctx, usize::MAX)
                .is_ok()
        );
        assert!(failure_statuses(Method::GetRunningTasks).is_empty());
    }

    #[test]
    fn unknown_and_out_of_range_priorities_count_as_user() {
        assert_eq!(servant_priority(1), engine::ServantPriority::Dedicated);
        assert_eq!(servant_priority(2), engine::ServantPriority::User);
        assert_eq!(servant_priority(0), engine::ServantPriority::User);
        assert_eq!(servant_priority(77), engine::ServantPriority::User);
    }

    /// Rule "order of checks": the requested wait is checked against the
    /// limit before the caller's deadline cuts it, so the same request is
    /// refused with or without a deadline.
    #[tokio::test(start_paused = true)]
    async fn an_out_of_range_wait_is_refused_whatever_the_deadline() {
        let service = SchedulerService::new(Scheduler::new(engine::Config {
            user_tokens: engine::TokenSet::new(["user"]),
            servant_tokens: engine::TokenSet::new(["servant"]),
            ..engine::Config::default()
        }));
        let over = engine::Limits::default().max_wait + Duration::from_secs(10);
        let request = pb::WaitForStartingTaskRequest {
            token: "user".into(),
            milliseconds_to_wait: u32::try_from(over.as_millis()).unwrap(),
            env_desc: Some(pb::EnvironmentDesc {
                compiler_digest: "gcc".into(),
            }),
            immediate_reqs: 1,
            next_keep_alive_in_ms: 10_000,
            ..Default::default()
        };
        for deadline in [None, Some(Instant::now() + Duration::from_secs(5))] {
            let ctx = CallContext {
                peer: "10.0.0.9".parse().unwrap(),
                connection: None,
                deadline,
            };
            let refused = service
                .wait_for_starting_task(request.clone(), &ctx)
                .await
                .unwrap_err();
            assert_eq!(refused.code, pb::Status::InvalidArgument, "{deadline:?}");
        }
    }
}
