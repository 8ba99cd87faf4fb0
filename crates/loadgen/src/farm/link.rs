//! How a simulated daemon of the farm reaches the scheduler: over a real
//! socket ([`Endpoint`]), or, with `--in-process`, this scheduler's own
//! service and engine in the same process under tokio's paused clock. The
//! second has no sockets, no threads and no load generator lag: the
//! placement alone decides, and a run of minutes takes seconds whatever
//! else the machine runs.

use std::{net::IpAddr, sync::Arc};

use yadcc_pb::{self as pb, Method};
use yadcc_scheduler::service::{CallContext, RpcStatus, SchedulerService};
use yadcc_sim::{Stats, client::Endpoint, stats::Call};

/// A call that got no answer it could use.
#[derive(Debug)]
pub(crate) enum Failed {
    /// `NO_QUOTA_AVAILABLE`: nothing free within the wait.
    NoQuota,
    /// Anything else (counted in the run's errors).
    Error,
}

/// One simulated daemon's way to the scheduler.
#[derive(Clone)]
pub(crate) enum Link {
    Socket(Endpoint),
    InProcess {
        service: SchedulerService,
        /// What a socket would tell of every call: the daemon's address and
        /// its one connection (a daemon's turns are its connection's).
        context: CallContext,
        stats: Arc<Stats>,
    },
}

impl Link {
    /// The in-process way of the daemon at `peer` on `connection`.
    pub(crate) fn in_process(
        service: SchedulerService,
        peer: IpAddr,
        connection: u64,
        stats: Arc<Stats>,
    ) -> Self {
        Link::InProcess {
            service,
            context: CallContext {
                peer,
                connection: Some(connection),
                deadline: None,
            },
            stats,
        }
    }

    /// One call, the same way whichever link: `Q`'s method over the socket,
    /// or the service's answer in this process with errors counted as the
    /// socket's client counts them.
    pub(crate) async fn call<Q: FarmCall>(&self, request: Q) -> Result<Q::Response, Failed> {
        match self {
            Link::Socket(endpoint) => socket(endpoint, Q::METHOD, &request).await,
            Link::InProcess {
                service,
                context,
                stats,
            } => match request.answer_in_process(service, context).await {
                Ok(answer) => Ok(answer),
                Err(status) if status.code == pb::Status::NoQuotaAvailable => Err(Failed::NoQuota),
                Err(status) => {
                    stats.record_error(Call::Rpc(Q::METHOD), &format!("{:?}", status.code));
                    Err(Failed::Error)
                }
            },
        }
    }
}

/// A request the farm's daemons send: its method, its answer, and how this
/// process's service answers it.
pub(crate) trait FarmCall: prost::Message + Sized {
    const METHOD: Method;
    type Response: prost::Message + Default;
    fn answer_in_process(
        self,
        service: &SchedulerService,
        context: &CallContext,
    ) -> impl Future<Output = Result<Self::Response, RpcStatus>>;
}

impl FarmCall for pb::HeartbeatRequest {
    const METHOD: Method = Method::Heartbeat;
    type Response = pb::HeartbeatResponse;
    async fn answer_in_process(
        self,
        service: &SchedulerService,
        context: &CallContext,
    ) -> Result<Self::Response, RpcStatus> {
        service.heartbeat(self, context)
    }
}

impl FarmCall for pb::WaitForStartingTaskRequest {
    const METHOD: Method = Method::WaitForStartingTask;
    type Response = pb::WaitForStartingTaskResponse;
    async fn answer_in_process(
        self,
        service: &SchedulerService,
        context: &CallContext,
    ) -> Result<Self::Response, RpcStatus> {
        service.wait_for_starting_task(self, context).await
    }
}

impl FarmCall for pb::KeepTaskAliveRequest {
    const METHOD: Method = Method::KeepTaskAlive;
    type Response = pb::KeepTaskAliveResponse;
    async fn answer_in_process(
        self,
        service: &SchedulerService,
        context: &CallContext,
    ) -> Result<Self::Response, RpcStatus> {
        service.keep_task_alive(self, context).await
    }
}

impl FarmCall for pb::FreeTaskRequest {
    const METHOD: Method = Method::FreeTask;
    type Response = pb::FreeTaskResponse;
    async fn answer_in_process(
        self,
        service: &SchedulerService,
        context: &CallContext,
    ) -> Result<Self::Response, RpcStatus> {
        service.free_task(self, context).await
    }
}

async fn socket<Q, A>(endpoint: &Endpoint, method: Method, request: &Q) -> Result<A, Failed>
where
    Q: prost::Message,
    A: prost::Message + Default,
{
    endpoint
        .call::<Q, A>(method, request)
        .await
        .map_err(|error| {
            if error.is_no_quota() {
                Failed::NoQuota
            } else {
                Failed::Error
            }
        })
}
