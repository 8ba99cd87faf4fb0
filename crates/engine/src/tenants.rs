//! Tenants: named groups of user tokens sharing the farm by weight
//! (owner: `Tenants`), and the token directory that tells a call's tenant
//! from its token ([`Access`]).
//!
//! Rule "fair shares per tenant": every tenant has a virtual time that a
//! grant from the queues advances by `1 / weight` (start-time fair queuing,
//! in fixed point). The queues serve the waiting tenant of least virtual
//! time first, so backlogged tenants are served in proportion to their
//! weights whatever their number of requesters or calls. A tenant that
//! starts waiting again starts at the virtual time of the latest grant
//! (never below its own): being idle earns no credit, and using capacity
//! nobody waited for costs none (grants made at admission, from free
//! capacity, leave the virtual time alone). O(1) per grant whatever the
//! number of tenants; the queues keep one ordered entry per waiting tenant.
//!
//! The virtual clock is rebased so it never saturates: only differences
//! between virtual times decide, so once the latest grant's virtual time
//! passes [`REBASE_AT`] every virtual time (and every key the queues hold)
//! is moved down by the same amount, after the serve pass that crossed it.
//! Between two rebases a grant adds at most [`MAX_STEP`], so no number of
//! grants and no weight in [`MIN_TENANT_WEIGHT`]..=[`MAX_TENANT_WEIGHT`]
//! can reach `u64::MAX` (before, a saturated clock tied every tenant and
//! the first one in the file won every grant until a restart).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::tokens::{Redacted, TokenDigest, TokenSet};
use super::views::TenantView;

/// The tenant the token flags form when no tenants file is given.
pub const DEFAULT_TENANT: &str = "default";

/// Virtual time one grant costs a tenant of weight 1. Weights are at most
/// [`MAX_TENANT_WEIGHT`], so a step is never below 4 * 10^6: rounding keeps
/// the ratio of two steps within 10^-6 of the ratio of the weights.
const VIRTUAL_UNIT: f64 = (1u64 << 32) as f64;

/// Smallest weight a tenant may have (the file's check names it): with
/// [`MAX_TENANT_WEIGHT`], a ratio of 10^6 between two tenants, which keeps
/// one grant's step ([`MAX_STEP`]) small against the clock's range.
pub const MIN_TENANT_WEIGHT: f64 = 0.001;

/// Largest weight a tenant may have (the file's check names it).
pub const MAX_TENANT_WEIGHT: f64 = 1_000.0;

/// The step of a tenant of [`MIN_TENANT_WEIGHT`]: the most one grant moves
/// the clock (about 2^42).
pub(crate) const MAX_STEP: u64 = (VIRTUAL_UNIT / MIN_TENANT_WEIGHT) as u64;

/// Once the latest grant's virtual time is past this, the clock is rebased.
/// Low enough that a single tenant of the smallest weight crosses it every
/// ~770 grants (so a test sees many rebases), high enough that tenants that
/// wait keep their standing ([`KEPT_LAG`]); a rebase costs one pass over the
/// waiting tenants' keys, at most once per ~10^6 grants of weight-1 tenants.
pub(crate) const REBASE_AT: u64 = 1 << 52;

/// How far behind the latest grant a rebase leaves a tenant's virtual time:
/// 256 grants of the smallest weight, 2^18 of weight 1. A waiting tenant
/// only falls that far behind while it is passed over (its `max_share`, or
/// a `min_version` no free servant has); like idleness, that earns no
/// credit beyond this.
pub(crate) const KEPT_LAG: u64 = 1 << 50;

/// Upper bounds (seconds) of the wait-time histogram's buckets; the last
/// bucket is everything above. Waits end within `Limits::max_wait` (10 s).
pub const WAIT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One tenant as configured: a tenants file's `[[tenant]]`, or the token
/// flags' `default`.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantSpec {
    pub name: String,
    /// Share of contended capacity relative to the other waiting tenants
    /// ([`MIN_TENANT_WEIGHT`]..=[`MAX_TENANT_WEIGHT`]).
    pub weight: f64,
    /// Most of the farm's slots this tenant holds while another tenant
    /// waits for them, in (0, 1].
    pub max_share: Option<f64>,
    /// SHA-256 of each user token of the tenant.
    pub token_digests: Redacted<Vec<TokenDigest>>,
}

/// Who may call: the tenants and their tokens, and the servants' tokens.
/// Replaced as a whole by a reload ([`super::Scheduler::set_tenancy`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Tenancy {
    pub tenants: Vec<TenantSpec>,
    /// `None`: the `--acceptable_servant_tokens` flag's set.
    pub servant_tokens: Option<TokenSet>,
}

/// A tenant's number in `Tenants` (stable for the life of the engine:
/// a tenant removed by a reload and added again gets its number back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct TenantId(pub u32);

/// The token check's answer: the tenant of every accepted user token.
#[derive(Debug, Default)]
pub(crate) struct Access {
    /// The token flags' set, all of it one tenant (rule "token check":
    /// compared in constant time against every entry).
    flag_users: Option<(TokenSet, TenantId)>,
    /// A tenants file's tokens by digest. The key is the SHA-256 of the
    /// presented token, so a lookup's timing can tell at most something
    /// about digests, which does not help to find a token; one lookup
    /// whatever the number of tenants and tokens.
    by_digest: HashMap<TokenDigest, TenantId>,
    pub(crate) servant_tokens: TokenSet,
}

impl Access {
    /// The flags' access: every user token is tenant `id`.
    pub(crate) fn from_flags(users: TokenSet, id: TenantId, servant_tokens: TokenSet) -> Self {
        Access {
            flag_users: Some((users, id)),
            by_digest: HashMap::new(),
            servant_tokens,
        }
    }

    /// A tenants file's access; `ids[i]` is the number of `tenants[i]`.
    pub(crate) fn from_specs(
        tenants: &[TenantSpec],
        ids: &[TenantId],
        servant_tokens: TokenSet,
    ) -> Self {
        let by_digest = tenants
            .iter()
            .zip(ids)
            .flat_map(|(t, &id)| t.token_digests.iter().map(move |d| (*d, id)))
            .collect();
        Access {
            flag_users: None,
            by_digest,
            servant_tokens,
        }
    }

    /// The tenant of user token `presented`, if it is accepted.
    pub(crate) fn tenant_of(&self, presented: &TokenDigest) -> Option<TenantId> {
        if let Some((set, id)) = &self.flag_users
            && set.accepts(presented)
        {
            return Some(*id);
        }
        self.by_digest.get(presented).copied()
    }
}

/// One tenant's standing and figures.
#[derive(Debug, Clone)]
struct TenantRec {
    name: Arc<str>,
    weight: f64,
    /// Virtual time one grant from the queues costs it.
    step: u64,
    max_share: Option<f64>,
    /// In the running configuration (a removed tenant stays while its
    /// calls wait and its grants run).
    configured: bool,
    vtime: u64,
    waiting: usize,
    held: u64,
    grants_total: u64,
    wait_buckets: [u64; WAIT_BUCKETS.len() + 1],
    wait_sum: Duration,
}

impl TenantRec {
    fn new(spec: &TenantSpec) -> Self {
        let mut rec = TenantRec {
            name: Arc::from(spec.name.as_str()),
            weight: 1.0,
            step: 0,
            max_share: None,
            configured: true,
            vtime: 0,
            waiting: 0,
            held: 0,
            grants_total: 0,
            wait_buckets: [0; WAIT_BUCKETS.len() + 1],
            wait_sum: Duration::ZERO,
        };
        rec.set(spec);
        rec
    }

    fn set(&mut self, spec: &TenantSpec) {
        // The file's check refuses other weights; the clamp keeps the
        // clock's bound whatever a caller passes.
        let weight = if spec.weight.is_nan() {
            1.0
        } else {
            spec.weight.clamp(MIN_TENANT_WEIGHT, MAX_TENANT_WEIGHT)
        };
        self.weight = weight;
        self.step = ((VIRTUAL_UNIT / weight) as u64).clamp(1, MAX_STEP);
        self.max_share = spec.max_share;
        self.configured = true;
    }

    fn idle(&self) -> bool {
        self.waiting == 0 && self.held == 0
    }
}

/// Every tenant the engine knows: the configured ones, and removed ones
/// that still have calls waiting or grants held.
pub(crate) struct Tenants {
    recs: Vec<TenantRec>,
    by_name: HashMap<Arc<str>, TenantId>,
    /// The virtual time of the latest grant from the queues.
    virtual_now: u64,
}

impl Tenants {
    /// The tenants of `specs`, numbered in order.
    pub(crate) fn new(specs: &[TenantSpec]) -> Self {
        let mut t = Tenants {
            recs: Vec::new(),
            by_name: HashMap::new(),
            virtual_now: 0,
        };
        t.configure(specs);
        t
    }

    /// Makes `specs` the configured tenants; returns their numbers, in
    /// order. Tenants not named any more stay known (unconfigured) while
    /// they wait or hold, keeping their virtual time if they come back.
    pub(crate) fn configure(&mut self, specs: &[TenantSpec]) -> Vec<TenantId> {
        for rec in &mut self.recs {
            rec.configured = false;
        }
        specs
            .iter()
            .map(|spec| match self.by_name.get(spec.name.as_str()) {
                Some(&id) => {
                    self.recs[id.0 as usize].set(spec);
                    id
                }
                None => {
                    let id = TenantId(u32::try_from(self.recs.len()).unwrap_or(u32::MAX));
                    let rec = TenantRec::new(spec);
                    self.by_name.insert(rec.name.clone(), id);
                    self.recs.push(rec);
                    id
                }
            })
            .collect()
    }

    /// Zero figures and standings, same tenants and numbers (rule
    /// "leadership"; the token directory keeps naming them).
    pub(crate) fn restarted(&self) -> Tenants {
        Tenants {
            recs: self
                .recs
                .iter()
                .map(|r| TenantRec {
                    vtime: 0,
                    waiting: 0,
                    held: 0,
                    grants_total: 0,
                    wait_buckets: [0; WAIT_BUCKETS.len() + 1],
                    wait_sum: Duration::ZERO,
                    ..r.clone()
                })
                .collect(),
            by_name: self.by_name.clone(),
            virtual_now: 0,
        }
    }

    fn rec(&mut self, id: TenantId) -> Option<&mut TenantRec> {
        self.recs.get_mut(id.0 as usize)
    }

    /// The tenant's virtual time now (its key in the queues only grows).
    pub(crate) fn vtime(&self, id: TenantId) -> u64 {
        self.recs.get(id.0 as usize).map_or(0, |r| r.vtime)
    }

    /// A call of the tenant joined a queue; returns its virtual time. A
    /// tenant that had nothing waiting catches up with the latest grant.
    pub(crate) fn started_waiting(&mut self, id: TenantId) -> u64 {
        let now = self.virtual_now;
        let Some(r) = self.rec(id) else {
            return now;
        };
        if r.waiting == 0 {
            r.vtime = r.vtime.max(now);
        }
        r.waiting += 1;
        r.vtime
    }

    /// A call of the tenant left its queue.
    pub(crate) fn stopped_waiting(&mut self, id: TenantId) {
        if let Some(r) = self.rec(id) {
            r.waiting = r.waiting.saturating_sub(1);
        }
    }

    /// Rule "fair shares per tenant": a queued call of the tenant got its
    /// first grant after waiting `waited`.
    pub(crate) fn served_from_queue(&mut self, id: TenantId, waited: Duration) {
        let Some(r) = self.recs.get_mut(id.0 as usize) else {
            return;
        };
        self.virtual_now = self.virtual_now.max(r.vtime);
        r.vtime = r.vtime.saturating_add(r.step);
        r.record_wait(waited);
    }

    /// The latest grant's virtual time (the clock's reading; tests bound it).
    #[cfg(test)]
    pub(crate) fn virtual_now(&self) -> u64 {
        self.virtual_now
    }

    /// If the clock is past [`REBASE_AT`], moves every virtual time down so
    /// the latest grant's is [`KEPT_LAG`] (a time further behind becomes 0)
    /// and returns the amount: the caller moves the queues' keys down by
    /// the same amount (order kept, as only differences count). Called
    /// between serve passes, never while one holds keys.
    pub(crate) fn rebase(&mut self) -> Option<u64> {
        if self.virtual_now <= REBASE_AT {
            return None;
        }
        let base = self.virtual_now - KEPT_LAG;
        self.virtual_now = KEPT_LAG;
        for r in &mut self.recs {
            r.vtime = r.vtime.saturating_sub(base);
        }
        Some(base)
    }

    /// A call of the tenant got grants at once.
    pub(crate) fn served_at_once(&mut self, id: TenantId) {
        if let Some(r) = self.rec(id) {
            r.record_wait(Duration::ZERO);
        }
    }

    /// A grant was made to the tenant.
    pub(crate) fn granted(&mut self, id: TenantId) {
        if let Some(r) = self.rec(id) {
            r.held += 1;
            r.grants_total += 1;
        }
    }

    /// A grant of the tenant ended.
    pub(crate) fn released(&mut self, id: TenantId) {
        if let Some(r) = self.rec(id) {
            r.held = r.held.saturating_sub(1);
        }
    }

    /// Rule "max share": true if one more grant would take the tenant over
    /// its `max_share` of the farm's `slots` (held and free).
    pub(crate) fn at_cap(&self, id: TenantId, slots: u64) -> bool {
        self.recs.get(id.0 as usize).is_some_and(|r| {
            r.max_share
                .is_some_and(|share| (r.held + 1) as f64 > share * slots as f64)
        })
    }

    /// The configured tenants, then removed ones still waiting or holding.
    pub(crate) fn views(&self, slots: u64) -> Vec<TenantView> {
        let weights: f64 = self
            .recs
            .iter()
            .filter(|r| r.configured)
            .map(|r| r.weight)
            .sum();
        self.recs
            .iter()
            .filter(|r| r.configured || !r.idle())
            .map(|r| TenantView {
                name: r.name.to_string(),
                configured: r.configured,
                weight: r.weight,
                weight_share: if r.configured && weights > 0.0 {
                    r.weight / weights
                } else {
                    0.0
                },
                max_share: r.max_share,
                waiting: r.waiting as u64,
                held: r.held,
                slots,
                grants_total: r.grants_total,
                wait_buckets: r.wait_buckets.to_vec(),
                wait_sum: r.wait_sum,
            })
            .collect()
    }
}

impl TenantRec {
    fn record_wait(&mut self, waited: Duration) {
        let secs = waited.as_secs_f64();
        let bucket = WAIT_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(WAIT_BUCKETS.len());
        self.wait_buckets[bucket] += 1;
        self.wait_sum += waited;
    }
}
