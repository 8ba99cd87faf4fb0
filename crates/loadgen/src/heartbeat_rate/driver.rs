//! Benchmark P1's driver: one call as fast as possible over N keep-alive connections,
//! per protocol, and the bare route they are compared against (its server
//! side is in `src/main.rs`, behind the `bench-route` feature).
//!
//! The compared calls share everything on the client side: one connection
//! per simulated servant from its own loopback address, one call in flight
//! per connection, whole requests (frame or HTTP head and body) encoded once
//! before the clock starts and written as they are, the answer's status
//! checked and its body skipped. So the client spends about the same CPU on
//! every kind of call and the difference is the server's.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use tokio::{sync::Barrier, task::JoinSet, time::Instant};

use bytes::BytesMut;
use prost::Message;
use yadcc_pb::{self as pb, Method};

use yadcc_sim::{
    Addressing, BARE_PATH,
    client::{CallError, Endpoint, SerialConn},
    environment_digest, octet,
    servant::{self, ServantBehaviour, ServantSpec},
    stats::{self, Histogram, Row, Stats},
    wire::{self, Outcome, Wire},
};

use crate::process::{self, ProcessSample};

/// One kind of call to send as fast as possible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// `POST /bench/bare` over plain HTTP with the binary Heartbeat body.
    Bare,
    /// `Heartbeat` in a `flare://` frame.
    HeartbeatFlare,
    /// `Heartbeat` over the daemons' `http+pb`.
    HeartbeatHttpPb,
    /// `Heartbeat` in JSON over plain HTTP.
    HeartbeatJson,
    /// `Heartbeat` in binary protobuf over plain HTTP, as the JSON target
    /// sends it but for the body: the same route and server path (hyper), so
    /// the two differ only by the codec.
    HeartbeatProtobuf,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Bare => "bare",
            Target::HeartbeatFlare => "heartbeat-flare",
            Target::HeartbeatHttpPb => "heartbeat-http+pb",
            Target::HeartbeatJson => "heartbeat-json",
            Target::HeartbeatProtobuf => "heartbeat-protobuf",
        }
    }

    pub fn parse(name: &str) -> Option<Target> {
        match name.trim() {
            "bare" => Some(Target::Bare),
            "flare" | "heartbeat-flare" => Some(Target::HeartbeatFlare),
            "http+pb" | "binary" | "heartbeat-http+pb" => Some(Target::HeartbeatHttpPb),
            "json" | "heartbeat-json" => Some(Target::HeartbeatJson),
            "protobuf" | "heartbeat-protobuf" => Some(Target::HeartbeatProtobuf),
            _ => None,
        }
    }

    /// How answers come back on the connection.
    fn protocol(self) -> Wire {
        match self {
            Target::HeartbeatFlare => Wire::Flare,
            Target::HeartbeatHttpPb | Target::HeartbeatProtobuf | Target::Bare => Wire::HttpPb,
            Target::HeartbeatJson => Wire::Json,
        }
    }
}

/// What to send, and how hard. `Debug` leaves the tokens out: a config
/// printed in a log must not hand them on.
#[derive(Clone)]
pub struct HeartbeatRateConfig {
    pub target: SocketAddr,
    pub user_token: String,
    pub servant_token: String,
    /// Connections (one simulated servant each).
    pub connections: usize,
    /// Requests each connection keeps in flight: 1 sends one and waits for
    /// its answer; more are written back to back and their answers read
    /// before the next window, as a daemon multiplexing its calls does.
    pub pipeline: usize,
    /// Measured time per target per round.
    pub duration: Duration,
    /// Unmeasured time before each measured phase.
    pub warmup: Duration,
    /// Targets run one after the other, `rounds` times, so a slow moment on a
    /// shared machine does not favour one of them.
    pub rounds: usize,
    pub targets: Vec<Target>,
    /// Environments each servant reports (5).
    pub environments: usize,
    /// Running tasks each servant reports (16), each under a real grant.
    pub tasks_per_servant: usize,
    /// The scheduler's PID, if on this host: its CPU time per request is measured.
    pub scheduler_pid: Option<u32>,
    /// How servants register and grants are set up before the measured phases.
    pub setup_protocol: Wire,
}

impl std::fmt::Debug for HeartbeatRateConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeartbeatRateConfig")
            .field("target", &self.target)
            .field("user_token", &format_args!("<redacted>"))
            .field("servant_token", &format_args!("<redacted>"))
            .field("connections", &self.connections)
            .field("pipeline", &self.pipeline)
            .field("duration", &self.duration)
            .field("warmup", &self.warmup)
            .field("rounds", &self.rounds)
            .field("targets", &self.targets)
            .field("environments", &self.environments)
            .field("tasks_per_servant", &self.tasks_per_servant)
            .field("scheduler_pid", &self.scheduler_pid)
            .field("setup_protocol", &self.setup_protocol)
            .finish()
    }
}

/// The measurements of one target over every round.
#[derive(Debug)]
pub struct TargetResult {
    pub target: Target,
    pub request_bytes: usize,
    pub ok: u64,
    pub errors: BTreeMap<String, u64>,
    pub elapsed: Duration,
    pub latency: Histogram,
    /// Scheduler CPU time over the measured windows (if its PID was given).
    pub scheduler_cpu: Option<Duration>,
    /// This process's CPU time over the measured windows.
    pub client_cpu: Option<Duration>,
    /// Successful requests per second in each round, in order.
    pub round_rates: Vec<f64>,
}

impl TargetResult {
    pub fn per_second(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Scheduler CPU time per successful request (`None` if none succeeded).
    pub fn scheduler_cpu_per_request(&self) -> Option<Duration> {
        let cpu = self.scheduler_cpu?;
        (self.ok > 0).then(|| cpu.div_f64(self.ok as f64))
    }

    /// Load generator CPU time per successful request.
    pub fn client_cpu_per_request(&self) -> Option<Duration> {
        let cpu = self.client_cpu?;
        (self.ok > 0).then(|| cpu.div_f64(self.ok as f64))
    }

    /// The median over rounds of this target's rate against `other`'s in
    /// the same round: targets run in turn, so each round compares phases
    /// seconds apart, and a noisy moment on a shared machine moves one
    /// round's ratio rather than the figure.
    pub fn median_round_ratio(&self, other: &TargetResult) -> Option<f64> {
        let mut ratios: Vec<f64> = self
            .round_rates
            .iter()
            .zip(&other.round_rates)
            .filter(|&(_, theirs)| *theirs > 0.0)
            .map(|(mine, theirs)| mine / theirs)
            .collect();
        ratios.sort_by(f64::total_cmp);
        let middle = ratios.len() / 2;
        match ratios.len() {
            0 => None,
            n if n % 2 == 1 => Some(ratios[middle]),
            _ => Some((ratios[middle - 1] + ratios[middle]) / 2.0),
        }
    }

    pub fn row(&self) -> Row {
        Row::from_histogram(
            self.target.name(),
            self.ok,
            0,
            self.errors.clone(),
            &self.latency,
            self.elapsed,
        )
    }
}

/// One simulated servant of the benchmark and its whole requests, per target.
struct Machine {
    local: Option<IpAddr>,
    spec: ServantSpec,
    grants: Vec<u64>,
    requests: HashMap<Target, Vec<u8>>,
}

/// The whole request of `target` carrying `heartbeat`.
/// `pipeline` whole requests back to back; the daemons' protocols number
/// them 1, 2, ... as a daemon numbers the calls it has in flight.
fn encode_target(
    target: Target,
    heartbeat: &pb::HeartbeatRequest,
    host: &str,
    pipeline: usize,
) -> Vec<u8> {
    let binary = heartbeat.encode_to_vec();
    // pbjson's Serialize cannot fail for generated messages.
    let json = matches!(target, Target::HeartbeatJson)
        .then(|| serde_json::to_vec(heartbeat).unwrap_or_default());
    let timeout = wire::client_timeout(Method::Heartbeat);
    let mut out = BytesMut::new();
    for id in 1..=pipeline.max(1) as u64 {
        match target {
            Target::HeartbeatFlare => {
                wire::encode_flare_request(&mut out, id, Method::Heartbeat, timeout, &binary);
            }
            Target::HeartbeatHttpPb => {
                wire::encode_http_pb_request(&mut out, id, Method::Heartbeat, timeout, &binary);
            }
            Target::HeartbeatJson => {
                let json = json.as_deref().unwrap_or_default();
                wire::encode_json_request(&mut out, host, Method::Heartbeat, json);
            }
            Target::HeartbeatProtobuf => wire::encode_http_request(
                &mut out,
                Method::Heartbeat.rpc_path(),
                &[
                    ("Host", host.to_owned()),
                    ("Content-Type", "application/x-protobuf".to_owned()),
                ],
                &binary,
            ),
            Target::Bare => wire::encode_http_request(
                &mut out,
                BARE_PATH,
                &[("Content-Type", "application/x-protobuf".to_owned())],
                &binary,
            ),
        }
    }
    out.to_vec()
}

/// Runs the benchmark; `progress` hears what is going on.
pub async fn run(
    config: &HeartbeatRateConfig,
    progress: impl Fn(String),
) -> Result<Vec<TargetResult>, String> {
    if config.duration > Duration::from_secs(25) {
        // Grants are renewed (30 s leases) before each phase, not during it.
        return Err("--duration is at most 25 s per phase".to_owned());
    }
    if config.targets.contains(&Target::Bare) {
        check_bare_route(config.target).await?;
    }
    let addressing = Addressing::detect(config.target);
    let stats = Arc::new(Stats::default());
    let behaviour = ServantBehaviour::stock(config.servant_token.clone());
    let capacity = config.tasks_per_servant.max(1) as u32;
    let mut machines: Vec<Machine> = (0..config.connections.max(1))
        .map(|index| {
            let (local, location) =
                addressing.machine(octet::HEARTBEAT_RATE_SERVANTS, index, config.target);
            Machine {
                local,
                spec: ServantSpec {
                    ip: location.ip(),
                    port: location.port(),
                    num_processors: capacity * 2,
                    capacity,
                    dedicated: true,
                    environments: (0..config.environments).map(environment_digest).collect(),
                    total_memory: 256 << 30,
                    base_load: 0,
                },
                grants: Vec::new(),
                requests: HashMap::new(),
            }
        })
        .collect();

    // Register every servant, then fill each with real grants, so the
    // heartbeats report tasks the scheduler knows (the common case).
    // A heartbeat with no running task, on the servant's own connection:
    // registers it (next heartbeat in 10 s) or lets it leave (0).
    let plain_heartbeat = |machine: &Machine, next_heartbeat_in_ms: u32| {
        let endpoint = Endpoint::new(
            config.target,
            machine.local,
            config.setup_protocol,
            stats.clone(),
        );
        let request = servant::heartbeat_request(
            &machine.spec,
            &behaviour,
            &machine.spec.location().to_string(),
            0,
            Vec::new(),
            next_heartbeat_in_ms,
        );
        async move {
            endpoint
                .call::<_, pb::HeartbeatResponse>(Method::Heartbeat, &request)
                .await
        }
    };
    for machine in &machines {
        plain_heartbeat(machine, 10_000)
            .await
            .map_err(|error| format!("registering a servant: {error}"))?;
    }
    let (delegate_ip, _) = addressing.machine(octet::HEARTBEAT_RATE_DELEGATE, 0, config.target);
    let delegate = Endpoint::new(
        config.target,
        delegate_ip,
        config.setup_protocol,
        stats.clone(),
    );
    let by_location: HashMap<String, usize> = machines
        .iter()
        .enumerate()
        .map(|(index, machine)| (machine.spec.location().to_string(), index))
        .collect();
    let wanted = machines.len() * config.tasks_per_servant;
    let mut granted = 0;
    while granted < wanted {
        let request = pb::WaitForStartingTaskRequest {
            token: config.user_token.clone(),
            milliseconds_to_wait: 0,
            env_desc: Some(pb::EnvironmentDesc {
                compiler_digest: environment_digest(0),
            }),
            immediate_reqs: (wanted - granted).min(1000) as u32,
            prefetch_reqs: 0,
            next_keep_alive_in_ms: 30_000,
            min_version: 0,
        };
        let reply = match delegate
            .call::<_, pb::WaitForStartingTaskResponse>(Method::WaitForStartingTask, &request)
            .await
        {
            Ok(reply) => reply,
            Err(error) if error.is_no_quota() => break,
            Err(error) => return Err(format!("acquiring grants: {error}")),
        };
        if reply.grants.is_empty() {
            break;
        }
        for grant in reply.grants {
            granted += 1;
            if let Some(&index) = by_location.get(&grant.servant_location) {
                machines[index].grants.push(grant.task_grant_id);
            }
        }
    }
    let all_grants: Vec<u64> = machines
        .iter()
        .flat_map(|m| m.grants.iter().copied())
        .collect();
    for machine in &mut machines {
        let tasks = machine
            .grants
            .iter()
            .enumerate()
            .map(|(index, grant)| pb::RunningTask {
                servant_task_id: index as u64 + 1,
                task_grant_id: *grant,
                servant_location: String::new(),
                task_digest: format!("{:032x}", u128::from(*grant) * 0x9e37_79b9_7f4a_7c15),
            })
            .collect();
        let request = servant::heartbeat_request(
            &machine.spec,
            &behaviour,
            &machine.spec.location().to_string(),
            0,
            tasks,
            10_000,
        );
        let host = config.target.to_string();
        machine.requests = config
            .targets
            .iter()
            .map(|&target| {
                let requests = encode_target(target, &request, &host, config.pipeline);
                (target, requests)
            })
            .collect();
    }
    let sizes: Vec<String> = config
        .targets
        .iter()
        .map(|target| {
            let bytes =
                machines[0].requests.get(target).map_or(0, Vec::len) / config.pipeline.max(1);
            format!("{} {bytes} bytes", target.name())
        })
        .collect();
    progress(format!(
        "{} servants registered with {} grants ({} asked); whole heartbeat requests: {}",
        machines.len(),
        all_grants.len(),
        wanted,
        sizes.join(", ")
    ));

    let machines = Arc::new(machines);
    let mut results: Vec<TargetResult> = config
        .targets
        .iter()
        .map(|&target| TargetResult {
            target,
            request_bytes: machines[0].requests.get(&target).map_or(0, Vec::len)
                / config.pipeline.max(1),
            ok: 0,
            errors: BTreeMap::new(),
            elapsed: Duration::ZERO,
            latency: Histogram::default(),
            scheduler_cpu: config.scheduler_pid.map(|_| Duration::ZERO),
            client_cpu: Some(Duration::ZERO),
            round_rates: Vec::new(),
        })
        .collect();
    for round in 0..config.rounds.max(1) {
        for result in &mut results {
            renew(&delegate, &config.user_token, &all_grants).await?;
            let phase = phase(config, &machines, result.target).await?;
            progress(format!(
                "round {}: {:<16} {:>9.0} req/s  p99 {} ms  errors {}",
                round + 1,
                result.target.name(),
                phase.ok as f64 / phase.elapsed.as_secs_f64(),
                stats::millis(phase.latency.quantile(0.99).unwrap_or_default()),
                phase.errors.values().sum::<u64>()
            ));
            result
                .round_rates
                .push(phase.ok as f64 / phase.elapsed.as_secs_f64().max(1e-9));
            result.ok += phase.ok;
            result.elapsed += phase.elapsed;
            result.scheduler_cpu = add_cpu(result.scheduler_cpu, phase.scheduler_cpu);
            result.client_cpu = add_cpu(result.client_cpu, phase.client_cpu);
            result.latency.merge(&phase.latency);
            for (kind, count) in phase.errors {
                *result.errors.entry(kind).or_default() += count;
            }
        }
    }

    // Clean up: free the grants, servants leave.
    for chunk in all_grants.chunks(10_000) {
        let request = pb::FreeTaskRequest {
            token: config.user_token.clone(),
            task_grant_ids: chunk.to_vec(),
        };
        let _ = delegate
            .call::<_, pb::FreeTaskResponse>(Method::FreeTask, &request)
            .await;
    }
    for machine in machines.iter() {
        let _ = plain_heartbeat(machine, 0).await;
    }
    Ok(results)
}

/// Only a scheduler built with the `bench-route` feature and started with
/// `--bench_bare_route` serves the bare route: say so at once rather than
/// measure a phase of 404s.
async fn check_bare_route(target: SocketAddr) -> Result<(), String> {
    let mut connection = SerialConn::connect(None, target, Wire::HttpPb)
        .await
        .map_err(|error| format!("cannot connect to {target}: {error}"))?;
    let request = encode_target(Target::Bare, &pb::HeartbeatRequest::default(), "", 1);
    match connection.exchange(&request).await {
        Ok(answer) if matches!(answer.outcome, Outcome::Ok(_)) => Ok(()),
        answered => Err(format!(
            "the scheduler does not serve POST {BARE_PATH} ({answered:?}): build it with \
             `--features bench-route` and start it with --bench_bare_route, or leave \
             `bare` out of --targets"
        )),
    }
}

async fn renew(delegate: &Endpoint, token: &str, grants: &[u64]) -> Result<(), String> {
    for chunk in grants.chunks(10_000) {
        let request = pb::KeepTaskAliveRequest {
            token: token.to_owned(),
            task_grant_ids: chunk.to_vec(),
            next_keep_alive_in_ms: 30_000,
        };
        delegate
            .call::<_, pb::KeepTaskAliveResponse>(Method::KeepTaskAlive, &request)
            .await
            .map_err(|error| format!("renewing grants: {error}"))?;
    }
    Ok(())
}

struct Phase {
    ok: u64,
    errors: BTreeMap<String, u64>,
    elapsed: Duration,
    latency: Histogram,
    scheduler_cpu: Option<Duration>,
    client_cpu: Option<Duration>,
}

fn add_cpu(total: Option<Duration>, phase: Option<Duration>) -> Option<Duration> {
    Some(total? + phase?)
}

/// CPU time a process spent between two samples.
fn cpu_between(before: Option<ProcessSample>, after: Option<ProcessSample>) -> Option<Duration> {
    Some(after?.cpu.saturating_sub(before?.cpu))
}

/// One measured phase: every connection sends its request in a loop.
async fn phase(
    config: &HeartbeatRateConfig,
    machines: &Arc<Vec<Machine>>,
    target: Target,
) -> Result<Phase, String> {
    let protocol = target.protocol();
    let pipeline = config.pipeline.max(1);
    let latency = Arc::new(Histogram::default());
    let measuring = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(machines.len() + 1));
    let mut workers = JoinSet::new();
    for index in 0..machines.len() {
        let machines = machines.clone();
        let (latency, measuring, done, ok, ready) = (
            latency.clone(),
            measuring.clone(),
            done.clone(),
            ok.clone(),
            ready.clone(),
        );
        let target_addr = config.target;
        workers.spawn(async move {
            let machine = &machines[index];
            let request: &[u8] = machine.requests.get(&target).map_or(&[], Vec::as_slice);
            let mut errors: BTreeMap<String, u64> = BTreeMap::new();
            let mut conn = SerialConn::connect(machine.local, target_addr, protocol)
                .await
                .ok();
            ready.wait().await;
            while !done.load(Relaxed) {
                let Some(connection) = conn.as_mut() else {
                    match SerialConn::connect(machine.local, target_addr, protocol).await {
                        Ok(connection) => conn = Some(connection),
                        Err(error) => {
                            let error = CallError::Connect(error.to_string());
                            *errors.entry(error.kind()).or_default() += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    continue;
                };
                let started = Instant::now();
                let result = connection.exchange_pipelined(request, pipeline).await;
                let elapsed = started.elapsed();
                let measured = measuring.load(Relaxed) && !done.load(Relaxed);
                let failure = match result {
                    Ok(answer) => match answer.outcome {
                        Outcome::Ok(_) => None,
                        Outcome::Failed { code, description } => {
                            Some(CallError::Rpc { code, description })
                        }
                        Outcome::Http { status } => Some(CallError::Http { status }),
                    },
                    Err(error) => Some(error),
                };
                match failure {
                    None if measured => {
                        ok.fetch_add(pipeline as u64, Relaxed);
                        latency.record(elapsed);
                    }
                    None => {}
                    Some(error) if measured => *errors.entry(error.kind()).or_default() += 1,
                    Some(_) => {}
                }
                if !connection.is_reusable() {
                    conn = None;
                }
            }
            errors
        });
    }
    ready.wait().await;
    tokio::time::sleep(config.warmup).await;
    latency.reset();
    ok.store(0, Relaxed);
    let scheduler_before = config.scheduler_pid.and_then(process::sample);
    let client_before = process::sample(std::process::id());
    measuring.store(true, Relaxed);
    let started = Instant::now();
    tokio::time::sleep(config.duration).await;
    done.store(true, Relaxed);
    let elapsed = started.elapsed();
    let scheduler_cpu = cpu_between(
        scheduler_before,
        config.scheduler_pid.and_then(process::sample),
    );
    let client_cpu = cpu_between(client_before, process::sample(std::process::id()));
    let mut errors = BTreeMap::new();
    while let Some(worker) = workers.join_next().await {
        let worker_errors = worker.map_err(|error| format!("worker failed: {error}"))?;
        for (kind, count) in worker_errors {
            *errors.entry(kind).or_default() += count;
        }
    }
    let latency = Arc::try_unwrap(latency).unwrap_or_default();
    Ok(Phase {
        ok: ok.load(Relaxed),
        errors,
        elapsed,
        latency,
        scheduler_cpu,
        client_cpu,
    })
}

#[cfg(test)]
mod tests;
