//! What a simulated daemon's role does besides changing its own state: set
//! its timers, start, finish and kill tasks on servants, count events, and
//! ask for calls. The roles (`servant`, `delegate`, `jobs`) decide under
//! their lock; `daemons` sends the [`Request`]s once the lock is released,
//! so a call's continuation, which may run at once, never finds it held.

use bytes::Bytes;
use tokio::time::Instant;

use super::{
    registry::Registry,
    shard::{Event, Shard},
    stats::Events,
};

/// A call a role asks for.
#[derive(Debug)]
pub(crate) enum Request {
    /// The servant's heartbeat, encoded.
    Heartbeat(Bytes),
    /// The lane's `WaitForStartingTask`, for `immediate` waiting jobs.
    Ask {
        lane: usize,
        immediate: u32,
    },
    /// `KeepTaskAlive` of these grants.
    Renew(Vec<u64>),
    Free(Vec<u64>),
    GetConfig,
    ListTasks,
}

/// One machine's view of the world while its role changes state.
pub(crate) struct Effects<'a> {
    /// The machine (its index in the cluster).
    pub(crate) machine: usize,
    pub(crate) now: Instant,
    /// The cluster is stopping: no new work.
    pub(crate) stopping: bool,
    pub(crate) registry: &'a Registry,
    pub(crate) events: &'a Events,
    timers: &'a Shard,
    requests: Vec<Request>,
}

impl<'a> Effects<'a> {
    pub(crate) fn new(
        machine: usize,
        stopping: bool,
        registry: &'a Registry,
        events: &'a Events,
        timers: &'a Shard,
    ) -> Effects<'a> {
        Effects {
            machine,
            now: Instant::now(),
            stopping,
            registry,
            events,
            timers,
            requests: Vec::new(),
        }
    }

    /// `event` of this machine falls due at `at`.
    pub(crate) fn after(&self, at: Instant, event: Event) {
        self.timers.at(at, event);
    }

    pub(crate) fn request(&mut self, request: Request) {
        self.requests.push(request);
    }

    /// The calls asked for, to send now.
    pub(crate) fn into_requests(self) -> Vec<Request> {
        self.requests
    }
}
