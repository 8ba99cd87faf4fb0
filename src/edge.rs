//! The edge's limits, shared by every protocol: the settings (one flag each,
//! see `config.rs`) and the global budget of bytes buffered for requests that
//! have not finished arriving. A leaf: the listener (`net`), the daemons'
//! protocols (`daemon`) and the HTTP protocols read it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

/// Bodies up to this size are never counted against the budget: every call a
/// daemon makes is far smaller, so a flood of large stalled bodies cannot
/// starve them. Their memory is bounded by the connection caps instead.
pub const SMALL_BODY_BYTES: usize = 64 * 1024;

/// Calls one daemon connection may have in flight; more are answered
/// "overloaded" (status 11) at once. A daemon runs one long poll per compiler
/// plus a handful of periodic calls, far below this.
pub const MAX_CALLS_IN_FLIGHT_PER_CONNECTION: usize = 1024;

/// File descriptors kept back from the connection cap for everything else
/// the process opens (listener, runtime, logs), so that an over-cap client can
/// still be accepted and closed instead of waiting in the backlog.
pub const RESERVED_FDS: u64 = 64;

/// Limits at the edge. Defaults are the flags' defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeSettings {
    /// From a connection's (or request's) first byte to its complete head: an
    /// HTTP header block, or a frame's 16-byte header and meta.
    pub header_read_timeout: Duration,
    /// From a complete head to the last byte of its body or payload.
    pub body_read_timeout: Duration,
    /// A daemon connection with nothing in flight and no byte for this long is
    /// closed. (On the general HTTP path hyper closes a keep-alive connection
    /// after the header-read timeout.)
    pub idle_timeout: Duration,
    /// Open connections at most; None: derived from the file-descriptor limit.
    pub max_connections: Option<usize>,
    /// Open connections from one address block at most (see [`address_block`]).
    pub max_connections_per_ip: usize,
    /// Bytes buffered at most for bodies larger than [`SMALL_BODY_BYTES`]
    /// that are still arriving. The daemons' protocols (`flare`, `http+pb`)
    /// keep a body's share until its call is answered; the general HTTP path
    /// (hyper) gives it back once the body is read, so bodies being served
    /// there are bounded by the connection caps instead.
    pub max_buffered_body_bytes: usize,
    /// After a shutdown signal, how long connections may drain.
    pub shutdown_grace: Duration,
}

/// The shortest idle timeout allowed: stock daemons recycle idle connections
/// after 45 s and expect the server to keep them 60 s.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

impl Default for EdgeSettings {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(90),
            max_connections: None,
            max_connections_per_ip: 256,
            max_buffered_body_bytes: 32 << 20,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl EdgeSettings {
    /// The connection cap: the configured one, or the file-descriptor limit
    /// less [`RESERVED_FDS`].
    pub fn connection_cap(&self) -> usize {
        self.max_connections.unwrap_or_else(|| {
            let soft = rlimit::Resource::NOFILE
                .get()
                .map_or(1024, |(soft, _hard)| soft);
            usize::try_from(soft.saturating_sub(RESERVED_FDS).max(16)).unwrap_or(usize::MAX)
        })
    }
}

/// Raises the soft file-descriptor limit to the hard one, so the connection
/// cap is as high as the operator allows. Returns the new soft limit.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

/// The global budget for large bodies. Cheap to clone.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    inner: Arc<Budget>,
}

#[derive(Debug)]
struct Budget {
    capacity: usize,
    used: AtomicUsize,
}

/// Bytes taken from a [`BodyBudget`], given back on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: usize,
}

impl BodyBudget {
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Budget {
                capacity,
                used: AtomicUsize::new(0),
            }),
        }
    }

    /// Reserves room for a body of `bytes`, or None when the budget cannot
    /// hold it. Small bodies are free.
    pub fn reserve(&self, bytes: usize) -> Option<Reservation> {
        let mut reservation = Reservation {
            budget: Arc::clone(&self.inner),
            bytes: 0,
        };
        reservation.grow_to(bytes).then_some(reservation)
    }

    /// Bytes reserved right now.
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Relaxed)
    }
}

impl Reservation {
    /// Grows the reservation to cover a body of `total` bytes so far;
    /// false (and unchanged) when the budget cannot hold it.
    pub fn grow_to(&mut self, total: usize) -> bool {
        let wanted = total.saturating_sub(SMALL_BODY_BYTES);
        if wanted <= self.bytes {
            return true;
        }
        let extra = wanted - self.bytes;
        let budget = &self.budget;
        let taken = budget
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(extra)
                    .filter(|&after| after <= budget.capacity)
            })
            .is_ok();
        if taken {
            self.bytes = wanted;
        }
        taken
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The block the per-address cap counts: an IPv4 address (IPv4-mapped IPv6
/// included) on its own, an IPv6 address by its /64. One host or site is
/// usually given a whole /64 and can pick any address in it, so counting IPv6
/// addresses one by one would let a single client open connections without
/// bound.
pub fn address_block(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv6Addr};
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !((1u128 << 64) - 1))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_bodies_are_free_and_large_ones_share_the_budget() {
        let budget = BodyBudget::new(10 * SMALL_BODY_BYTES);
        let small: Vec<_> = (0..100)
            .map(|_| budget.reserve(SMALL_BODY_BYTES).expect("small"))
            .collect();
        assert_eq!(budget.used(), 0);
        let big = budget.reserve(9 * SMALL_BODY_BYTES).expect("fits");
        assert_eq!(budget.used(), 8 * SMALL_BODY_BYTES);
        assert!(budget.reserve(4 * SMALL_BODY_BYTES).is_none());
        let mut growing = budget.reserve(2 * SMALL_BODY_BYTES).expect("fits");
        assert!(!growing.grow_to(4 * SMALL_BODY_BYTES), "over the budget");
        assert_eq!(budget.used(), 9 * SMALL_BODY_BYTES);
        drop(big);
        assert!(growing.grow_to(4 * SMALL_BODY_BYTES));
        drop(growing);
        drop(small);
        assert_eq!(budget.used(), 0);
    }
}
