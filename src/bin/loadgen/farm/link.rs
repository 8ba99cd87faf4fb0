//! How a simulated daemon of the farm reaches the scheduler: over a real
//! socket ([`Endpoint`]), or, with `--in-process`, this scheduler's own
//! service and engine in the same process under tokio's paused clock. The
//! second has no sockets, no threads and no load generator lag: the
//! placement alone decides, and a run of minutes takes seconds whatever
//! else the machine runs.

use std::{net::IpAddr, sync::Arc};

use yadcc_scheduler::{
    pb::{self, Method},
    service::{CallContext, SchedulerService},
    sim::{Stats, client::Endpoint, stats::Call},
};

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
    // Made only by a load generator built with the `farm-in-process` feature.
    #[cfg_attr(not(feature = "farm-in-process"), allow(dead_code))]
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
    #[cfg_attr(not(feature = "farm-in-process"), allow(dead_code))]
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

    /// The in-process answer, errors counted as the socket's client counts them.
    fn counted<T>(
        stats: &Stats,
        method: Method,
        answer: Result<T, yadcc_scheduler::service::RpcStatus>,
    ) -> Result<T, Failed> {
        match answer {
            Ok(answer) => Ok(answer),
            Err(status) if status.code == pb::Status::NoQuotaAvailable => Err(Failed::NoQuota),
            Err(status) => {
                stats.record_error(Call::Rpc(method), &format!("{:?}", status.code));
                Err(Failed::Error)
            }
        }
    }

    pub(crate) async fn heartbeat(
        &self,
        request: pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse, Failed> {
        match self {
            Link::Socket(endpoint) => socket(endpoint, Method::Heartbeat, &request).await,
            Link::InProcess {
                service,
                context,
                stats,
            } => Self::counted(
                stats,
                Method::Heartbeat,
                service.heartbeat(request, context),
            ),
        }
    }

    pub(crate) async fn wait_for_starting_task(
        &self,
        request: pb::WaitForStartingTaskRequest,
    ) -> Result<pb::WaitForStartingTaskResponse, Failed> {
        match self {
            Link::Socket(endpoint) => socket(endpoint, Method::WaitForStartingTask, &request).await,
            Link::InProcess {
                service,
                context,
                stats,
            } => Self::counted(
                stats,
                Method::WaitForStartingTask,
                service.wait_for_starting_task(request, context).await,
            ),
        }
    }

    pub(crate) async fn keep_task_alive(
        &self,
        request: pb::KeepTaskAliveRequest,
    ) -> Result<pb::KeepTaskAliveResponse, Failed> {
        match self {
            Link::Socket(endpoint) => socket(endpoint, Method::KeepTaskAlive, &request).await,
            Link::InProcess {
                service,
                context,
                stats,
            } => Self::counted(
                stats,
                Method::KeepTaskAlive,
                service.keep_task_alive(request, context).await,
            ),
        }
    }

    pub(crate) async fn free_task(
        &self,
        request: pb::FreeTaskRequest,
    ) -> Result<pb::FreeTaskResponse, Failed> {
        match self {
            Link::Socket(endpoint) => socket(endpoint, Method::FreeTask, &request).await,
            Link::InProcess {
                service,
                context,
                stats,
            } => Self::counted(
                stats,
                Method::FreeTask,
                service.free_task(request, context).await,
            ),
        }
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
