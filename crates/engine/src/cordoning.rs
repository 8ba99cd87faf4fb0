//! Operators' cordons applied to the servants (rule "cordon", see
//! `cordons`): a change of the cordons moves every servant it covers in
//! the placement indexes at once, and what people see of the cordons counts
//! the tasks still running under each.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use tokio::time::Instant;

use super::cordons::{Cordon, CordonView};
use super::envs::Effects;
use super::state::State;

impl State {
    /// Cordons `location` (replacing what was set there) and takes the
    /// servants it covers out of the free sets.
    pub(crate) fn cordon(&mut self, location: SocketAddr, cordon: Cordon, now: Instant) {
        self.cordons.insert(location, cordon);
        self.recordon(now);
    }

    /// Puts the servants at `location` back; queued requests their free
    /// slots can satisfy are served at once. False if it was not cordoned.
    pub(crate) fn uncordon(&mut self, location: SocketAddr, now: Instant) -> bool {
        let removed = self.cordons.remove(location);
        if removed {
            self.recordon(now);
        }
        removed
    }

    /// Replaces every cordon (the state a new leader read).
    pub(crate) fn replace_cordons(
        &mut self,
        entries: impl IntoIterator<Item = (SocketAddr, Cordon)>,
        now: Instant,
    ) {
        self.cordons.replace(entries);
        self.recordon(now);
    }

    /// Every servant's flag from the cordons now, then what the changes
    /// call for (serving queued requests on uncordoned slots).
    fn recordon(&mut self, now: Instant) {
        let mut fx = Effects::default();
        let cordons = &self.cordons;
        self.servants.recordon(
            |reported, observed| cordons.covering(reported, observed).is_some(),
            &mut self.envs,
            &mut fx,
        );
        self.apply(fx, now);
    }

    /// Every cordon with the grants still running under it, by location.
    /// O(servants + cordons).
    pub(crate) fn cordon_views(&self) -> Vec<CordonView> {
        let mut running: BTreeMap<SocketAddr, u32> = BTreeMap::new();
        for s in self.servants.iter() {
            if let Some(location) = self.cordons.covering(s.reported(), s.observed()) {
                let count = running.entry(location).or_default();
                *count = count.saturating_add(s.granted());
            }
        }
        self.cordons
            .iter()
            .map(|(location, cordon)| {
                let here = running.get(&location).copied();
                CordonView::new(location, cordon.clone(), here.unwrap_or(0), here.is_some())
            })
            .collect()
    }
}
