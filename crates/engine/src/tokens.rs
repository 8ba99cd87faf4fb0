//! Token checks (user and servant sets) and the serving-daemon token ring.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};
use tokio::time::Instant;

pub use yadcc_text::Redacted;

/// SHA-256 of a presented token. Comparing digests of fixed length means the
/// comparison time does not depend on the lengths of the configured tokens.
pub type TokenDigest = [u8; 32];

/// Hashes a presented token once per call; the digest is then checked against
/// every configured set.
pub(crate) fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// An accepted set of tokens (`--acceptable_user_tokens` or
/// `--acceptable_servant_tokens`).
///
/// Rule "token lists": entries are literal (no trimming); an empty entry
/// accepts the empty token (daemons started without `--token`), never
/// anyone; an empty list accepts nobody. Only [`TokenSet::anyone`] (the
/// explicit `--insecure_accept_any_token`) accepts every token. `Debug`
/// shows the shape, never a token or a digest.
#[derive(Clone, Debug, Default)]
pub struct TokenSet {
    anyone: bool,
    digests: Redacted<Vec<TokenDigest>>,
    entries: Redacted<Vec<String>>,
}

/// Same configuration (for settings tests); never use it to check a token.
impl PartialEq for TokenSet {
    fn eq(&self, other: &Self) -> bool {
        self.anyone == other.anyone && self.entries == other.entries
    }
}

impl Eq for TokenSet {}

impl TokenSet {
    /// Rule "token flag": the one place a token flag is split. The value is
    /// split on every `,` and each entry kept literally, as the original
    /// reads it: `"a, "` is the tokens `a` and ` ` (a space), and `"a,"` is
    /// `a` and the empty token. A flag that is empty as a whole stops the
    /// start, as in the original (the settings check it); split, it would be
    /// the empty token alone, never anyone.
    pub fn from_flag(flag: &str) -> TokenSet {
        TokenSet::new(flag.split(','))
    }

    /// Exactly these tokens, literally; an empty list accepts nobody.
    pub fn new<I, S>(tokens: I) -> TokenSet
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let entries: Vec<String> = tokens.into_iter().map(Into::into).collect();
        TokenSet {
            anyone: false,
            digests: Redacted(entries.iter().map(|t| digest(t)).collect()),
            entries: Redacted(entries),
        }
    }

    /// Every token, whatever it is (the open mode; say so loudly at start).
    pub fn anyone() -> TokenSet {
        TokenSet {
            anyone: true,
            ..TokenSet::default()
        }
    }

    /// True in the open mode.
    pub fn accepts_anyone(&self) -> bool {
        self.anyone
    }

    /// True if an empty entry lets daemons without `--token` in (warn at start).
    pub fn accepts_empty_token(&self) -> bool {
        self.anyone || self.entries.iter().any(String::is_empty)
    }

    /// Number of listed tokens (0 in the open mode).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if no token is listed (nobody, or anyone in the open mode).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The first listed token: the demo's simulated daemons must present one.
    pub fn first_entry(&self) -> Option<&str> {
        self.entries.first().map(String::as_str)
    }

    /// Whether one of `digests` is listed here: the checks between token
    /// lists at start and reload (not for calls: it stops at a match).
    pub fn lists_any_of(&self, digests: &[TokenDigest]) -> bool {
        digests.iter().any(|d| self.digests.contains(d))
    }

    /// Whether a token is listed both here and in `other` (as above).
    pub fn shares_a_token_with(&self, other: &TokenSet) -> bool {
        self.lists_any_of(&other.digests)
    }

    /// Whether `token` is accepted (hashes it; the engine hashes once per
    /// call and uses [`TokenSet::accepts`]).
    pub fn accepts_token(&self, token: &str) -> bool {
        self.accepts(&digest(token))
    }

    /// Rule "token check": constant-time comparison (`subtle`) against every
    /// configured token, without stopping at the first match, so timing
    /// tells neither whether nor which token matched.
    pub(crate) fn accepts(&self, presented: &TokenDigest) -> bool {
        let mut matched = Choice::from(0);
        for known in self.digests.iter() {
            matched |= known.ct_eq(presented);
        }
        self.anyone | bool::from(matched)
    }
}

/// The serving-daemon token of epoch `k`: hex of the first 16 bytes of
/// SHA-256(secret || k as u64 little-endian). Deterministic, so a restarted
/// scheduler with the same secret hands out the same tokens.
pub(crate) fn serving_token(secret: &[u8], epoch: u64) -> String {
    let mut h = Sha256::new();
    h.update(secret);
    h.update(epoch.to_le_bytes());
    hex::encode(&h.finalize()[..16])
}

/// The three serving-daemon tokens (expiring, active, next) for epochs
/// k-1, k, k+1, where k = wall-clock unix time / rollout interval.
///
/// The wall clock is read once at start; afterwards time advances with
/// `tokio::time`, so paused-time tests can roll tokens out.
#[derive(Debug)]
pub(crate) struct TokenRing {
    secret: Redacted<Vec<u8>>,
    interval: Duration,
    wall_at_start: Duration,
    start: Instant,
    epoch: u64,
    tokens: Redacted<[String; 3]>,
}

impl TokenRing {
    /// `secret = None` draws a random 32-byte secret (tokens then change on
    /// restart). An interval under one millisecond is raised to one millisecond.
    pub(crate) fn new(secret: Option<Vec<u8>>, interval: Duration, start: Instant) -> Self {
        let secret = secret.unwrap_or_else(|| rand::random::<[u8; 32]>().to_vec());
        let interval = interval.max(Duration::from_millis(1));
        let wall_at_start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut ring = TokenRing {
            secret: Redacted(secret),
            interval,
            wall_at_start,
            start,
            epoch: 0,
            tokens: Default::default(),
        };
        let epoch = ring.epoch_at(start);
        ring.fill(epoch);
        ring
    }

    fn wall_now(&self, now: Instant) -> Duration {
        self.wall_at_start + now.saturating_duration_since(self.start)
    }

    fn epoch_at(&self, now: Instant) -> u64 {
        (self.wall_now(now).as_nanos() / self.interval.as_nanos()) as u64
    }

    fn fill(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.tokens.0 = [
            serving_token(&self.secret, epoch.wrapping_sub(1)),
            serving_token(&self.secret, epoch),
            serving_token(&self.secret, epoch.wrapping_add(1)),
        ];
    }

    /// Expiring, active and next token at `now` (recomputed only when the epoch changes).
    pub(crate) fn current(&mut self, now: Instant) -> &[String; 3] {
        let epoch = self.epoch_at(now);
        if epoch != self.epoch {
            self.fill(epoch);
        }
        &self.tokens.0
    }

    /// Time until the next rollout, for the snapshot.
    pub(crate) fn rollout_in(&self, now: Instant) -> Duration {
        let wall = self.wall_now(now).as_nanos();
        let step = self.interval.as_nanos();
        let next = (wall / step + 1) * step;
        Duration::from_nanos(u64::try_from(next - wall).unwrap_or(u64::MAX))
    }
}
