//! `GetRunningTasks`: every daemon asks for the same list every second, so
//! its answer is built and encoded once per version of the engine's list
//! ([`crate::engine::Scheduler::running_tasks_version`]) and per encoding,
//! and every caller gets the same bytes (`Bytes`, reference-counted: never
//! copied per caller). This is the one owner of that answer: the engine
//! keeps only the version, the service only translates.

use std::sync::Mutex;

use bytes::Bytes;

use super::{codec, error::ApiError};
use crate::{
    pb::{self, Encoding},
    service::{CallContext, SchedulerService},
};

/// The encoded copies one answer keeps: one per encoding (binary, JSON).
/// Compressed answers would add a slot per algorithm (see [`slot`]).
const SLOTS: usize = 2;

/// Which copy an answer in `encoding` is.
fn slot(encoding: Encoding) -> usize {
    match encoding {
        Encoding::Binary => 0,
        Encoding::Json => 1,
    }
}

/// The latest `GetRunningTasks` answer and its encoded copies.
#[derive(Debug, Default)]
pub struct RunningTasksAnswers {
    latest: Mutex<Option<Built>>,
}

/// An answer for one version of the list.
#[derive(Debug)]
struct Built {
    version: u64,
    response: pb::GetRunningTasksResponse,
    encoded: [Option<Bytes>; SLOTS],
}

impl RunningTasksAnswers {
    /// The answer in `encoding`, built when the engine's list changed and
    /// encoded the first time it is asked for in that encoding. Callers
    /// meanwhile wait for the one build instead of each building their own.
    pub fn encoded(
        &self,
        service: &SchedulerService,
        request: pb::GetRunningTasksRequest,
        ctx: &CallContext,
        encoding: Encoding,
    ) -> Result<Bytes, ApiError> {
        let version = service.running_tasks_version();
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        let built = match latest.take() {
            Some(built) if built.version == version => built,
            _ => {
                let answer = service.get_running_tasks(request, ctx)?;
                Built {
                    version: answer.version,
                    response: answer.response,
                    encoded: Default::default(),
                }
            }
        };
        let built = latest.insert(built);
        let copy = &mut built.encoded[slot(encoding)];
        if let Some(bytes) = copy {
            return Ok(bytes.clone());
        }
        let bytes = Bytes::from(codec::encode(encoding, &built.response)?);
        *copy = Some(bytes.clone());
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{self, Scheduler};

    fn servant_with_task(service: &SchedulerService, grant: u64) {
        let heartbeat = pb::HeartbeatRequest {
            token: "servant".into(),
            location: "10.0.0.1:8335".into(),
            next_heartbeat_in_ms: 10_000,
            capacity: 4,
            num_processors: 8,
            running_tasks: vec![pb::RunningTask {
                servant_task_id: 3,
                task_grant_id: grant,
                task_digest: "digest".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let ctx = CallContext {
            peer: "10.0.0.1".parse().unwrap(),
            deadline: None,
        };
        service.heartbeat(heartbeat, &ctx).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn the_answer_is_encoded_once_per_version_and_encoding() {
        // A fresh engine adopts the task a servant reports, so the list has
        // something in it after a heartbeat.
        let service = SchedulerService::new(Scheduler::new(engine::Config {
            servant_tokens: engine::TokenSet::new(["servant"]),
            ..engine::Config::default()
        }));
        let answers = RunningTasksAnswers::default();
        let ctx = CallContext {
            peer: "10.0.0.9".parse().unwrap(),
            deadline: None,
        };
        let ask = |encoding| {
            answers
                .encoded(&service, pb::GetRunningTasksRequest {}, &ctx, encoding)
                .unwrap()
        };
        let empty = ask(Encoding::Binary);
        assert!(empty.is_empty());
        assert_eq!(&ask(Encoding::Json)[..], b"{}");

        servant_with_task(&service, 77);
        tokio::time::advance(engine::Config::default().running_tasks_refresh).await;
        let binary = ask(Encoding::Binary);
        assert!(
            !binary.is_empty(),
            "a new version of the list is a new answer"
        );
        let again = ask(Encoding::Binary);
        assert_eq!(binary.as_ptr(), again.as_ptr(), "one encoding, shared");
        let json = ask(Encoding::Json);
        assert_eq!(
            &json[..],
            br#"{"runningTasks":[{"servantTaskId":"3","servantLocation":"10.0.0.1:8335","taskDigest":"digest"}]}"#
        );
        assert_eq!(json.as_ptr(), ask(Encoding::Json).as_ptr());
    }
}
