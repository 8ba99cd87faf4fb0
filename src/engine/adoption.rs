//! The adoption window after a (re)start: what the engine remembers so that
//! tasks started under the previous instance survive, and nothing else does.
//!
//! Rule "adoption": during the window, a task a verified servant not behind
//! NAT reports under a grant id this instance never issued becomes a grant
//! on that servant. Never adopted: an id this instance issued (it is live,
//! or was freed or expired: `retired`), so a heartbeat sent just before a
//! `FreeTask` cannot bring the grant back. A renewal of an id no servant has
//! reported yet is answered `true` and remembered (`pending`), and honoured
//! when a servant reports the id. Both memories are bounded: if `retired`
//! fills up the window closes early (adopting less is safe, adopting a freed
//! id is not); if `pending` fills up, further early renewals answer `false`.
//! Everything is dropped when the window closes.

use std::collections::{HashMap, HashSet};

use tokio::time::Instant;

use super::requesters::Owner;

/// A renewal of an id no servant had reported yet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingRenewal {
    pub owner: Owner,
    pub lease_until: Instant,
}

pub(crate) struct AdoptionWindow {
    until: Instant,
    open: bool,
    retired: HashSet<u64>,
    pending: HashMap<u64, PendingRenewal>,
    max_retired: usize,
    max_pending: usize,
}

impl AdoptionWindow {
    pub(crate) fn new(
        until: Instant,
        now: Instant,
        max_retired: usize,
        max_pending: usize,
    ) -> Self {
        AdoptionWindow {
            until,
            open: now < until,
            retired: HashSet::new(),
            pending: HashMap::new(),
            max_retired,
            max_pending,
        }
    }

    /// True while unknown reported ids may be adopted; closes (and frees its
    /// memory) the first time it is asked after the window ended.
    pub(crate) fn is_open(&mut self, now: Instant) -> bool {
        if self.open && now >= self.until {
            self.close();
        }
        self.open
    }

    /// When the expiry task should close the window, if it is open.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.open.then_some(self.until)
    }

    fn close(&mut self) {
        self.open = false;
        self.retired = HashSet::new();
        self.pending = HashMap::new();
    }

    /// An id this instance issued left the grant table: never adopt it.
    pub(crate) fn retire(&mut self, id: u64) {
        if !self.open {
            return;
        }
        if self.retired.len() >= self.max_retired {
            self.close();
            return;
        }
        self.retired.insert(id);
        self.pending.remove(&id);
    }

    /// Whether a reported unknown id may be adopted now.
    pub(crate) fn may_adopt(&mut self, id: u64, now: Instant) -> bool {
        id != 0 && self.is_open(now) && !self.retired.contains(&id)
    }

    /// The renewal remembered for `id`, taken (it becomes the grant's).
    pub(crate) fn take_pending(&mut self, id: u64) -> Option<PendingRenewal> {
        self.pending.remove(&id)
    }

    /// Rule "early renewal": a renewal of an id nobody reported yet, inside
    /// the window. True if remembered (or refreshed by the same owner);
    /// `Err(())` if another owner renewed it first; false otherwise.
    pub(crate) fn renew_early(
        &mut self,
        id: u64,
        owner: Owner,
        lease_until: Instant,
        now: Instant,
    ) -> Result<bool, ()> {
        if !self.may_adopt(id, now) {
            return Ok(false);
        }
        if let Some(p) = self.pending.get_mut(&id) {
            if p.owner != owner {
                return Err(());
            }
            p.lease_until = p.lease_until.max(lease_until);
            return Ok(true);
        }
        if self.pending.len() >= self.max_pending {
            return Ok(false);
        }
        self.pending
            .insert(id, PendingRenewal { owner, lease_until });
        Ok(true)
    }

    /// Rule "early free": the owner (or anyone, if nobody renewed it) gave
    /// the id back before any servant reported it: never adopt it. `Err(())`
    /// if another owner renewed it.
    pub(crate) fn free_early(&mut self, id: u64, owner: Owner, now: Instant) -> Result<(), ()> {
        if !self.is_open(now) {
            return Ok(());
        }
        if self.pending.get(&id).is_some_and(|p| p.owner != owner) {
            return Err(());
        }
        self.retire(id);
        Ok(())
    }

    /// Ids remembered (retired + pending), for tests of the bound.
    #[cfg(test)]
    pub(crate) fn remembered(&self) -> usize {
        self.retired.len() + self.pending.len()
    }
}
