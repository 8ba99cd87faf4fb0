//! The edge's limits, shared by every protocol: the settings (one flag each,
//! see `config.rs`), the budget of request bytes buffered (each connection's
//! own allowance, then the global budget) and the bound on a connection's
//! queued answer bytes. A leaf: the listener (`net`), the daemons' protocols
//! (`daemon`) and the HTTP protocols read it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::Notify;

pub use self::{
    budget::{
        ADDRESS_SHARE_DIVISOR, BodyBudget, ConnectionBudget, Reservation, SERVANTS_RESERVE_DIVISOR,
        STRANGERS_SHARE_DIVISOR, ServantCheck,
    },
    buffers::{BufferCharge, CONNECTION_BUFFERS_BYTES, ConnectionBuffers},
    echo::{ECHO_BYTES, MESSAGE_BYTES, echo, echo_bytes, echo_within},
    proof::Proof,
};

pub mod budget;
pub mod buffers;
pub use yadcc_text::echo;
pub mod proof;

/// Request bytes each connection may buffer on its own allowance; beyond
/// it, every byte comes from the global budget (`--max_buffered_body_bytes`).
/// Every call a daemon makes is far smaller, so a flood of stalled bodies on
/// other connections, which exhausts the global budget, cannot starve a
/// daemon's connection; and buffered request bytes are at most connections x
/// this + the global budget, however many streams a connection opens.
pub const CONNECTION_BODY_BYTES: usize = 64 * 1024;

/// Answer bytes a connection may have queued (written to nobody yet) before
/// it stops taking calls, at least: a connection whose peer does not read
/// stops there, and is closed once it has read nothing for the body-read
/// timeout. See [`answer_queue_bound`].
pub const ANSWER_QUEUE_FLOOR: usize = 8 << 20;

/// The answer bytes a connection may have queued before it stops taking
/// calls: [`ANSWER_QUEUE_FLOOR`], or two of the largest answer it has
/// queued, whichever is larger (so a daemon asking for a list larger than
/// the floor still gets one while the previous one is being written).
pub fn answer_queue_bound(largest_answer: usize) -> usize {
    ANSWER_QUEUE_FLOOR.max(largest_answer.saturating_mul(2))
}

/// Calls one daemon connection may have in flight unless
/// `--max_calls_in_flight_per_connection` says otherwise; more are answered
/// "overloaded" (status 11) at once. A daemon runs one long poll per compiler
/// plus a handful of periodic calls, far below this.
pub const MAX_CALLS_IN_FLIGHT_PER_CONNECTION: usize = 1024;

/// Open connections from one address unless `--max_connections_per_ip`
/// says otherwise: an office of 1,000 daemons behind one NAT address holds
/// 2,000 (two each), with room to double; but never more than half the
/// connection cap (see [`EdgeSettings::connection_cap_per_ip`]).
pub const MAX_CONNECTIONS_PER_IP: usize = 4096;

/// Messages a daemon connection may send in a row that are read and
/// dropped unanswered (flare frames without `request_meta`: a response's
/// frame, or one of a kind the server does not serve) before it is closed.
/// Stock daemons send none; they are never activity either (the idle
/// timeout counts from the last request served).
pub const MAX_DROPPED_IN_A_ROW: usize = 8;

/// HTTP/2 keep-alive pings: sent after this long without a frame from the
/// peer; a peer that does not answer one within
/// [`HTTP2_KEEP_ALIVE_TIMEOUT`] is gone, and its connection is closed. The
/// pings are not activity for the idle timeout (open streams are).
pub const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Near the connection cap, connections that never proved a token are
/// evicted, the oldest first, to keep this many places free (at least one):
/// one in a hundred of the cap. See [`eviction_headroom`].
pub const EVICTION_HEADROOM_DIVISOR: usize = 100;

/// The free places under a connection cap of `cap` below which a new
/// connection evicts the oldest stranger.
pub fn eviction_headroom(cap: usize) -> usize {
    (cap / EVICTION_HEADROOM_DIVISOR).max(1)
}

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
    /// Open connections from one address block at most (see
    /// [`address_block`]); None: derived from the connection cap.
    pub max_connections_per_ip: Option<usize>,
    /// Calls one daemon connection may have in flight at most.
    pub max_calls_in_flight_per_connection: usize,
    /// Request bytes buffered at most over all connections beyond each
    /// connection's own [`CONNECTION_BODY_BYTES`]. The daemons' protocols
    /// (`flare`, `http+pb`) keep a body's share until its call is answered;
    /// the general HTTP path (hyper) gives it back once the body is read.
    pub max_buffered_body_bytes: usize,
    /// After a shutdown signal, how long connections may drain.
    pub shutdown_grace: Duration,
    /// HTTP/2 streams one connection may have open at once.
    pub http2_max_concurrent_streams: u32,
}

/// HTTP/2 streams per connection by default: RFC 9113's recommended minimum,
/// which gRPC clients expect; hyper's own default is 200.
pub const DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS: u32 = 100;

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
            max_connections_per_ip: None,
            max_calls_in_flight_per_connection: MAX_CALLS_IN_FLIGHT_PER_CONNECTION,
            max_buffered_body_bytes: 32 << 20,
            shutdown_grace: Duration::from_secs(10),
            http2_max_concurrent_streams: DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
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

impl EdgeSettings {
    /// The per-address cap under a connection cap of `connection_cap`: the
    /// configured one, or [`MAX_CONNECTIONS_PER_IP`] but at most half the
    /// connection cap, so that one address (a flood, or an office) never
    /// holds every descriptor and locks everyone else out. Descriptors for
    /// 4,160 connections or more serve an office of 2,000 connections.
    pub fn connection_cap_per_ip(&self, connection_cap: usize) -> usize {
        self.max_connections_per_ip
            .unwrap_or_else(|| MAX_CONNECTIONS_PER_IP.min(connection_cap / 2).max(1))
    }
}

/// Raises the soft file-descriptor limit to the hard one, so the connection
/// cap is as high as the operator allows. Returns the new soft limit.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

/// The answer bytes one connection of the general HTTP path (hyper) has
/// queued: counted from when a response leaves its handler until hyper has
/// taken its bytes. The listener counts them ([`crate::net`]); the RPC seam
/// waits for [`QueuedAnswers::room`] before it runs a call, so a connection
/// whose answers are not read (HTTP/2 streams whose window stays shut) stops
/// taking calls at [`answer_queue_bound`]. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct QueuedAnswers {
    inner: Arc<Queued>,
}

#[derive(Debug, Default)]
struct Queued {
    bytes: AtomicUsize,
    largest: AtomicUsize,
    room: Notify,
}

impl QueuedAnswers {
    /// An answer of `bytes` is queued.
    pub fn add(&self, bytes: usize) {
        self.inner.largest.fetch_max(bytes, Ordering::Relaxed);
        self.inner.bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    /// `bytes` of queued answers were taken (or dropped).
    pub fn remove(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.inner.bytes.fetch_sub(bytes, Ordering::AcqRel);
        if !self.over_bound() {
            self.inner.room.notify_waiters();
        }
    }

    /// Bytes queued now.
    pub fn bytes(&self) -> usize {
        self.inner.bytes.load(Ordering::Acquire)
    }

    fn over_bound(&self) -> bool {
        self.bytes() > answer_queue_bound(self.inner.largest.load(Ordering::Relaxed))
    }

    /// Waits until the answers queued are within the bound.
    pub async fn room(&self) {
        loop {
            let room = self.inner.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if !self.over_bound() {
                return;
            }
            room.await;
        }
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

    #[tokio::test]
    async fn calls_wait_for_room_while_queued_answers_exceed_the_bound() {
        let queued = QueuedAnswers::default();
        let answer = ANSWER_QUEUE_FLOOR / 8;
        for _ in 0..8 {
            queued.add(answer);
        }
        queued.room().await;
        queued.add(1);
        let waiting = tokio::spawn({
            let queued = queued.clone();
            async move { queued.room().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "over the bound: no room");
        queued.remove(1);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("room once an answer is taken")
            .unwrap();
        queued.remove(ANSWER_QUEUE_FLOOR);
        assert_eq!(queued.bytes(), 0);
        // One answer larger than the floor is let through, and so is a
        // second while it is being written.
        queued.add(ANSWER_QUEUE_FLOOR * 3);
        queued.room().await;
        queued.add(ANSWER_QUEUE_FLOOR * 3);
        queued.room().await;
    }

    #[test]
    fn the_answer_queue_holds_two_of_the_largest_answer_or_the_floor() {
        assert_eq!(answer_queue_bound(0), ANSWER_QUEUE_FLOOR);
        assert_eq!(answer_queue_bound(3_600_000), ANSWER_QUEUE_FLOOR);
        assert_eq!(answer_queue_bound(80 << 20), 160 << 20);
        assert_eq!(answer_queue_bound(usize::MAX), usize::MAX);
    }
}
