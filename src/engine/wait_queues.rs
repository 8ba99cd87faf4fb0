//! The queues of waiting requests: one per environment, grouped by
//! requesting machine, and [`WaitQueues`], which numbers the calls and counts
//! them across every queue. Only `WaitQueues` puts a call into a queue or takes
//! one out, so its count is the sum of the queues' lengths.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::ops::Bound::{Excluded, Unbounded};
use std::time::Duration;

use tokio::sync::oneshot;

use super::requesters::Owner;
use super::types::{EnvId, Grant, Rejection};

/// The answer a queued request receives.
pub(crate) type Answer = Result<Vec<Grant>, Rejection>;

/// What a `WaitForStartingTask` call asks for, once checked: the grants
/// `grant_now` makes and a queued call keeps until it is served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GrantOrder {
    pub env: EnvId,
    pub owner: Owner,
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
    pub tx: oneshot::Sender<Answer>,
}

/// Where a machine stands in an environment's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct MachineKey {
    /// The machine's serve-clock stamp (see `Requesters::granted`).
    pub served: u64,
    /// Arrival number of its oldest call queued here.
    pub head: u64,
    pub ip: IpAddr,
}

/// One machine's calls in one environment, oldest first.
struct MachineQueue {
    seqs: BTreeSet<u64>,
    /// The key the ordered set holds for it (never above the true key).
    held: MachineKey,
}

/// The queued requests of one environment.
#[derive(Default)]
pub(crate) struct WaitQueue {
    by_seq: BTreeMap<u64, Waiter>,
    order: BTreeSet<MachineKey>,
    machines: HashMap<IpAddr, MachineQueue>,
}

impl WaitQueue {
    pub(crate) fn len(&self) -> usize {
        self.by_seq.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_seq.is_empty()
    }

    /// Queues a call; `served` is its machine's stamp now.
    fn insert(&mut self, seq: u64, waiter: Waiter, served: u64) {
        let ip = waiter.order.owner.ip;
        self.by_seq.insert(seq, waiter);
        match self.machines.get_mut(&ip) {
            Some(m) => {
                m.seqs.insert(seq);
            }
            None => {
                let held = MachineKey {
                    served,
                    head: seq,
                    ip,
                };
                self.order.insert(held);
                self.machines.insert(
                    ip,
                    MachineQueue {
                        seqs: BTreeSet::from([seq]),
                        held,
                    },
                );
            }
        }
    }

    /// Takes a call out of the queue.
    fn remove(&mut self, seq: u64) -> Option<Waiter> {
        let w = self.by_seq.remove(&seq)?;
        let ip = w.order.owner.ip;
        if let Some(m) = self.machines.get_mut(&ip) {
            m.seqs.remove(&seq);
            if m.seqs.is_empty() {
                self.order.remove(&m.held);
                self.machines.remove(&ip);
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

    /// The first held key after `cursor` (from the start if `None`).
    pub(crate) fn next_after(&self, cursor: Option<MachineKey>) -> Option<MachineKey> {
        match cursor {
            None => self.order.first().copied(),
            Some(k) => self.order.range((Excluded(k), Unbounded)).next().copied(),
        }
    }

    /// The machine's true key given its stamp now.
    pub(crate) fn true_key(&self, ip: IpAddr, served: u64) -> Option<MachineKey> {
        let head = *self.machines.get(&ip)?.seqs.first()?;
        Some(MachineKey { served, head, ip })
    }

    /// Moves a machine from its held key to its true one.
    pub(crate) fn rekey(&mut self, ip: IpAddr, truth: MachineKey) {
        if let Some(m) = self.machines.get_mut(&ip)
            && m.held != truth
        {
            self.order.remove(&m.held);
            self.order.insert(truth);
            m.held = truth;
        }
    }

    /// A machine's calls here, oldest first.
    pub(crate) fn calls_of(&self, ip: IpAddr) -> Vec<u64> {
        self.machines
            .get(&ip)
            .map(|m| m.seqs.iter().copied().collect())
            .unwrap_or_default()
    }
}

/// Every queue's bookkeeping: call numbers, the number of calls queued in
/// all, and the bounds on both.
pub(crate) struct WaitQueues {
    next_seq: u64,
    count: usize,
    max: usize,
    max_per_machine: usize,
    /// Requests answered `NoQuotaAvailable` (counter).
    no_quota: u64,
}

impl WaitQueues {
    pub(crate) fn new(max: usize, max_per_machine: usize) -> Self {
        WaitQueues {
            next_seq: 1,
            count: 0,
            max,
            max_per_machine,
            no_quota: 0,
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

    /// The queue bounds (rule "limits"): true if one more call may not queue, given how many its
    /// machine has queued already.
    pub(crate) fn full(&self, machine_waiting: usize) -> bool {
        self.count >= self.max || machine_waiting >= self.max_per_machine
    }

    /// Queues a call in `queue`; `served` is its machine's stamp now.
    /// Returns the call's number.
    pub(crate) fn enqueue(&mut self, queue: &mut WaitQueue, waiter: Waiter, served: u64) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        queue.insert(seq, waiter, served);
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
