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

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::{
    EncodedAnswer, codec,
    compression::{self, Accepted, Algorithm},
    error::{ApiError, ErrorKind},
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

/// Log target of the builds (`RUST_LOG=yadcc_scheduler::running_tasks=debug`
/// shows how long each took).
const LOG: &str = "yadcc_scheduler::running_tasks";

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
///
/// Building a large cluster's answer (listing, encoding, compressing) takes
/// milliseconds: it runs on a blocking thread, one build at a time, while
/// the callers that need it wait asynchronously. Every other call, and every
/// caller of an answer already built, goes on meanwhile: a build never holds
/// a runtime thread or the lock callers read the answer under.
#[derive(Debug)]
pub struct RunningTasksCache {
    latest: Arc<Mutex<Latest>>,
    /// Held by the one build (or encoding) in progress.
    building: tokio::sync::Mutex<()>,
    /// The bound on an answer's encoding (`--max_running_tasks_bytes`).
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Latest {
    built: Option<Built>,
    /// When a cut list was last reported in the log.
    cut_reported: Option<Instant>,
}

/// An answer for one version of the list. Cheap to clone: the response is
/// shared, the copies are reference-counted bytes.
#[derive(Debug, Clone)]
struct Built {
    version: u64,
    response: Arc<pb::GetRunningTasksResponse>,
    /// A compressed slot holds the plain bytes when compression did not
    /// shrink them (so it is tried once, too).
    encoded: [Option<EncodedAnswer>; SLOTS],
}

impl Built {
    /// The answer for a caller of `encoding` accepting `accepts`, if its
    /// copy is made already.
    fn answer(&self, encoding: Encoding, accepts: Accepted) -> Option<EncodedAnswer> {
        let plain = self.encoded[slot(encoding, None)].as_ref()?;
        match compression::choose(plain.payload.len(), accepts) {
            None => Some(plain.clone()),
            Some(algorithm) => self.encoded[slot(encoding, Some(algorithm))].clone(),
        }
    }

    /// The same, making the copies it needs: encoding, then compressing.
    fn make_answer(
        &mut self,
        encoding: Encoding,
        accepts: Accepted,
    ) -> Result<EncodedAnswer, ApiError> {
        let plain = match &self.encoded[slot(encoding, None)] {
            Some(plain) => plain.clone(),
            None => {
                let bytes = codec::encode(encoding, &*self.response)?;
                let plain = EncodedAnswer::plain(bytes.into());
                self.encoded[slot(encoding, None)] = Some(plain.clone());
                plain
            }
        };
        let Some(algorithm) = compression::choose(plain.payload.len(), accepts) else {
            return Ok(plain);
        };
        let copy = &mut self.encoded[slot(encoding, Some(algorithm))];
        if let Some(compressed) = copy {
            return Ok(compressed.clone());
        }
        let (compression, payload) = compression::compress_with(plain.payload, algorithm);
        let compressed = EncodedAnswer {
            payload,
            compression,
        };
        *copy = Some(compressed.clone());
        Ok(compressed)
    }
}

impl Default for RunningTasksCache {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_ANSWER_BYTES)
    }
}

impl RunningTasksCache {
    /// Answers whose encoding is at most `max_bytes`.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            latest: Arc::default(),
            building: tokio::sync::Mutex::new(()),
            max_bytes,
        }
    }

    /// The answer in `encoding` for a caller accepting `accepts`: the list
    /// is built when the engine's version changed, encoded the first time
    /// it is asked for in that encoding and compressed the first time a
    /// caller accepts that algorithm (a large binary list for the daemons'
    /// preferred algorithm at once, with the build). Callers meanwhile wait
    /// for the one build instead of each building their own.
    pub async fn encoded(
        &self,
        service: &SchedulerService,
        request: pb::GetRunningTasksRequest,
        ctx: &CallContext,
        encoding: Encoding,
        accepts: Accepted,
    ) -> Result<EncodedAnswer, ApiError> {
        let version = service.running_tasks_version();
        if let Some(answer) = self.ready(version, encoding, accepts) {
            return Ok(answer);
        }
        let _building = self.building.lock().await;
        // Another caller may have built it while this one waited.
        if let Some(answer) = self.ready(version, encoding, accepts) {
            return Ok(answer);
        }
        let current = self.lock().built.clone().filter(|b| b.version >= version);
        let service = service.clone();
        let (ctx, max_bytes) = (*ctx, self.max_bytes);
        let job = move || -> Result<(Built, EncodedAnswer, usize), ApiError> {
            let started = std::time::Instant::now();
            let (mut built, left_out) = match current {
                Some(built) => (built, 0),
                None => {
                    let answer = service.get_running_tasks(request, &ctx, max_bytes)?;
                    let mut built = Built {
                        version: answer.version,
                        response: Arc::new(answer.response),
                        encoded: Default::default(),
                    };
                    // Every stock daemon accepts the preferred algorithm:
                    // a large list is compressed for them with the build.
                    built.make_answer(Encoding::Binary, Accepted::ALL)?;
                    (built, answer.left_out)
                }
            };
            let answer = built.make_answer(encoding, accepts)?;
            tracing::debug!(
                target: LOG,
                version = built.version,
                tasks = built.response.running_tasks.len(),
                bytes = answer.payload.len(),
                compression = answer.compression.map(Algorithm::label),
                elapsed_us = started.elapsed().as_micros() as u64,
                "built a GetRunningTasks answer"
            );
            Ok((built, answer, left_out))
        };
        let (built, answer, left_out) =
            tokio::task::spawn_blocking(job).await.map_err(|error| {
                ApiError::new(
                    ErrorKind::Internal,
                    format!("building the task list failed: {error}"),
                )
            })??;
        let mut latest = self.lock();
        if left_out > 0 {
            latest.report_cut(built.response.running_tasks.len(), left_out);
        }
        if latest
            .built
            .as_ref()
            .is_none_or(|b| b.version <= built.version)
        {
            latest.built = Some(built);
        }
        Ok(answer)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Latest> {
        self.latest.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer already made for `version` (or a later one), if any.
    fn ready(&self, version: u64, encoding: Encoding, accepts: Accepted) -> Option<EncodedAnswer> {
        let latest = self.lock();
        let built = latest.built.as_ref().filter(|b| b.version >= version)?;
        built.answer(encoding, accepts)
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
    async fn ask(
        answers: &RunningTasksCache,
        service: &SchedulerService,
        encoding: Encoding,
        accepts: Accepted,
    ) -> EncodedAnswer {
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
            .await
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_answer_is_encoded_once_per_version_and_encoding() {
        let service = service();
        let answers = RunningTasksCache::default();
        let plain = |encoding| ask(&answers, &service, encoding, Accepted::NONE);
        let empty = plain(Encoding::Binary).await.payload;
        assert!(empty.is_empty());
        assert_eq!(&plain(Encoding::Json).await.payload[..], b"{}\n");

        servant_with_tasks(&service, 1);
        tokio::time::advance(engine::Config::default().running_tasks_refresh).await;
        let binary = plain(Encoding::Binary).await.payload;
        assert!(
            !binary.is_empty(),
            "a new version of the list is a new answer"
        );
        let again = plain(Encoding::Binary).await.payload;
        assert_eq!(binary.as_ptr(), again.as_ptr(), "one encoding, shared");
        let json = plain(Encoding::Json).await.payload;
        assert_eq!(
            &json[..],
            concat!(
                r#"{"runningTasks":[{"servantTaskId":"3","servantLocation":"10.0.0.1:8335","#,
                r#""taskDigest":"digest"}]}"#,
                "\n"
            )
            .as_bytes()
        );
        assert_eq!(json.as_ptr(), plain(Encoding::Json).await.payload.as_ptr());
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_list_is_compressed_once_per_version_and_algorithm() {
        let service = service();
        let answers = RunningTasksCache::default();
        servant_with_tasks(&service, 2000);
        tokio::time::advance(engine::Config::default().running_tasks_refresh).await;
        let binary = |accepts| ask(&answers, &service, Encoding::Binary, accepts);
        let plain = binary(Accepted::NONE).await;
        assert_eq!(plain.compression, None);
        assert!(plain.payload.len() >= compression::COMPRESS_FROM_BYTES);
        let daemon = binary(Accepted::ALL).await;
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
            binary(Accepted::ALL).await.payload.as_ptr(),
            daemon.payload.as_ptr()
        );
        for algorithm in Algorithm::PREFERRED {
            let only = Accepted::from_bits(1 << algorithm.wire());
            let answer = binary(only).await;
            assert_eq!(answer.compression, Some(algorithm));
            assert_eq!(
                algorithm
                    .inflate(&answer.payload, plain.payload.len())
                    .unwrap(),
                plain.payload,
                "{algorithm:?}"
            );
            assert_eq!(binary(only).await.payload.as_ptr(), answer.payload.as_ptr());
        }
        // A new version of the list is compressed anew.
        servant_with_tasks(&service, 1999);
        tokio::time::advance(engine::Config::default().running_tasks_refresh).await;
        let next = binary(Accepted::ALL).await;
        assert_ne!(next.payload, daemon.payload);
    }

    /// Callers of one new version wait for one build, not one each.
    #[tokio::test(start_paused = true)]
    async fn callers_of_a_new_version_share_one_build() {
        let service = service();
        let answers = RunningTasksCache::default();
        servant_with_tasks(&service, 2000);
        tokio::time::advance(engine::Config::default().running_tasks_refresh).await;
        let callers: Vec<_> = (0..8)
            .map(|_| ask(&answers, &service, Encoding::Binary, Accepted::ALL))
            .collect();
        let answered = futures_util::future::join_all(callers).await;
        let first = answered[0].payload.as_ptr();
        assert!(
            answered
                .iter()
                .all(|answer| answer.payload.as_ptr() == first),
            "the same bytes for every caller"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_over_the_bound_is_cut_to_it() {
        let service = service();
        servant_with_tasks(&service, 2000);
        tokio::time::advance(engine::Config::default().running_tasks_refresh).await;
        let whole = ask(
            &RunningTasksCache::default(),
            &service,
            Encoding::Binary,
            Accepted::NONE,
        )
        .await;
        let bound = whole.payload.len() / 3;
        let cut = ask(
            &RunningTasksCache::new(bound),
            &service,
            Encoding::Binary,
            Accepted::NONE,
        )
        .await;
        assert!(cut.payload.len() <= bound && cut.payload.len() > bound - 200);
        let listed = <pb::GetRunningTasksResponse as prost::Message>::decode(cut.payload)
            .unwrap()
            .running_tasks
            .len();
        assert!((600..700).contains(&listed), "{listed}");
    }
}
