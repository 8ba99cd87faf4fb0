//! The servant role of a simulated daemon.
//!
//! A servant heartbeats every second (`next_heartbeat_in_ms = 10000`) with its
//! environments, processors, load (a drifting base load plus the tasks it
//! runs), memory, priority and the tasks delegates started on it (the
//! [`Registry`](super::Registry)). It kills every task whose grant id comes back in
//! `expired_tasks`, and says goodbye with `next_heartbeat_in_ms = 0` when the
//! simulation stops. A heartbeat still unanswered when the next falls due
//! makes the servant skip that beat, as a daemon whose heartbeat call blocks.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Mutex, atomic::Ordering::Relaxed},
};

use bytes::{BufMut, Bytes, BytesMut};
use prost::{
    Message,
    encoding::{WireType, encode_key, encode_varint, encoded_len_varint},
};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use tokio::time::Instant;

pub use super::behaviour::ServantBehaviour;
use super::{
    client::lock,
    effects::{Effects, Request},
    registry::Task,
    shard::Event,
    stats::TaskKill,
};
use yadcc_pb as pb;

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

/// Memory a running compilation takes, for the reported available memory.
const MEMORY_PER_TASK: u64 = 1 << 30;

/// Memory the servant reports available with `running` compilations.
fn memory_available(spec: &ServantSpec, running: u64) -> u64 {
    let used = (spec.total_memory / 8) + running * MEMORY_PER_TASK;
    spec.total_memory.saturating_sub(used)
}

/// The heartbeat a servant sends (as a message; the simulated cluster
/// encodes the same bytes with a [`HeartbeatEncoder`]).
pub fn heartbeat_request(
    spec: &ServantSpec,
    behaviour: &ServantBehaviour,
    location: &str,
    base_load: u32,
    running_tasks: Vec<pb::RunningTask>,
    next_heartbeat_in_ms: u32,
) -> pb::HeartbeatRequest {
    let running = running_tasks.len() as u64;
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
        memory_available_in_bytes: memory_available(spec, running),
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

/// `HeartbeatRequest` field numbers of what changes from one heartbeat to
/// the next.
const CURRENT_LOAD: u32 = 4;
const NEXT_HEARTBEAT_IN_MS: u32 = 7;
const MEMORY_AVAILABLE: u32 = 16;
const RUNNING_TASKS: u32 = 17;
/// `RunningTask` field numbers.
const SERVANT_TASK_ID: u32 = 1;
const TASK_GRANT_ID: u32 = 2;
const TASK_DIGEST: u32 = 7;

/// One servant's heartbeats, byte for byte what prost encodes for
/// [`heartbeat_request`] (fields in number order, zeros left out), with
/// everything that never changes encoded once: per beat only the load, the
/// available memory and the running tasks are written.
#[derive(Debug, Clone)]
pub struct HeartbeatEncoder {
    /// Fields 1-3 (location, capacity).
    head: Vec<u8>,
    /// Field 6 (environments).
    environments: Vec<u8>,
    /// Fields 10-15 (processors, version, token, priority, total memory).
    tail: Vec<u8>,
    spec: ServantSpec,
}

impl HeartbeatEncoder {
    pub fn new(spec: &ServantSpec, behaviour: &ServantBehaviour, location: &str) -> Self {
        let whole = heartbeat_request(spec, behaviour, location, 0, Vec::new(), 0);
        let only = |pick: &dyn Fn(&mut pb::HeartbeatRequest, &pb::HeartbeatRequest)| {
            let mut part = pb::HeartbeatRequest::default();
            pick(&mut part, &whole);
            part.encode_to_vec()
        };
        HeartbeatEncoder {
            head: only(&|part, whole| {
                part.location.clone_from(&whole.location);
                part.capacity = whole.capacity;
            }),
            environments: only(&|part, whole| part.env_descs.clone_from(&whole.env_descs)),
            tail: only(&|part, whole| {
                part.num_processors = whole.num_processors;
                part.version = whole.version;
                part.not_accepting_task_reason = whole.not_accepting_task_reason;
                part.token.clone_from(&whole.token);
                part.servant_priority = whole.servant_priority;
                part.total_memory_in_bytes = whole.total_memory_in_bytes;
            }),
            spec: spec.clone(),
        }
    }

    /// The heartbeat with `base_load`, `next_heartbeat_in_ms` and `tasks`
    /// (by grant id).
    pub fn encode(
        &self,
        base_load: u32,
        next_heartbeat_in_ms: u32,
        tasks: &HashMap<u64, Task>,
    ) -> Bytes {
        let task_len = |grant: u64, task: &Task| {
            let varint = |value: u64| {
                if value == 0 {
                    0
                } else {
                    1 + encoded_len_varint(value)
                }
            };
            varint(task.servant_task_id) + varint(grant) + 2 + task.digest.len()
        };
        let tasks_len: usize = tasks
            .iter()
            .map(|(grant, task)| {
                let len = task_len(*grant, task);
                2 + encoded_len_varint(len as u64) + len
            })
            .sum();
        let mut out = BytesMut::with_capacity(
            self.head.len() + self.environments.len() + self.tail.len() + 32 + tasks_len,
        );
        let varint_field = |out: &mut BytesMut, tag: u32, value: u64| {
            if value != 0 {
                encode_key(tag, WireType::Varint, out);
                encode_varint(value, out);
            }
        };
        out.put_slice(&self.head);
        let running = tasks.len() as u64;
        varint_field(&mut out, CURRENT_LOAD, u64::from(base_load) + running);
        out.put_slice(&self.environments);
        varint_field(&mut out, NEXT_HEARTBEAT_IN_MS, next_heartbeat_in_ms.into());
        out.put_slice(&self.tail);
        varint_field(
            &mut out,
            MEMORY_AVAILABLE,
            memory_available(&self.spec, running),
        );
        for (grant, task) in tasks {
            encode_key(RUNNING_TASKS, WireType::LengthDelimited, &mut out);
            encode_varint(task_len(*grant, task) as u64, &mut out);
            varint_field(&mut out, SERVANT_TASK_ID, task.servant_task_id);
            varint_field(&mut out, TASK_GRANT_ID, *grant);
            encode_key(TASK_DIGEST, WireType::LengthDelimited, &mut out);
            encode_varint(task.digest.len() as u64, &mut out);
            out.put_slice(&task.digest);
        }
        out.freeze()
    }
}

/// The servant role of one machine.
#[derive(Debug)]
pub(crate) struct Servant {
    pub(crate) spec: ServantSpec,
    heartbeat: HeartbeatEncoder,
    state: Mutex<ServantState>,
}

#[derive(Debug)]
struct ServantState {
    base_load: u32,
    registered: bool,
    /// A heartbeat is out and unanswered.
    beating: bool,
    /// When the next heartbeat falls due.
    next: Instant,
    rng: SmallRng,
}

impl Servant {
    /// A servant whose first heartbeat goes out at `first_at`.
    pub(crate) fn new(spec: ServantSpec, behaviour: &ServantBehaviour, first_at: Instant) -> Self {
        let heartbeat = HeartbeatEncoder::new(&spec, behaviour, &spec.location().to_string());
        Servant {
            state: Mutex::new(ServantState {
                base_load: spec.base_load,
                registered: false,
                beating: false,
                next: first_at,
                rng: SmallRng::from_rng(&mut rand::rng()),
            }),
            heartbeat,
            spec,
        }
    }

    pub(crate) fn first_heartbeat_at(&self) -> Instant {
        lock(&self.state).next
    }

    pub(crate) fn registered(&self) -> bool {
        lock(&self.state).registered
    }

    /// The goodbye: no task, next heartbeat in 0 ms.
    pub(crate) fn leave_request(&self) -> Bytes {
        let base_load = lock(&self.state).base_load;
        self.heartbeat.encode(base_load, 0, &HashMap::new())
    }
}

impl Servant {
    /// Its heartbeat fell due: the next one is set, and this one sent unless
    /// the last is still unanswered.
    pub(crate) fn beat(&self, behaviour: &ServantBehaviour, fx: &mut Effects<'_>) {
        let interval = behaviour.heartbeat_interval;
        let mut state = lock(&self.state);
        state.next += interval;
        if state.next < fx.now {
            // Fell behind (an overloaded machine): skip, do not burst.
            state.next = fx.now + interval;
        }
        fx.after(state.next, Event::Heartbeat(fx.machine));
        if state.beating {
            return;
        }
        state.beating = true;
        // The machine's own load drifts a little each second.
        let drift: i64 = state.rng.random_range(-1..=1);
        let ceiling = i64::from(self.spec.num_processors / 2);
        state.base_load = (i64::from(state.base_load) + drift).clamp(0, ceiling) as u32;
        let base_load = state.base_load;
        let next_in = behaviour.next_heartbeat_in_ms;
        let payload = fx.registry.with_tasks(fx.machine, |tasks| {
            self.heartbeat.encode(base_load, next_in, tasks)
        });
        fx.request(Request::Heartbeat(payload));
    }

    /// Its heartbeat was answered (with the grants whose tasks must die) or
    /// failed. Kills those tasks; returns each one's grant and owner.
    pub(crate) fn answered(
        &self,
        expired: Option<&[u64]>,
        fx: &mut Effects<'_>,
    ) -> Vec<(u64, usize)> {
        let registered_now = {
            let mut state = lock(&self.state);
            state.beating = false;
            let first = expired.is_some() && !state.registered;
            state.registered |= expired.is_some();
            first
        };
        if registered_now {
            fx.events.servants_registered.fetch_add(1, Relaxed);
        }
        let Some(expired) = expired.filter(|expired| !expired.is_empty()) else {
            return Vec::new();
        };
        let killed = fx.registry.kill(fx.machine, expired);
        let (servant, now) = (fx.machine, fx.now);
        fx.events
            .record_kills(killed.iter().map(|(grant, task)| TaskKill {
                grant: *grant,
                servant,
                started: task.started,
                killed: now,
            }));
        killed
            .into_iter()
            .map(|(grant, task)| (grant, task.owner))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ServantSpec {
        ServantSpec {
            ip: "127.1.0.7".parse().unwrap(),
            port: 8335,
            num_processors: 16,
            capacity: 6,
            dedicated: false,
            environments: vec!["a".repeat(64), "b".repeat(64)],
            total_memory: 64 << 30,
            base_load: 3,
        }
    }

    fn behaviour() -> ServantBehaviour {
        ServantBehaviour::stock("servant-secret")
    }

    /// What is encoded once and what per beat together are prost's bytes.
    #[test]
    fn encoded_heartbeats_are_prost_s_byte_for_byte() {
        let spec = spec();
        let behaviour = behaviour();
        let location = spec.location().to_string();
        let encoder = HeartbeatEncoder::new(&spec, &behaviour, &location);
        let tasks: HashMap<u64, Task> = [(7, 1), (u64::MAX, 300), (1 << 40, 0)]
            .into_iter()
            .map(|(grant, servant_task_id)| {
                let digest = [b'0' + (grant % 10) as u8; 32];
                let owner = 2;
                (
                    grant,
                    Task {
                        servant_task_id,
                        digest,
                        owner,
                        started: Instant::now(),
                    },
                )
            })
            .collect();
        for (base_load, next, tasks) in [(2, 10_000, tasks.clone()), (0, 0, HashMap::new())] {
            let fast = encoder.encode(base_load, next, &tasks);
            let listed = tasks
                .iter()
                .map(|(grant, task)| pb::RunningTask {
                    servant_task_id: task.servant_task_id,
                    task_grant_id: *grant,
                    servant_location: String::new(),
                    task_digest: String::from_utf8(task.digest.to_vec()).unwrap(),
                })
                .collect();
            let slow = heartbeat_request(&spec, &behaviour, &location, base_load, listed, next);
            assert_eq!(fast, slow.encode_to_vec(), "load {base_load}, next {next}");
        }
    }
}
