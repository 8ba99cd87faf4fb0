//! Rule "guessing costs time", one limit for every credential (the
//! inspection password, admin tokens, daemons' tokens): failures are counted
//! per address block, and a block that failed too many is *slowed*, never
//! locked: a right credential from it still passes, a wrong one waits
//! [`SLOWED_ANSWER`] before its refusal. So nobody behind the same NAT
//! address or proxy can lock an operator out by guessing, and a guesser's
//! wrong guesses cost it a second each.
//!
//! The table is bounded ([`MAX_TRACKED_BLOCKS`]) and, when full, forgets the
//! blocks that guessed least: a flood of addresses that each fail once
//! pushes out one another, never a block that is slowed or was before.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr},
    sync::Mutex,
    time::Duration,
};

use tokio::time::Instant;

/// Failed credentials a block may present in one [`GUESS_WINDOW`] before
/// its wrong answers are slowed.
pub const GUESSES_PER_WINDOW: u32 = 10;
/// The window over which [`GUESSES_PER_WINDOW`] counts.
pub const GUESS_WINDOW: Duration = Duration::from_secs(60);
/// The first slowed period lasts this long; each further one twice the last.
pub const FIRST_LOCKOUT: Duration = Duration::from_secs(60);
/// The longest slowed period.
pub const MAX_LOCKOUT: Duration = Duration::from_secs(3600);
/// A block without a failure for this long starts again from
/// [`FIRST_LOCKOUT`], and is the first forgotten.
pub const LOCKOUT_MEMORY: Duration = Duration::from_secs(6 * 3600);
/// How long a wrong credential from a slowed block waits for its refusal.
pub const SLOWED_ANSWER: Duration = Duration::from_secs(1);
/// Blocks tracked at most (about 100 bytes each).
pub const MAX_TRACKED_BLOCKS: usize = 16_384;
/// IPv6 addresses count per this prefix by default: a /56 is what one
/// customer commonly gets, so a /64 per limit would hand one guesser 256
/// limits, and a /48 65,536.
pub const DEFAULT_IPV6_PREFIX: u8 = 56;

/// One block's recent failures.
#[derive(Debug, Clone, Copy)]
struct Attempts {
    window_started: Instant,
    failures: u32,
    /// Failures since the block was last quiet for [`LOCKOUT_MEMORY`]: how
    /// much it guesses, which decides who is forgotten first.
    total: u32,
    /// Slowed periods so far (each twice as long as the one before).
    lockouts: u32,
    slowed_until: Option<Instant>,
    last_failure: Instant,
}

impl Attempts {
    /// Lower is forgotten first: quiet blocks, then those that guessed least.
    fn keep_rank(&self, now: Instant) -> (bool, bool, u32, u32, Instant) {
        (
            now.duration_since(self.last_failure) < LOCKOUT_MEMORY,
            self.slowed_until.is_some_and(|until| until > now),
            self.lockouts,
            self.total,
            self.last_failure,
        )
    }
}

/// What a failed credential did to its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Failure {
    /// Some(its length) when this failure started a slowed period.
    pub started: Option<Duration>,
    /// Some(what is left of it) when the block was slowed already: this
    /// answer waits [`SLOWED_ANSWER`].
    pub slowed: Option<Duration>,
}

/// The table of failures by block.
#[derive(Debug)]
pub struct Guessing {
    blocks: Mutex<HashMap<IpAddr, Attempts>>,
    ipv6_prefix: u8,
    capacity: usize,
}

impl Default for Guessing {
    fn default() -> Self {
        Guessing::new(DEFAULT_IPV6_PREFIX)
    }
}

impl Guessing {
    /// IPv6 addresses counted per `/ipv6_prefix` (`--guessing_ipv6_prefix`).
    pub fn new(ipv6_prefix: u8) -> Self {
        Guessing::with_capacity(ipv6_prefix, MAX_TRACKED_BLOCKS)
    }

    fn with_capacity(ipv6_prefix: u8, capacity: usize) -> Self {
        Guessing {
            blocks: Mutex::default(),
            ipv6_prefix: ipv6_prefix.min(128),
            capacity,
        }
    }

    /// The block `peer` counts in: an IPv4 address, an IPv6 prefix.
    pub fn block(&self, peer: IpAddr) -> IpAddr {
        match peer.to_canonical() {
            IpAddr::V4(v4) => IpAddr::V4(v4),
            IpAddr::V6(v6) => {
                let host_bits = 128 - u32::from(self.ipv6_prefix);
                let mask = u128::MAX.checked_shl(host_bits).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & mask))
            }
        }
    }

    /// Some(what is left) while `peer`'s block is slowed.
    pub fn slowed_for(&self, peer: IpAddr) -> Option<Duration> {
        let now = Instant::now();
        let blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        let until = blocks.get(&self.block(peer))?.slowed_until?;
        (until > now).then(|| until - now)
    }

    /// Blocks tracked now.
    pub fn tracked(&self) -> usize {
        self.blocks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Counts a failed credential from `peer`.
    pub fn failed(&self, peer: IpAddr) -> Failure {
        let now = Instant::now();
        let block = self.block(peer);
        let mut blocks = self.blocks.lock().unwrap_or_else(|p| p.into_inner());
        if blocks.len() >= self.capacity && !blocks.contains_key(&block) {
            forget_least_guessing(&mut blocks, now, self.capacity);
        }
        let attempts = blocks.entry(block).or_insert(Attempts {
            window_started: now,
            failures: 0,
            total: 0,
            lockouts: 0,
            slowed_until: None,
            last_failure: now,
        });
        if now.duration_since(attempts.last_failure) >= LOCKOUT_MEMORY {
            attempts.lockouts = 0;
            attempts.total = 0;
        }
        attempts.last_failure = now;
        attempts.total = attempts.total.saturating_add(1);
        if let Some(until) = attempts.slowed_until.filter(|until| *until > now) {
            return Failure {
                started: None,
                slowed: Some(until - now),
            };
        }
        if now.duration_since(attempts.window_started) >= GUESS_WINDOW {
            attempts.window_started = now;
            attempts.failures = 0;
        }
        attempts.failures += 1;
        if attempts.failures < GUESSES_PER_WINDOW {
            return Failure::default();
        }
        let lockout = FIRST_LOCKOUT
            .saturating_mul(1u32 << attempts.lockouts.min(16))
            .min(MAX_LOCKOUT);
        attempts.lockouts += 1;
        attempts.failures = 0;
        attempts.window_started = now + lockout;
        attempts.slowed_until = Some(now + lockout);
        Failure {
            started: Some(lockout),
            slowed: None,
        }
    }
}

/// Makes room for an eighth of the table at once (so a flood of new
/// addresses sorts the table once per 2,048 of them, not once each): the
/// blocks ranked lowest by [`Attempts::keep_rank`] go.
fn forget_least_guessing(blocks: &mut HashMap<IpAddr, Attempts>, now: Instant, capacity: usize) {
    let room = (capacity / 8).max(1);
    let mut ranked: Vec<_> = blocks
        .iter()
        .map(|(block, attempts)| (attempts.keep_rank(now), *block))
        .collect();
    let cut = room.min(ranked.len());
    if cut == 0 {
        return;
    }
    ranked.select_nth_unstable(cut - 1);
    for (_, block) in &ranked[..cut] {
        blocks.remove(block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn ten_failures_a_minute_then_a_slowed_period_that_doubles() {
        let guessing = Guessing::default();
        let guesser = ip("192.0.2.7");
        for _ in 1..GUESSES_PER_WINDOW {
            assert_eq!(guessing.failed(guesser), Failure::default());
            assert_eq!(guessing.slowed_for(guesser), None);
        }
        assert_eq!(guessing.failed(guesser).started, Some(FIRST_LOCKOUT));
        assert_eq!(guessing.slowed_for(guesser), Some(FIRST_LOCKOUT));
        assert_eq!(
            guessing.slowed_for(ip("192.0.2.8")),
            None,
            "another address"
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            guessing.failed(guesser).slowed,
            Some(FIRST_LOCKOUT - Duration::from_secs(10)),
            "a failure while slowed is slowed, and does not lengthen it"
        );

        tokio::time::advance(FIRST_LOCKOUT).await;
        assert_eq!(guessing.slowed_for(guesser), None);
        for _ in 1..GUESSES_PER_WINDOW {
            assert_eq!(guessing.failed(guesser), Failure::default());
        }
        assert_eq!(guessing.failed(guesser).started, Some(2 * FIRST_LOCKOUT));
        tokio::time::advance(FIRST_LOCKOUT).await;
        assert_eq!(guessing.slowed_for(guesser), Some(FIRST_LOCKOUT));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_spread_over_minutes_are_never_slowed() {
        let guessing = Guessing::default();
        let guesser = ip("2001:db8::1");
        for _ in 0..5 * GUESSES_PER_WINDOW {
            assert_eq!(guessing.failed(guesser), Failure::default());
            tokio::time::advance(GUESS_WINDOW / (GUESSES_PER_WINDOW - 2)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_slash_56_guesses_as_one_block_by_default_or_as_the_operator_says() {
        let guessing = Guessing::default();
        for subnet in 0..GUESSES_PER_WINDOW {
            // Ten /64s of one /56.
            guessing.failed(ip(&format!("2001:db8:0:{subnet:x}::1")));
        }
        assert!(guessing.slowed_for(ip("2001:db8:0:ff::9")).is_some());
        assert!(guessing.slowed_for(ip("2001:db8:0:100::1")).is_none());

        let per_64 = Guessing::new(64);
        for subnet in 0..GUESSES_PER_WINDOW {
            per_64.failed(ip(&format!("2001:db8:0:{subnet:x}::1")));
        }
        assert!(per_64.slowed_for(ip("2001:db8:0:1::2")).is_none());
        assert_eq!(per_64.block(ip("2001:db8:0:1::2")), ip("2001:db8:0:1::"));
        assert_eq!(
            Guessing::new(128).block(ip("2001:db8::2")),
            ip("2001:db8::2")
        );
        assert_eq!(Guessing::new(0).block(ip("2001:db8::2")), ip("::"));
        assert_eq!(
            Guessing::default().block(ip("::ffff:192.0.2.1")),
            ip("192.0.2.1"),
            "IPv4-mapped is IPv4"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_addresses_failing_once_never_flushes_a_slowed_block() {
        let capacity = 1024;
        let guessing = Guessing::with_capacity(DEFAULT_IPV6_PREFIX, capacity);
        let guesser = ip("192.0.2.7");
        let heavy = ip("192.0.2.8");
        for _ in 0..GUESSES_PER_WINDOW {
            guessing.failed(guesser);
        }
        for _ in 0..GUESSES_PER_WINDOW - 1 {
            guessing.failed(heavy);
        }
        for n in 0..17 * capacity as u32 {
            guessing.failed(IpAddr::V4((0x0a00_0000 + n).into()));
            assert!(guessing.tracked() <= capacity);
        }
        assert_eq!(guessing.slowed_for(guesser), Some(FIRST_LOCKOUT));
        assert_eq!(
            guessing.failed(heavy).started,
            Some(FIRST_LOCKOUT),
            "the block that guessed most but was not slowed is remembered too"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn blocks_quiet_for_hours_are_forgotten_first() {
        let guessing = Guessing::with_capacity(DEFAULT_IPV6_PREFIX, 8);
        let old = ip("192.0.2.1");
        for _ in 0..GUESSES_PER_WINDOW {
            guessing.failed(old);
        }
        tokio::time::advance(LOCKOUT_MEMORY).await;
        for n in 0..8u32 {
            guessing.failed(IpAddr::V4((0x0a00_0000 + n).into()));
        }
        for _ in 1..GUESSES_PER_WINDOW {
            assert_eq!(guessing.failed(old), Failure::default());
        }
        assert_eq!(
            guessing.failed(old).started,
            Some(FIRST_LOCKOUT),
            "it starts again from the first period"
        );
    }
}
