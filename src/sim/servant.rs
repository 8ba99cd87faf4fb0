//! Simulated compile servants, and the in-process registry through which
//! simulated delegates start tasks on them.
//!
//! A servant heartbeats every second (`next_heartbeat_in_ms = 10000`) with its
//! environments, processors, load (a drifting base load plus the tasks it
//! runs), memory, priority and the tasks delegates started on it. It kills
//! every task whose grant id comes back in `expired_tasks`, and says goodbye
//! with `next_heartbeat_in_ms = 0` when the simulation stops.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, PoisonError, atomic::Ordering::Relaxed},
    time::Duration,
};

use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::{
    sync::{oneshot, watch},
    time::Instant,
};

use super::client::Endpoint;
use crate::pb::{self, Method};

/// Version the simulated daemons report.
pub const DAEMON_VERSION: u32 = 1;

/// One simulated compile server.
#[derive(Debug, Clone)]
pub struct ServantSpec {
    /// Address it connects from; `location` reports it with `port`.
    pub ip: IpAddr,
    pub port: u16,
    pub num_processors: u32,
    /// Tasks it is willing to run (`capacity`).
    pub capacity: u32,
    pub dedicated: bool,
    /// Compiler digests it offers.
    pub environments: Vec<String>,
    pub total_memory: u64,
    /// Load from the machine's own work, before any compile task.
    pub base_load: u32,
}

impl ServantSpec {
    /// What it reports as `location` and what the scheduler hands out in grants.
    pub fn location(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

/// A task a delegate started on a servant.
#[derive(Debug)]
struct Task {
    servant_task_id: u64,
    task_digest: String,
    kill: Option<oneshot::Sender<()>>,
}

#[derive(Debug, Default)]
struct Slot {
    next_task_id: u64,
    /// By grant id.
    tasks: HashMap<u64, Task>,
}

/// Which tasks run where: delegates start and finish tasks here, servants
/// report them in their heartbeats and kill the expired ones. Keyed by the
/// servant's location; fixed at start, so lookups need no global lock.
#[derive(Debug, Default)]
pub struct Registry {
    slots: HashMap<SocketAddr, Mutex<Slot>>,
}

impl Registry {
    pub fn new(locations: impl IntoIterator<Item = SocketAddr>) -> Registry {
        Registry {
            slots: locations
                .into_iter()
                .map(|location| (location, Mutex::default()))
                .collect(),
        }
    }

    fn slot(&self, location: &SocketAddr) -> Option<std::sync::MutexGuard<'_, Slot>> {
        self.slots
            .get(location)
            .map(|slot| slot.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Starts a task on the servant at `location` (a grant's
    /// `servant_location`). The receiver fires if the servant kills it.
    /// `None` if no simulated servant has that location.
    pub fn start(
        &self,
        location: &str,
        grant_id: u64,
        task_digest: String,
    ) -> Option<oneshot::Receiver<()>> {
        let location = location.parse::<SocketAddr>().ok()?;
        let mut slot = self.slot(&location)?;
        let (kill, killed) = oneshot::channel();
        slot.next_task_id += 1;
        let servant_task_id = slot.next_task_id;
        slot.tasks.insert(
            grant_id,
            Task {
                servant_task_id,
                task_digest,
                kill: Some(kill),
            },
        );
        Some(killed)
    }

    /// The task finished: the servant stops reporting it.
    pub fn finish(&self, location: &str, grant_id: u64) {
        if let Ok(location) = location.parse::<SocketAddr>()
            && let Some(mut slot) = self.slot(&location)
        {
            slot.tasks.remove(&grant_id);
        }
    }

    /// The servant's running tasks, as its heartbeat lists them.
    fn report(&self, location: &SocketAddr) -> Vec<pb::RunningTask> {
        self.slot(location)
            .map(|slot| {
                slot.tasks
                    .iter()
                    .map(|(grant_id, task)| pb::RunningTask {
                        servant_task_id: task.servant_task_id,
                        task_grant_id: *grant_id,
                        servant_location: String::new(),
                        task_digest: task.task_digest.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Kills the listed tasks; returns how many were running.
    fn kill(&self, location: &SocketAddr, grant_ids: &[u64]) -> u64 {
        let Some(mut slot) = self.slot(location) else {
            return 0;
        };
        let mut killed = 0;
        for grant_id in grant_ids {
            if let Some(mut task) = slot.tasks.remove(grant_id) {
                killed += 1;
                if let Some(kill) = task.kill.take() {
                    let _ = kill.send(());
                }
            }
        }
        killed
    }

    /// Tasks running on every servant.
    pub fn running(&self) -> usize {
        self.slots
            .values()
            .map(|slot| {
                slot.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .tasks
                    .len()
            })
            .sum()
    }
}

/// How servants behave. Its `Debug` redacts the token.
#[derive(Clone)]
pub struct ServantBehaviour {
    pub token: String,
    /// Between heartbeats (1 s, as the daemon).
    pub heartbeat_interval: Duration,
    /// `next_heartbeat_in_ms` (10000, as the daemon).
    pub next_heartbeat_in_ms: u32,
    /// Send `next_heartbeat_in_ms = 0` when stopping.
    pub leave_on_stop: bool,
}

impl std::fmt::Debug for ServantBehaviour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServantBehaviour")
            .field("token", &format_args!("<redacted>"))
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("next_heartbeat_in_ms", &self.next_heartbeat_in_ms)
            .field("leave_on_stop", &self.leave_on_stop)
            .finish()
    }
}

/// Memory a running compilation takes, for the reported available memory.
const MEMORY_PER_TASK: u64 = 1 << 30;

/// Runs one servant until `stop` turns true. The first heartbeat goes out at
/// `first_at` (spread out so thousands of servants do not connect at once).
pub async fn run(
    spec: ServantSpec,
    behaviour: Arc<ServantBehaviour>,
    endpoint: Arc<Endpoint>,
    registry: Arc<Registry>,
    first_at: Instant,
    mut stop: watch::Receiver<bool>,
) {
    let location = spec.location();
    let location_text = location.to_string();
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    let mut base_load = spec.base_load;
    let mut next = first_at;
    let mut registered = false;
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => break,
            () = tokio::time::sleep_until(next) => {}
        }
        let now = Instant::now();
        next += behaviour.heartbeat_interval;
        if next < now {
            // Fell behind (an overloaded machine): skip, do not burst.
            next = now + behaviour.heartbeat_interval;
        }
        // The machine's own load drifts a little each second.
        let drift: i64 = rng.random_range(-1..=1);
        base_load =
            (i64::from(base_load) + drift).clamp(0, i64::from(spec.num_processors / 2)) as u32;
        let request = heartbeat_request(
            &spec,
            &behaviour,
            &location_text,
            base_load,
            registry.report(&location),
            behaviour.next_heartbeat_in_ms,
        );
        let reply = tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => break,
            reply = endpoint.call::<_, pb::HeartbeatResponse>(Method::Heartbeat, &request) => reply,
        };
        if let Ok(reply) = reply {
            if !registered {
                registered = true;
                endpoint
                    .stats()
                    .events
                    .servants_registered
                    .fetch_add(1, Relaxed);
            }
            if !reply.expired_tasks.is_empty() {
                let killed = registry.kill(&location, &reply.expired_tasks);
                endpoint
                    .stats()
                    .events
                    .tasks_killed
                    .fetch_add(killed, Relaxed);
            }
        }
    }
    if behaviour.leave_on_stop && registered {
        let request =
            heartbeat_request(&spec, &behaviour, &location_text, base_load, Vec::new(), 0);
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            endpoint.call::<_, pb::HeartbeatResponse>(Method::Heartbeat, &request),
        )
        .await;
    }
}

/// The heartbeat a servant sends.
pub fn heartbeat_request(
    spec: &ServantSpec,
    behaviour: &ServantBehaviour,
    location: &str,
    base_load: u32,
    running_tasks: Vec<pb::RunningTask>,
    next_heartbeat_in_ms: u32,
) -> pb::HeartbeatRequest {
    let running = running_tasks.len() as u64;
    let used_memory = (spec.total_memory / 8) + running * MEMORY_PER_TASK;
    pb::HeartbeatRequest {
        token: behaviour.token.clone(),
        next_heartbeat_in_ms,
        version: DAEMON_VERSION,
        location: location.to_owned(),
        num_processors: spec.num_processors,
        current_load: base_load + running_tasks.len() as u32,
        servant_priority: if spec.dedicated {
            pb::ServantPriority::Dedicated
        } else {
            pb::ServantPriority::User
        } as i32,
        not_accepting_task_reason: 0,
        capacity: spec.capacity,
        total_memory_in_bytes: spec.total_memory,
        memory_available_in_bytes: spec.total_memory.saturating_sub(used_memory),
        env_descs: spec
            .environments
            .iter()
            .map(|digest| pb::EnvironmentDesc {
                compiler_digest: digest.clone(),
            })
            .collect(),
        running_tasks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_reports_and_kills_tasks() {
        let location: SocketAddr = "127.1.0.1:8335".parse().unwrap();
        let registry = Registry::new([location]);
        let mut killed = registry.start("127.1.0.1:8335", 7, "d".into()).unwrap();
        registry.start("127.1.0.1:8335", 8, "e".into()).unwrap();
        assert!(registry.start("127.9.9.9:8335", 9, "f".into()).is_none());
        assert_eq!(registry.report(&location).len(), 2);
        assert_eq!(registry.kill(&location, &[7, 99]), 1);
        assert!(killed.try_recv().is_ok());
        registry.finish("127.1.0.1:8335", 8);
        assert_eq!(registry.running(), 0);
    }

    #[test]
    fn behaviour_debug_redacts_the_token() {
        let servant = ServantBehaviour {
            token: "servant-secret".into(),
            heartbeat_interval: Duration::from_secs(1),
            next_heartbeat_in_ms: 10_000,
            leave_on_stop: true,
        };
        let printed = format!("{servant:?}");
        assert!(!printed.contains("-secret"), "{printed}");
        assert!(printed.contains("token: <redacted>"), "{printed}");
    }
}
