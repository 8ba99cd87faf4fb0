//! The operators' five RPCs, transport-neutral: protobuf request in,
//! protobuf response or an [`AdminError`] out. The only place that
//! translates between `admin.proto`'s messages and [`crate::admin`]'s types;
//! the caller was authenticated before the request was decoded.

use crate::{
    admin::{Admin, AdminError, AuditEvent, Caller},
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
    pub fn admin(&self) -> &Admin {
        &self.admin
    }

    pub async fn cordon_servant(
        &self,
        request: pb::CordonServantRequest,
        caller: &Caller,
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
        caller: &Caller,
    ) -> Result<pb::UncordonServantResponse, AdminError> {
        Ok(pb::UncordonServantResponse {
            was_cordoned: self.admin.uncordon(caller, &request.location).await?,
        })
    }

    pub async fn drain_servant(
        &self,
        request: pb::DrainServantRequest,
        caller: &Caller,
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
        _caller: &Caller,
    ) -> pb::ListServantStatesResponse {
        pb::ListServantStatesResponse {
            servants: self
                .admin
                .servant_states()
                .into_iter()
                .map(servant_state)
                .collect(),
        }
    }

    pub fn list_audit_events(
        &self,
        _request: pb::ListAuditEventsRequest,
        _caller: &Caller,
    ) -> pb::ListAuditEventsResponse {
        pb::ListAuditEventsResponse {
            events: self
                .admin
                .audit_events()
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
