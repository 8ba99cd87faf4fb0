//! Every simulated daemon of a cluster and what they share: the machines
//! (each with its [`Endpoint`], servant role and delegate role), the
//! [`Registry`] of running tasks, the [`Stats`], the shards' timers, and the
//! check of the task lists the scheduler sends.
//!
//! Nothing here has a task per machine or per call: the shards' tasks fire
//! what falls due ([`Daemons::fire`]), and each answer's continuation runs on
//! its connection's reader. Either way a role changes its state under its
//! lock and returns the calls it asks for ([`Effects`]); they are sent here,
//! once the lock is released (a send may run a continuation at once, which
//! takes that lock again).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::Bytes;
use prost::Message;

use super::{
    behaviour::{DelegateBehaviour, ServantBehaviour},
    client::{CallError, Endpoint, Reply, record_failure, record_reply, settle},
    delegate::Delegate,
    effects::{Effects, Request},
    jobs::LongPoll,
    registry::Registry,
    servant::{DAEMON_VERSION, Servant},
    shard::{Event, Shard},
    stats::Stats,
    task_lists::TaskLists,
};
use yadcc_pb::{self as pb, Method};

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
    shards: Vec<Arc<Shard>>,
    servant_behaviour: ServantBehaviour,
    delegate_behaviour: DelegateBehaviour,
    task_lists: TaskLists,
    /// Every delegate's `GetConfig`, encoded once.
    config_request: Bytes,
    stopping: AtomicBool,
    /// `WaitForStartingTask` calls out, and `FreeTask` calls out: a
    /// stopping cluster waits for both, so no grant is left behind.
    long_polls: AtomicUsize,
    frees: AtomicUsize,
}

/// How long each of the last calls of a stopping daemon may take.
const LAST_CALL: Duration = Duration::from_secs(2);

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

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Relaxed)
    }

    /// What machine `machine`'s role may do now.
    fn effects(&self, machine: usize) -> Effects<'_> {
        Effects::new(
            machine,
            self.is_stopping(),
            &self.registry,
            &self.stats.events,
            Daemons::shard_of(&self.shards, machine),
        )
    }

    /// Sets machine `machine`'s first heartbeat.
    pub(crate) fn start_servant(&self, machine: usize) {
        if let Some(servant) = &self.machines[machine].servant {
            let fx = self.effects(machine);
            fx.after(servant.first_heartbeat_at(), Event::Heartbeat(machine));
        }
    }

    /// Starts machine `machine`'s delegate: its periodic calls and workload.
    pub(crate) fn start_delegate(self: &Arc<Self>, machine: usize) {
        if let Some(delegate) = &self.machines[machine].delegate {
            let mut fx = self.effects(machine);
            delegate.start(&self.delegate_behaviour, &mut fx);
            self.send_requests(machine, fx.into_requests());
        }
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
        let machine = event_machine(&event);
        let daemon = &self.machines[machine];
        let mut fx = self.effects(machine);
        let delegating = &self.delegate_behaviour;
        match (event, &daemon.servant, &daemon.delegate) {
            (Event::Heartbeat(_), Some(servant), _) => {
                servant.beat(&self.servant_behaviour, &mut fx);
            }
            (Event::RunningTasks(_), _, Some(delegate)) => delegate.list_tasks(delegating, &mut fx),
            (Event::Config(_), _, Some(delegate)) => delegate.get_config(delegating, &mut fx),
            (Event::Renew(_), _, Some(delegate)) => delegate.renew(delegating, &mut fx),
            (Event::Arrival(_), _, Some(delegate)) => delegate.arrival(delegating, &mut fx),
            (Event::BuildStart(_), _, Some(delegate)) => delegate.build_start(delegating, &mut fx),
            (Event::JobDone { grant, .. }, _, Some(delegate)) => {
                delegate.job_done(grant, delegating, &mut fx);
            }
            (Event::LaneRetry { lane, .. }, _, Some(delegate)) => {
                delegate.lane_retry(lane, &mut fx);
            }
            _ => {}
        }
        self.send_requests(machine, fx.into_requests());
    }

    /// Sends the calls machine `machine`'s role asked for.
    fn send_requests(self: &Arc<Self>, machine: usize, requests: Vec<Request>) {
        for request in requests {
            match request {
                Request::Heartbeat(payload) => {
                    self.send(
                        machine,
                        Method::Heartbeat,
                        payload,
                        Daemons::heartbeat_answered,
                    );
                }
                Request::Ask { lane, immediate } => self.ask(machine, lane, immediate),
                Request::Renew(ids) => self.renew(machine, ids),
                Request::Free(ids) => self.free(machine, ids),
                Request::GetConfig => {
                    let payload = self.config_request.clone();
                    self.send(
                        machine,
                        Method::GetConfig,
                        payload,
                        |daemons, machine, result| {
                            let rpc = Method::GetConfig;
                            let _ = settle::<pb::GetConfigResponse>(&daemons.stats, rpc, result);
                            if let Some(delegate) = &daemons.machines[machine].delegate {
                                delegate.configured();
                            }
                        },
                    );
                }
                Request::ListTasks => {
                    let payload = Bytes::new();
                    let rpc = Method::GetRunningTasks;
                    self.send(machine, rpc, payload, Daemons::tasks_listed);
                }
            }
        }
    }

    /// Sends a call of machine `machine`; `then` runs with its outcome.
    fn send(
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

    fn heartbeat_answered(self: &Arc<Self>, machine: usize, result: Result<Reply, CallError>) {
        let Some(servant) = &self.machines[machine].servant else {
            return;
        };
        let reply = settle::<pb::HeartbeatResponse>(&self.stats, Method::Heartbeat, result);
        let expired = reply.as_ref().ok().map(|reply| &reply.expired_tasks[..]);
        let killed = servant.answered(expired, &mut self.effects(machine));
        for (grant, owner) in killed {
            if let Some(delegate) = &self.machines[owner].delegate {
                let mut fx = self.effects(owner);
                delegate.task_killed(grant, &self.delegate_behaviour, &mut fx);
                self.send_requests(owner, fx.into_requests());
            }
        }
    }

    /// The lane's `WaitForStartingTask`: grants for the jobs waiting now,
    /// plus a prefetch.
    fn ask(self: &Arc<Self>, machine: usize, lane: usize, immediate: u32) {
        let Some(delegate) = &self.machines[machine].delegate else {
            return;
        };
        let behaviour = &self.delegate_behaviour;
        let request = pb::WaitForStartingTaskRequest {
            token: behaviour.token.clone(),
            milliseconds_to_wait: behaviour.wait_ms,
            env_desc: Some(pb::EnvironmentDesc {
                compiler_digest: delegate.environments[lane].clone(),
            }),
            immediate_reqs: immediate,
            prefetch_reqs: behaviour.prefetch,
            next_keep_alive_in_ms: behaviour.grant_lease_ms,
            min_version: DAEMON_VERSION,
        };
        self.long_polls.fetch_add(1, Relaxed);
        let payload = Bytes::from(request.encode_to_vec());
        let rpc = Method::WaitForStartingTask;
        self.send(machine, rpc, payload, move |daemons, machine, result| {
            let reply = settle::<pb::WaitForStartingTaskResponse>(&daemons.stats, rpc, result);
            let ended = match reply {
                Ok(reply) => LongPoll::Granted(reply.grants),
                Err(error) if error.is_no_quota() => LongPoll::NoQuota,
                Err(_) => LongPoll::Failed,
            };
            if let Some(delegate) = &daemons.machines[machine].delegate {
                let mut fx = daemons.effects(machine);
                delegate.long_poll_ended(lane, ended, &mut fx);
                daemons.send_requests(machine, fx.into_requests());
            }
            // After what it asked for, so a stopping cluster sees the frees.
            daemons.long_polls.fetch_sub(1, Relaxed);
        });
    }

    fn renew(self: &Arc<Self>, machine: usize, ids: Vec<u64>) {
        let behaviour = &self.delegate_behaviour;
        let request = pb::KeepTaskAliveRequest {
            token: behaviour.token.clone(),
            task_grant_ids: ids,
            next_keep_alive_in_ms: behaviour.renew_lease_ms,
        };
        let payload = Bytes::from(request.encode_to_vec());
        let ids = request.task_grant_ids;
        let rpc = Method::KeepTaskAlive;
        self.send(machine, rpc, payload, move |daemons, machine, result| {
            let reply = settle::<pb::KeepTaskAliveResponse>(&daemons.stats, rpc, result);
            if let Some(delegate) = &daemons.machines[machine].delegate {
                let statuses = reply.as_ref().ok().map(|reply| &reply.statuses[..]);
                delegate.renewed(&ids, statuses, &daemons.effects(machine));
            }
        });
    }

    /// `FreeTask`; errors are recorded and otherwise ignored, as the daemon does.
    fn free(self: &Arc<Self>, machine: usize, ids: Vec<u64>) {
        let request = pb::FreeTaskRequest {
            token: self.delegate_behaviour.token.clone(),
            task_grant_ids: ids,
        };
        self.frees.fetch_add(1, Relaxed);
        let payload = Bytes::from(request.encode_to_vec());
        self.send(machine, Method::FreeTask, payload, |daemons, _, result| {
            let _ = settle::<pb::FreeTaskResponse>(&daemons.stats, Method::FreeTask, result);
            daemons.frees.fetch_sub(1, Relaxed);
        });
    }

    /// A `GetRunningTasks` answer: the list checked (`TaskLists`), its
    /// bytes counted, the longest list remembered.
    fn tasks_listed(self: &Arc<Self>, machine: usize, result: Result<Reply, CallError>) {
        let rpc = Method::GetRunningTasks;
        let checked = result.and_then(|reply| Ok((self.task_lists.check(&reply)?, reply)));
        match checked {
            Ok((list, reply)) => {
                record_reply(&self.stats, rpc, &reply, list.message_bytes);
                let largest = &self.stats.events.largest_task_list;
                largest.fetch_max(list.tasks as u64, Relaxed);
            }
            Err(error) => record_failure(&self.stats, rpc, &error),
        }
        if let Some(delegate) = &self.machines[machine].delegate {
            delegate.listed();
        }
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
        let _ = tokio::time::timeout(LAST_CALL, call).await;
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
        if let Ok(reply) = tokio::time::timeout(LAST_CALL, call).await {
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

/// The machine an event is for (deadlines are not any machine's).
fn event_machine(event: &Event) -> usize {
    match event {
        Event::Heartbeat(machine)
        | Event::RunningTasks(machine)
        | Event::Config(machine)
        | Event::Renew(machine)
        | Event::Arrival(machine)
        | Event::BuildStart(machine)
        | Event::JobDone { machine, .. }
        | Event::LaneRetry { machine, .. } => *machine,
        Event::Expire(_) => 0,
    }
}
