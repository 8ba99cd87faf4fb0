//! The operators' five RPCs, transport-neutral: protobuf request in,
//! protobuf response or an [`AdminError`] out. The only place that
//! translates between `admin.proto`'s messages and [`crate::admin`]'s types;
//! the caller was authenticated before the request was decoded.

use crate::{
    admin::{Admin, AdminError, AuditEvent, Operator},
    engine::{CordonState, CordonView},
    pb,
};

/// The admin service over one [`Admin`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AdminService {
    admin: Admin,
}

impl AdminService {
    pub fn new(admin: Admin) -> Self {
        AdminService { admin }
    }

    /// The operators' side behind this service (authentication, state).
    pub fn operators(&self) -> &Admin {
        &self.admin
    }

    pub async fn cordon_servant(
        &self,
        request: pb::CordonServantRequest,
        caller: &Operator,
    ) -> Result<pb::CordonServantResponse, AdminError> {
        let view = self
            .admin
            .cordon(caller, &request.location, &request.reason, false)
            .await?;
        Ok(pb::CordonServantResponse {
            servant: Some(servant_state(view)),
        })
    }

    pub async fn uncordon_servant(
        &self,
        request: pb::UncordonServantRequest,
        caller: &Operator,
    ) -> Result<pb::UncordonServantResponse, AdminError> {
        Ok(pb::UncordonServantResponse {
            was_cordoned: self.admin.uncordon(caller, &request.location).await?,
        })
    }

    pub async fn drain_servant(
        &self,
        request: pb::DrainServantRequest,
        caller: &Operator,
    ) -> Result<pb::DrainServantResponse, AdminError> {
        let view = self
            .admin
            .cordon(caller, &request.location, &request.reason, true)
            .await?;
        Ok(pb::DrainServantResponse {
            servant: Some(servant_state(view)),
        })
    }

    pub fn list_servant_states(
        &self,
        _request: pb::ListServantStatesRequest,
        _caller: &Operator,
    ) -> pb::ListServantStatesResponse {
        pb::ListServantStatesResponse {
            servants: self
                .admin
                .servant_states()
                .into_iter()
                .map(servant_state)
                .collect(),
            ejected: self
                .admin
                .ejected_servants()
                .iter()
                .map(ejected_servant)
                .collect(),
        }
    }

    pub fn list_audit_events(
        &self,
        _request: pb::ListAuditEventsRequest,
        _caller: &Operator,
    ) -> pb::ListAuditEventsResponse {
        pb::ListAuditEventsResponse {
            events: self
                .admin
                .audit_events_with_ejections()
                .into_iter()
                .map(audit_event)
                .collect(),
        }
    }
}

fn servant_state(view: CordonView) -> pb::ServantState {
    let state = match view.state {
        CordonState::Cordoned => pb::CordonState::Cordoned,
        CordonState::Draining => pb::CordonState::Draining,
        CordonState::Drained => pb::CordonState::Drained,
    };
    pb::ServantState {
        location: view.location.to_string(),
        state: state as i32,
        reason: view.cordon.reason,
        who: view.cordon.by,
        since_unix_ms: view.cordon.since_unix_ms,
        running_tasks: view.running,
        registered: view.registered,
    }
}

fn ejected_servant(view: &crate::engine::ServantView) -> pb::EjectedServant {
    pb::EjectedServant {
        location: view.reported_location.to_string(),
        state: view.outlier.state().to_owned(),
        ejected_for_ms: view.outlier.ejected_for.map_or(0, |left| {
            u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
        }),
        ejections: view.outlier.ejections,
        reason: view
            .outlier
            .last_evidence
            .map(|e| e.to_string())
            .unwrap_or_default(),
    }
}

fn audit_event(event: AuditEvent) -> pb::AuditEvent {
    pb::AuditEvent {
        at_unix_ms: event.at_unix_ms,
        who: event.who,
        action: event.action,
        location: event.location,
        reason: event.reason,
        peer: event.peer,
        protocol: event.protocol,
    }
}
