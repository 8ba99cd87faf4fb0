//! Servants operators took out of rotation, by location (owner: `Cordons`).
//! A cordon is the operator's word, not something a daemon said: it is kept
//! for a location whether or not a servant is there, survives the servant's
//! expiry and a restart of the engine, and is replaced as a whole when this
//! instance starts to lead (the state saved by whoever led before).
//!
//! Rule "cordon": a servant whose reported location (or, failing that, the
//! location the scheduler sees, the one grants name) is cordoned has no
//! free slot in the placement indexes, so it gets no new grant; nothing else
//! about it changes (its grants, renewals, frees, reports, the running-task
//! list, the environments it keeps available). The flag is set on the
//! servant's record by `State::heartbeat` and `State::recordon`; `Servant`
//! reads it when it computes its place.

use std::collections::BTreeMap;
use std::net::SocketAddr;

/// What an operator set on a location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cordon {
    /// Drain: the state reports the tasks still running until none is.
    pub drain: bool,
    /// What the operator said.
    pub reason: String,
    /// Who acted (an identity the admin layer spells).
    pub by: String,
    /// When, in milliseconds since the Unix epoch (the caller's clock: the
    /// engine keeps no wall-clock time).
    pub since_unix_ms: u64,
}

/// Where a cordoned servant is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CordonState {
    /// No new grant; its running tasks go on.
    Cordoned,
    /// Drained while tasks still run there.
    Draining,
    /// Drained, and nothing runs there any more.
    Drained,
}

impl CordonState {
    /// `cordoned`, `draining`, `drained`: for logs and the dashboard.
    pub fn label(self) -> &'static str {
        match self {
            CordonState::Cordoned => "cordoned",
            CordonState::Draining => "draining",
            CordonState::Drained => "drained",
        }
    }
}

/// A cordoned location as people see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CordonView {
    pub location: SocketAddr,
    pub cordon: Cordon,
    pub state: CordonState,
    /// Grants counted against the servants there (live and zombie).
    pub running: u32,
    /// Whether a live servant is there.
    pub registered: bool,
}

impl CordonView {
    pub(crate) fn new(
        location: SocketAddr,
        cordon: Cordon,
        running: u32,
        registered: bool,
    ) -> Self {
        let state = match (cordon.drain, running) {
            (false, _) => CordonState::Cordoned,
            (true, 0) => CordonState::Drained,
            (true, _) => CordonState::Draining,
        };
        CordonView {
            location,
            cordon,
            state,
            running,
            registered,
        }
    }
}

/// Every cordoned location.
#[derive(Debug, Default)]
pub(crate) struct Cordons {
    by_location: BTreeMap<SocketAddr, Cordon>,
}

impl Cordons {
    /// The cordoned location that covers a servant reporting `reported` and
    /// seen at `observed` (rule "cordon"). Costs nothing while no servant
    /// is cordoned: every heartbeat asks.
    pub(crate) fn covering(
        &self,
        reported: SocketAddr,
        observed: SocketAddr,
    ) -> Option<SocketAddr> {
        if self.by_location.is_empty() {
            return None;
        }
        [reported, observed]
            .into_iter()
            .find(|location| self.by_location.contains_key(location))
    }

    pub(crate) fn get(&self, location: SocketAddr) -> Option<&Cordon> {
        self.by_location.get(&location)
    }

    pub(crate) fn len(&self) -> usize {
        self.by_location.len()
    }

    pub(crate) fn insert(&mut self, location: SocketAddr, cordon: Cordon) {
        self.by_location.insert(location, cordon);
    }

    /// False if `location` was not cordoned.
    pub(crate) fn remove(&mut self, location: SocketAddr) -> bool {
        self.by_location.remove(&location).is_some()
    }

    /// Replaces every cordon with `entries` (a later entry for a location wins).
    pub(crate) fn replace(&mut self, entries: impl IntoIterator<Item = (SocketAddr, Cordon)>) {
        self.by_location = entries.into_iter().collect();
    }

    /// Every cordon, by location.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (SocketAddr, &Cordon)> {
        self.by_location
            .iter()
            .map(|(location, cordon)| (*location, cordon))
    }
}
