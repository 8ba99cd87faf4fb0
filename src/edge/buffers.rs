//! The budget of memory held by connections that have not yet made a
//! request: a partial HTTP head, a TLS handshake, an HTTP/2 preface. The
//! connection cap follows the descriptor limit, so without a bound of its
//! own 20,000 connections each holding a partial 64 KB head hold gigabytes.
//! A connection is charged from its accept until its first request starts
//! (then its bodies are in the body budget, [`super::budget`]): a fixed
//! cost, more for HTTP/2's state, and twice every byte read (buffers grow
//! by doubling). A connection whose charge does not fit is closed, so the
//! newest growth is what goes; each address block holds at most its share,
//! so attackers on a few addresses leave room for everyone else.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
};

use super::address_block;

/// Bytes all connections that have made no request yet may be charged
/// together. With the base cost, 32,768 such connections, or about 1,000
/// holding a 64 KB partial head each.
pub const CONNECTION_BUFFERS_BYTES: usize = 128 << 20;

/// The part of [`CONNECTION_BUFFERS_BYTES`] one address block may hold, as
/// a divisor: an eighth (16 MiB: 4,096 new connections of an office behind
/// one NAT address at the base cost).
pub const BUFFERS_ADDRESS_SHARE_DIVISOR: usize = 8;

/// What a connection costs before it sent anything: its task, socket and
/// first read buffer.
pub const PENDING_CONNECTION_BYTES: usize = 4 * 1024;

/// What an HTTP/2 connection's state costs beyond that (hyper's h2 codec
/// buffers and header tables), measured at about 46 KB a connection.
pub const PENDING_HTTP2_BYTES: usize = 48 * 1024;

/// The budget. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ConnectionBuffers {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    capacity: usize,
    share: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_block: HashMap<IpAddr, usize>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl ConnectionBuffers {
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Shared {
                capacity,
                share: capacity / BUFFERS_ADDRESS_SHARE_DIVISOR,
                held: Mutex::default(),
            }),
        }
    }

    /// The charge of a new connection from `peer`, at the base cost; None
    /// when it does not fit (the connection is then closed).
    pub fn admit(&self, peer: IpAddr) -> Option<BufferCharge> {
        let charge = BufferCharge {
            inner: Arc::new(Charge {
                budget: Arc::clone(&self.inner),
                block: address_block(peer),
                bytes: Mutex::new(0),
                released: AtomicBool::new(false),
            }),
        };
        charge.grow_to(PENDING_CONNECTION_BYTES).then_some(charge)
    }

    /// Bytes charged now.
    pub fn used(&self) -> usize {
        self.inner.lock().total
    }
}

/// One connection's charge, given back when its first request starts or
/// when it closes. Cheap to clone: the listener, the reads and the first
/// request share it.
#[derive(Debug, Clone)]
pub struct BufferCharge {
    inner: Arc<Charge>,
}

#[derive(Debug)]
struct Charge {
    budget: Arc<Shared>,
    block: IpAddr,
    bytes: Mutex<usize>,
    released: AtomicBool,
}

impl BufferCharge {
    /// Grows the charge to `total` bytes; false (unchanged) when the budget
    /// or the address's share cannot hold it. Always true once released.
    pub fn grow_to(&self, total: usize) -> bool {
        if self.is_released() {
            return true;
        }
        let mut bytes = self
            .inner
            .bytes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if total <= *bytes {
            return true;
        }
        let extra = total - *bytes;
        let budget = &self.inner.budget;
        let mut held = budget.lock();
        let block = held.by_block.get(&self.inner.block).copied().unwrap_or(0);
        if held.total + extra > budget.capacity || block + extra > budget.share {
            return false;
        }
        held.total += extra;
        *held.by_block.entry(self.inner.block).or_default() += extra;
        *bytes = total;
        true
    }

    /// Adds `extra` bytes to the charge.
    pub fn grow_by(&self, extra: usize) -> bool {
        let now = *self
            .inner
            .bytes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.grow_to(now.saturating_add(extra))
    }

    /// The connection made its first request: nothing more is charged.
    pub fn release(&self) {
        if !self.inner.released.swap(true, Ordering::AcqRel) {
            self.inner.give_back();
        }
    }

    pub fn is_released(&self) -> bool {
        self.inner.released.load(Ordering::Acquire)
    }
}

impl Charge {
    fn give_back(&self) {
        let mut bytes = self.bytes.lock().unwrap_or_else(PoisonError::into_inner);
        if *bytes == 0 {
            return;
        }
        let mut held = self.budget.lock();
        held.total -= *bytes;
        if let Some(block) = held.by_block.get_mut(&self.block) {
            *block -= *bytes;
            if *block == 0 {
                held.by_block.remove(&self.block);
            }
        }
        *bytes = 0;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn an_address_holds_its_share_and_others_still_connect() {
        let buffers = ConnectionBuffers::new(64 * PENDING_CONNECTION_BYTES);
        // 8 connections at the base cost fill an address's eighth.
        let mut attacker: Vec<_> = (0..8)
            .map(|_| buffers.admit(ip("10.0.0.66")).expect("within the share"))
            .collect();
        assert!(buffers.admit(ip("10.0.0.66")).is_none(), "over its share");
        assert!(!attacker[0].grow_by(1), "a held one cannot grow either");
        let other = buffers.admit(ip("10.0.0.2")).expect("another address fits");
        assert!(other.grow_to(4 * PENDING_CONNECTION_BYTES));
        assert_eq!(buffers.used(), 12 * PENDING_CONNECTION_BYTES);
        // Its first request: given back, and it grows without limit after.
        other.release();
        assert!(other.grow_to(1 << 30));
        assert_eq!(buffers.used(), 8 * PENDING_CONNECTION_BYTES);
        attacker.truncate(4);
        assert!(attacker[0].grow_by(4 * PENDING_CONNECTION_BYTES));
        drop((attacker, other));
        assert_eq!(buffers.used(), 0);
        assert!(buffers.inner.lock().by_block.is_empty());
    }

    #[test]
    fn the_whole_budget_bounds_many_addresses() {
        let buffers = ConnectionBuffers::new(64 * PENDING_CONNECTION_BYTES);
        let held: Vec<_> = (0..100)
            .filter_map(|n| buffers.admit(ip(&format!("10.0.1.{n}"))))
            .collect();
        assert_eq!(held.len(), 64);
        assert_eq!(buffers.used(), 64 * PENDING_CONNECTION_BYTES);
        drop(held);
        assert_eq!(buffers.used(), 0);
    }
}
