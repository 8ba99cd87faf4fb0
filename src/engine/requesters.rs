//! Requesting machines (delegates, by IP): who owns a grant, when each
//! machine was last served, and the per-machine figures of the Requesters view.

use std::collections::HashMap;
use std::net::IpAddr;

use super::tokens::TokenDigest;
use super::views::RequesterView;

/// Who received a grant: the requesting machine and the token it presented.
/// Rule "grant ownership": only the owner may renew or free the grant.
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
}

/// What the engine keeps about one requesting machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Requester {
    /// Serve-clock value of its latest grant (0: never served). Only grows
    /// while the record exists, which the waiting queues rely on.
    last_served: u64,
    /// Its calls waiting in a queue now.
    waiting: usize,
    /// Grants it owns now (live and zombie).
    held: u64,
    /// Grants made to it since start.
    grants_total: u64,
    /// Its renewals and frees of grants it does not own, refused.
    refused_total: u64,
}

impl Requester {
    fn idle(&self) -> bool {
        self.waiting == 0 && self.held == 0
    }
}

/// Every requesting machine seen, bounded: beyond `limit` records, idle ones
/// (nothing held, nothing waiting) are forgotten.
pub(crate) struct Requesters {
    by_ip: HashMap<IpAddr, Requester>,
    clock: u64,
    limit: usize,
}

impl Requesters {
    pub(crate) fn new(limit: usize) -> Self {
        Requesters {
            by_ip: HashMap::new(),
            clock: 0,
            limit: limit.max(1),
        }
    }

    /// The record of `ip`, created if needed.
    fn entry(&mut self, ip: IpAddr) -> &mut Requester {
        if self.by_ip.len() >= self.limit && !self.by_ip.contains_key(&ip) {
            // Amortised: one O(n) pass frees every idle record at once.
            self.by_ip.retain(|_, r| !r.idle());
        }
        self.by_ip.entry(ip).or_default()
    }

    /// Calls of `ip` waiting in a queue now.
    pub(crate) fn waiting(&self, ip: &IpAddr) -> usize {
        self.by_ip.get(ip).map_or(0, |r| r.waiting)
    }

    /// A call from `ip` joined a queue; returns when `ip` was last served.
    pub(crate) fn started_waiting(&mut self, ip: IpAddr) -> u64 {
        let r = self.entry(ip);
        r.waiting += 1;
        r.last_served
    }

    /// A call from `ip` left its queue.
    pub(crate) fn stopped_waiting(&mut self, ip: IpAddr) {
        let r = self.entry(ip);
        r.waiting = r.waiting.saturating_sub(1);
    }

    /// When `ip` was last served (0 if never or forgotten while idle).
    pub(crate) fn last_served(&self, ip: &IpAddr) -> u64 {
        self.by_ip.get(ip).map_or(0, |r| r.last_served)
    }

    /// Rule "fair shares per machine": a grant to `ip` makes it the machine
    /// served most recently.
    pub(crate) fn granted(&mut self, ip: IpAddr) {
        self.clock += 1;
        let clock = self.clock;
        let r = self.entry(ip);
        r.last_served = clock;
        r.held += 1;
        r.grants_total += 1;
    }

    /// A grant owned by `ip` was forgotten.
    pub(crate) fn released(&mut self, ip: IpAddr) {
        if let Some(r) = self.by_ip.get_mut(&ip) {
            r.held = r.held.saturating_sub(1);
        }
    }

    /// An adopted grant found its owner (its first renewer).
    pub(crate) fn adopted_by(&mut self, ip: IpAddr) {
        self.entry(ip).held += 1;
    }

    /// A renewal or free from `ip` of a grant it does not own.
    pub(crate) fn refused(&mut self, ip: IpAddr) {
        self.entry(ip).refused_total += 1;
    }

    /// Every machine remembered, sorted by IP.
    pub(crate) fn views(&self) -> Vec<RequesterView> {
        let mut views: Vec<RequesterView> = self
            .by_ip
            .iter()
            .map(|(&ip, r)| RequesterView {
                ip,
                grants_held: r.held,
                waiting: r.waiting as u64,
                grants_total: r.grants_total,
                refused_total: r.refused_total,
            })
            .collect();
        views.sort_unstable_by_key(|r| r.ip);
        views
    }
}
