//! Grants: ids, leases, renewals, frees and zombies.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::placement::{Effects, EnvId, sync};
use super::requesters::Owner;
use super::servants::ServantKey;
use super::state::{State, later};
use super::types::Grant;

/// One grant the engine counts against a servant.
pub(crate) struct GrantRec {
    pub servant: ServantKey,
    pub servant_addr: SocketAddr,
    /// Who received it; `None` for an adopted grant nobody renewed yet.
    pub owner: Option<Owner>,
    /// `None` for adopted grants.
    pub environment: Option<Arc<str>>,
    pub granted_at: Instant,
    /// Meaningless once `zombie` is set.
    pub lease_until: Instant,
    pub prefetch: bool,
    /// Lease ended; still counts until the servant stops reporting it.
    pub zombie: bool,
    pub adopted: bool,
}

/// Bits of a grant id that locate its record in the table (up to 2^20
/// slots); the other 44 bits are random.
const SLOT_BITS: u32 = 20;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

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
/// Rule "grant ids": an id is 44 bits drawn from `rand` (a CSPRNG) followed
/// by 20 bits that are the record's slot XOR a pad derived from the random
/// bits and a per-engine secret. So the whole id looks random, a guess hits a
/// live grant with probability about 2^-44, it is never 0, and it is re-drawn
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
                    let id: u64 = rand::random();
                    if id != 0 && !self.contains_key(&id) {
                        break id;
                    }
                };
                self.insert_adopted(id, rec);
                return id;
            }
        };
        let id = loop {
            let high = rand::random::<u64>() >> SLOT_BITS;
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

impl State {
    /// Makes one grant on `key` for environment `env`; lease runs from now.
    /// Only reduces free capacity, so it never triggers serving.
    pub(crate) fn grant_on(
        &mut self,
        key: ServantKey,
        env: EnvId,
        owner: Owner,
        lease: Duration,
        prefetch: bool,
        now: Instant,
    ) -> Grant {
        let lease_until = later(now, lease);
        let environment = self.envs.get(env).map(|e| e.name.clone());
        let servant = self
            .servants
            .get(&key)
            .expect("placement returns live servants")
            .observed;
        let id = self.grants.insert_new(GrantRec {
            servant: key,
            servant_addr: servant,
            owner: Some(owner),
            environment,
            granted_at: now,
            lease_until,
            prefetch,
            zombie: false,
            adopted: false,
        });
        let s = self.servants.get_mut(&key).expect("checked above");
        s.grants.insert(id);
        s.ever_assigned += 1;
        // A grant only raises the servant's key: the indexes may lag (see
        // `placement`), so no environment is touched here.
        s.repose();
        self.grant_deadlines.insert((lease_until, id));
        self.note_deadline(lease_until);
        self.counters.grants_issued += 1;
        self.requesters.granted(owner.ip);
        Grant {
            id,
            servant,
            prefetch,
        }
    }

    /// Rule "renew": true if the grant is live and `caller` owns it (lease =
    /// now + `lease`); false if unknown, a zombie, or owned by someone else
    /// (rule "grant ownership": counted as refused). An adopted grant belongs
    /// to its first renewer. Inside the adoption window an id no servant
    /// reported yet is remembered and answered true (rule "early renewal").
    pub(crate) fn renew(&mut self, id: u64, caller: Owner, lease: Duration, now: Instant) -> bool {
        let until = later(now, lease);
        let Some(g) = self.grants.get_mut(&id) else {
            return match self.adoption.renew_early(id, caller, until, now) {
                Ok(remembered) => {
                    if remembered {
                        self.counters.early_renewals += 1;
                    }
                    remembered
                }
                Err(()) => {
                    self.refuse(caller);
                    false
                }
            };
        };
        if g.zombie {
            return false;
        }
        match g.owner {
            Some(owner) if owner != caller => {
                self.counters.renewals_refused += 1;
                self.requesters.refused(caller.ip);
                return false;
            }
            Some(_) => {}
            None => {
                g.owner = Some(caller);
                self.requesters.adopted_by(caller.ip);
            }
        }
        if until != g.lease_until {
            self.grant_deadlines.remove(&(g.lease_until, id));
            self.grant_deadlines.insert((until, id));
            g.lease_until = until;
            self.note_deadline(until);
        }
        self.counters.renewals += 1;
        true
    }

    /// A renewal refused because `caller` does not own the id.
    fn refuse(&mut self, caller: Owner) {
        self.counters.renewals_refused += 1;
        self.requesters.refused(caller.ip);
    }

    /// Rule "free": releases every known id (zombies too) that `caller` owns
    /// (or that nobody owns: adopted and not renewed), skipping unknown ids
    /// and, counted as refused, ids someone else owns, without stopping;
    /// then serves queued requests that the released capacity can satisfy.
    /// Inside the adoption window an unknown id is remembered as freed, so a
    /// late report cannot bring it back (rule "early free").
    pub(crate) fn free_ids(&mut self, ids: &[u64], caller: Owner, now: Instant) {
        let mut fx = Effects::default();
        for &id in ids {
            let allowed = match self.grants.get(&id) {
                Some(g) => g.owner.is_none_or(|owner| owner == caller),
                None => self.adoption.free_early(id, caller, now).is_ok(),
            };
            if !allowed {
                self.counters.frees_refused += 1;
                self.requesters.refused(caller.ip);
            } else if self.release(id, &mut fx) {
                self.counters.frees += 1;
            }
        }
        self.apply(fx, now);
    }

    /// Forgets one grant and returns its slot to the indexes; false if unknown.
    pub(crate) fn release(&mut self, id: u64, fx: &mut Effects) -> bool {
        let Some(g) = self.forget(id) else {
            return false;
        };
        if let Some(s) = self.servants.get_mut(&g.servant) {
            s.grants.remove(&id);
            s.zombies.remove(&id);
            s.adopted.remove(&id);
            let (old, new) = s.repose();
            sync(&mut self.envs, &mut s.envs, old, new, fx);
        }
        true
    }

    /// The one way a grant leaves the table: its lease deadline, its owner's
    /// count and, inside the adoption window, a note never to adopt the id.
    /// The caller updates the servant.
    pub(crate) fn forget(&mut self, id: u64) -> Option<GrantRec> {
        let g = self.grants.remove(&id)?;
        if !g.zombie {
            self.grant_deadlines.remove(&(g.lease_until, id));
        }
        if let Some(owner) = g.owner {
            self.requesters.released(owner.ip);
        }
        self.adoption.retire(id);
        Some(g)
    }

    /// Rule "lease expiry": the grant becomes a zombie; it keeps counting
    /// against its servant until a heartbeat no longer lists it.
    pub(crate) fn zombify(&mut self, id: u64) {
        if let Some(g) = self.grants.get_mut(&id) {
            if g.zombie {
                return;
            }
            g.zombie = true;
            if let Some(s) = self.servants.get_mut(&g.servant) {
                s.zombies.insert(id);
            }
            self.counters.leases_expired += 1;
        }
    }
}
