//! What operators did: one structured log line per action (target
//! [`AUDIT_LOG`]) and the latest [`MAX_AUDIT_EVENTS`] actions, newest first,
//! saved with the cordons so that a restart or a failover keeps them.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Target of the audit's log lines (`RUST_LOG=yadcc_scheduler::audit=info`).
pub const AUDIT_LOG: &str = "yadcc_scheduler::audit";

/// Actions the list keeps; older ones leave it (the log keeps them all).
pub const MAX_AUDIT_EVENTS: usize = 200;

/// One accepted action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// Who ([`super::Identity`] as text).
    pub who: String,
    /// The RPC's name (`CordonServant`).
    pub action: String,
    /// The servant's location as the operator named it.
    pub location: String,
    #[serde(default)]
    pub reason: String,
    /// The caller's address.
    pub peer: String,
    /// The protocol it called over.
    pub protocol: String,
}

impl AuditEvent {
    /// The action's structured log line.
    pub(super) fn log(&self) {
        tracing::info!(
            target: AUDIT_LOG,
            who = %self.who,
            action = %self.action,
            location = %self.location,
            reason = %self.reason,
            peer = %self.peer,
            protocol = %self.protocol,
            "admin action"
        );
    }
}

/// The latest actions, newest first, at most [`MAX_AUDIT_EVENTS`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditLog {
    events: VecDeque<AuditEvent>,
}

impl AuditLog {
    /// The list as saved (newest first), cut to its bound.
    pub fn from_saved(events: Vec<AuditEvent>) -> AuditLog {
        let mut events: VecDeque<AuditEvent> = events.into();
        events.truncate(MAX_AUDIT_EVENTS);
        AuditLog { events }
    }

    /// Adds the newest action; the oldest leaves when the list is full.
    pub fn push(&mut self, event: AuditEvent) {
        self.events.push_front(event);
        self.events.truncate(MAX_AUDIT_EVENTS);
    }

    /// Newest first.
    pub fn events(&self) -> impl Iterator<Item = &AuditEvent> {
        self.events.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: u64) -> AuditEvent {
        AuditEvent {
            at_unix_ms: n,
            who: "token:0123456789ab".into(),
            action: "CordonServant".into(),
            location: "10.0.0.1:8335".into(),
            reason: String::new(),
            peer: "127.0.0.1".into(),
            protocol: "http+pb".into(),
        }
    }

    #[test]
    fn the_list_is_newest_first_and_bounded() {
        let mut log = AuditLog::default();
        for n in 0..(MAX_AUDIT_EVENTS as u64 + 5) {
            log.push(event(n));
        }
        let kept: Vec<u64> = log.events().map(|event| event.at_unix_ms).collect();
        assert_eq!(kept.len(), MAX_AUDIT_EVENTS);
        assert_eq!(kept[0], MAX_AUDIT_EVENTS as u64 + 4);
        assert_eq!(*kept.last().unwrap(), 5);
        let saved = AuditLog::from_saved(log.events().cloned().chain([event(0)]).collect());
        assert_eq!(saved.events().count(), MAX_AUDIT_EVENTS);
        assert_eq!(saved, log);
    }
}
