//! Which wire protocol a call arrived on, and the latest protocol each peer
//! used. A leaf: the transports set it, metrics, the access log and the
//! dashboard read it, and nothing here knows a socket or a frame.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

/// The protocol of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// The daemons' binary framework protocol (`flare://`, frames starting `CPRF`).
    Flare,
    /// `POST /rpc/yadcc.scheduler.SchedulerService.<Method>`, the daemons'
    /// `http+pb`: on a daemon connection (requests carrying `Rpc-SeqNo`,
    /// answered out of order) or through the general HTTP server (curl,
    /// scripts; JSON or binary). One wire, one label, whichever server.
    HttpPb,
    /// Connect unary, `POST /yadcc.scheduler.SchedulerService/<Method>`.
    Connect,
    /// gRPC unary over HTTP/2, on the Connect path (`application/grpc`).
    Grpc,
    /// gRPC-Web, binary or base64 text, on the Connect path (`application/grpc-web`).
    GrpcWeb,
}

impl Protocol {
    /// Every protocol, for documentation and tests.
    pub const ALL: [Protocol; 5] = [
        Protocol::Flare,
        Protocol::HttpPb,
        Protocol::Connect,
        Protocol::Grpc,
        Protocol::GrpcWeb,
    ];

    /// The label in metrics, the access log and the dashboard.
    pub fn label(self) -> &'static str {
        match self {
            Protocol::Flare => "flare",
            Protocol::HttpPb => "http+pb",
            Protocol::Connect => "connect",
            Protocol::Grpc => "grpc",
            Protocol::GrpcWeb => "grpc-web",
        }
    }

    /// Whether a long poll that the caller's deadline would cut short is
    /// answered "no quota" just before that deadline, so the answer still
    /// arrives (what the daemons and Connect clients get), rather than left
    /// to end in DEADLINE_EXCEEDED at it (gRPC's rule, which its clients and
    /// their retry policies expect).
    pub fn answers_no_quota_before_deadline(self) -> bool {
        !matches!(self, Protocol::Grpc | Protocol::GrpcWeb)
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Which server a connection is served by, for the connection series
/// (`protocol` label): the daemons' binary protocol, their `http+pb`
/// framing, or the general HTTP server (HTTP/1.1, h2c or TLS), whose
/// connections carry any of the HTTP protocols, each call labelled by its
/// own [`Protocol`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnectionKind {
    Flare,
    DaemonHttp,
    Http,
}

impl ConnectionKind {
    /// The label in the connection series.
    pub fn label(self) -> &'static str {
        match self {
            ConnectionKind::Flare => "flare",
            ConnectionKind::DaemonHttp => "http+pb",
            ConnectionKind::Http => "http",
        }
    }
}

/// Peers remembered at most; an address flood must not grow memory without
/// bound. When full, entries not seen for [`PEER_FORGET_AFTER`] are dropped
/// first; if none are that old, new peers are not recorded until some are.
pub const MAX_PEERS: usize = 65_536;
/// A peer silent this long is forgotten when room is needed.
pub const PEER_FORGET_AFTER: Duration = Duration::from_secs(600);
/// When full, the table is swept for forgotten peers at most this often: a
/// sweep walks every entry under the lock, and a flood of new addresses must
/// not pay for one per call.
pub const PEER_SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// The protocol of each peer's latest call, for the dashboard.
#[derive(Debug, Default)]
pub struct PeerProtocols {
    table: Mutex<PeerTable>,
}

#[derive(Debug, Default)]
struct PeerTable {
    latest: HashMap<IpAddr, (Protocol, Instant)>,
    /// No sweep before this; None: none yet.
    next_sweep: Option<Instant>,
    sweeps: u64,
}

impl PeerProtocols {
    /// Notes a call from `peer` over `protocol`.
    pub fn record(&self, peer: IpAddr, protocol: Protocol) {
        self.record_at(peer, protocol, Instant::now());
    }

    fn record_at(&self, peer: IpAddr, protocol: Protocol, now: Instant) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let table = &mut *table;
        if let Some(entry) = table.latest.get_mut(&peer) {
            *entry = (protocol, now);
            return;
        }
        if table.latest.len() >= MAX_PEERS {
            if table.next_sweep.is_some_and(|next| now < next) {
                return;
            }
            table.sweeps += 1;
            table.next_sweep = Some(now + PEER_SWEEP_INTERVAL);
            table
                .latest
                .retain(|_, (_, seen)| now.saturating_duration_since(*seen) < PEER_FORGET_AFTER);
            if table.latest.len() >= MAX_PEERS {
                return;
            }
        }
        table.latest.insert(peer, (protocol, now));
    }

    /// Peer address -> protocol label of its latest call.
    pub fn labels(&self) -> std::collections::BTreeMap<String, &'static str> {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table
            .latest
            .iter()
            .map(|(ip, (protocol, _))| (ip.to_string(), protocol.label()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_distinct() {
        let labels: std::collections::HashSet<_> = Protocol::ALL
            .iter()
            .map(|protocol| protocol.label())
            .collect();
        assert_eq!(labels.len(), Protocol::ALL.len());
    }

    #[test]
    fn the_latest_call_wins() {
        let peers = PeerProtocols::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        peers.record(ip, Protocol::HttpPb);
        peers.record(ip, Protocol::Flare);
        assert_eq!(peers.labels().get("10.0.0.1"), Some(&"flare"));
    }

    #[test]
    fn a_full_table_is_swept_at_most_once_per_interval() {
        let peers = PeerProtocols::default();
        let start = Instant::now();
        let address = |n: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n));
        let full = u32::try_from(MAX_PEERS).unwrap();
        for n in 0..full {
            peers.record_at(address(n), Protocol::Flare, start);
        }
        let sweeps = || peers.table.lock().unwrap().sweeps;
        assert_eq!(sweeps(), 0);

        // A flood of new addresses while nobody is old enough to forget.
        for n in full..full + 10_000 {
            peers.record_at(
                address(n),
                Protocol::Connect,
                start + Duration::from_secs(1),
            );
        }
        assert_eq!(sweeps(), 1, "one sweep for the whole flood");
        assert_eq!(peers.labels().len(), MAX_PEERS);
        assert!(!peers.labels().contains_key(&address(full).to_string()));

        // Known peers are still updated in place.
        peers.record_at(address(0), Protocol::HttpPb, start + Duration::from_secs(2));
        assert_eq!(
            peers.labels().get(&address(0).to_string()),
            Some(&"http+pb")
        );
        assert_eq!(sweeps(), 1);

        // Once the old peers are forgettable and the interval has passed,
        // the next new peer sweeps and gets in.
        let later = start + PEER_FORGET_AFTER + Duration::from_secs(1);
        peers.record_at(address(full + 20_000), Protocol::Flare, later);
        assert_eq!(sweeps(), 2);
        let labels = peers.labels();
        assert!(labels.contains_key(&address(full + 20_000).to_string()));
        assert!(
            labels.contains_key(&address(0).to_string()),
            "seen recently"
        );
        assert_eq!(labels.len(), 2);
    }
}
