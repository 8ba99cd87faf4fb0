//! The adoption window after a (re)start: what the engine remembers so that
//! tasks started under the previous instance survive, and nothing else does.
//!
//! Rule "adoption": during the window, a task a verified servant not behind
//! NAT reports under a grant id this instance never issued becomes a grant
//! on that servant. Never adopted: an id this instance issued (it is live,
//! or was freed or expired: `retired`), so a heartbeat sent just before a
//! `FreeTask` cannot bring the grant back, nor an id freed before any servant
//! reported it (`freed_early`). A renewal of an id no servant has reported
//! yet is answered `true` and remembered (`pending`), and honoured when a
//! servant reports the id. All three memories are bounded, and only ids this
//! instance issued can close the window:
//! - `retired` full: the window closes early (adopting less is safe,
//!   adopting a freed id is not). Only this instance's own grants reach it,
//!   so no caller can close the window by freeing made-up ids.
//! - `freed_early` full: further early frees are not remembered. Anyone with
//!   the user token can free any unknown id, so this set must not close the
//!   window; the cost of a forgotten early free is a stale report adopting
//!   the id until its servant's next heartbeat no longer lists it.
//! - `pending` full, in total or for the caller's machine: further early
//!   renewals answer `false`. The per-machine share keeps one machine from
//!   using up the room every other delegate's renewals need.
//!
//! Everything is dropped when the window closes.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use tokio::time::Instant;

use super::requesters::Owner;

/// A renewal of an id no servant had reported yet.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingRenewal {
    pub owner: Owner,
    pub lease_until: Instant,
}

/// How much each memory of the window may hold (see the module comment).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdoptionBounds {
    pub max_retired: usize,
    pub max_freed_early: usize,
    pub max_pending: usize,
    pub max_pending_per_machine: usize,
}

pub(crate) struct AdoptionWindow {
    until: Instant,
    open: bool,
    retired: HashSet<u64>,
    freed_early: HashSet<u64>,
    pending: HashMap<u64, PendingRenewal>,
    /// Entries of `pending` per renewing machine; no zero counts are kept.
    pending_by_machine: HashMap<IpAddr, usize>,
    bounds: AdoptionBounds,
}

impl AdoptionWindow {
    pub(crate) fn new(until: Instant, now: Instant, bounds: AdoptionBounds) -> Self {
        AdoptionWindow {
            until,
            open: now < until,
            retired: HashSet::new(),
            freed_early: HashSet::new(),
            pending: HashMap::new(),
            pending_by_machine: HashMap::new(),
            bounds,
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
        self.freed_early = HashSet::new();
        self.pending = HashMap::new();
        self.pending_by_machine = HashMap::new();
    }

    /// An id this instance issued left the grant table: never adopt it.
    pub(crate) fn retire(&mut self, id: u64) {
        if !self.open {
            return;
        }
        if self.retired.len() >= self.bounds.max_retired {
            self.close();
            return;
        }
        self.retired.insert(id);
        self.take_pending(id);
    }

    /// Whether a reported unknown id may be adopted now.
    pub(crate) fn may_adopt(&mut self, id: u64, now: Instant) -> bool {
        id != 0
            && self.is_open(now)
            && !self.retired.contains(&id)
            && !self.freed_early.contains(&id)
    }

    /// The renewal remembered for `id`, taken (it becomes the grant's).
    pub(crate) fn take_pending(&mut self, id: u64) -> Option<PendingRenewal> {
        let p = self.pending.remove(&id)?;
        if let Some(count) = self.pending_by_machine.get_mut(&p.owner.ip) {
            *count -= 1;
            if *count == 0 {
                self.pending_by_machine.remove(&p.owner.ip);
            }
        }
        Some(p)
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
            if !p.owner.holds(&owner) {
                return Err(());
            }
            p.lease_until = p.lease_until.max(lease_until);
            return Ok(true);
        }
        let machine_count = self.pending_by_machine.get(&owner.ip).copied();
        if self.pending.len() >= self.bounds.max_pending
            || machine_count.unwrap_or(0) >= self.bounds.max_pending_per_machine
        {
            return Ok(false);
        }
        *self.pending_by_machine.entry(owner.ip).or_insert(0) += 1;
        self.pending
            .insert(id, PendingRenewal { owner, lease_until });
        Ok(true)
    }

    /// Rule "early free": the owner (or anyone, if nobody renewed it) gave
    /// the id back before any servant reported it: never adopt it, as far as
    /// `freed_early` has room (it never closes the window, see the module
    /// comment). `Err(())` if another owner renewed it.
    pub(crate) fn free_early(&mut self, id: u64, owner: Owner, now: Instant) -> Result<(), ()> {
        if !self.is_open(now) {
            return Ok(());
        }
        if self
            .pending
            .get(&id)
            .is_some_and(|p| !p.owner.holds(&owner))
        {
            return Err(());
        }
        self.take_pending(id);
        if self.freed_early.len() < self.bounds.max_freed_early {
            self.freed_early.insert(id);
        }
        Ok(())
    }

    /// Ids remembered (retired + freed early + pending), for tests of the bound.
    #[cfg(test)]
    pub(crate) fn remembered(&self) -> usize {
        self.retired.len() + self.freed_early.len() + self.pending.len()
    }
}
