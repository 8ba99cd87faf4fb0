//! The standard gRPC health service, `grpc.health.v1.Health` (tonic-health's
//! generated server, our answers), for Kubernetes gRPC probes and
//! `grpc-health-probe`: `SERVING` while the scheduler is ready, `NOT_SERVING`
//! once it is not ([`Readiness`], which `/readyz` reports too), for the
//! whole server (the empty name) and for the scheduler service. Served over
//! gRPC, gRPC-Web and Connect ([`super::connect_bridge`]).
//!
//! As the protocol says: `Check` of another name is `NOT_FOUND`; `Watch`
//! sends the status now and at every change, `SERVICE_UNKNOWN` for another
//! name, and stays open, except that it ends (OK) after the final
//! `NOT_SERVING` of a shutdown, so that watchers do not hold their
//! connections through the drain.

use std::pin::Pin;

use axum::Router;
use futures_util::Stream;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tonic_health::pb::{
    HealthCheckRequest, HealthCheckResponse,
    health_check_response::ServingStatus,
    health_server::{Health, HealthServer},
};

use super::connect_bridge::bridged;
use crate::{
    pb::SCHEDULER_SERVICE,
    readiness::{NotReady, Readiness},
};

/// The health service's full name.
pub const SERVICE: &str = "grpc.health.v1.Health";

/// The names whose health is reported: the whole server (empty) and the
/// scheduler service.
pub const REPORTED: [&str; 2] = ["", SCHEDULER_SERVICE];

/// The health service, routed by its paths.
pub fn router<S: Clone + Send + Sync + 'static>(readiness: Readiness) -> Router<S> {
    Router::new().route_service(
        &format!("/{SERVICE}/{{method}}"),
        bridged(HealthServer::new(HealthService { readiness })),
    )
}

#[derive(Debug)]
struct HealthService {
    readiness: Readiness,
}

/// The status of `service` when the scheduler's readiness is `readiness`;
/// `None` for a name not reported here.
fn status_of(service: &str, readiness: Result<(), NotReady>) -> Option<ServingStatus> {
    REPORTED.contains(&service).then_some(match readiness {
        Ok(()) => ServingStatus::Serving,
        Err(_) => ServingStatus::NotServing,
    })
}

fn answer(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = &request.get_ref().service;
        match status_of(service, self.readiness.current()) {
            Some(status) => Ok(Response::new(answer(status))),
            None => Err(Status::not_found(format!(
                "no health is reported for {service:?}; ask for \"\" (the server) or \
                 {SCHEDULER_SERVICE:?}"
            ))),
        }
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let service = request.into_inner().service;
        Ok(Response::new(Box::pin(watch_statuses(
            service,
            self.readiness.subscribe(),
        ))))
    }
}

/// What `Watch` of `service` sends: its status now, then each change; done
/// after a final one.
fn watch_statuses(
    service: String,
    readiness: watch::Receiver<Result<(), NotReady>>,
) -> impl Stream<Item = Result<HealthCheckResponse, Status>> + Send {
    futures_util::stream::unfold(
        Some((readiness, None)),
        move |state: Option<(_, Option<ServingStatus>)>| {
            let service = service.clone();
            async move {
                let (mut readiness, sent) = state?;
                loop {
                    let now = *readiness.borrow_and_update();
                    let status = status_of(&service, now).unwrap_or(ServingStatus::ServiceUnknown);
                    if sent != Some(status) {
                        return Some((Ok(answer(status)), Some((readiness, Some(status)))));
                    }
                    let final_state = now.is_err_and(NotReady::is_final);
                    if final_state || readiness.changed().await.is_err() {
                        return None;
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    fn statuses(answers: &[Result<HealthCheckResponse, Status>]) -> Vec<ServingStatus> {
        answers
            .iter()
            .map(|answer| answer.as_ref().unwrap().status())
            .collect()
    }

    #[tokio::test]
    async fn watch_reports_the_change_and_ends_after_a_shutdown() {
        for service in REPORTED {
            let readiness = Readiness::new();
            let mut stream = Box::pin(watch_statuses(service.into(), readiness.subscribe()));
            let first = stream.next().await.unwrap();
            assert_eq!(statuses(&[first]), [ServingStatus::Serving]);
            readiness.set_not_ready(NotReady::ShuttingDown);
            let rest: Vec<_> = stream.collect().await;
            assert_eq!(statuses(&rest), [ServingStatus::NotServing]);
        }
    }

    #[tokio::test]
    async fn an_unknown_name_is_not_found_to_check_and_unknown_to_watch() {
        let readiness = Readiness::new();
        let health = HealthService {
            readiness: readiness.clone(),
        };
        let request = || {
            Request::new(HealthCheckRequest {
                service: "no.such.Service".into(),
            })
        };
        let refused = health.check(request()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::NotFound);
        let mut stream = health.watch(request()).await.unwrap().into_inner();
        let first = stream.next().await.unwrap();
        assert_eq!(statuses(&[first]), [ServingStatus::ServiceUnknown]);
        readiness.set_not_ready(NotReady::ShuttingDown);
        assert!(stream.next().await.is_none(), "ends with the drain");
    }
}
