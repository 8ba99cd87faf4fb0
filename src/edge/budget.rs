//! The budget of request bytes buffered (`--max_buffered_body_bytes`),
//! charged to whoever sends them. Each connection first buffers within its
//! own [`CONNECTION_BODY_BYTES`]; beyond it a body draws on the general pool
//! within its address block's share (and, while its connection has proved
//! no token, within the strangers' share of all strangers together). A part
//! of the budget is kept back for the addresses registered servants
//! heartbeat from: a daemon's largest call (a heartbeat reporting up to
//! 8,192 running tasks, about 1 MB) must fit even on a new connection,
//! whatever anyone else sends, or the scheduler loses every task the
//! servant runs.

use std::{
    collections::HashMap,
    fmt,
    net::IpAddr,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
};

use super::{CONNECTION_BODY_BYTES, Proof, address_block};

/// The part of the general pool that connections which have not proved
/// themselves ([`Proof`]) may hold together, as a divisor of the budget: a
/// quarter. A flood of stalled bodies from strangers on many addresses
/// leaves the rest to the servants and delegates that proved a token.
pub const STRANGERS_SHARE_DIVISOR: usize = 4;

/// The part of the general pool one address block ([`address_block`]) may
/// hold, as a divisor of the budget: an eighth. One attacker, with a token
/// or without, leaves seven eighths to everyone else; an office behind one
/// NAT address still buffers 4 MiB beyond its connections' own allowances
/// under the default budget.
pub const ADDRESS_SHARE_DIVISOR: usize = 8;

/// The part of the budget kept for the addresses of registered servants, as
/// a divisor: a quarter (8 MiB by default, eight of the largest
/// heartbeats). Nobody else draws on it, so servants' heartbeats fit when
/// others have taken the general pool, from any number of addresses and
/// with any token.
pub const SERVANTS_RESERVE_DIVISOR: usize = 4;

/// The part of the servants' reserve one servant address may hold, as a
/// divisor of the reserve: two of the largest heartbeats at once by
/// default, so that a host shared with an attacker cannot take it all.
const SERVANT_HOST_SHARE_DIVISOR: usize = 4;

/// Whether an IP address is a registered servant's: the engine's view
/// ([`crate::engine::ServantHosts`]), as a plain function so the edge needs
/// nothing of the engine.
pub type ServantCheck = Arc<dyn Fn(IpAddr) -> bool + Send + Sync>;

/// The global budget of request bytes. Cheap to clone.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    pools: Arc<Pools>,
}

struct Pools {
    limits: Limits,
    held: Mutex<Held>,
    is_servant: ServantCheck,
}

impl fmt::Debug for Pools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pools")
            .field("limits", &self.limits)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    general: usize,
    strangers: usize,
    address: usize,
    reserve: usize,
    servant_host: usize,
}

/// What is held now, in each pool and by each address block.
#[derive(Debug, Default)]
struct Held {
    general: usize,
    strangers: usize,
    reserve: usize,
    by_block: HashMap<IpAddr, ByBlock>,
}

#[derive(Debug, Default, Clone, Copy)]
struct ByBlock {
    general: usize,
    reserve: usize,
}

/// Who a connection's bytes are charged to.
#[derive(Debug, Clone)]
struct Sender {
    ip: IpAddr,
    block: IpAddr,
    proof: Proof,
}

/// Where the bytes of one draw came from.
enum Drawn {
    General { stranger: bool },
    Reserve,
}

impl Pools {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `bytes` for `sender` whole, from the general pool if its
    /// shares allow, else from the servants' reserve if it is a servant's
    /// address; None when neither holds them.
    fn take(&self, bytes: usize, sender: Option<&Sender>) -> Option<Drawn> {
        let limits = self.limits;
        let stranger = sender.is_some_and(|sender| !sender.proof.is_proved());
        {
            let mut held = self.lock();
            let fits = held.general + bytes <= limits.general
                && (!stranger || held.strangers + bytes <= limits.strangers)
                && sender.is_none_or(|sender| {
                    let block = held
                        .by_block
                        .get(&sender.block)
                        .copied()
                        .unwrap_or_default();
                    block.general + bytes <= limits.address
                });
            if fits {
                held.general += bytes;
                if stranger {
                    held.strangers += bytes;
                }
                if let Some(sender) = sender {
                    held.by_block.entry(sender.block).or_default().general += bytes;
                }
                return Some(Drawn::General { stranger });
            }
        }
        // Asked outside the lock: the engine's view takes a lock of its own.
        let sender = sender?;
        if !(self.is_servant)(sender.ip) {
            return None;
        }
        let mut held = self.lock();
        let in_reserve = held.reserve;
        let block = held.by_block.entry(sender.block).or_default();
        if in_reserve + bytes > limits.reserve || block.reserve + bytes > limits.servant_host {
            if block.general == 0 && block.reserve == 0 {
                held.by_block.remove(&sender.block);
            }
            return None;
        }
        block.reserve += bytes;
        held.reserve += bytes;
        Some(Drawn::Reserve)
    }

    fn give_back(&self, taken: &Reservation) {
        if taken.general_bytes == 0 && taken.reserve_bytes == 0 {
            return;
        }
        let mut held = self.lock();
        held.general -= taken.general_bytes;
        held.strangers -= taken.strangers_bytes;
        held.reserve -= taken.reserve_bytes;
        if let Some(sender) = &taken.sender
            && let Some(block) = held.by_block.get_mut(&sender.block)
        {
            block.general -= taken.general_bytes;
            block.reserve -= taken.reserve_bytes;
            if block.general == 0 && block.reserve == 0 {
                held.by_block.remove(&sender.block);
            }
        }
    }
}

/// A connection's own allowance: bytes that may be taken, and how many are.
#[derive(Debug)]
struct Allowance {
    capacity: usize,
    used: AtomicUsize,
}

impl Allowance {
    fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Allowance {
            capacity,
            used: AtomicUsize::new(0),
        })
    }

    /// Takes as much of `bytes` as is left; returns what it took.
    fn take_up_to(&self, bytes: usize) -> usize {
        let before = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used < self.capacity).then(|| used + bytes.min(self.capacity - used))
            })
            .unwrap_or(self.capacity);
        bytes.min(self.capacity.saturating_sub(before))
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Request bytes taken from a connection's allowance and the pools, given
/// back on drop.
#[derive(Debug)]
pub struct Reservation {
    pools: Arc<Pools>,
    /// The connection's allowance; None for a request served without one.
    own: Option<Arc<Allowance>>,
    /// None for a request served without a connection: trusted, charged to
    /// no address. Shared, so that a call carrying its reservation stays
    /// small.
    sender: Option<Arc<Sender>>,
    own_bytes: usize,
    general_bytes: usize,
    /// Of `general_bytes`, those counted in the strangers' share too.
    strangers_bytes: usize,
    reserve_bytes: usize,
}

impl BodyBudget {
    /// A budget of `capacity` bytes beyond the connections' own allowances,
    /// with no servant known (see [`BodyBudget::with_servants`]).
    pub fn new(capacity: usize) -> Self {
        Self::with_servants(capacity, Arc::new(|_| false))
    }

    /// A budget of `capacity` bytes whose servants' reserve serves the
    /// addresses `is_servant` says are registered servants'.
    pub fn with_servants(capacity: usize, is_servant: ServantCheck) -> Self {
        let reserve = capacity / SERVANTS_RESERVE_DIVISOR;
        let limits = Limits {
            general: capacity - reserve,
            strangers: capacity / STRANGERS_SHARE_DIVISOR,
            address: capacity / ADDRESS_SHARE_DIVISOR,
            reserve,
            servant_host: reserve / SERVANT_HOST_SHARE_DIVISOR,
        };
        Self {
            pools: Arc::new(Pools {
                limits,
                held: Mutex::default(),
                is_servant,
            }),
        }
    }

    /// Reserves room for `bytes` of a request that came with no connection
    /// of its own (every byte from the general pool), or None when it
    /// cannot hold them.
    pub fn reserve(&self, bytes: usize) -> Option<Reservation> {
        let mut reservation = Reservation::new(&self.pools, None, None);
        reservation.grow_to(bytes).then_some(reservation)
    }

    /// Bytes reserved right now, beyond the connections' own allowances.
    pub fn used(&self) -> usize {
        let held = self.pools.lock();
        held.general + held.reserve
    }
}

/// One connection's share of request bytes: its own
/// [`CONNECTION_BODY_BYTES`] first, then the pools, charged to its address
/// and standing. Cheap to clone; every request on the connection (every
/// HTTP/2 stream) draws from it.
#[derive(Debug, Clone)]
pub struct ConnectionBudget {
    pools: Arc<Pools>,
    own: Arc<Allowance>,
    sender: Arc<Sender>,
}

impl ConnectionBudget {
    /// The budget of a connection from `peer` whose standing is `proof`.
    pub fn new(global: &BodyBudget, peer: IpAddr, proof: Proof) -> Self {
        let ip = peer.to_canonical();
        Self {
            pools: Arc::clone(&global.pools),
            own: Allowance::new(CONNECTION_BODY_BYTES),
            sender: Arc::new(Sender {
                ip,
                block: address_block(ip),
                proof,
            }),
        }
    }

    /// The connection's standing, which a call that proves a token marks.
    pub fn proof(&self) -> &Proof {
        &self.sender.proof
    }

    /// Reserves room for `bytes` of a request, or None when the
    /// connection's allowance and the pools together cannot hold it.
    pub fn reserve(&self, bytes: usize) -> Option<Reservation> {
        let mut reservation = Reservation::new(
            &self.pools,
            Some(Arc::clone(&self.own)),
            Some(Arc::clone(&self.sender)),
        );
        reservation.grow_to(bytes).then_some(reservation)
    }
}

impl Reservation {
    fn new(pools: &Arc<Pools>, own: Option<Arc<Allowance>>, sender: Option<Arc<Sender>>) -> Self {
        Reservation {
            pools: Arc::clone(pools),
            own,
            sender,
            own_bytes: 0,
            general_bytes: 0,
            strangers_bytes: 0,
            reserve_bytes: 0,
        }
    }

    /// Grows the reservation to cover `total` bytes so far; false (and
    /// unchanged) when the budget cannot hold it.
    pub fn grow_to(&mut self, total: usize) -> bool {
        let held = self.own_bytes + self.general_bytes + self.reserve_bytes;
        if total <= held {
            return true;
        }
        let extra = total - held;
        let from_own = self.own.as_ref().map_or(0, |own| own.take_up_to(extra));
        let from_pools = extra - from_own;
        if from_pools > 0 {
            match self.pools.take(from_pools, self.sender.as_deref()) {
                Some(Drawn::General { stranger }) => {
                    self.general_bytes += from_pools;
                    if stranger {
                        self.strangers_bytes += from_pools;
                    }
                }
                Some(Drawn::Reserve) => self.reserve_bytes += from_pools,
                None => {
                    if let Some(own) = &self.own {
                        own.give_back(from_own);
                    }
                    return false;
                }
            }
        }
        self.own_bytes += from_own;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.pools.give_back(self);
        if let Some(own) = &self.own {
            own.give_back(self.own_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: usize = 1024;

    fn from(budget: &BodyBudget, ip: &str, proof: &Proof) -> ConnectionBudget {
        ConnectionBudget::new(budget, ip.parse().unwrap(), proof.clone())
    }

    fn held(budget: &BodyBudget) -> (usize, usize, usize, usize) {
        let held = budget.pools.lock();
        (
            held.general,
            held.strangers,
            held.reserve,
            held.by_block.len(),
        )
    }

    #[test]
    fn a_connection_buffers_its_allowance_then_draws_on_the_pools() {
        let budget = BodyBudget::new(64 * CONNECTION_BODY_BYTES);
        let first = from(&budget, "10.0.0.1", &Proof::proved());
        // Many small requests on one connection (HTTP/2 streams) share its
        // allowance: it is per connection, not per request.
        let small: Vec<_> = (0..64)
            .map(|_| first.reserve(KIB).expect("within the allowance"))
            .collect();
        assert_eq!(budget.used(), 0);
        let over = first.reserve(1000).expect("from the general pool");
        assert_eq!(budget.used(), 1000, "every byte past the allowance counts");
        drop(small);
        let mut growing = first.reserve(0).expect("nothing yet");
        assert!(
            growing.grow_to(CONNECTION_BODY_BYTES),
            "the allowance is back"
        );
        assert_eq!(budget.used(), 1000);
        assert!(growing.grow_to(3 * CONNECTION_BODY_BYTES));
        assert_eq!(budget.used(), 1000 + 2 * CONNECTION_BODY_BYTES);
        drop((over, growing));
        assert_eq!(held(&budget), (0, 0, 0, 0), "everything given back");
        assert_eq!(first.own.used.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn one_address_with_a_token_or_without_takes_its_share_and_no_more() {
        // 8 MiB: 6 MiB general, strangers 2 MiB, 1 MiB an address.
        let budget = BodyBudget::new(128 * CONNECTION_BODY_BYTES);
        let share = 16 * CONNECTION_BODY_BYTES;
        for proof in [Proof::stranger(), Proof::proved()] {
            let attacker: Vec<_> = (0..40)
                .map(|_| from(&budget, "10.0.0.66", &proof))
                .collect();
            let mut held_by_attacker: Vec<_> = attacker
                .iter()
                .filter_map(|connection| connection.reserve(2 * CONNECTION_BODY_BYTES))
                .collect();
            assert_eq!(
                held_by_attacker.len(),
                16,
                "{proof:?}: its share, then refused"
            );
            assert_eq!(budget.used(), share);
            // The same address on IPv6-mapped form is the same block.
            let mapped = from(&budget, "::ffff:10.0.0.66", &proof);
            assert!(mapped.reserve(2 * CONNECTION_BODY_BYTES).is_none());
            // A daemon's large heartbeat on a new connection from another
            // address fits, before it proved anything.
            let daemon = from(&budget, "10.0.0.2", &Proof::stranger());
            let heartbeat = daemon.reserve(900 * KIB).expect("another address fits");
            held_by_attacker.clear();
            drop(heartbeat);
            assert_eq!(held(&budget), (0, 0, 0, 0));
        }
    }

    #[test]
    fn strangers_on_many_addresses_share_a_quarter_and_proved_connections_the_rest() {
        let budget = BodyBudget::new(128 * CONNECTION_BODY_BYTES);
        let strangers_share = 32 * CONNECTION_BODY_BYTES;
        let mut held_by_strangers = Vec::new();
        for address in 1..=8 {
            let connection = from(&budget, &format!("10.0.1.{address}"), &Proof::stranger());
            while let Some(reservation) = connection.reserve(2 * CONNECTION_BODY_BYTES) {
                held_by_strangers.push(reservation);
            }
        }
        assert_eq!(
            held(&budget).1,
            strangers_share,
            "the strangers' share is full"
        );
        // A connection that proves its token gets past it.
        let proof = Proof::stranger();
        let daemon = from(&budget, "10.0.2.1", &proof);
        assert!(daemon.reserve(2 * CONNECTION_BODY_BYTES).is_none());
        proof.mark();
        let heartbeat = daemon
            .reserve(8 * CONNECTION_BODY_BYTES)
            .expect("a large heartbeat of a proved servant");
        assert_eq!(budget.used(), strangers_share + 7 * CONNECTION_BODY_BYTES);
        drop((held_by_strangers, heartbeat));
        assert_eq!(held(&budget), (0, 0, 0, 0));
    }

    #[test]
    fn registered_servants_heartbeats_fit_when_others_took_the_general_pool() {
        let servant: IpAddr = "10.0.3.1".parse().unwrap();
        // The default: 24 MiB general, 4 MiB an address, 8 MiB kept for
        // servants, 2 MiB for one servant address.
        let budget = BodyBudget::with_servants(
            512 * CONNECTION_BODY_BYTES,
            Arc::new(move |ip| ip == servant),
        );
        // Eight addresses with a proved token take the whole general pool.
        let mut taken = Vec::new();
        for address in 1..=8 {
            let connection = from(&budget, &format!("10.0.4.{address}"), &Proof::proved());
            while let Some(reservation) = connection.reserve(2 * CONNECTION_BODY_BYTES) {
                taken.push(reservation);
            }
        }
        assert!(
            held(&budget).0 >= 383 * CONNECTION_BODY_BYTES,
            "the general pool is full: {:?}",
            held(&budget)
        );
        let stranger = from(&budget, "10.0.3.2", &Proof::stranger());
        assert!(stranger.reserve(900 * KIB).is_none(), "no room for others");
        // The servant, on a new connection that proved nothing yet, fits
        // its largest heartbeat in the reserve, twice at once, not more.
        let first = from(&budget, "10.0.3.1", &Proof::stranger());
        let second = from(&budget, "10.0.3.1", &Proof::stranger());
        let heartbeats = (
            first.reserve(900 * KIB).expect("the reserve holds it"),
            second.reserve(900 * KIB).expect("and a second one"),
        );
        assert_eq!(held(&budget).2, 2 * (900 * KIB - CONNECTION_BODY_BYTES));
        let third = from(&budget, "10.0.3.1", &Proof::stranger());
        assert!(
            third.reserve(900 * KIB).is_none(),
            "one servant address holds at most its part of the reserve"
        );
        drop((taken, heartbeats));
        assert_eq!(held(&budget), (0, 0, 0, 0));
    }

    #[test]
    fn a_request_without_a_connection_counts_every_byte() {
        let budget = BodyBudget::new(1000);
        let reservation = budget.reserve(10).expect("fits");
        assert_eq!(budget.used(), 10);
        assert!(budget.reserve(741).is_none(), "beyond the general pool");
        drop(reservation);
        assert_eq!(budget.used(), 0);
    }
}
