//! Requesters (delegates): who owns a grant (an address and a token), when
//! each requester was last served and how many calls it has waiting (a
//! daemon's connection, or an address: [`RequesterId`]), and the figures of
//! the Requesters view, per address.

use std::collections::HashMap;
use std::net::IpAddr;

use super::tokens::TokenDigest;
use super::types::RequesterId;
use super::views::RequesterView;

/// Who received a grant: the requesting machine and the token it presented.
/// Rule "grant ownership": only its holder may renew or free the grant (see
/// [`Owner::holds`]); the address stays for the Requesters figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Owner {
    /// Canonical requester IP (IPv4-mapped IPv6 is IPv4).
    pub ip: IpAddr,
    /// The first 8 bytes of the token's SHA-256: enough to tell configured
    /// tokens apart (2^-64 collision chance), and not the token itself.
    pub token: u64,
}

impl Owner {
    pub(crate) fn new(ip: IpAddr, digest: &TokenDigest) -> Owner {
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&digest[..8]);
        Owner {
            ip: ip.to_canonical(),
            token: u64::from_le_bytes(tag),
        }
    }

    /// Rule "grant ownership": whether `caller` is this grant's holder. The
    /// token must match, the address need not: a delegate behind a NAT pool
    /// that is not sticky, or two balancers without PROXY headers, renews
    /// from a second address, and refusing it kills its tasks. The grant id
    /// itself is the proof (33 random bits, shown only to its holder), so a
    /// stranger needs both a configured token and a live id.
    pub(crate) fn holds(&self, caller: &Owner) -> bool {
        self.token == caller.token
    }
}

/// What the engine keeps about one requesting address (the Requesters view).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Machine {
    /// Its calls waiting in a queue now, over all its requesters.
    waiting: usize,
    /// Grants it owns now (live and zombie).
    held: u64,
    /// Grants made to it since start.
    grants_total: u64,
    /// Its renewals and frees of grants it does not own, refused.
    refused_total: u64,
    /// Its calls refused at once because a waiter cap was reached.
    wait_cap_refusals: u64,
}

impl Machine {
    fn idle(&self) -> bool {
        self.waiting == 0 && self.held == 0
    }
}

/// What the engine keeps about one requester's turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Turn {
    /// Serve-clock value of its latest grant (0: never served). Only grows
    /// while the record exists, which the waiting queues rely on.
    last_served: u64,
    /// Its calls waiting in a queue now.
    waiting: usize,
}

/// Every requester and requesting address seen, each bounded: beyond
/// `limit` records, idle ones (nothing waiting; for an address, nothing held
/// either) are forgotten.
pub(crate) struct Requesters {
    machines: HashMap<IpAddr, Machine>,
    turns: HashMap<RequesterId, Turn>,
    clock: u64,
    limit: usize,
}

impl Requesters {
    pub(crate) fn new(limit: usize) -> Self {
        Requesters {
            machines: HashMap::new(),
            turns: HashMap::new(),
            clock: 0,
            limit: limit.max(1),
        }
    }

    /// The record of address `ip`, created if needed.
    fn machine(&mut self, ip: IpAddr) -> &mut Machine {
        if self.machines.len() >= self.limit && !self.machines.contains_key(&ip) {
            // Amortised: one O(n) pass frees every idle record at once.
            self.machines.retain(|_, m| !m.idle());
        }
        self.machines.entry(ip).or_default()
    }

    /// The turn of `requester`, created if needed. A daemon's connections
    /// come and go: a requester with nothing waiting is forgotten once there
    /// are too many, and then starts as never served, like a new one.
    fn turn(&mut self, requester: RequesterId) -> &mut Turn {
        if self.turns.len() >= self.limit && !self.turns.contains_key(&requester) {
            self.turns.retain(|_, t| t.waiting > 0);
        }
        self.turns.entry(requester).or_default()
    }

    /// Calls of `requester` waiting in a queue now.
    pub(crate) fn waiting(&self, requester: &RequesterId) -> usize {
        self.turns.get(requester).map_or(0, |t| t.waiting)
    }

    /// A call from `requester` joined a queue; returns when it was last served.
    pub(crate) fn started_waiting(&mut self, requester: RequesterId) -> u64 {
        self.machine(requester.ip).waiting += 1;
        let t = self.turn(requester);
        t.waiting += 1;
        t.last_served
    }

    /// A call from `requester` left its queue.
    pub(crate) fn stopped_waiting(&mut self, requester: RequesterId) {
        let m = self.machine(requester.ip);
        m.waiting = m.waiting.saturating_sub(1);
        let t = self.turn(requester);
        t.waiting = t.waiting.saturating_sub(1);
    }

    /// A call from `requester` was refused at once: a waiter cap was full.
    pub(crate) fn refused_at_cap(&mut self, requester: RequesterId) {
        self.machine(requester.ip).wait_cap_refusals += 1;
    }

    /// When `requester` was last served (0 if never or forgotten while idle).
    pub(crate) fn last_served(&self, requester: &RequesterId) -> u64 {
        self.turns.get(requester).map_or(0, |t| t.last_served)
    }

    /// Rule "fair shares per requester": a grant to `requester` makes it the
    /// requester served most recently; its owner's address holds one more.
    pub(crate) fn granted(&mut self, owner: IpAddr, requester: RequesterId) {
        self.clock += 1;
        let clock = self.clock;
        self.turn(requester).last_served = clock;
        let m = self.machine(owner);
        m.held += 1;
        m.grants_total += 1;
    }

    /// A grant owned by `ip` was forgotten.
    pub(crate) fn released(&mut self, ip: IpAddr) {
        if let Some(m) = self.machines.get_mut(&ip) {
            m.held = m.held.saturating_sub(1);
        }
    }

    /// An adopted grant found its owner (its first renewer).
    pub(crate) fn adopted_by(&mut self, ip: IpAddr) {
        self.machine(ip).held += 1;
    }

    /// A renewal or free from `ip` of a grant it does not own.
    pub(crate) fn refused(&mut self, ip: IpAddr) {
        self.machine(ip).refused_total += 1;
    }

    /// Every address remembered, sorted by IP, with how many requesters
    /// (daemon connections, or the address itself) it has waiting.
    pub(crate) fn views(&self) -> Vec<RequesterView> {
        let mut waiting_requesters: HashMap<IpAddr, u64> = HashMap::new();
        for (requester, turn) in &self.turns {
            if turn.waiting > 0 {
                *waiting_requesters.entry(requester.ip).or_default() += 1;
            }
        }
        let mut views: Vec<RequesterView> = self
            .machines
            .iter()
            .map(|(&ip, m)| RequesterView {
                ip,
                grants_held: m.held,
                waiting: m.waiting as u64,
                waiting_requesters: waiting_requesters.get(&ip).copied().unwrap_or(0),
                grants_total: m.grants_total,
                refused_total: m.refused_total,
                wait_cap_refusals: m.wait_cap_refusals,
            })
            .collect();
        views.sort_unstable_by_key(|r| r.ip);
        views
    }
}
