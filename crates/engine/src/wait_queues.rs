//! The queues of waiting requests: one per environment, grouped by tenant
//! and within a tenant by requester ([`RequesterId`]: a daemon's
//! connection, or an address), and
//! [`WaitQueues`], which numbers the calls, counts them across every queue
//! and holds the caps. Only `WaitQueues` puts a call into a queue or takes
//! one out, so its count is the sum of the queues' lengths.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound::{Excluded, Unbounded};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::requesters::Owner;
use super::tenants::TenantId;
use super::types::{EnvId, Grant, Rejection, RequesterId};

/// The answer a queued request receives.
pub(crate) type WaitResult = Result<Vec<Grant>, Rejection>;

/// What a `WaitForStartingTask` call asks for, once checked: the grants
/// `grant_now` makes and a queued call keeps until it is served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrantOrder {
    pub env: EnvId,
    pub owner: Owner,
    /// Who takes turns: the grants' owner's connection, or its address.
    pub requester: RequesterId,
    /// Whose share the grants count against (the token's tenant).
    pub tenant: TenantId,
    pub min_version: u32,
    pub lease: Duration,
    /// Grants before this index are immediate, the rest prefetch.
    pub immediate: u32,
    /// Grants wanted in all (immediate + prefetch, capped).
    pub total: u32,
}

/// A queued `WaitForStartingTask` call.
pub(crate) struct Waiter {
    pub order: GrantOrder,
    /// When it was queued (the tenant's wait-time histogram).
    pub queued_at: Instant,
    pub tx: oneshot::Sender<WaitResult>,
}

/// Where a requester stands among its tenant's requesters in an
/// environment's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TurnKey {
    /// The requester's serve-clock stamp (see `Requesters::granted`).
    pub served: u64,
    /// Arrival number of its oldest call queued here.
    pub head: u64,
    pub requester: RequesterId,
}

/// Where a tenant stands in an environment's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TenantKey {
    /// The tenant's virtual time (see `tenants`).
    pub vtime: u64,
    pub tenant: TenantId,
}

/// Where a requester's calls stand in an environment's queue: its tenant's
/// place, then its own among the tenant's requesters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct QueueKey {
    pub tenant: TenantKey,
    pub turn: TurnKey,
}

/// One requester's calls of one tenant in one environment, oldest first.
struct RequesterQueue {
    seqs: BTreeSet<u64>,
    /// The key its tenant's ordered set holds for it (never above the true key).
    held: TurnKey,
}

/// One tenant's requesters in one environment.
struct TenantQueue {
    /// The key the queue's ordered set holds for it (never above the true key).
    held: TenantKey,
    order: BTreeSet<TurnKey>,
}

/// The queued requests of one environment: tenants in the order of their
/// virtual time, each tenant's requesters in the order of their turns.
#[derive(Default)]
pub(crate) struct WaitQueue {
    by_seq: BTreeMap<u64, Waiter>,
    tenants: BTreeSet<TenantKey>,
    tenant_queues: HashMap<TenantId, TenantQueue>,
    requesters: HashMap<(TenantId, RequesterId), RequesterQueue>,
}

impl WaitQueue {
    pub(crate) fn len(&self) -> usize {
        self.by_seq.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_seq.is_empty()
    }

    /// Queues a call; `served` is its requester's stamp now and `vtime`
    /// its tenant's virtual time.
    fn insert(&mut self, seq: u64, waiter: Waiter, served: u64, vtime: u64) {
        let requester = waiter.order.requester;
        let tenant = waiter.order.tenant;
        self.by_seq.insert(seq, waiter);
        if let Some(r) = self.requesters.get_mut(&(tenant, requester)) {
            r.seqs.insert(seq);
            return;
        }
        let held = TurnKey {
            served,
            head: seq,
            requester,
        };
        let tq = self.tenant_queues.entry(tenant).or_insert_with(|| {
            let held = TenantKey { vtime, tenant };
            self.tenants.insert(held);
            TenantQueue {
                held,
                order: BTreeSet::new(),
            }
        });
        tq.order.insert(held);
        self.requesters.insert(
            (tenant, requester),
            RequesterQueue {
                seqs: BTreeSet::from([seq]),
                held,
            },
        );
    }

    /// Takes a call out of the queue.
    fn remove(&mut self, seq: u64) -> Option<Waiter> {
        let w = self.by_seq.remove(&seq)?;
        let key = (w.order.tenant, w.order.requester);
        if let Some(r) = self.requesters.get_mut(&key) {
            r.seqs.remove(&seq);
            if r.seqs.is_empty() {
                let held = r.held;
                self.requesters.remove(&key);
                if let Some(tq) = self.tenant_queues.get_mut(&key.0) {
                    tq.order.remove(&held);
                    if tq.order.is_empty() {
                        self.tenants.remove(&tq.held);
                        self.tenant_queues.remove(&key.0);
                    }
                }
            }
        }
        Some(w)
    }

    /// Call `seq`, if queued here.
    pub(crate) fn get(&self, seq: u64) -> Option<&Waiter> {
        self.by_seq.get(&seq)
    }

    /// Every call, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&u64, &Waiter)> {
        self.by_seq.iter()
    }

    /// The first held key after `cursor` (from the start if `None`): the
    /// next requester of the cursor's tenant, else the first of the next
    /// tenant. A tenant moved since (its key only grows) comes after.
    pub(crate) fn next_after(&self, cursor: Option<QueueKey>) -> Option<QueueKey> {
        if let Some(c) = cursor
            && let Some(tq) = self.tenant_queues.get(&c.tenant.tenant)
            && tq.held == c.tenant
            && let Some(&turn) = tq.order.range((Excluded(c.turn), Unbounded)).next()
        {
            return Some(QueueKey {
                tenant: c.tenant,
                turn,
            });
        }
        self.first_of_tenant_after(cursor.map(|c| c.tenant))
    }

    /// The first requester of the first tenant after `tenant` (from the
    /// start if `None`): passes over every requester of `tenant`.
    pub(crate) fn first_of_tenant_after(&self, tenant: Option<TenantKey>) -> Option<QueueKey> {
        let next = match tenant {
            None => self.tenants.first().copied(),
            Some(k) => self.tenants.range((Excluded(k), Unbounded)).next().copied(),
        }?;
        let turn = *self.tenant_queues.get(&next.tenant)?.order.first()?;
        Some(QueueKey { tenant: next, turn })
    }

    /// The requester's true key given its stamp now.
    pub(crate) fn true_key(
        &self,
        tenant: TenantId,
        requester: RequesterId,
        served: u64,
    ) -> Option<TurnKey> {
        let head = *self.requesters.get(&(tenant, requester))?.seqs.first()?;
        Some(TurnKey {
            served,
            head,
            requester,
        })
    }

    /// Moves a requester from its held key to its true one.
    pub(crate) fn rekey(&mut self, tenant: TenantId, requester: RequesterId, truth: TurnKey) {
        if let Some(r) = self.requesters.get_mut(&(tenant, requester))
            && r.held != truth
            && let Some(tq) = self.tenant_queues.get_mut(&tenant)
        {
            tq.order.remove(&r.held);
            tq.order.insert(truth);
            r.held = truth;
        }
    }

    /// Moves a tenant, with all its requesters, to its true key.
    pub(crate) fn rekey_tenant(&mut self, truth: TenantKey) {
        if let Some(tq) = self.tenant_queues.get_mut(&truth.tenant)
            && tq.held != truth
        {
            self.tenants.remove(&tq.held);
            self.tenants.insert(truth);
            tq.held = truth;
        }
    }

    /// The tenants' clock was rebased by `base` (see `Tenants::rebase`):
    /// every held key moves down with it, so the order and the rule that a
    /// held key is never above the true one both hold.
    pub(crate) fn rebase_tenants(&mut self, base: u64) {
        for tq in self.tenant_queues.values_mut() {
            tq.held.vtime = tq.held.vtime.saturating_sub(base);
        }
        self.tenants = self.tenant_queues.values().map(|tq| tq.held).collect();
    }

    /// A requester's calls of a tenant here, oldest first.
    pub(crate) fn calls_of(&self, tenant: TenantId, requester: RequesterId) -> Vec<u64> {
        self.requesters
            .get(&(tenant, requester))
            .map(|r| r.seqs.iter().copied().collect())
            .unwrap_or_default()
    }
}

/// Every queue's bookkeeping: call numbers, the number of calls queued in
/// all, and the bounds on both.
pub(crate) struct WaitQueues {
    next_seq: u64,
    count: usize,
    max: usize,
    max_per_requester: usize,
    /// Requests answered `NoQuotaAvailable` (counter).
    no_quota: u64,
    /// Requests refused at once by each cap (counters).
    refused_total_cap: u64,
    refused_requester_cap: u64,
}

impl WaitQueues {
    pub(crate) fn new(max: usize, max_per_requester: usize) -> Self {
        WaitQueues {
            next_seq: 1,
            count: 0,
            max,
            max_per_requester,
            no_quota: 0,
            refused_total_cap: 0,
            refused_requester_cap: 0,
        }
    }

    /// Numbers calls after those `earlier` numbered, so a number is never
    /// given twice in the life of the engine (see `State::restart`).
    pub(crate) fn continue_after(&mut self, earlier: &WaitQueues) {
        self.next_seq = self.next_seq.max(earlier.next_seq);
    }

    /// Calls queued now, over every environment.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// The queue bounds: true if a cap keeps one more call from queueing
    /// (`max_waiters` in all, or `max_waiters_per_requester`, given how many
    /// its requester has queued already), counted per cap.
    pub(crate) fn cap_reached(&mut self, requester_waiting: usize) -> bool {
        if self.count >= self.max {
            self.refused_total_cap += 1;
            true
        } else if requester_waiting >= self.max_per_requester {
            self.refused_requester_cap += 1;
            true
        } else {
            false
        }
    }

    /// Requests refused at once since start, by the total cap and by the
    /// per-requester cap.
    pub(crate) fn refused_at_caps(&self) -> (u64, u64) {
        (self.refused_total_cap, self.refused_requester_cap)
    }

    /// Queues a call in `queue`; `served` is its requester's stamp now,
    /// `vtime` its tenant's virtual time. Returns the call's number.
    pub(crate) fn enqueue(
        &mut self,
        queue: &mut WaitQueue,
        waiter: Waiter,
        served: u64,
        vtime: u64,
    ) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        queue.insert(seq, waiter, served, vtime);
        self.count += 1;
        seq
    }

    /// Takes call `seq` out of `queue`, if it is still there.
    pub(crate) fn dequeue(&mut self, queue: &mut WaitQueue, seq: u64) -> Option<Waiter> {
        let w = queue.remove(seq)?;
        self.count -= 1;
        Some(w)
    }

    /// A request was answered `NoQuotaAvailable`.
    pub(crate) fn count_no_quota(&mut self) {
        self.no_quota += 1;
    }

    /// Requests answered `NoQuotaAvailable` since start.
    pub(crate) fn no_quota(&self) -> u64 {
        self.no_quota
    }
}
