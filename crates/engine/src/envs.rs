//! Per-environment indexes and the placement rule.
//!
//! Every environment (compiler digest) has an ordered set of the servants that
//! offer it and have a free slot, keyed by `(tier, utilisation, registration)`.
//! Placement walks that set from the front, so a pick costs O(log n) plus the
//! few servants it must skip (the requester's own machine, servants older than
//! the request's `min_version`), never a scan of the cluster.
//!
//! Invariant: the key an environment holds for a servant is never greater
//! than the servant's true key (no free slot = infinitely great). Every change
//! that may lower a key (free, zombie reaped, heartbeat, registration) updates
//! all the servant's environments at once. A grant only raises its servant's
//! key, so it updates nothing: the first pick that meets the stale, too-low
//! entry moves it to its true place before going on. The first entry whose
//! key is current is then the true minimum, since every later entry's true
//! key is at least its held key. A grant therefore costs O(log n) for the one
//! environment that is picked from, not O(environments x log n), and a grant
//! followed by its free usually touches no index at all.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc;

use super::types::{EnvId, ServantKey, ServantPriority};
use super::wait_queues::WaitQueue;

/// One environment a servant offers, and what that environment's index
/// holds for the servant.
///
/// Held by the servant's record, written only here (by [`sync`],
/// [`detach`] and [`relink`]), so it always says what the indexes hold.
#[derive(Debug, Clone)]
pub(crate) struct EnvLink {
    name: Arc<str>,
    id: EnvId,
    /// Version counted in the environment's `accepting` map, if any.
    accepting: Option<u32>,
    /// Key held in the environment's free set (never above the true key).
    place: Option<PlaceKey>,
    /// Not yet counted in the environment (just added by a heartbeat).
    fresh: bool,
}

impl EnvLink {
    /// A link to an environment the servant just started offering.
    pub(crate) fn fresh(name: Arc<str>, id: EnvId) -> Self {
        EnvLink {
            name,
            id,
            accepting: None,
            place: None,
            fresh: true,
        }
    }

    /// The compiler digest.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The environment's slot.
    pub(crate) fn id(&self) -> EnvId {
        self.id
    }
}

/// Records, in a servant's sorted links, the key the free set of `env` now
/// holds for it (placement moved a stale entry to its true place).
pub(crate) fn relink(links: &mut [EnvLink], env: &str, place: Option<PlaceKey>) {
    if let Ok(i) = links.binary_search_by(|l| l.name.as_ref().cmp(env)) {
        links[i].place = place;
    }
}

/// A servant's environments, sorted by name.
pub(crate) type EnvList = Vec<EnvLink>;

/// Largest slot count the engine works with (2^31 - 1); capacities above
/// are clamped, which keeps the utilisation key below exact.
pub(crate) const MAX_SLOTS: u32 = (1 << 31) - 1;

/// Position of a servant with free capacity in an environment's free set: 24
/// bytes, compared field by field.
///
/// `class` orders by tier (rule "prefer dedicated"), then within a tier by
/// speed class (rule "observed speed"; always 0 without it); `rank` by
/// utilisation `granted / available`; `servant` (registration order) breaks
/// ties, earliest first.
///
/// Utilisation is compared exactly, without floats: `rank` holds
/// `floor(granted * 2^62 / available)`. With `0 <= granted < available <=
/// MAX_SLOTS < 2^31`, two different fractions differ by at least `1 / (a1 *
/// a2) > 2^-62`, so their scaled floors differ, and equal fractions give
/// equal values: the order is exactly that of cross-multiplication, at the
/// cost of one integer comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PlaceKey {
    pub class: u8,
    pub rank: u64,
    pub servant: ServantKey,
}

impl PlaceKey {
    /// Key of a servant with `granted < available <= MAX_SLOTS`, of speed
    /// class `speed` (at most `speed::MAX_CLASS`).
    pub(crate) fn new(
        tier: u8,
        speed: u8,
        granted: u32,
        available: u32,
        servant: ServantKey,
    ) -> Self {
        debug_assert!(granted < available && available <= MAX_SLOTS);
        debug_assert!(tier <= 1 && speed <= super::speed::MAX_CLASS);
        let util = ((u128::from(granted) << 62) / u128::from(available.max(1))) as u64;
        PlaceKey {
            class: (tier << 6) | speed,
            rank: util,
            servant,
        }
    }
}

/// Rule "prefer dedicated": a dedicated servant whose granted tasks are under
/// half its processors is tier 0; every other servant is tier 1. (The
/// requester's own machine, the last resort, is handled in [`pick`].)
pub(crate) fn tier(priority: ServantPriority, granted: u32, num_processors: u32) -> u8 {
    if priority == ServantPriority::Dedicated && u64::from(granted) * 2 < u64::from(num_processors)
    {
        0
    } else {
        1
    }
}

/// What one servant contributes to the index of each environment it offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Presence {
    /// `Some(version)` if the servant accepts tasks at all (`max_tasks > 0`).
    pub accepting: Option<u32>,
    /// Its key in the free set if it has a free slot right now.
    pub place: Option<PlaceKey>,
    /// Free slots (0 when `place` is `None`).
    pub free: u32,
}

impl Presence {
    /// A servant that is not in an environment at all.
    pub(crate) const ABSENT: Presence = Presence {
        accepting: None,
        place: None,
        free: 0,
    };
}

/// Everything the engine keeps per environment.
pub(crate) struct EnvEntry {
    name: Arc<str>,
    /// Live servants listing the environment (any capacity).
    offering: usize,
    /// Versions of the servants accepting tasks for it, with counts: answers
    /// "is there a servant with max_tasks > 0 and version >= v" in O(log n).
    accepting: BTreeMap<u32, usize>,
    /// Servants with a free slot, in placement order (held keys may lag
    /// below the true ones after grants; see the module documentation).
    free: BTreeSet<PlaceKey>,
    /// Queued requests, by machine (see `wait_queues` and `waiters`).
    waiters: WaitQueue,
}

impl EnvEntry {
    /// The compiler digest.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Live servants offering it (any capacity).
    pub(crate) fn offering(&self) -> usize {
        self.offering
    }

    /// True if some servant may have a free slot for it.
    pub(crate) fn has_free(&self) -> bool {
        !self.free.is_empty()
    }

    /// Its queued requests.
    pub(crate) fn queue(&self) -> &WaitQueue {
        &self.waiters
    }

    /// The first key of the free set after `after` (from the start if
    /// `None`), in placement order.
    pub(crate) fn free_after(&self, after: Option<PlaceKey>) -> Option<PlaceKey> {
        match after {
            None => self.free.first().copied(),
            Some(k) => self.free.range((Excluded(k), Unbounded)).next().copied(),
        }
    }

    /// Rule "environment available": some live servant offers it with
    /// `max_tasks > 0` and a version of at least `min_version`.
    pub(crate) fn available_for(&self, min_version: u32) -> bool {
        self.accepting.range(min_version..).next().is_some()
    }

    fn max_accepting(&self) -> Option<u32> {
        self.accepting.last_key_value().map(|(v, _)| *v)
    }
}

/// Environment slots, found by name once per request and by id afterwards.
#[derive(Default)]
pub(crate) struct Envs {
    slots: Vec<Option<EnvEntry>>,
    by_name: HashMap<Arc<str>, EnvId>,
    vacant: Vec<EnvId>,
}

impl Envs {
    /// The slot of an environment, if any servant or waiter uses it.
    pub(crate) fn lookup(&self, name: &str) -> Option<EnvId> {
        self.by_name.get(name).copied()
    }

    /// The slot of an environment, created if needed.
    pub(crate) fn intern(&mut self, name: &str) -> (Arc<str>, EnvId) {
        if let Some((n, id)) = self.by_name.get_key_value(name) {
            return (n.clone(), *id);
        }
        let name: Arc<str> = Arc::from(name);
        let entry = EnvEntry {
            name: name.clone(),
            offering: 0,
            accepting: BTreeMap::new(),
            free: BTreeSet::new(),
            waiters: WaitQueue::default(),
        };
        let id = match self.vacant.pop() {
            Some(id) => {
                self.slots[id] = Some(entry);
                id
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        };
        self.by_name.insert(name.clone(), id);
        (name, id)
    }

    /// The entry in a slot; `None` if the slot was dropped.
    pub(crate) fn get(&self, id: EnvId) -> Option<&EnvEntry> {
        self.slots.get(id).and_then(Option::as_ref)
    }

    fn get_mut(&mut self, id: EnvId) -> Option<&mut EnvEntry> {
        self.slots.get_mut(id).and_then(Option::as_mut)
    }

    /// Replaces a key of `env`'s free set that is not its servant's true key
    /// (a servant gone, or its key raised by grants: see the module
    /// documentation) by the true one, if the servant has a free slot.
    pub(crate) fn correct_free(&mut self, env: EnvId, held: PlaceKey, truth: Option<PlaceKey>) {
        if let Some(entry) = self.get_mut(env) {
            entry.free.remove(&held);
            if let Some(t) = truth {
                entry.free.insert(t);
            }
        }
    }

    /// The queue of a live slot: `WaitQueues` changes it, nothing else.
    pub(crate) fn queue_mut(&mut self, id: EnvId) -> Option<&mut WaitQueue> {
        self.get_mut(id).map(|e| &mut e.waiters)
    }

    /// Drops a slot that no servant offers and no request waits for.
    pub(crate) fn drop_if_unused(&mut self, id: EnvId) {
        let unused = matches!(self.get(id), Some(e) if e.offering == 0 && e.waiters.is_empty());
        if unused && let Some(entry) = self.slots[id].take() {
            self.by_name.remove(&entry.name);
            self.vacant.push(id);
        }
    }

    /// Live entries, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &EnvEntry> {
        self.slots.iter().flatten()
    }

    /// Every live slot id (shutdown, a rebase of the tenants' clock).
    pub(crate) fn ids(&self) -> Vec<EnvId> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].is_some())
            .collect()
    }
}

/// Follow-up work an index change asks for, done once the change is complete.
#[derive(Default)]
pub(crate) struct Effects {
    /// Environments that gained usable capacity while requests are queued.
    pub serve: Vec<EnvId>,
    /// Environments whose newest accepting version dropped while requests are queued.
    pub lost: Vec<EnvId>,
    /// Environments a servant stopped offering (may now be unused).
    pub left: Vec<EnvId>,
}

/// Brings every environment of one servant up to date with its presence,
/// which changed from `old` to `new` (both true, as computed from the
/// servant). O(environments x log n); free when nothing changed.
pub(crate) fn sync(
    envs: &mut Envs,
    links: &mut [EnvLink],
    old: Presence,
    new: Presence,
    fx: &mut Effects,
) {
    for link in links.iter_mut() {
        let Some(entry) = envs.get_mut(link.id) else {
            continue;
        };
        let was = if link.fresh {
            link.fresh = false;
            entry.offering += 1;
            Presence::ABSENT
        } else {
            old
        };
        if link.accepting != new.accepting {
            let max_before = entry.max_accepting();
            if let Some(v) = link.accepting {
                uncount(entry, v);
            }
            if let Some(v) = new.accepting {
                *entry.accepting.entry(v).or_insert(0) += 1;
            }
            link.accepting = new.accepting;
            if entry.max_accepting() < max_before && !entry.waiters.is_empty() {
                fx.lost.push(link.id);
            }
        }
        if link.place != new.place {
            if let Some(k) = link.place {
                entry.free.remove(&k);
            }
            if let Some(k) = new.place {
                entry.free.insert(k);
            }
            link.place = new.place;
        }
        // Rule "serve on new capacity": more free slots, a new servant or
        // environment, or a newer version may satisfy a queued request.
        if new.place.is_some()
            && (was.place.is_none() || new.free > was.free || new.accepting > was.accepting)
            && !entry.waiters.is_empty()
        {
            fx.serve.push(link.id);
        }
    }
}

/// Takes a servant out of the given environments (it stopped offering them
/// or is gone).
pub(crate) fn detach(envs: &mut Envs, links: &[EnvLink], fx: &mut Effects) {
    for link in links {
        if link.fresh {
            continue;
        }
        let Some(entry) = envs.get_mut(link.id) else {
            continue;
        };
        entry.offering -= 1;
        fx.left.push(link.id);
        if let Some(k) = link.place {
            entry.free.remove(&k);
        }
        if let Some(v) = link.accepting {
            let max_before = entry.max_accepting();
            uncount(entry, v);
            if entry.max_accepting() < max_before && !entry.waiters.is_empty() {
                fx.lost.push(link.id);
            }
        }
    }
}

fn uncount(entry: &mut EnvEntry, version: u32) {
    if let Some(count) = entry.accepting.get_mut(&version) {
        *count -= 1;
        if *count == 0 {
            entry.accepting.remove(&version);
        }
    }
}
