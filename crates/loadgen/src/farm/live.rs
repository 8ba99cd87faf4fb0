//! The farm run against a real scheduler, in real time: every servant
//! heartbeats every second as the stock daemon does (its 15 s load average,
//! its `--max_remote_tasks` as `capacity`, the tasks it runs), and every
//! developer's delegate asks for grants as the stock daemon does: one
//! `WaitForStartingTask` at a time, for the compiles waiting now plus one
//! prefetch, 5 s waits, 15 s leases; the running grants renewed every
//! second; a prefetched grant unused for 10 s given back; each grant freed
//! when its compile ends.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};
use yadcc_pb as pb;
use yadcc_scheduler::service::SchedulerService;
use yadcc_sim::{self as sim, Stats, Wire, client::Endpoint, servant::DAEMON_VERSION};

use super::link::{Failed, Link};
use super::model::{Farm, Outcome};

/// Between two runs of the model (and frees of the compiles that ended).
const TICK: Duration = Duration::from_millis(100);
// The farm's daemons keep the stock daemons' habits.
use yadcc_stock::{
    GRANT_LEASE_MS, HEARTBEAT_PERIOD as HEARTBEAT_INTERVAL,
    NEXT_HEARTBEAT_IN_MS as HEARTBEAT_NEXT_MS, PREFETCH, RENEW_LEASE_MS,
    RENEW_PERIOD as RENEW_INTERVAL, WAIT_MS,
};
/// Largest `immediate_reqs` asked at once (the scheduler's bound is 1,024).
const MOST_IMMEDIATE: usize = 1000;
/// A prefetched grant is treated as expiring 5 s before its lease.
const SPARE_LIFE: Duration = Duration::from_secs(10);
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(100);
/// Memory a servant reports: far above the scheduler's floor, so memory
/// never decides.
const TOTAL_MEMORY: u64 = 128 << 30;
const AVAILABLE_MEMORY: u64 = 100 << 30;
/// Second octet of the farm's servants' and developers' loopback addresses.
const SERVANTS_OCTET: u8 = 6;
const DEVELOPERS_OCTET: u8 = 7;

/// How the live run reaches the scheduler.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) address: SocketAddr,
    pub(crate) protocol: Wire,
    pub(crate) user_token: String,
    pub(crate) servant_token: String,
}

/// Every simulated daemon's way to the scheduler, and the tokens they present.
pub(crate) struct Links {
    pub(crate) servants: Vec<Link>,
    pub(crate) developers: Vec<Link>,
    pub(crate) user_token: String,
    pub(crate) servant_token: String,
    pub(crate) stats: Arc<Stats>,
}

impl Links {
    /// Over sockets: each servant and developer from its own loopback address.
    pub(crate) fn sockets(target: &Target, servants: usize, developers: usize) -> Links {
        let stats = Arc::new(Stats::default());
        let endpoint = |octet: u8, index: usize| {
            Link::Socket(Endpoint::new(
                target.address,
                Some(sim::machine_ip(octet, index)),
                target.protocol,
                stats.clone(),
            ))
        };
        Links {
            servants: (0..servants).map(|i| endpoint(SERVANTS_OCTET, i)).collect(),
            developers: (0..developers)
                .map(|i| endpoint(DEVELOPERS_OCTET, i))
                .collect(),
            user_token: target.user_token.clone(),
            servant_token: target.servant_token.clone(),
            stats,
        }
    }

    /// To `service` in this process, each daemon with the address and one
    /// connection of its own, as over sockets.
    pub(crate) fn in_process(
        service: &SchedulerService,
        user_token: &str,
        servant_token: &str,
        servants: usize,
        developers: usize,
    ) -> Links {
        let stats = Arc::new(Stats::default());
        let link = |octet: u8, index: usize, connection: u64| {
            Link::in_process(
                service.clone(),
                sim::machine_ip(octet, index),
                connection,
                stats.clone(),
            )
        };
        let servant_links = (0..servants)
            .map(|i| link(SERVANTS_OCTET, i, i as u64))
            .collect();
        let developer_links = (0..developers)
            .map(|i| link(DEVELOPERS_OCTET, i, (servants + i) as u64))
            .collect();
        Links {
            servants: servant_links,
            developers: developer_links,
            user_token: user_token.to_owned(),
            servant_token: servant_token.to_owned(),
            stats,
        }
    }
}

#[derive(Debug, Default)]
struct Developer {
    /// Prefetched grants not used yet: servant and since when.
    spares: Vec<(u64, usize, Instant)>,
    /// Grants running a compile, and on which servant.
    running: HashMap<u64, usize>,
}

struct Live {
    farm: Farm,
    developers: Vec<Developer>,
    /// The servant a grant's location names.
    by_location: HashMap<String, usize>,
    stopping: bool,
}

fn lock(live: &Mutex<Live>) -> MutexGuard<'_, Live> {
    live.lock().unwrap_or_else(PoisonError::into_inner)
}

fn environment() -> String {
    sim::environment_digest(0)
}

fn location(index: usize) -> String {
    SocketAddr::new(sim::machine_ip(SERVANTS_OCTET, index), sim::SERVANT_PORT).to_string()
}

impl Live {
    /// Starts waiting compiles on the developer's spares; the grants the
    /// developer has to give back (stale spares).
    fn use_spares(&mut self, developer: usize, now: Instant) -> Vec<u64> {
        let mut stale = Vec::new();
        let Live {
            farm, developers, ..
        } = self;
        let state = &mut developers[developer];
        state.spares.retain(|&(grant, _, since)| {
            let keep = now.duration_since(since) < SPARE_LIFE;
            if !keep {
                stale.push(grant);
            }
            keep
        });
        while farm.waiting(developer) > 0 {
            let Some((grant, servant, _)) = state.spares.pop() else {
                break;
            };
            farm.start(developer, servant, grant, now);
            state.running.insert(grant, servant);
        }
        stale
    }

    /// Grants came: each starts a waiting compile or is kept as a spare.
    fn granted(
        &mut self,
        developer: usize,
        grants: Vec<pb::StartingTaskGrant>,
        now: Instant,
    ) -> Vec<u64> {
        let mut unknown = Vec::new();
        for grant in grants {
            let Some(&servant) = self.by_location.get(&grant.servant_location) else {
                unknown.push(grant.task_grant_id);
                continue;
            };
            let id = grant.task_grant_id;
            if self.farm.start(developer, servant, id, now) {
                self.developers[developer].running.insert(id, servant);
            } else {
                self.developers[developer].spares.push((id, servant, now));
            }
        }
        unknown
    }
}

/// What a live run measured.
pub(crate) struct Run {
    pub(crate) outcome: Outcome,
    pub(crate) stats: Arc<Stats>,
    /// How late each of the model's ticks ran, in milliseconds: the load
    /// generator's own lag, which delays every free and every new compile's
    /// request whatever the scheduler (a busy machine shows here, not as
    /// the scheduler's placement).
    pub(crate) tick_lags_ms: Vec<f64>,
}

/// Runs the farm against the scheduler: the servants heartbeat from now
/// (the farm's origin should be a few seconds later, so they are known
/// before the first build), then until every build ended or `limit` after
/// the origin.
pub(crate) async fn run(links: Links, farm: Farm, limit: Duration) -> Result<Run, String> {
    let Links {
        servants: servant_endpoints,
        developers: developer_endpoints,
        user_token,
        servant_token,
        stats,
    } = links;
    let servants = farm.machines.len();
    let developers = farm.scenario.developers;
    let by_location = (0..servants)
        .map(|index| (location(index), index))
        .collect();
    let origin = farm.origin;
    let live = Arc::new(Mutex::new(Live {
        developers: (0..developers).map(|_| Developer::default()).collect(),
        farm,
        by_location,
        stopping: false,
    }));
    let wakeups: Vec<Arc<Notify>> = (0..developers).map(|_| Arc::new(Notify::new())).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (index, endpoint) in servant_endpoints.iter().enumerate() {
        let phase = HEARTBEAT_INTERVAL.mul_f64(index as f64 / servants.max(1) as f64);
        tasks.spawn(heartbeats(
            live.clone(),
            endpoint.clone(),
            servant_token.clone(),
            index,
            phase,
        ));
    }
    for developer in 0..developers {
        let endpoint = developer_endpoints[developer].clone();
        let token = user_token.clone();
        tasks.spawn(long_polls(
            live.clone(),
            endpoint.clone(),
            token.clone(),
            developer,
            wakeups[developer].clone(),
        ));
        let phase = RENEW_INTERVAL.mul_f64(developer as f64 / developers.max(1) as f64);
        tasks.spawn(renewals(live.clone(), endpoint, token, developer, phase));
    }
    // The servants heartbeat from now: the first build starts at `origin`.
    tokio::time::sleep_until(origin).await;
    let end = origin + limit;
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tick_lags_ms = Vec::new();
    loop {
        let due = ticks.tick().await;
        let now = Instant::now();
        tick_lags_ms.push(now.saturating_duration_since(due).as_secs_f64() * 1e3);
        let mut frees: Vec<(usize, Vec<u64>)> = Vec::new();
        let finished = {
            let mut state = lock(&live);
            let ended = state.farm.advance(now);
            let mut by_developer: HashMap<usize, Vec<u64>> = HashMap::new();
            for ended in ended {
                state.developers[ended.developer]
                    .running
                    .remove(&ended.grant);
                by_developer
                    .entry(ended.developer)
                    .or_default()
                    .push(ended.grant);
            }
            for (developer, wakeup) in wakeups.iter().enumerate() {
                let stale = state.use_spares(developer, now);
                by_developer.entry(developer).or_default().extend(stale);
                if state.farm.waiting(developer) > 0 {
                    wakeup.notify_one();
                }
            }
            frees.extend(by_developer.into_iter().filter(|(_, ids)| !ids.is_empty()));
            let finished = state.farm.done() || now >= end;
            if finished {
                state.stopping = true;
            }
            finished
        };
        for (developer, ids) in frees {
            free(&developer_endpoints[developer], &user_token, ids);
        }
        if finished {
            break;
        }
    }
    let outcome = lock(&live).farm.outcome(Instant::now());
    // Give back what is still held, as a daemon does on shutdown.
    let held: Vec<(usize, Vec<u64>)> = {
        let state = lock(&live);
        state
            .developers
            .iter()
            .enumerate()
            .map(|(developer, d)| {
                let ids = d
                    .running
                    .keys()
                    .copied()
                    .chain(d.spares.iter().map(|s| s.0))
                    .collect();
                (developer, ids)
            })
            .collect()
    };
    for wakeup in &wakeups {
        wakeup.notify_one();
    }
    for (developer, ids) in held {
        if !ids.is_empty() {
            let _ = call_free(&developer_endpoints[developer], &user_token, ids).await;
        }
    }
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    Ok(Run {
        outcome,
        stats,
        tick_lags_ms,
    })
}

fn free(endpoint: &Link, token: &str, ids: Vec<u64>) {
    let endpoint = endpoint.clone();
    let token = token.to_owned();
    tokio::spawn(async move {
        let _ = call_free(&endpoint, &token, ids).await;
    });
}

async fn call_free(endpoint: &Link, token: &str, ids: Vec<u64>) -> Result<(), Failed> {
    let request = pb::FreeTaskRequest {
        token: token.to_owned(),
        task_grant_ids: ids,
    };
    endpoint.call(request).await.map(drop)
}

async fn heartbeats(
    live: Arc<Mutex<Live>>,
    endpoint: Link,
    token: String,
    servant: usize,
    phase: Duration,
) {
    let mut beats = tokio::time::interval_at(Instant::now() + phase, HEARTBEAT_INTERVAL);
    beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let location = location(servant);
    loop {
        beats.tick().await;
        let request = {
            let mut state = lock(&live);
            let dedicated = state.farm.scenario.servants[servant].dedicated;
            let now = Instant::now();
            let machine = &mut state.farm.machines[servant];
            let running_tasks = machine
                .tasks
                .iter()
                .map(|task| pb::RunningTask {
                    servant_task_id: task.grant,
                    task_grant_id: task.grant,
                    servant_location: location.clone(),
                    task_digest: format!("{:032x}", task.grant),
                })
                .collect();
            pb::HeartbeatRequest {
                token: token.clone(),
                next_heartbeat_in_ms: HEARTBEAT_NEXT_MS,
                version: DAEMON_VERSION,
                location: location.clone(),
                num_processors: machine.processors,
                current_load: machine.load.current_load(now),
                servant_priority: if dedicated {
                    pb::ServantPriority::Dedicated
                } else {
                    pb::ServantPriority::User
                } as i32,
                not_accepting_task_reason: 0,
                capacity: machine.max_tasks,
                total_memory_in_bytes: TOTAL_MEMORY,
                memory_available_in_bytes: AVAILABLE_MEMORY,
                env_descs: vec![pb::EnvironmentDesc {
                    compiler_digest: environment(),
                }],
                running_tasks,
            }
        };
        let Ok(answer) = endpoint.call(request).await else {
            continue;
        };
        if answer.expired_tasks.is_empty() {
            continue;
        }
        let mut state = lock(&live);
        let now = Instant::now();
        for grant in answer.expired_tasks {
            if state.farm.kill(servant, grant, now) {
                for developer in &mut state.developers {
                    developer.running.remove(&grant);
                }
            }
        }
    }
}

async fn long_polls(
    live: Arc<Mutex<Live>>,
    endpoint: Link,
    token: String,
    developer: usize,
    wakeup: Arc<Notify>,
) {
    loop {
        let immediate = {
            let state = lock(&live);
            if state.stopping {
                return;
            }
            state.farm.waiting(developer)
        };
        if immediate == 0 {
            wakeup.notified().await;
            continue;
        }
        let request = pb::WaitForStartingTaskRequest {
            token: token.clone(),
            milliseconds_to_wait: WAIT_MS,
            env_desc: Some(pb::EnvironmentDesc {
                compiler_digest: environment(),
            }),
            immediate_reqs: immediate.min(MOST_IMMEDIATE) as u32,
            prefetch_reqs: PREFETCH,
            next_keep_alive_in_ms: GRANT_LEASE_MS,
            min_version: DAEMON_VERSION,
        };
        let answer = endpoint.call(request).await;
        match answer {
            Ok(answer) => {
                let unknown = {
                    let mut state = lock(&live);
                    state.granted(developer, answer.grants, Instant::now())
                };
                if !unknown.is_empty() {
                    free(&endpoint, &token, unknown);
                }
            }
            Err(Failed::NoQuota) => {}
            Err(Failed::Error) => tokio::time::sleep(RETRY_AFTER_ERROR).await,
        }
    }
}

async fn renewals(
    live: Arc<Mutex<Live>>,
    endpoint: Link,
    token: String,
    developer: usize,
    phase: Duration,
) {
    let mut turns = tokio::time::interval_at(Instant::now() + phase, RENEW_INTERVAL);
    turns.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        turns.tick().await;
        let ids: Vec<u64> = lock(&live).developers[developer]
            .running
            .keys()
            .copied()
            .collect();
        if ids.is_empty() {
            continue;
        }
        let request = pb::KeepTaskAliveRequest {
            token: token.clone(),
            task_grant_ids: ids,
            next_keep_alive_in_ms: RENEW_LEASE_MS,
        };
        let _ = endpoint.call(request).await;
    }
}
