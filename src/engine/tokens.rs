//! Token checks (user and servant sets) and the serving-daemon token ring.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// SHA-256 of a presented token. Comparing digests of fixed length means the
/// comparison time does not depend on the lengths of the configured tokens.
pub(crate) type TokenDigest = [u8; 32];

/// Hashes a presented token once per call; the digest is then checked against
/// every configured set.
pub(crate) fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// An accepted set of tokens (`--acceptable_user_tokens` or
/// `--acceptable_servant_tokens`). An empty list accepts nobody; an empty
/// string in the list accepts anyone.
#[derive(Clone)]
pub(crate) struct TokenSet {
    anyone: bool,
    digests: Vec<TokenDigest>,
}

/// Shows how many tokens there are, never their digests.
impl std::fmt::Debug for TokenSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSet")
            .field("anyone", &self.anyone)
            .field("tokens", &self.digests.len())
            .finish()
    }
}

impl TokenSet {
    /// Precomputes the digests of the configured tokens.
    pub(crate) fn new(tokens: &[String]) -> Self {
        TokenSet {
            anyone: tokens.iter().any(|t| t.is_empty()),
            digests: tokens
                .iter()
                .filter(|t| !t.is_empty())
                .map(|t| digest(t))
                .collect(),
        }
    }

    /// Rule "token check": constant-time comparison against every configured
    /// token, without stopping at the first match, so timing tells neither
    /// whether nor which token matched.
    pub(crate) fn accepts(&self, presented: &TokenDigest) -> bool {
        let mut matched = 0u8;
        for known in &self.digests {
            let mut diff = 0u8;
            for (a, b) in known.iter().zip(presented.iter()) {
                diff |= a ^ b;
            }
            // 1 when diff == 0, else 0, without a data-dependent branch.
            let equal = ((u16::from(diff)).wrapping_sub(1) >> 8) as u8 & 1;
            matched |= std::hint::black_box(equal);
        }
        self.anyone | (matched != 0)
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
pub(crate) struct TokenRing {
    secret: Vec<u8>,
    interval: Duration,
    wall_at_start: Duration,
    start: Instant,
    epoch: u64,
    tokens: [String; 3],
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
            secret,
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
        self.tokens = [
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
        &self.tokens
    }

    /// Time until the next rollout, for the snapshot.
    pub(crate) fn rollout_in(&self, now: Instant) -> Duration {
        let wall = self.wall_now(now).as_nanos();
        let step = self.interval.as_nanos();
        let next = (wall / step + 1) * step;
        Duration::from_nanos(u64::try_from(next - wall).unwrap_or(u64::MAX))
    }
}
