//! What operators do to the farm, transport-neutral: who may act
//! ([`credentials`]: `--admin_tokens`, the bearer token, the seam for a
//! client certificate), cordons and drains on the engine, what they did
//! ([`audit`]), and what lasts ([`store`]). [`crate::service::admin`]
//! translates the protobuf messages; this module knows none.
//!
//! An action is checked (credentials, then arguments, then whether this
//! instance leads), saved with the whole state, and only then applied and
//! logged: a state that could not be saved changes nothing, so a restart
//! or a failover never undoes an answered action. One action at a time.

pub mod audit;
pub mod credentials;
pub mod store;

use std::{
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::{SystemTime, UNIX_EPOCH},
};

pub use audit::{AUDIT_LOG, AuditEvent, AuditLog, MAX_AUDIT_EVENTS};
pub use credentials::{AdminTokens, ClientCertificate, Credentials, Identity, fingerprint};
pub use store::{SavedCordon, SavedState, Store};

use crate::{
    engine::{Cordon, CordonView, Rejection, Scheduler, check_location},
    ha::Leadership,
    protocol::Protocol,
};

/// Why an action was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// No credential came (401).
    #[error("{0}")]
    Unauthenticated(String),
    /// A credential came that is not an operator's (403).
    #[error("{0}")]
    Forbidden(String),
    /// A field is out of range or malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// This instance does not lead (a standby taking over): ask the leader.
    #[error("{0}")]
    NotLeading(String),
    /// The state could not be saved; nothing changed.
    #[error("{0}")]
    NotSaved(String),
}

/// An accepted caller.
#[derive(Debug, Clone)]
pub struct Operator {
    pub identity: Identity,
    /// Its address (the socket's, or a trusted proxy's client).
    pub peer: IpAddr,
    pub protocol: Protocol,
}

/// The operators' side of one scheduler. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Admin(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    tokens: AdminTokens,
    engine: Scheduler,
    leadership: Leadership,
    store: Store,
    audit: Mutex<AuditLog>,
    /// One action at a time, from its save to its effect: the saved state
    /// and the engine never disagree.
    acting: tokio::sync::Mutex<()>,
}

impl Admin {
    pub fn new(
        tokens: AdminTokens,
        engine: Scheduler,
        leadership: Leadership,
        store: Store,
    ) -> Self {
        Admin(Arc::new(Inner {
            tokens,
            engine,
            leadership,
            store,
            audit: Mutex::default(),
            acting: tokio::sync::Mutex::new(()),
        }))
    }

    /// Closed: no admin token, nothing saved.
    pub fn closed(engine: Scheduler, leadership: Leadership) -> Self {
        Admin::new(AdminTokens::default(), engine, leadership, Store::Memory)
    }

    /// Where the state lasts.
    pub fn store(&self) -> &Store {
        &self.0.store
    }

    /// The configured tokens.
    pub fn tokens(&self) -> &AdminTokens {
        &self.0.tokens
    }

    /// Who the call is, if it may act: an admin token (a client
    /// certificate's subject is carried, but none is accepted until a TLS
    /// listener and a flag listing subjects exist). No credential is 401,
    /// any other 403 (also every token while the API is closed); refusals
    /// are logged (at most a line a second).
    pub fn authenticate(
        &self,
        credentials: &Credentials,
        peer: IpAddr,
        protocol: Protocol,
    ) -> Result<Operator, AdminError> {
        let refused = |error: AdminError| {
            tracing::warn!(
                target: AUDIT_LOG,
                peer = %peer,
                protocol = protocol.label(),
                "admin call refused: {error}"
            );
            error
        };
        const CLOSED: &str =
            "the admin API is closed: start the scheduler with --admin_tokens=TOKEN";
        let Some(token) = credentials.token() else {
            let why = if self.0.tokens.is_closed() {
                CLOSED
            } else if credentials.certificate_subject().is_some() {
                "no client certificate is accepted for the admin API yet"
            } else if credentials.has_other_scheme() {
                "the Authorization header is not `Bearer <admin token>`"
            } else {
                "send `Authorization: Bearer <admin token>`"
            };
            return Err(refused(AdminError::Unauthenticated(why.to_owned())));
        };
        if self.0.tokens.is_closed() {
            return Err(refused(AdminError::Forbidden(CLOSED.to_owned())));
        }
        let Some(label) = self.0.tokens.label_of(token) else {
            return Err(refused(AdminError::Forbidden(
                "the token is not an admin token (--admin_tokens)".to_owned(),
            )));
        };
        Ok(Operator {
            identity: Identity::Token {
                label: label.to_owned(),
            },
            peer,
            protocol,
        })
    }

    /// Cordons (or, with `drain`, drains) the servant at `location`.
    pub async fn cordon(
        &self,
        caller: &Operator,
        location: &str,
        reason: &str,
        drain: bool,
    ) -> Result<CordonView, AdminError> {
        let engine = &self.0.engine;
        let _acting = self.0.acting.lock().await;
        let at = engine.check_cordon(location, reason).map_err(invalid)?;
        self.check_leading()?;
        let action = if drain {
            "DrainServant"
        } else {
            "CordonServant"
        };
        let cordon = Cordon {
            drain,
            reason: reason.to_owned(),
            by: caller.identity.to_string(),
            since_unix_ms: unix_millis(),
        };
        let mut state = self.state();
        state.cordons.retain(|saved| saved.location != at);
        state.cordons.push(SavedCordon::new(at, &cordon));
        state.cordons.sort_by_key(|saved| saved.location);
        let event = self.event(caller, action, location, reason, cordon.since_unix_ms);
        self.save(&mut state, event).await?;
        Ok(engine.cordon(at, cordon))
    }

    /// Puts the servant at `location` back into rotation; whether it was
    /// cordoned. An uncordon of a location that was not is still audited.
    pub async fn uncordon(&self, caller: &Operator, location: &str) -> Result<bool, AdminError> {
        let engine = &self.0.engine;
        let at = check_location(location).map_err(invalid)?;
        let _acting = self.0.acting.lock().await;
        self.check_leading()?;
        let mut state = self.state();
        let before = state.cordons.len();
        state.cordons.retain(|saved| saved.location != at);
        let was_cordoned = state.cordons.len() < before;
        let event = self.event(caller, "UncordonServant", location, "", unix_millis());
        self.save(&mut state, event).await?;
        engine.uncordon(at);
        Ok(was_cordoned)
    }

    /// Every cordoned, draining or drained servant, by location.
    pub fn servant_states(&self) -> Vec<CordonView> {
        self.0.engine.cordons()
    }

    /// The latest actions, newest first.
    pub fn audit_events(&self) -> Vec<AuditEvent> {
        self.audit().events().cloned().collect()
    }

    /// Servants rule "broken servants" took out of rotation or tries again,
    /// in registration order. O(cluster): an operator's call.
    pub fn ejected_servants(&self) -> Vec<crate::engine::ServantView> {
        self.0
            .engine
            .snapshot()
            .servants
            .into_iter()
            .filter(|s| s.outlier.state() != "in_rotation")
            .collect()
    }

    /// The operators' actions and the scheduler's own ejections of broken
    /// servants (`who` = `scheduler`, action `EjectServant`), newest first.
    /// The ejections are not saved: they describe this instance's servants,
    /// which a restart forgets too.
    pub fn audit_events_with_ejections(&self) -> Vec<AuditEvent> {
        let now = std::time::SystemTime::now();
        let mut events = self.audit_events();
        events.extend(self.0.engine.snapshot().ejections.into_iter().map(|e| {
            let at = now.checked_sub(e.ago).unwrap_or(std::time::UNIX_EPOCH);
            AuditEvent {
                at_unix_ms: at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                who: "scheduler".to_owned(),
                action: "EjectServant".to_owned(),
                location: e.reported.to_string(),
                reason: format!("ejection {}: {}", e.ejections, e.evidence),
                peer: e.servant.to_string(),
                protocol: String::new(),
            }
        }));
        events.sort_by_key(|event| std::cmp::Reverse(event.at_unix_ms));
        events
    }

    /// Replaces the cordons and the audit list with a saved state (at start,
    /// or when this instance starts to lead); None: nothing was saved yet.
    pub fn restore(&self, saved: Option<SavedState>) {
        let saved = saved.unwrap_or_default();
        self.0
            .engine
            .replace_cordons(saved.cordons.iter().map(SavedCordon::entry).collect());
        *self.audit() = AuditLog::from_saved(saved.audit);
    }

    /// The state as it would be saved now.
    pub fn state(&self) -> SavedState {
        SavedState {
            version: store::STATE_VERSION,
            cordons: self
                .0
                .engine
                .cordons()
                .into_iter()
                .map(|view| SavedCordon::new(view.location, &view.cordon))
                .collect(),
            audit: self.audit_events(),
        }
    }

    /// Saves `state` with `event` added, then records the event: the caller
    /// applies the action once this succeeded.
    async fn save(&self, state: &mut SavedState, event: AuditEvent) -> Result<(), AdminError> {
        let mut audit = AuditLog::from_saved(std::mem::take(&mut state.audit));
        audit.push(event.clone());
        state.audit = audit.events().cloned().collect();
        if let Err(why) = self.0.store.save(state).await {
            tracing::error!(
                target: AUDIT_LOG,
                who = %event.who,
                action = %event.action,
                location = %event.location,
                peer = %event.peer,
                "admin action not taken: the state could not be saved: {why}"
            );
            return Err(AdminError::NotSaved(format!(
                "the state could not be saved, so nothing changed: {why}"
            )));
        }
        *self.audit() = audit;
        event.log();
        Ok(())
    }

    /// Only the leader acts: a standby taking over daemons has a stale view
    /// of the cordons and may not write the saved state.
    fn check_leading(&self) -> Result<(), AdminError> {
        if self.0.leadership.is_serving() {
            Ok(())
        } else {
            Err(AdminError::NotLeading(format!(
                "this instance does not lead ({}): act on the leader",
                self.0.leadership.current().describe()
            )))
        }
    }

    fn event(
        &self,
        caller: &Operator,
        action: &str,
        location: &str,
        reason: &str,
        at_unix_ms: u64,
    ) -> AuditEvent {
        AuditEvent {
            at_unix_ms,
            who: caller.identity.to_string(),
            action: action.to_owned(),
            location: location.to_owned(),
            reason: reason.to_owned(),
            peer: caller.peer.to_string(),
            protocol: caller.protocol.label().to_owned(),
        }
    }

    fn audit(&self) -> std::sync::MutexGuard<'_, AuditLog> {
        self.0.audit.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a leader read from etcd replaces what this instance held.
impl crate::ha::SavedStateKeeper for Admin {
    fn restore_saved(&self, saved: Option<&[u8]>) -> Result<(), String> {
        let saved = saved.map(SavedState::decode).transpose()?;
        self.restore(saved);
        Ok(())
    }
}

fn invalid(rejection: Rejection) -> AdminError {
    match rejection {
        Rejection::InvalidArgument(why) => AdminError::InvalidArgument(why),
        other => AdminError::InvalidArgument(other.to_string()),
    }
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests;
