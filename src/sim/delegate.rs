//! Simulated delegates: the daemon on a developer's machine that submits
//! compilations.
//!
//! As the reference daemon: `GetConfig` every 10 s; per compiler digest one
//! background loop calling `WaitForStartingTask` (`milliseconds_to_wait =
//! 5000`, `next_keep_alive_in_ms = 15000`, `immediate_reqs` = jobs waiting now,
//! `prefetch_reqs = 1`), retrying 100 ms after a failure; prefetched grants are
//! treated as expiring 5 s early and freed if unused by then; running tasks are
//! renewed with `KeepTaskAlive` every second (`next_keep_alive_in_ms = 10000`);
//! each task is freed with `FreeTask` when done; `GetRunningTasks` about once
//! a second. A job "compiles" on its servant (through the in-process
//! [`Registry`]) for a random time.

use std::{
    collections::{HashMap, VecDeque},
    ops::RangeInclusive,
    sync::{Arc, Mutex, MutexGuard, PoisonError, atomic::Ordering::Relaxed},
    time::Duration,
};

use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::{
    sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot, watch},
    task::JoinSet,
    time::Instant,
};

use super::{client::Endpoint, servant::DAEMON_VERSION, servant::Registry};
use crate::pb::{self, Method};

/// Where jobs come from.
#[derive(Debug, Clone)]
pub enum Workload {
    /// A steady stream: jobs arrive at random (Poisson) at this rate, per delegate.
    Rate { jobs_per_second: f64 },
    /// A developer building now and then: idle, then a build of `files`
    /// compilations with `parallelism` at once (`make -jN`).
    Builds {
        idle: RangeInclusive<Duration>,
        files: RangeInclusive<u32>,
        parallelism: RangeInclusive<u32>,
    },
}

/// How delegates behave. Defaults are the reference daemon's. Its `Debug`
/// redacts the token.
#[derive(Clone)]
pub struct DelegateBehaviour {
    pub token: String,
    pub workload: Workload,
    /// How long one compilation runs on its servant.
    pub task_duration: RangeInclusive<Duration>,
    /// `milliseconds_to_wait` (5000).
    pub wait_ms: u32,
    /// `next_keep_alive_in_ms` of `WaitForStartingTask` (15000).
    pub grant_lease_ms: u32,
    /// `prefetch_reqs` (1).
    pub prefetch: u32,
    /// Between `KeepTaskAlive` calls (1 s).
    pub renew_interval: Duration,
    /// `next_keep_alive_in_ms` of `KeepTaskAlive` (10000).
    pub renew_lease_ms: u32,
    /// Between `GetConfig` calls (10 s).
    pub config_interval: Duration,
    /// Between `GetRunningTasks` calls (1 s); `None`: never.
    pub running_tasks_interval: Option<Duration>,
    /// Jobs queued or running per delegate beyond which new ones are shed
    /// (so an overloaded scheduler does not grow the simulator's memory).
    pub max_jobs: usize,
}

impl std::fmt::Debug for DelegateBehaviour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegateBehaviour")
            .field("token", &format_args!("<redacted>"))
            .field("workload", &self.workload)
            .field("task_duration", &self.task_duration)
            .field("wait_ms", &self.wait_ms)
            .field("grant_lease_ms", &self.grant_lease_ms)
            .field("prefetch", &self.prefetch)
            .field("renew_interval", &self.renew_interval)
            .field("renew_lease_ms", &self.renew_lease_ms)
            .field("config_interval", &self.config_interval)
            .field("running_tasks_interval", &self.running_tasks_interval)
            .field("max_jobs", &self.max_jobs)
            .finish()
    }
}

impl DelegateBehaviour {
    pub fn new(token: impl Into<String>, workload: Workload) -> DelegateBehaviour {
        DelegateBehaviour {
            token: token.into(),
            workload,
            task_duration: Duration::from_secs(2)..=Duration::from_secs(10),
            wait_ms: 5000,
            grant_lease_ms: 15_000,
            prefetch: 1,
            renew_interval: Duration::from_secs(1),
            renew_lease_ms: 10_000,
            config_interval: Duration::from_secs(10),
            running_tasks_interval: Some(Duration::from_secs(1)),
            max_jobs: 2000,
        }
    }

    /// Prefetched grants count as expired this much before their lease ends.
    const EARLY_EXPIRY_MS: u32 = 5000;
}

/// One delegate's view of a grant.
#[derive(Debug, Clone)]
struct Grant {
    id: u64,
    location: String,
}

/// A compiler digest the delegate compiles with: jobs waiting for a grant,
/// and prefetched grants waiting for a job.
#[derive(Debug)]
struct Lane {
    digest: String,
    waiting: Mutex<VecDeque<oneshot::Sender<Grant>>>,
    spares: Mutex<Vec<(Grant, Instant)>>,
    wake: Notify,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One delegate: what its tasks share.
struct Delegate {
    behaviour: Arc<DelegateBehaviour>,
    endpoint: Arc<Endpoint>,
    registry: Arc<Registry>,
    lanes: Vec<Arc<Lane>>,
    /// Grants of jobs running now (renewed every second).
    running: Mutex<HashMap<u64, ()>>,
    /// Jobs queued or running.
    jobs: Arc<Semaphore>,
    stop: watch::Receiver<bool>,
}

impl Delegate {
    async fn stopped(&self) {
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|stopped| *stopped).await;
    }

    fn is_stopped(&self) -> bool {
        *self.stop.borrow()
    }
}

/// Runs one delegate, compiling with `environments`, until `stop` turns true;
/// then frees every grant it holds.
pub async fn run(
    behaviour: Arc<DelegateBehaviour>,
    endpoint: Arc<Endpoint>,
    registry: Arc<Registry>,
    environments: Vec<String>,
    stop: watch::Receiver<bool>,
) {
    let max_jobs = behaviour.max_jobs;
    let shared = Arc::new(Delegate {
        behaviour,
        endpoint,
        registry,
        lanes: environments
            .into_iter()
            .map(|digest| {
                Arc::new(Lane {
                    digest,
                    waiting: Mutex::default(),
                    spares: Mutex::default(),
                    wake: Notify::new(),
                })
            })
            .collect(),
        running: Mutex::default(),
        jobs: Arc::new(Semaphore::new(max_jobs)),
        stop,
    });
    if shared.lanes.is_empty() {
        return;
    }
    let mut loops = JoinSet::new();
    loops.spawn(config_loop(shared.clone()));
    loops.spawn(renew_loop(shared.clone()));
    if let Some(interval) = shared.behaviour.running_tasks_interval {
        loops.spawn(running_tasks_loop(shared.clone(), interval));
    }
    for lane in &shared.lanes {
        loops.spawn(lane_loop(shared.clone(), lane.clone()));
    }
    loops.spawn(workload_loop(shared.clone()));
    shared.stopped().await;
    loops.abort_all();
    while loops.join_next().await.is_some() {}

    // Give back everything still held, as a daemon does on shutdown.
    let mut ids: Vec<u64> = lock(&shared.running).drain().map(|(id, _)| id).collect();
    for lane in &shared.lanes {
        ids.extend(lock(&lane.spares).drain(..).map(|(grant, _)| grant.id));
    }
    if !ids.is_empty() {
        let request = pb::FreeTaskRequest {
            token: shared.behaviour.token.clone(),
            task_grant_ids: ids,
        };
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            shared
                .endpoint
                .call::<_, pb::FreeTaskResponse>(Method::FreeTask, &request),
        )
        .await;
    }
}

/// Where in its period a periodic call of this machine falls.
fn random_phase(period: Duration) -> Duration {
    rand::rng().random_range(Duration::ZERO..=period)
}

/// Sleeps `duration` or until stopped; false if stopped.
async fn pause(shared: &Delegate, duration: Duration) -> bool {
    tokio::select! {
        biased;
        () = shared.stopped() => false,
        () = tokio::time::sleep(duration) => true,
    }
}

async fn config_loop(shared: Arc<Delegate>) {
    let request = pb::GetConfigRequest {
        token: shared.behaviour.token.clone(),
    };
    // Real daemons were not started in the same instant: a cluster started
    // at once would otherwise ask in bursts of every machine together.
    if !pause(&shared, random_phase(shared.behaviour.config_interval)).await {
        return;
    }
    loop {
        let _ = shared
            .endpoint
            .call::<_, pb::GetConfigResponse>(Method::GetConfig, &request)
            .await;
        if !pause(&shared, shared.behaviour.config_interval).await {
            return;
        }
    }
}

async fn running_tasks_loop(shared: Arc<Delegate>, interval: Duration) {
    if !pause(&shared, random_phase(interval)).await {
        return;
    }
    loop {
        let _ = shared
            .endpoint
            .call::<_, pb::GetRunningTasksResponse>(
                Method::GetRunningTasks,
                &pb::GetRunningTasksRequest {},
            )
            .await;
        if !pause(&shared, interval).await {
            return;
        }
    }
}

/// Renews running tasks every second; frees prefetched grants that were not
/// used before their (early) expiry.
async fn renew_loop(shared: Arc<Delegate>) {
    let behaviour = &shared.behaviour;
    let spare_life = Duration::from_millis(u64::from(
        behaviour
            .grant_lease_ms
            .saturating_sub(DelegateBehaviour::EARLY_EXPIRY_MS),
    ));
    if !pause(&shared, random_phase(behaviour.renew_interval)).await {
        return;
    }
    loop {
        if !pause(&shared, behaviour.renew_interval).await {
            return;
        }
        let ids: Vec<u64> = lock(&shared.running).keys().copied().collect();
        if !ids.is_empty() {
            let request = pb::KeepTaskAliveRequest {
                token: behaviour.token.clone(),
                task_grant_ids: ids.clone(),
                next_keep_alive_in_ms: behaviour.renew_lease_ms,
            };
            if let Ok(reply) = shared
                .endpoint
                .call::<_, pb::KeepTaskAliveResponse>(Method::KeepTaskAlive, &request)
                .await
            {
                let running = lock(&shared.running);
                let refused = ids
                    .iter()
                    .zip(reply.statuses.iter().chain(std::iter::repeat(&false)))
                    .filter(|(id, renewed)| !**renewed && running.contains_key(id))
                    .count();
                drop(running);
                shared
                    .endpoint
                    .stats()
                    .events
                    .renewals_refused
                    .fetch_add(refused as u64, Relaxed);
            }
        }
        let now = Instant::now();
        let mut expired = Vec::new();
        for lane in &shared.lanes {
            lock(&lane.spares).retain(|(grant, at)| {
                let keep = now.duration_since(*at) < spare_life;
                if !keep {
                    expired.push(grant.id);
                }
                keep
            });
        }
        if !expired.is_empty() {
            shared
                .endpoint
                .stats()
                .events
                .spares_expired
                .fetch_add(expired.len() as u64, Relaxed);
            free(&shared, expired).await;
        }
    }
}

/// `FreeTask`; errors are ignored (recorded in the stats), as the daemon does.
async fn free(shared: &Delegate, ids: Vec<u64>) {
    let request = pb::FreeTaskRequest {
        token: shared.behaviour.token.clone(),
        task_grant_ids: ids,
    };
    let _ = shared
        .endpoint
        .call::<_, pb::FreeTaskResponse>(Method::FreeTask, &request)
        .await;
}

/// The background loop of one compiler digest: asks for as many grants as
/// jobs are waiting (plus a prefetch), one call at a time.
async fn lane_loop(shared: Arc<Delegate>, lane: Arc<Lane>) {
    let behaviour = &shared.behaviour;
    let stats = shared.endpoint.stats().clone();
    loop {
        let immediate = loop {
            let waiting = {
                let mut waiting = lock(&lane.waiting);
                waiting.retain(|job| !job.is_closed());
                waiting.len()
            };
            if waiting > 0 {
                break waiting;
            }
            tokio::select! {
                biased;
                () = shared.stopped() => return,
                () = lane.wake.notified() => {}
            }
        };
        let request = pb::WaitForStartingTaskRequest {
            token: behaviour.token.clone(),
            milliseconds_to_wait: behaviour.wait_ms,
            env_desc: Some(pb::EnvironmentDesc {
                compiler_digest: lane.digest.clone(),
            }),
            immediate_reqs: immediate.min(1000) as u32,
            prefetch_reqs: behaviour.prefetch,
            next_keep_alive_in_ms: behaviour.grant_lease_ms,
            min_version: DAEMON_VERSION,
        };
        let reply = tokio::select! {
            biased;
            () = shared.stopped() => return,
            reply = shared.endpoint.call::<_, pb::WaitForStartingTaskResponse>(
                Method::WaitForStartingTask, &request) => reply,
        };
        match reply {
            Ok(reply) => {
                stats
                    .events
                    .grants_received
                    .fetch_add(reply.grants.len() as u64, Relaxed);
                let now = Instant::now();
                for grant in reply.grants {
                    let mut grant = Grant {
                        id: grant.task_grant_id,
                        location: grant.servant_location,
                    };
                    loop {
                        let Some(job) = lock(&lane.waiting).pop_front() else {
                            lock(&lane.spares).push((grant, now));
                            break;
                        };
                        match job.send(grant) {
                            Ok(()) => break,
                            Err(returned) => grant = returned,
                        }
                    }
                }
            }
            // The cluster was busy for the whole wait: ask again at once.
            Err(error) if error.is_no_quota() => {}
            Err(_) => {
                if !pause(&shared, Duration::from_millis(100)).await {
                    return;
                }
            }
        }
    }
}

/// Produces jobs until stopped.
async fn workload_loop(shared: Arc<Delegate>) {
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    match shared.behaviour.workload.clone() {
        Workload::Rate { jobs_per_second } => {
            if jobs_per_second <= 0.0 {
                shared.stopped().await;
                return;
            }
            let mut next = Instant::now();
            loop {
                // Exponential inter-arrival times: a Poisson stream.
                let gap = -(1.0 - rng.random::<f64>()).ln() / jobs_per_second;
                next += Duration::from_secs_f64(gap.min(60.0));
                tokio::select! {
                    biased;
                    () = shared.stopped() => return,
                    () = tokio::time::sleep_until(next) => {}
                }
                let Ok(permit) = shared.jobs.clone().try_acquire_owned() else {
                    shared
                        .endpoint
                        .stats()
                        .events
                        .jobs_shed
                        .fetch_add(1, Relaxed);
                    continue;
                };
                let lane = shared.lanes[rng.random_range(0..shared.lanes.len())].clone();
                let duration = random_duration(&mut rng, &shared.behaviour.task_duration);
                tokio::spawn(job(shared.clone(), lane, duration, permit));
            }
        }
        Workload::Builds {
            idle,
            files,
            parallelism,
        } => loop {
            if !pause(&shared, random_duration(&mut rng, &idle)).await {
                return;
            }
            let files = rng.random_range(files.clone());
            let parallel = Arc::new(Semaphore::new(
                rng.random_range(parallelism.clone()).max(1) as usize
            ));
            let lane = shared.lanes[rng.random_range(0..shared.lanes.len())].clone();
            let mut build = JoinSet::new();
            for _ in 0..files {
                let Ok(slot) = parallel.clone().acquire_owned().await else {
                    break;
                };
                if shared.is_stopped() {
                    return;
                }
                let Ok(permit) = shared.jobs.clone().try_acquire_owned() else {
                    break;
                };
                let duration = random_duration(&mut rng, &shared.behaviour.task_duration);
                let shared = shared.clone();
                let lane = lane.clone();
                build.spawn(async move {
                    job(shared, lane, duration, permit).await;
                    drop(slot);
                });
                // Reap finished compilations as the build goes.
                while build.try_join_next().is_some() {}
            }
            tokio::select! {
                biased;
                () = shared.stopped() => return,
                () = async { while build.join_next().await.is_some() {} } => {}
            }
        },
    }
}

fn random_duration(rng: &mut SmallRng, range: &RangeInclusive<Duration>) -> Duration {
    if range.start() >= range.end() {
        return *range.start();
    }
    rng.random_range(range.clone())
}

/// One compilation: wait for a grant, run on the servant, free the grant.
async fn job(
    shared: Arc<Delegate>,
    lane: Arc<Lane>,
    duration: Duration,
    _permit: OwnedSemaphorePermit,
) {
    let stats = shared.endpoint.stats().clone();
    let spare = lock(&lane.spares).pop();
    let grant = match spare {
        Some((grant, _)) => grant,
        None => {
            let (sender, receiver) = oneshot::channel();
            lock(&lane.waiting).push_back(sender);
            lane.wake.notify_one();
            tokio::select! {
                biased;
                () = shared.stopped() => return,
                grant = receiver => match grant {
                    Ok(grant) => grant,
                    Err(_) => return,
                },
            }
        }
    };
    lock(&shared.running).insert(grant.id, ());
    let task_digest = format!("{:032x}", rand::rng().random::<u128>());
    let Some(killed) = shared
        .registry
        .start(&grant.location, grant.id, task_digest)
    else {
        stats.events.unknown_servants.fetch_add(1, Relaxed);
        lock(&shared.running).remove(&grant.id);
        free(&shared, vec![grant.id]).await;
        return;
    };
    stats.events.tasks_started.fetch_add(1, Relaxed);
    let finished = tokio::select! {
        biased;
        () = shared.stopped() => return,
        _ = killed => false,
        () = tokio::time::sleep(duration) => true,
    };
    // The servant stops reporting the task before the grant is freed, so a
    // heartbeat in between never lists a freed grant.
    shared.registry.finish(&grant.location, grant.id);
    lock(&shared.running).remove(&grant.id);
    free(&shared, vec![grant.id]).await;
    if finished {
        stats.events.tasks_completed.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaviour_debug_redacts_the_token() {
        let delegate = DelegateBehaviour::new(
            "user-secret",
            Workload::Rate {
                jobs_per_second: 1.0,
            },
        );
        let printed = format!("{delegate:?}");
        assert!(!printed.contains("-secret"), "{printed}");
        assert!(printed.contains("token: <redacted>"), "{printed}");
    }
}
