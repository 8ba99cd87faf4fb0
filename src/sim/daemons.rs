//! Every simulated daemon of a cluster and what they share: the machines
//! (each with its [`Endpoint`], servant role and delegate role), the
//! [`Registry`] of running tasks, the [`Stats`], the shards' timers, and the
//! check of the task lists the scheduler sends.
//!
//! Nothing here has a task per machine or per call: the shards' tasks fire
//! what falls due ([`Daemons::fire`]), and each answer's continuation runs on
//! the connection's reader. Handlers change a role's state under its lock
//! and send calls only once the lock is released (a send may run a
//! continuation at once, which takes that lock again).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::Bytes;
use prost::Message;
use tokio::time::Instant;

use super::{
    client::{CallError, Endpoint, Reply, lock, settle},
    delegate::{Delegate, DelegateBehaviour},
    registry::Registry,
    servant::{Servant, ServantBehaviour},
    shard::{Event, Shard},
    stats::Stats,
    wire::Compression,
};
use crate::pb::{self, Method};

/// One simulated machine: a daemon, servant or delegate or both, all its
/// calls on one endpoint.
#[derive(Debug)]
pub(crate) struct Daemon {
    pub(crate) endpoint: Endpoint,
    pub(crate) servant: Option<Servant>,
    pub(crate) delegate: Option<Delegate>,
}

/// Everything the simulated daemons share.
#[derive(Debug)]
pub(crate) struct Daemons {
    pub(crate) machines: Vec<Daemon>,
    pub(crate) registry: Registry,
    pub(crate) stats: Arc<Stats>,
    pub(crate) shards: Vec<Arc<Shard>>,
    pub(crate) servant_behaviour: ServantBehaviour,
    pub(crate) delegate_behaviour: DelegateBehaviour,
    pub(crate) task_lists: TaskLists,
    /// Every delegate's `GetConfig`, encoded once.
    pub(crate) config_request: Bytes,
    stopping: AtomicBool,
    /// `WaitForStartingTask` calls out, and `FreeTask` calls out: a
    /// stopping cluster waits for both, so no grant is left behind.
    pub(crate) long_polls: AtomicUsize,
    pub(crate) frees: AtomicUsize,
}

impl Daemons {
    pub(crate) fn new(
        machines: Vec<Daemon>,
        registry: Registry,
        stats: Arc<Stats>,
        shards: Vec<Arc<Shard>>,
        servant_behaviour: ServantBehaviour,
        delegate_behaviour: DelegateBehaviour,
    ) -> Daemons {
        let config_request = pb::GetConfigRequest {
            token: delegate_behaviour.token.clone(),
        };
        Daemons {
            machines,
            registry,
            stats,
            shards,
            servant_behaviour,
            delegate_behaviour,
            task_lists: TaskLists::default(),
            config_request: Bytes::from(config_request.encode_to_vec()),
            stopping: AtomicBool::new(false),
            long_polls: AtomicUsize::new(0),
            frees: AtomicUsize::new(0),
        }
    }

    /// The shard whose timers serve machine `machine`.
    pub(crate) fn shard_of(shards: &[Arc<Shard>], machine: usize) -> &Arc<Shard> {
        &shards[machine % shards.len()]
    }

    /// `event` of machine `machine` falls due at `at`.
    pub(crate) fn after(&self, machine: usize, at: Instant, event: Event) {
        Daemons::shard_of(&self.shards, machine).at(at, event);
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Relaxed)
    }

    /// Runs what fell due. Once stopping, only call deadlines still fire.
    pub(crate) fn fire(self: &Arc<Self>, event: Event) {
        if let Event::Expire(expiry) = &event {
            expiry.fire();
            return;
        }
        if self.is_stopping() {
            return;
        }
        let now = Instant::now();
        match event {
            Event::Heartbeat(machine) => self.heartbeat(machine, now),
            Event::RunningTasks(machine) => self.list_running_tasks(machine, now),
            Event::Config(machine) => self.get_config(machine, now),
            Event::Renew(machine) => self.renew(machine, now),
            Event::Arrival(machine) => self.arrival(machine, now),
            Event::BuildStart(machine) => self.build_start(machine, now),
            Event::JobDone { machine, grant } => self.job_done(machine, grant, now),
            Event::LaneRetry { machine, lane } => self.lane_retry(machine, lane),
            Event::Expire(_) => {}
        }
    }

    /// Sends a call of machine `machine`; `then` runs with its outcome.
    pub(crate) fn send(
        self: &Arc<Self>,
        machine: usize,
        rpc: Method,
        payload: Bytes,
        then: impl FnOnce(&Arc<Daemons>, usize, Result<Reply, CallError>) + Send + 'static,
    ) {
        let daemons = self.clone();
        self.machines[machine].endpoint.send(
            rpc,
            payload,
            Box::new(move |result| then(&daemons, machine, result)),
        );
    }

    /// Stops every machine's periodic calls and workload, then, as daemons
    /// shutting down: delegates give back every grant they hold, and once no
    /// long poll or free is out (at most `limit`), so no grant is left behind
    /// and no long poll sees its environment leave, servants say goodbye.
    pub(crate) async fn stop(self: &Arc<Self>, limit: Duration) {
        self.stopping.store(true, Relaxed);
        let machines = 0..self.machines.len();
        let giving_back = machines.clone().map(|machine| self.give_back(machine));
        let quiet = async {
            futures_util::future::join_all(giving_back).await;
            while self.long_polls.load(Relaxed) > 0 || self.frees.load(Relaxed) > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let _ = tokio::time::timeout(limit, quiet).await;
        futures_util::future::join_all(machines.map(|machine| self.say_goodbye(machine))).await;
    }

    /// How long one of the last calls may take.
    const LAST_CALL: Duration = Duration::from_secs(2);

    async fn give_back(self: &Arc<Self>, machine: usize) {
        let daemon = &self.machines[machine];
        let Some(delegate) = &daemon.delegate else {
            return;
        };
        let ids = delegate.take_grants();
        if ids.is_empty() {
            return;
        }
        let request = pb::FreeTaskRequest {
            token: self.delegate_behaviour.token.clone(),
            task_grant_ids: ids,
        };
        let call = daemon
            .endpoint
            .call::<_, pb::FreeTaskResponse>(Method::FreeTask, &request);
        let _ = tokio::time::timeout(Daemons::LAST_CALL, call).await;
    }

    async fn say_goodbye(self: &Arc<Self>, machine: usize) {
        let daemon = &self.machines[machine];
        let Some(servant) = &daemon.servant else {
            return;
        };
        if !self.servant_behaviour.leave_on_stop || !servant.registered() {
            return;
        }
        let call = daemon
            .endpoint
            .call_raw(Method::Heartbeat, servant.leave_request());
        if let Ok(reply) = tokio::time::timeout(Daemons::LAST_CALL, call).await {
            let _ = settle::<pb::HeartbeatResponse>(&self.stats, Method::Heartbeat, reply);
        }
    }

    /// Closes every connection (which drops the calls' continuations, and
    /// with them their hold on the cluster).
    pub(crate) fn close(&self) {
        for daemon in &self.machines {
            daemon.endpoint.close();
        }
    }
}

/// One task list checked: what it came as, and what it held.
#[derive(Debug)]
struct CheckedList {
    message: Bytes,
    compression: Compression,
    message_bytes: usize,
    tasks: usize,
}

/// What one `GetRunningTasks` answer held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListFigures {
    /// The list's bytes inflated.
    pub(crate) message_bytes: usize,
    pub(crate) tasks: usize,
}

/// The check of the task lists: every distinct answer is inflated and
/// decoded whole once, and answers equal to the last one checked (the
/// scheduler sends every caller the same list for a while) are compared byte
/// for byte instead. A machine of the cluster pays for a list what a daemon
/// pays to receive it, not a decoding each: decoding every copy would make
/// the simulator's cost grow with the square of the cluster.
#[derive(Debug, Default)]
pub(crate) struct TaskLists {
    last: Mutex<Option<Arc<CheckedList>>>,
}

impl TaskLists {
    pub(crate) fn check(&self, reply: &Reply) -> Result<ListFigures, CallError> {
        let last = lock(&self.last).clone();
        if let Some(last) = last
            && last.compression == reply.compression
            && last.message == reply.message
        {
            return Ok(ListFigures {
                message_bytes: last.message_bytes,
                tasks: last.tasks,
            });
        }
        let inflated = reply.inflated()?;
        let list = pb::GetRunningTasksResponse::decode(inflated.as_ref())
            .map_err(|error| CallError::Decode(error.to_string()))?;
        let checked = CheckedList {
            // A copy, so the reader's buffer is not held.
            message: Bytes::copy_from_slice(&reply.message),
            compression: reply.compression,
            message_bytes: inflated.len(),
            tasks: list.running_tasks.len(),
        };
        let figures = ListFigures {
            message_bytes: checked.message_bytes,
            tasks: checked.tasks,
        };
        *lock(&self.last) = Some(Arc::new(checked));
        Ok(figures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(message: &[u8], compression: Compression) -> Reply {
        Reply {
            message: Bytes::copy_from_slice(message),
            compression,
            answer_bytes: message.len() + 24,
            latency: Duration::ZERO,
        }
    }

    /// A list is decoded when it differs from the last one checked; a broken
    /// one is an error even right after a good one of the same length.
    #[test]
    fn task_lists_are_checked_once_per_distinct_answer() {
        let list = |digest: &str| {
            pb::GetRunningTasksResponse {
                running_tasks: vec![pb::RunningTask {
                    servant_task_id: 1,
                    task_grant_id: 0,
                    servant_location: "127.1.0.1:8335".into(),
                    task_digest: digest.into(),
                }],
            }
            .encode_to_vec()
        };
        let lists = TaskLists::default();
        let first = list("aa");
        let figures = lists.check(&reply(&first, Compression::None)).unwrap();
        assert_eq!((figures.tasks, figures.message_bytes), (1, first.len()));
        let zstd = Compression::Zstd.compress(&first);
        let figures = lists.check(&reply(&zstd, Compression::Zstd)).unwrap();
        assert_eq!((figures.tasks, figures.message_bytes), (1, first.len()));
        let mut broken = first.clone();
        // The length of the only task becomes longer than the message.
        broken[1] += 1;
        assert!(lists.check(&reply(&broken, Compression::None)).is_err());
        assert!(lists.check(&reply(&first, Compression::None)).is_ok());
        let empty = lists.check(&reply(&[], Compression::None)).unwrap();
        assert_eq!(empty.tasks, 0);
    }
}
