//! `GetRunningTasks`: every daemon asks for the same list every second, so
//! its answer is built and encoded once per version of the engine's list
//! ([`crate::engine::Scheduler::running_tasks_version`]), per encoding and
//! per compression, and every caller gets the same bytes (`Bytes`,
//! reference-counted: never copied per caller). This is the one owner of
//! that answer: the engine keeps only the version, the service only
//! translates.
//!
//! The answer is the whole list, as the original sends it: stock daemons
//! take answers up to 512 MiB. Its one bound is `--max_running_tasks_bytes`
//! (the encoding, before compression); a longer list is cut, with a warning.

use std::sync::Mutex;

use tokio::time::Instant;

use super::{
    Answer, codec,
    compression::{self, Accepted, Algorithm},
    error::ApiError,
};
use crate::{
    pb::{self, Encoding},
    service::{CallContext, SchedulerService},
};

/// The bound on an answer's encoding unless a flag says otherwise: 64 MiB,
/// about 700,000 tasks, far more than any cluster runs at once.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 64 << 20;

/// How often a list over the bound is reported in the log while it stays so.
const CUT_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Compressions an encoded copy may have: none, or one of the algorithms.
const COMPRESSIONS: usize = 1 + Algorithm::PREFERRED.len();
/// The encoded copies one answer keeps: per encoding and compression.
const SLOTS: usize = 2 * COMPRESSIONS;

/// Which copy an answer in `encoding`, compressed with `compression`, is.
fn slot(encoding: Encoding, compression: Option<Algorithm>) -> usize {
    let encoding = match encoding {
        Encoding::Binary => 0,
        Encoding::Json => 1,
    };
    let compression = match compression {
        None => 0,
        Some(algorithm) => {
            1 + Algorithm::PREFERRED
                .iter()
                .position(|&known| known == algorithm)
                .unwrap_or(0)
        }
    };
    encoding * COMPRESSIONS + compression
}

/// The latest `GetRunningTasks` answer and its encoded copies.
#[derive(Debug)]
pub struct RunningTasksAnswers {
    latest: Mutex<Latest>,
    /// The bound on an answer's encoding (`--max_running_tasks_bytes`).
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Latest {
    built: Option<Built>,
    /// When a cut list was last reported in the log.
    cut_reported: Option<Instant>,
}

/// An answer for one version of the list.
#[derive(Debug)]
struct Built {
    version: u64,
    response: pb::GetRunningTasksResponse,
    /// A compressed slot holds the plain bytes when compression did not
    /// shrink them (so it is tried once, too).
    encoded: [Option<Answer>; SLOTS],
}

impl Default for RunningTasksAnswers {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_ANSWER_BYTES)
    }
}

impl RunningTasksAnswers {
    /// Answers whose encoding is at most `max_bytes`.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            latest: Mutex::default(),
            max_bytes,
        }
    }

    /// The answer in `encoding` for a caller accepting `accepts`, built when
    /// the engine's list changed, encoded the first time it is asked for in
    /// that encoding and compressed the first time a caller accepts that
    /// algorithm. Callers meanwhile wait for the one build instead of each
    /// building their own.
    pub fn encoded(
        &self,
        service: &SchedulerService,
        request: pb::GetRunningTasksRequest,
        ctx: &CallContext,
        encoding: Encoding,
        accepts: Accepted,
    ) -> Result<Answer, ApiError> {
        let version = service.running_tasks_version();
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        let built = match latest.built.take() {
            Some(built) if built.version == version => built,
            _ => {
                let answer = service.get_running_tasks(request, ctx, self.max_bytes)?;
                if answer.left_out > 0 {
                    latest.report_cut(answer.response.running_tasks.len(), answer.left_out);
                }
                Built {
                    version: answer.version,
                    response: answer.response,
                    encoded: Default::default(),
                }
            }
        };
        let built = latest.built.insert(built);
        let plain = match &built.encoded[slot(encoding, None)] {
            Some(plain) => plain.clone(),
            None => {
                let bytes = codec::encode(encoding, &built.response)?;
                let plain = Answer::plain(bytes.into());
                built.encoded[slot(encoding, None)] = Some(plain.clone());
                plain
            }
        };
        let Some(algorithm) = compression::choose(plain.payload.len(), accepts) else {
            return Ok(plain);
        };
        let copy = &mut built.encoded[slot(encoding, Some(algorithm))];
        if let Some(compressed) = copy {
            return Ok(compressed.clone());
        }
        let (compression, payload) = compression::compress_with(plain.payload, algorithm);
        let compressed = Answer {
            payload,
            compression,
        };
        *copy = Some(compressed.clone());
        Ok(compressed)
    }
}

impl Latest {
    /// Logs a list cut to its bound: when it starts, then at most every
    /// [`CUT_WARNING_EVERY`] while it lasts.
    fn report_cut(&mut self, listed: usize, left_out: usize) {
        let now = Instant::now();
        if self
            .cut_reported
            .is_some_and(|at| now.duration_since(at) < CUT_WARNING_EVERY)
        {
            return;
        }
        self.cut_reported = Some(now);
        tracing::warn!(
            listed,
            left_out,
            "GetRunningTasks answers list only part of the running tasks: the whole list is \
             over --max_running_tasks_bytes"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{self, Scheduler};

    fn servant_with_tasks(service: &SchedulerService, tasks: u64) {
        let heartbeat = pb::HeartbeatRequest {
            token: "servant".into(),
            location: "10.0.0.1:8335".into(),
            next_heartbeat_in_ms: 10_000,
            capacity: 4,
            num_processors: 8,
            running_tasks: (0..tasks)
                .map(|task| pb::RunningTask {
                    servant_task_id: 3 + task,
                    task_grant_id: 77 + task,
                    task_digest: if tasks == 1 {
                        "digest".into()
                    } else {
                        format!("{:064x}", task.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                    },
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let ctx = CallContext {
            peer: "10.0.0.1".parse().unwrap(),
            connection: None,
            deadline: None,
        };
        service.heartbeat(heartbeat, &ctx).unwrap();
    }

    fn service() -> SchedulerService {
        // A fresh engine adopts the tasks a servant reports, so the list has
        // something in it after a heartbeat.
        SchedulerService::new(Scheduler::new(engine::Config {
            servant_tokens: engine::TokenSet::new(["servant"]),
            ..engine::Config::default()
        }))
    }

    /// The answer `answers` gives a caller of `encoding` accepting `accepts`.
    fn ask(
        answers: &RunningTasksAnswers,
        service: &SchedulerService,
        encoding: Encoding,
        accepts: Accepted,
    ) -> Answer {
        let ctx = CallContext {
            peer: "10.0.0.9".parse().unwrap(),
            connection: None,
            deadline: None,
        };
        answers
            .encoded(
                service,
                pb::GetRunningTasksRequest {},
                &ctx,
                encoding,
                accepts,
            )
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_answer_is_encoded_once_per_version_and_encoding() {
        let service = service();
        let answers = RunningTasksAnswers::default();
        let ask = |encoding| ask(&answers, &service, encoding, Accepted::NONE).payload;
        let empty = ask(Encoding::Binary);
        assert!(empty.is_empty());
        assert_eq!(&ask(Encoding::Json)[..], b"{}");

        servant_with_tasks(&service, 1);
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

    #[tokio::test(start_paused = true)]
    async fn a_large_list_is_compressed_once_per_version_and_algorithm() {
        let service = service();
        let answers = RunningTasksAnswers::default();
        servant_with_tasks(&service, 2000);
        tokio::time::advance(engine::Config::default().running_tasks_refresh).await;
        let ask = |accepts| ask(&answers, &service, Encoding::Binary, accepts);
        let plain = ask(Accepted::NONE);
        assert_eq!(plain.compression, None);
        assert!(plain.payload.len() >= compression::COMPRESS_FROM_BYTES);
        let daemon = ask(Accepted::from_bits(62));
        assert_eq!(daemon.compression, Some(Algorithm::Zstd));
        assert!(daemon.payload.len() < plain.payload.len() / 2);
        assert_eq!(
            Algorithm::Zstd
                .inflate(&daemon.payload, plain.payload.len())
                .unwrap(),
            plain.payload
        );
        // Every later caller accepting zstd gets the same compressed bytes.
        assert_eq!(
            ask(Accepted::from_bits(62)).payload.as_ptr(),
            daemon.payload.as_ptr()
        );
        for algorithm in Algorithm::PREFERRED {
            let only = Accepted::from_bits(1 << algorithm.wire());
            let answer = ask(only);
            assert_eq!(answer.compression, Some(algorithm));
            assert_eq!(
                algorithm
                    .inflate(&answer.payload, plain.payload.len())
                    .unwrap(),
                plain.payload,
                "{algorithm:?}"
            );
            assert_eq!(ask(only).payload.as_ptr(), answer.payload.as_ptr());
        }
        // A new version of the list is compressed anew.
        servant_with_tasks(&service, 1999);
        tokio::time::advance(engine::Config::default().running_tasks_refresh).await;
        let next = ask(Accepted::from_bits(62));
        assert_ne!(next.payload, daemon.payload);
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_over_the_bound_is_cut_to_it() {
        let service = service();
        servant_with_tasks(&service, 2000);
        tokio::time::advance(engine::Config::default().running_tasks_refresh).await;
        let plain = |answers: &RunningTasksAnswers| {
            ask(answers, &service, Encoding::Binary, Accepted::NONE)
        };
        let whole = plain(&RunningTasksAnswers::default());
        let bound = whole.payload.len() / 3;
        let cut = plain(&RunningTasksAnswers::new(bound));
        assert!(cut.payload.len() <= bound && cut.payload.len() > bound - 200);
        let listed = <pb::GetRunningTasksResponse as prost::Message>::decode(cut.payload)
            .unwrap()
            .running_tasks
            .len();
        assert!((600..700).contains(&listed), "{listed}");
    }
}
