//! Grants: ids, leases, renewals, frees and zombies.
//!
//! [`Grants`] owns every grant record, the lease deadlines, the adoption
//! window's memory and the grant counters. Its `insert` and `remove` are
//! called from one place each, `State::create_grant` and
//! `State::remove_grant` (in `lifecycle`), which keep the other indexes a
//! grant appears in (its servant's count and place, the requester's
//! figures) in step.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::adoption::{AdoptionBounds, AdoptionWindow};
use super::config::Config;
use super::requesters::Owner;
use super::tenants::TenantId;
use super::types::{EnvId, RequesterId, ServantKey, later};
use super::views::{Counters, GrantView};

/// One grant the engine counts against a servant. Stored records live in
/// [`Grants`], which never lends one out mutably.
pub(crate) struct GrantRec {
    pub servant: ServantKey,
    pub servant_addr: SocketAddr,
    /// Who received it; `None` for an adopted grant nobody renewed yet.
    pub owner: Option<Owner>,
    /// Whose share it counts against; `None` for an adopted grant.
    pub tenant: Option<TenantId>,
    /// `None` for adopted grants.
    pub environment: Option<Arc<str>>,
    pub granted_at: Instant,
    /// Meaningless once `zombie` is set.
    pub lease_until: Instant,
    pub prefetch: bool,
    /// Lease ended; still counts until the servant stops reporting it.
    pub zombie: bool,
    pub adopted: bool,
    /// A heartbeat of its servant listed it: it ran (rule "broken servants").
    pub listed: bool,
}

/// Bits of a grant id that locate its record in the table (up to 2^20
/// slots); the other 33 are random.
const SLOT_BITS: u32 = 20;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
/// Every id is below 2^53: the original's `/inspect` dump gives ids as JSON
/// numbers, which JavaScript and `jq` read as doubles, exact only up to 2^53.
pub(crate) const ID_BITS: u32 = 53;
const ID_MASK: u64 = (1 << ID_BITS) - 1;

/// splitmix64's finaliser: a fast bijective mixer.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

struct Slot {
    /// 0 when vacant.
    id: u64,
    rec: Option<GrantRec>,
}

/// All grants, found by id without hashing.
///
/// Rule "grant ids": an id is below 2^53 ([`ID_BITS`], so JSON readers keep
/// it exact), 33 bits drawn from `rand` (a CSPRNG) followed by 20 bits that
/// are the record's slot XOR a pad derived from the random bits and a
/// per-engine secret. So the whole id looks random, a guess hits a given
/// live grant with probability about 2^-33, it is never 0, and it is re-drawn
/// if it collides with a known grant; yet finding a grant is an array access
/// to a slot that was recently freed and is still in cache. (A hash map keyed
/// by 100,000 fully random ids misses the cache twice per insert: measured,
/// that alone took the 10,000-servant grant+free cost past twice the
/// 10-servant cost.) Ids the engine did not make (adopted after a restart),
/// and grants beyond 2^20 live ones, live in a side map under fully random ids.
pub(crate) struct GrantTable {
    slots: Vec<Slot>,
    vacant: Vec<u32>,
    side: HashMap<u64, GrantRec>,
    secret: u64,
    len: usize,
    slot_limit: usize,
}

impl GrantTable {
    pub(crate) fn new() -> Self {
        GrantTable {
            slots: Vec::new(),
            vacant: Vec::new(),
            side: HashMap::new(),
            secret: rand::random(),
            len: 0,
            slot_limit: 1 << SLOT_BITS,
        }
    }

    /// A table with fewer slots, to test the side map.
    #[cfg(test)]
    pub(crate) fn with_slot_limit(slot_limit: usize) -> Self {
        GrantTable {
            slot_limit: slot_limit.min(1 << SLOT_BITS),
            ..GrantTable::new()
        }
    }

    fn pad(&self, high: u64) -> u64 {
        mix(high ^ self.secret) & SLOT_MASK
    }

    /// The slot an engine-made id points at, if it holds that id.
    fn slot_of(&self, id: u64) -> Option<usize> {
        let slot = ((id & SLOT_MASK) ^ self.pad(id >> SLOT_BITS)) as usize;
        match self.slots.get(slot) {
            Some(s) if s.id == id && id != 0 => Some(slot),
            _ => None,
        }
    }

    /// Number of grants (live, zombie, adopted).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// True if the engine knows the id.
    pub(crate) fn contains_key(&self, id: &u64) -> bool {
        self.slot_of(*id).is_some() || self.side.contains_key(id)
    }

    pub(crate) fn get(&self, id: &u64) -> Option<&GrantRec> {
        match self.slot_of(*id) {
            Some(slot) => self.slots[slot].rec.as_ref(),
            None => self.side.get(id),
        }
    }

    pub(crate) fn get_mut(&mut self, id: &u64) -> Option<&mut GrantRec> {
        match self.slot_of(*id) {
            Some(slot) => self.slots[slot].rec.as_mut(),
            None => self.side.get_mut(id),
        }
    }

    /// Stores a grant under a new id (never 0, never a known id) and returns it.
    pub(crate) fn insert_new(&mut self, rec: GrantRec) -> u64 {
        let slot = match self.vacant.pop() {
            Some(slot) => slot as usize,
            None if self.slots.len() < self.slot_limit => {
                self.slots.push(Slot { id: 0, rec: None });
                self.slots.len() - 1
            }
            None => {
                // Slab full: further grants go to the side map.
                let id = loop {
                    let id = rand::random::<u64>() & ID_MASK;
                    if id != 0 && !self.contains_key(&id) {
                        break id;
                    }
                };
                self.insert_adopted(id, rec);
                return id;
            }
        };
        let id = loop {
            let high = rand::random::<u64>() >> (64 - (ID_BITS - SLOT_BITS));
            let id = (high << SLOT_BITS) | (slot as u64 ^ self.pad(high));
            if id != 0 && !self.side.contains_key(&id) {
                break id;
            }
        };
        self.slots[slot] = Slot { id, rec: Some(rec) };
        self.len += 1;
        id
    }

    /// Stores a grant under an id the engine did not make. The caller checks
    /// that the id is not 0 and not known.
    pub(crate) fn insert_adopted(&mut self, id: u64, rec: GrantRec) {
        debug_assert!(id != 0 && !self.contains_key(&id));
        self.side.insert(id, rec);
        self.len += 1;
    }

    pub(crate) fn remove(&mut self, id: &u64) -> Option<GrantRec> {
        let rec = match self.slot_of(*id) {
            Some(slot) => {
                self.slots[slot].id = 0;
                self.vacant.push(slot as u32);
                self.slots[slot].rec.take()
            }
            None => self.side.remove(id),
        };
        if rec.is_some() {
            self.len -= 1;
        }
        rec
    }

    /// Every grant with its id, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &GrantRec)> {
        self.slots
            .iter()
            .filter_map(|s| s.rec.as_ref().map(|r| (s.id, r)))
            .chain(self.side.iter().map(|(&id, r)| (id, r)))
    }
}

/// Where a new grant comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin {
    /// Issued to `owner` for environment `env`, with a lease of `lease` from
    /// now, answering a call of `requester`.
    Issued {
        env: EnvId,
        owner: Owner,
        requester: RequesterId,
        tenant: TenantId,
        lease: Duration,
        prefetch: bool,
    },
    /// A task a trusted servant reports under `id`, an id this (restarted)
    /// engine never issued, inside the adoption window (rule "adoption").
    Adopted { id: u64 },
}

/// A grant to make on `servant` (see `State::create_grant`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewGrant {
    pub servant: ServantKey,
    pub origin: Origin,
}

/// Why a grant ends (see `State::remove_grant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantEnd {
    /// Freed by its owner at `at`: the capacity is usable at once, and the
    /// time it was held tells its servant's speed (rule "observed speed").
    Freed { at: Instant },
    /// Released because the waiter it was made for was gone: the capacity
    /// is usable at once.
    Undelivered,
    /// A zombie its servant no longer reports.
    Reaped,
    /// An adopted grant its servant no longer reports.
    AdoptionEnded,
    /// Its servant expired or left.
    ServantGone,
}

/// What a renewal did (see `State::renew`).
pub(crate) enum Renewal {
    /// Renewed; `claimed` if the caller became the owner of an adopted
    /// grant, `moved` the new lease end if it changed.
    Renewed {
        claimed: bool,
        moved: Option<Instant>,
    },
    /// An id no servant reported yet, remembered (rule "early renewal").
    Remembered,
    /// Unknown, a zombie, or no room to remember it.
    NotRenewed,
    /// Someone else owns the id.
    Refused,
}

/// Every grant, with its lease deadline, the adoption window's memory and
/// the grant counters.
pub(crate) struct Grants {
    table: GrantTable,
    /// Lease ends of live (non-zombie) grants.
    deadlines: BTreeSet<(Instant, u64)>,
    /// What the adoption window after start remembers.
    adoption: AdoptionWindow,
    /// Lease given to adopted tasks.
    adopted_lease: Duration,
    /// The grant events of [`Counters`] (the other fields stay 0 here).
    counters: Counters,
}

impl Grants {
    pub(crate) fn new(config: &Config, now: Instant) -> Self {
        let limits = &config.limits;
        Grants {
            table: GrantTable::new(),
            deadlines: BTreeSet::new(),
            adoption: AdoptionWindow::new(
                later(now, config.adoption_window),
                now,
                AdoptionBounds {
                    max_retired: limits.max_adoption_retired_ids,
                    max_freed_early: limits.max_adoption_early_frees,
                    max_pending: limits.max_adoption_early_renewals,
                    max_pending_per_machine: limits.max_adoption_early_renewals_per_machine,
                },
            ),
            adopted_lease: config.adopted_lease,
            counters: Counters::default(),
        }
    }

    /// Number of grants (live, zombie, adopted).
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// True if the engine knows the id.
    pub(crate) fn contains(&self, id: u64) -> bool {
        self.table.contains_key(&id)
    }

    /// True if `id` is a live (not zombie) grant on `servant`.
    pub(crate) fn is_live_on(&self, id: u64, servant: ServantKey) -> bool {
        self.table
            .get(&id)
            .is_some_and(|g| g.servant == servant && !g.zombie)
    }

    /// [`Grants::is_live_on`], noting that its servant listed it.
    pub(crate) fn listed_live_on(&mut self, id: u64, servant: ServantKey) -> bool {
        match self.table.get_mut(&id) {
            Some(g) if g.servant == servant && !g.zombie => {
                g.listed = true;
                true
            }
            _ => false,
        }
    }

    /// Whether a reported unknown id may be adopted now (see `adoption`).
    pub(crate) fn may_adopt(&mut self, id: u64, now: Instant) -> bool {
        self.adoption.may_adopt(id, now)
    }

    /// Closes the adoption window, and frees its memory, once it is over.
    pub(crate) fn close_adoption_if_over(&mut self, now: Instant) {
        self.adoption.is_open(now);
    }

    /// The earliest lease end or end of the adoption window.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let lease = self.deadlines.first().map(|d| d.0);
        [lease, self.adoption.deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Takes the earliest lease deadline if it is at or before `now`.
    pub(crate) fn pop_expired(&mut self, now: Instant) -> Option<u64> {
        let &(at, id) = self.deadlines.first()?;
        if at > now {
            return None;
        }
        self.deadlines.pop_first();
        Some(id)
    }

    /// The grant events since start (other counters 0).
    pub(crate) fn counters(&self) -> Counters {
        self.counters
    }

    /// Ids remembered by the adoption window, for tests of its bound.
    #[cfg(test)]
    pub(crate) fn adoption_remembered(&self) -> usize {
        self.adoption.remembered()
    }

    /// Rule "adoption" (terms): the owner and lease end of a grant adopted
    /// now under `id`: `adopted_lease`, or longer if its owner renewed it
    /// before the servant reported it; that renewer owns it.
    pub(crate) fn adoption_terms(&mut self, id: u64, now: Instant) -> (Option<Owner>, Instant) {
        let early = self.adoption.take_pending(id);
        let lease_until = later(now, self.adopted_lease).max(early.map_or(now, |p| p.lease_until));
        (early.map(|p| p.owner), lease_until)
    }

    /// Stores a grant under a new id, or under `adopted_id`, with its lease
    /// deadline; returns the id. Only `State::create_grant` calls this.
    pub(crate) fn insert(&mut self, rec: GrantRec, adopted_id: Option<u64>) -> u64 {
        let lease_until = rec.lease_until;
        let id = match adopted_id {
            Some(id) => {
                self.table.insert_adopted(id, rec);
                self.counters.adoptions += 1;
                id
            }
            None => {
                self.counters.grants_issued += 1;
                self.table.insert_new(rec)
            }
        };
        self.deadlines.insert((lease_until, id));
        id
    }

    /// Takes a grant out of the table and its deadline; inside the adoption
    /// window the id is remembered so it is never adopted. Only
    /// `State::remove_grant` calls this.
    pub(crate) fn remove(&mut self, id: u64, end: GrantEnd) -> Option<GrantRec> {
        let g = self.table.remove(&id)?;
        if !g.zombie {
            self.deadlines.remove(&(g.lease_until, id));
        }
        self.adoption.retire(id);
        match end {
            GrantEnd::Freed { .. } | GrantEnd::Undelivered => self.counters.frees += 1,
            GrantEnd::Reaped => self.counters.zombies_reaped += 1,
            GrantEnd::AdoptionEnded => self.counters.adoptions_ended += 1,
            GrantEnd::ServantGone => {}
        }
        Some(g)
    }

    /// The grant records' part of rule "renew" (see `State::renew`).
    pub(crate) fn renew(
        &mut self,
        id: u64,
        caller: Owner,
        until: Instant,
        now: Instant,
    ) -> Renewal {
        let Some(g) = self.table.get_mut(&id) else {
            return match self.adoption.renew_early(id, caller, until, now) {
                Ok(true) => {
                    self.counters.early_renewals += 1;
                    Renewal::Remembered
                }
                Ok(false) => Renewal::NotRenewed,
                Err(()) => {
                    self.counters.renewals_refused += 1;
                    Renewal::Refused
                }
            };
        };
        if g.zombie {
            return Renewal::NotRenewed;
        }
        let mut claimed = false;
        match g.owner {
            Some(owner) if !owner.holds(&caller) => {
                self.counters.renewals_refused += 1;
                return Renewal::Refused;
            }
            Some(_) => {}
            None => {
                g.owner = Some(caller);
                claimed = true;
            }
        }
        let mut moved = None;
        if until != g.lease_until {
            self.deadlines.remove(&(g.lease_until, id));
            self.deadlines.insert((until, id));
            g.lease_until = until;
            moved = Some(until);
        }
        self.counters.renewals += 1;
        Renewal::Renewed { claimed, moved }
    }

    /// Who may free (rule "free"): the owner, or anyone if nobody owns the grant
    /// (adopted and not renewed); for an unknown id, see rule "early free".
    /// A refusal is counted.
    pub(crate) fn may_free(&mut self, id: u64, caller: Owner, now: Instant) -> bool {
        let allowed = match self.table.get(&id) {
            Some(g) => g.owner.is_none_or(|owner| owner.holds(&caller)),
            None => self.adoption.free_early(id, caller, now).is_ok(),
        };
        if !allowed {
            self.counters.frees_refused += 1;
        }
        allowed
    }

    /// The record's part of rule "lease expiry": the grant becomes a zombie.
    /// Returns its servant if it was live.
    pub(crate) fn zombify(&mut self, id: u64) -> Option<ServantKey> {
        let g = self.table.get_mut(&id)?;
        if g.zombie {
            return None;
        }
        g.zombie = true;
        self.counters.leases_expired += 1;
        Some(g.servant)
    }

    /// Every grant as people see it, oldest first.
    pub(crate) fn views(&self, now: Instant) -> Vec<GrantView> {
        let mut grants: Vec<GrantView> = self
            .table
            .iter()
            .map(|(id, g)| GrantView {
                id,
                requester: g.owner.map(|o| o.ip),
                servant: g.servant_addr,
                environment: g.environment.as_deref().map(str::to_owned),
                age: now.saturating_duration_since(g.granted_at),
                lease_left: if g.zombie {
                    Duration::ZERO
                } else {
                    g.lease_until.saturating_duration_since(now)
                },
                prefetch: g.prefetch,
                zombie: g.zombie,
                adopted: g.adopted,
            })
            .collect();
        grants.sort_unstable_by(|a, b| b.age.cmp(&a.age).then(a.id.cmp(&b.id)));
        grants
    }
}
