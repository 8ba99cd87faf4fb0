//! A simulated yadcc cluster that speaks the daemons' wire protocols to a
//! scheduler over real sockets: the demo (`yadcc-scheduler --demo`), the load
//! generator (`yadcc-loadgen`) and integration tests all run on it. It uses
//! the generated protobuf types only, never the server's modules, so it
//! checks the server from the outside as a stock daemon would.
//!
//! Every simulated machine is one daemon, as in a real cluster: servant and
//! delegate at once (a cluster may give some machines only the servant role),
//! both roles sharing one [`client::Endpoint`] (at most two connections) from
//! the machine's own loopback address (127.1.x.y), so the scheduler's
//! placement, self-avoidance and NAT detection see distinct machines.
//!
//! - [`wire`]: the client side of `flare://` frames, the daemons' `http+pb`
//!   and plain-HTTP JSON: encoding requests, decoding answers.
//! - [`client`]: connections carrying many calls at once with answers matched
//!   by id, the two-connection pool, the daemons' per-call timeouts.
//! - [`servant`]: the servant role, heartbeating every second, its heartbeat
//!   encoded once but for what changes; [`registry`]: the in-process
//!   [`Registry`] through which delegates start tasks on servants (what a
//!   servant reports running is what delegates started there).
//! - [`delegate`]: the delegate role: renewing grants, `GetConfig` and
//!   `GetRunningTasks`; `jobs`: its compilations, from a grant (prefetched,
//!   or from the compiler's `WaitForStartingTask` loop) to `FreeTask`;
//!   `behaviour`: both roles' periods, leases and workloads.
//! - `daemons`: every machine of a cluster and what they share; it fires
//!   what falls due and sends the calls the roles ask for (`effects`);
//!   `shard`: the timers; `task_lists`: the check of `GetRunningTasks`
//!   answers. No task runs per machine or per call: a few shard tasks fire
//!   what falls due (periodic calls, job arrivals and ends, call deadlines),
//!   and each answer's continuation runs on its connection's reader, so one
//!   process can play thousands of daemons.
//! - [`stats`]: per-RPC counts, latency percentiles, bytes and errors by kind.
//! - [`BARE_PATH`]: the route benchmark P1 compares Heartbeat against,
//!   named here because both sides need it: the scheduler serves it (feature
//!   `bench-route`), the load generator (`crates/loadgen/src/`, which drives
//!   the benchmarks) calls it.
//!
//! Stopping is explicit and bounded: [`Cluster::stop`] stops every periodic
//! call and workload, then waits (at most a few seconds) for servants to say
//! goodbye and delegates to free their grants.

mod behaviour;
pub mod client;
mod daemons;
pub mod delegate;
mod effects;
mod jobs;
pub mod registry;
pub mod servant;
mod shard;
pub mod stats;
mod task_lists;
pub mod wire;

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::Duration,
};

use rand::{Rng, SeedableRng, rngs::SmallRng, seq::IndexedRandom};
use sha2::{Digest, Sha256};
use tokio::{task::AbortHandle, time::Instant};

pub use delegate::{DelegateBehaviour, Workload};
pub use registry::Registry;
pub use servant::{ServantBehaviour, ServantSpec};
pub use stats::{Report, Stats};

use client::{DAEMON_MAX_CONNECTIONS, Deadlines, Endpoint};
use daemons::{Daemon, Daemons};
use delegate::Delegate;
use servant::Servant;
use shard::{Event, Shard};
pub use wire::Wire;
use wire::{DAEMON_ACCEPTABLE_COMPRESSION, FlareRequests};

/// User token of `yadcc-scheduler --demo` (public: the demo listens on loopback).
pub const DEMO_USER_TOKEN: &str = "demo-user-token";
/// Servant token of `yadcc-scheduler --demo`.
pub const DEMO_SERVANT_TOKEN: &str = "demo-servant-token";

/// Second octet of the loopback addresses of each kind of simulated machine.
pub mod octet {
    /// Machines (daemons) of a cluster: 127.1.x.y.
    pub const MACHINES: u8 = 1;
    /// Servants of the heartbeat-rate benchmark (P1): 127.3.x.y.
    pub const HEARTBEAT_RATE_SERVANTS: u8 = 3;
    /// The heartbeat-rate benchmark's delegate (setting up grants): 127.4.0.1.
    pub const HEARTBEAT_RATE_DELEGATE: u8 = 4;
}

/// Path of the bare route, which only a scheduler built with the
/// `bench-route` feature and started with `--bench_bare_route` serves.
pub const BARE_PATH: &str = "/bench/bare";

/// Port servants report in `location` (the yadcc servant's default).
pub const SERVANT_PORT: u16 = 8335;

/// The `index`-th machine of a group: 127.`group`.(index / 250).(index % 250 + 1);
/// room for 64,000 machines per group.
pub fn machine_ip(group: u8, index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        127,
        group,
        (index / 250).min(255) as u8,
        (index % 250 + 1) as u8,
    ))
}

/// How simulated machines get distinct identities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressing {
    /// Each machine connects from its own 127.g.x.y (Linux: all of 127/8 is local).
    PerMachineLoopback,
    /// Every machine connects from the default address; servants differ by the
    /// port they report (used where 127/8 aliases are missing, or over IPv6).
    SharedAddress,
}

impl Addressing {
    /// Per-machine loopback if the target is IPv4 loopback and 127.1.0.1 can
    /// be bound here; else a shared address.
    pub fn detect(target: SocketAddr) -> Addressing {
        let probe = tokio::net::TcpSocket::new_v4()
            .and_then(|socket| socket.bind(SocketAddr::new(machine_ip(octet::MACHINES, 0), 0)));
        if target.ip().is_loopback() && target.is_ipv4() && probe.is_ok() {
            Addressing::PerMachineLoopback
        } else {
            Addressing::SharedAddress
        }
    }

    /// Source address and reported location of the `index`-th machine of `group`.
    pub fn machine(
        self,
        group: u8,
        index: usize,
        target: SocketAddr,
    ) -> (Option<IpAddr>, SocketAddr) {
        match self {
            Addressing::PerMachineLoopback => {
                let ip = machine_ip(group, index);
                (Some(ip), SocketAddr::new(ip, SERVANT_PORT))
            }
            Addressing::SharedAddress => {
                let ip = source_ip(target);
                let port = 10_000u16
                    .wrapping_add(u16::from(group).wrapping_mul(10_000))
                    .wrapping_add(index as u16);
                (None, SocketAddr::new(ip, port))
            }
        }
    }
}

/// The address this host's packets to `target` leave from (no packet is sent).
fn source_ip(target: SocketAddr) -> IpAddr {
    let target = connect_address(target);
    if target.ip().is_loopback() {
        return target.ip();
    }
    let unspecified: SocketAddr = if target.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    std::net::UdpSocket::bind(unspecified)
        .and_then(|socket| {
            socket.connect(target)?;
            socket.local_addr()
        })
        .map_or(target.ip(), |local| local.ip())
}

/// Where to reach a scheduler listening on `listen`: its own address, or
/// loopback if it listens on every interface.
pub fn connect_address(listen: SocketAddr) -> SocketAddr {
    if listen.ip().is_unspecified() {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
    } else {
        listen
    }
}

/// The `index`-th simulated compiler: a SHA-256 hex digest, like a real one.
pub fn environment_digest(index: usize) -> String {
    hex::encode(Sha256::digest(
        format!("yadcc-sim-compiler-{index}").as_bytes(),
    ))
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The scheduler.
    pub target: SocketAddr,
    pub protocol: Wire,
    /// Machines with the servant role: machines 0..servants.
    pub servants: usize,
    /// Machines with the delegate role: machines 0..delegates. There are
    /// max(servants, delegates) machines; the first min of them play both.
    pub delegates: usize,
    /// Distinct compilers in the cluster (at least 5). Every servant offers
    /// the two most common and three others.
    pub environments: usize,
    pub servant: ServantBehaviour,
    pub delegate: DelegateBehaviour,
    /// Every servant offers this many slots (`capacity`); `None`: a share of
    /// its processors, as real machines are set up.
    pub servant_capacity: Option<u32>,
    /// Seed for the machines' shapes; `None`: random.
    pub seed: Option<u64>,
    /// `acceptable_compression_algorithms` of every flare call: what the
    /// daemons accept for answers (stock daemons: every algorithm, 62).
    pub acceptable_compression: u64,
}

impl ClusterConfig {
    /// Daemons as the reference behaves, with `servants` servants and
    /// `delegates` delegates running `workload`.
    pub fn new(
        target: SocketAddr,
        user_token: &str,
        servant_token: &str,
        servants: usize,
        delegates: usize,
        workload: Workload,
    ) -> ClusterConfig {
        ClusterConfig {
            target,
            protocol: Wire::Flare,
            servants,
            delegates,
            environments: 8,
            servant: ServantBehaviour::stock(servant_token),
            delegate: DelegateBehaviour::new(user_token, workload),
            servant_capacity: None,
            seed: None,
            acceptable_compression: DAEMON_ACCEPTABLE_COMPRESSION,
        }
    }

    /// The demo: 30 servants and 12 developers building now and then, so the
    /// dashboard shows load coming and going, and queues when builds overlap.
    pub fn demo(target: SocketAddr, user_token: &str, servant_token: &str) -> ClusterConfig {
        let mut config = ClusterConfig::new(
            target,
            user_token,
            servant_token,
            30,
            12,
            Workload::Builds {
                idle: Duration::from_secs(2)..=Duration::from_secs(20),
                files: 40..=400,
                parallelism: 8..=64,
            },
        );
        config.delegate.task_duration = Duration::from_millis(800)..=Duration::from_secs(8);
        config
    }
}

/// A running simulated cluster.
#[derive(Debug)]
pub struct Cluster {
    daemons: Arc<Daemons>,
    /// The shards' tasks and the one starting the delegates.
    tasks: Vec<AbortHandle>,
    delegates_started: Arc<AtomicBool>,
    servants: Vec<ServantSpec>,
    addressing: Addressing,
}

/// Shapes of servants: processors, and whether dedicated.
fn servant_spec(
    rng: &mut SmallRng,
    ip: Option<IpAddr>,
    location: SocketAddr,
    environments: usize,
) -> ServantSpec {
    let num_processors = *[8u32, 12, 16, 24, 32, 48, 64].choose(rng).unwrap_or(&16);
    let dedicated = rng.random_bool(1.0 / 3.0);
    let capacity = if dedicated {
        num_processors * 95 / 100
    } else {
        num_processors * 40 / 100
    }
    .max(1);
    let mut envs = vec![environment_digest(0), environment_digest(1)];
    let others: Vec<usize> = (2..environments.max(5)).collect();
    envs.extend(
        others
            .choose_multiple(rng, 3)
            .map(|&index| environment_digest(index)),
    );
    let base_load = if dedicated {
        rng.random_range(0..=1)
    } else {
        rng.random_range(0..=num_processors / 4)
    };
    ServantSpec {
        ip: ip.unwrap_or(location.ip()),
        port: location.port(),
        num_processors,
        capacity,
        dedicated,
        environments: envs,
        total_memory: u64::from(num_processors.max(8)) * (4 << 30),
        base_load,
    }
}

/// A delegate compiles with one or two compilers, mostly the common ones,
/// always ones some servant offers.
fn delegate_environments(rng: &mut SmallRng, offered: &[String]) -> Vec<String> {
    let common = [environment_digest(0), environment_digest(1)];
    let count = rng.random_range(1..=2);
    let mut chosen: Vec<String> = Vec::new();
    while chosen.len() < count {
        let pick = if rng.random_bool(0.7) {
            common.choose(rng).cloned()
        } else {
            offered.choose(rng).cloned()
        };
        if let Some(pick) = pick
            && !chosen.contains(&pick)
        {
            chosen.push(pick);
        }
    }
    chosen
}

/// Shards of the cluster's timers: one per core (each shard's task fires
/// its machines' due calls in one wake).
fn shard_count(machines: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    cores.clamp(1, 8).min(machines.max(1))
}

impl Cluster {
    /// Starts the servant roles now (first heartbeats spread over at most a
    /// second) and the delegate roles once every servant has registered (or
    /// after a few seconds). Must run inside a tokio runtime; returns at once.
    pub fn start(config: ClusterConfig) -> Cluster {
        let mut rng = match config.seed {
            Some(seed) => SmallRng::seed_from_u64(seed),
            None => SmallRng::from_rng(&mut rand::rng()),
        };
        let addressing = Addressing::detect(config.target);
        let stats = Arc::new(Stats::default());
        let count = config.servants.max(config.delegates);
        let shards: Vec<Arc<Shard>> = (0..shard_count(count)).map(|_| Arc::default()).collect();
        let requests = Arc::new(FlareRequests::new(config.acceptable_compression));
        let locations: Vec<(Option<IpAddr>, SocketAddr)> = (0..count)
            .map(|index| addressing.machine(octet::MACHINES, index, config.target))
            .collect();
        let servants: Vec<ServantSpec> = locations[..config.servants]
            .iter()
            .map(|(ip, location)| {
                let mut spec = servant_spec(&mut rng, *ip, *location, config.environments);
                if let Some(capacity) = config.servant_capacity {
                    spec.capacity = capacity;
                }
                spec
            })
            .collect();
        let registry = Registry::new(servants.iter().map(ServantSpec::location));
        let mut offered: Vec<String> = servants
            .iter()
            .flat_map(|spec| spec.environments.iter().cloned())
            .collect();
        offered.sort_unstable();
        offered.dedup();

        // Real servants are not in step: spread heartbeats over the interval
        // (10 ms apart for small clusters, so they register quickly).
        let interval = config.servant.heartbeat_interval;
        let ramp = (Duration::from_millis(10) * config.servants as u32).min(interval);
        let start = Instant::now();
        let machines: Vec<Daemon> = locations
            .iter()
            .enumerate()
            .map(|(index, (ip, _))| {
                let shard = Daemons::shard_of(&shards, index).clone();
                let deadlines: Deadlines = Arc::new(move |expiry: client::Expiry| {
                    shard.at(expiry.at, Event::Expire(expiry))
                });
                let endpoint = Endpoint::with_parts(
                    config.target,
                    *ip,
                    config.protocol,
                    stats.clone(),
                    DAEMON_MAX_CONNECTIONS,
                    requests.clone(),
                    deadlines,
                );
                let servant = servants.get(index).map(|spec| {
                    let share = index as f64 / config.servants.max(1) as f64;
                    Servant::new(spec.clone(), &config.servant, start + ramp.mul_f64(share))
                });
                let delegate = (index < config.delegates)
                    .then(|| Delegate::new(delegate_environments(&mut rng, &offered)));
                Daemon {
                    endpoint,
                    servant,
                    delegate,
                }
            })
            .collect();
        let daemons = Arc::new(Daemons::new(
            machines,
            registry,
            stats,
            shards.clone(),
            config.servant.clone(),
            config.delegate.clone(),
        ));
        for machine in 0..daemons.machines.len() {
            daemons.start_servant(machine);
        }
        let mut tasks: Vec<AbortHandle> = shards
            .iter()
            .map(|shard| {
                let (shard, daemons) = (shard.clone(), daemons.clone());
                tokio::spawn(async move { shard.run(|event| daemons.fire(event)).await })
                    .abort_handle()
            })
            .collect();
        let delegates_started = Arc::new(AtomicBool::new(false));
        let launch = launch_delegates(
            daemons.clone(),
            config.servants,
            ramp,
            delegates_started.clone(),
        );
        tasks.push(tokio::spawn(launch).abort_handle());
        Cluster {
            daemons,
            tasks,
            delegates_started,
            servants,
            addressing,
        }
    }

    /// Live connections of every machine now.
    pub fn connections(&self) -> usize {
        let machines = &self.daemons.machines;
        machines
            .iter()
            .map(|daemon| daemon.endpoint.connections())
            .sum()
    }

    /// Simulated machines (daemons).
    pub fn machines(&self) -> usize {
        self.daemons.machines.len()
    }

    /// What was measured so far.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.daemons.stats
    }

    /// The simulated servants.
    pub fn servants(&self) -> &[ServantSpec] {
        &self.servants
    }

    /// How machines got distinct identities.
    pub fn addressing(&self) -> Addressing {
        self.addressing
    }

    /// Tasks running on simulated servants now.
    pub fn running_tasks(&self) -> usize {
        self.daemons.registry.running()
    }

    /// True once the delegates were started.
    pub fn delegates_started(&self) -> bool {
        self.delegates_started.load(Relaxed)
    }

    /// Waits until the delegates have started, at most `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.delegates_started() {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    /// Stops every machine: delegates free their grants, servants send a last
    /// heartbeat with `next_heartbeat_in_ms = 0`. Waits at most 7 s: 5 for
    /// long polls and frees to end, 2 for the goodbyes.
    pub async fn stop(self) {
        self.daemons.stop(Duration::from_secs(5)).await;
        // Dropping `self` ends the timers and closes the connections.
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.daemons.close();
    }
}

/// Starts the delegates once every servant is known (or after a while
/// anyway), so they do not ask for environments nobody offers yet.
async fn launch_delegates(
    daemons: Arc<Daemons>,
    servants: usize,
    ramp: Duration,
    started: Arc<AtomicBool>,
) {
    let deadline = Instant::now() + ramp + Duration::from_secs(5);
    let registered = || daemons.stats.events.servants_registered.load(Relaxed) as usize;
    while registered() < servants && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if daemons.is_stopping() {
        return;
    }
    for machine in 0..daemons.machines.len() {
        daemons.start_delegate(machine);
    }
    started.store(true, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_get_distinct_loopback_addresses() {
        assert_eq!(machine_ip(1, 0).to_string(), "127.1.0.1");
        assert_eq!(machine_ip(1, 249).to_string(), "127.1.0.250");
        assert_eq!(machine_ip(1, 250).to_string(), "127.1.1.1");
        assert_eq!(machine_ip(1, 9999).to_string(), "127.1.39.250");
        let target: SocketAddr = "[::1]:8336".parse().unwrap();
        let (ip, a) = Addressing::SharedAddress.machine(1, 0, target);
        let (_, b) = Addressing::SharedAddress.machine(1, 1, target);
        assert_eq!(ip, None);
        assert_ne!(a, b);
        assert_eq!(a.ip(), target.ip());
    }

    #[test]
    fn servants_offer_five_environments_and_delegates_use_offered_ones() {
        let mut rng = SmallRng::seed_from_u64(7);
        let location: SocketAddr = "127.1.0.1:8335".parse().unwrap();
        let spec = servant_spec(&mut rng, None, location, 8);
        assert_eq!(spec.environments.len(), 5);
        assert!(spec.capacity >= 1 && spec.capacity <= spec.num_processors);
        let offered = spec.environments.clone();
        for _ in 0..50 {
            let chosen = delegate_environments(&mut rng, &offered);
            assert!(!chosen.is_empty());
            assert!(chosen.iter().all(|digest| offered.contains(digest)));
        }
        assert_eq!(environment_digest(0).len(), 64);
    }

    #[test]
    fn unspecified_listen_addresses_are_reached_on_loopback() {
        assert_eq!(
            connect_address("0.0.0.0:8336".parse().unwrap()).to_string(),
            "127.0.0.1:8336"
        );
        assert_eq!(
            connect_address("127.0.0.1:9".parse().unwrap()).to_string(),
            "127.0.0.1:9"
        );
    }
}
