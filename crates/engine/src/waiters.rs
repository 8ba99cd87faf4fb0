//! Requests waiting for capacity: admission, the fair serving pass, timeouts
//! and cancellation.
//!
//! Rule "fair shares per requester": each environment keeps its queued
//! requests grouped by requester ([`RequesterId`]): a daemon's connection
//! (`flare`, `http+pb`), or for other protocols the address. When capacity
//! appears (a free, a zombie reaped, a servant gaining capacity or joining)
//! the engine, still under the lock, hands it to the waiting requester that
//! was served least recently (ties: the one whose oldest waiting call came
//! first), and within one requester to its oldest call. A requester just
//! served goes behind every requester waiting longer, so a build with
//! hundreds of calls queued takes turns with a colleague's single compile
//! instead of going first, daemons behind one NAT address take turns with
//! each other, and one requester's waiters are capped
//! (`max_waiters_per_requester`). Capacity free at any moment is capacity no
//! queued request can use, so a new call may take it at once.
//!
//! The requesters are ordered by the key `(last served, oldest call,
//! requester)`. A requester's true key only grows (it is served, or its
//! oldest call leaves), so the ordered set may hold a key below the true one
//! and fixes it when met, as the placement indexes do: a grant costs
//! O(log n), not an update of every environment the requester waits in.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::envs::Effects;
use super::grants::{GrantEnd, NewGrant, Origin};
use super::requesters::Owner;
use super::shared::Shared;
use super::state::State;
use super::tenants::TenantId;
use super::types::{EnvId, Grant, GrantRequest, Rejection, RequesterId, later};
use super::wait_queues::{GrantOrder, QueueKey, TenantKey, WaitResult, Waiter};

/// Who makes a `WaitForStartingTask` call: the grants' owner, who takes
/// turns, and whose share they count against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaitCaller {
    pub owner: Owner,
    pub requester: RequesterId,
    pub tenant: TenantId,
}

/// Outcome of admitting a request under the lock.
pub(crate) enum Admission {
    /// Capacity was free right now.
    Granted(Vec<Grant>),
    /// Queued; wait on `rx` until `deadline`.
    Queued {
        env: EnvId,
        seq: u64,
        rx: oneshot::Receiver<WaitResult>,
        deadline: Instant,
    },
}

impl State {
    /// Rule "WaitForStartingTask" (the part under the lock): a call asking
    /// for no grant gets none, so `NoQuotaAvailable`, as the original answers
    /// it; environment not available fails at once (rule
    /// "prefetch-only calls": `NoQuotaAvailable` when `immediate` is 0, as
    /// the daemon expects for its idle prefetch); otherwise take what is free now
    /// (immediate grants first, then prefetch); if nothing is free, queue the
    /// request for its first grant unless it may not wait or a waiter cap is
    /// reached (its requester's `max_waiters_per_requester`, or
    /// `max_waiters` in all; counted, for the Requesters view too).
    pub(crate) fn admit(
        &mut self,
        req: &GrantRequest,
        caller: WaitCaller,
        immediate: u32,
        total: u32,
        now: Instant,
    ) -> Result<Admission, Rejection> {
        let WaitCaller {
            owner,
            requester,
            tenant,
        } = caller;
        if total == 0 {
            self.waiters.count_no_quota();
            return Err(Rejection::NoQuotaAvailable);
        }
        let env = match self.envs.lookup(&req.environment) {
            Some(id)
                if self
                    .envs
                    .get(id)
                    .is_some_and(|e| e.available_for(req.min_version)) =>
            {
                id
            }
            // Rule "taking over": an instance that may not grant yet, or
            // restarted a moment ago, cannot tell an environment nobody
            // offers from one whose servants have not reported to it yet;
            // the call waits for the fence to open or the servants to settle.
            _ if immediate > 0 && (!self.fence.allows(now) || self.settling(now)) => {
                self.envs.intern(&req.environment).1
            }
            _ => return Err(self.unavailable(&req.environment, immediate)),
        };
        let order = GrantOrder {
            env,
            owner,
            requester,
            tenant,
            min_version: req.min_version,
            lease: req.lease,
            immediate,
            total,
        };
        let grants = self.grant_now(&order, Vec::new(), now);
        if !grants.is_empty() {
            self.tenants.served_at_once(tenant);
            return Ok(Admission::Granted(grants));
        }
        if self.shutting_down || req.wait.is_zero() {
            self.waiters.count_no_quota();
            self.envs.drop_if_unused(env);
            return Err(Rejection::NoQuotaAvailable);
        }
        if self
            .waiters
            .cap_reached(self.requesters.waiting(&requester))
        {
            self.requesters.refused_at_cap(requester);
            self.waiters.count_no_quota();
            self.envs.drop_if_unused(env);
            return Err(Rejection::NoQuotaAvailable);
        }
        let (tx, rx) = oneshot::channel();
        let served = self.requesters.started_waiting(requester);
        let vtime = self.tenants.started_waiting(tenant);
        let queue = self.envs.queue_mut(env).expect("looked up above");
        let waiter = Waiter {
            order,
            queued_at: now,
            tx,
        };
        let seq = self.waiters.enqueue(queue, waiter, served, vtime);
        Ok(Admission::Queued {
            env,
            seq,
            rx,
            deadline: later(now, req.wait),
        })
    }

    /// Rule "environment not available", with the prefetch-only exception.
    fn unavailable(&mut self, environment: &str, immediate: u32) -> Rejection {
        if immediate == 0 {
            self.waiters.count_no_quota();
            Rejection::NoQuotaAvailable
        } else {
            Rejection::EnvironmentNotAvailable {
                environment: environment.to_owned(),
            }
        }
    }

    /// Grants one by one from capacity free right now until `order.total`
    /// grants are held or nothing fits. Grant `i` is a prefetch grant if
    /// `i >= order.immediate`.
    fn grant_now(
        &mut self,
        order: &GrantOrder,
        mut grants: Vec<Grant>,
        now: Instant,
    ) -> Vec<Grant> {
        while grants.len() < order.total as usize {
            let Some(servant) = self.pick(order.env, order.owner.ip, order.min_version, now) else {
                break;
            };
            let origin = Origin::Issued {
                env: order.env,
                owner: order.owner,
                requester: order.requester,
                tenant: order.tenant,
                lease: order.lease,
                prefetch: grants.len() >= order.immediate as usize,
            };
            grants.push(self.create_grant(NewGrant { servant, origin }, now));
        }
        grants
    }

    /// Rules "fair shares per tenant", "max share" and "fair shares per
    /// requester" (see the module documentation): hands free capacity of
    /// the given environments to queued requests, one first grant per
    /// visit, visiting tenants of least virtual time first, within one its
    /// requesters least recently served first (across the environments
    /// merged by that key) and a requester's calls oldest first, skipping
    /// (not blocking on) calls the free capacity cannot satisfy
    /// (min_version). A tenant or requester just served moves back. A
    /// tenant at its `max_share` is passed over; what nobody else could
    /// take is then offered to those passed over.
    /// Only then do served requests take their extra grants, from capacity
    /// no queued request can use.
    pub(crate) fn serve(&mut self, mut ids: Vec<EnvId>, now: Instant) {
        ids.sort_unstable();
        ids.dedup();
        let mut served: Vec<(Waiter, Vec<Grant>)> = Vec::new();
        if self.serve_pass(&ids, true, &mut served, now) {
            self.serve_pass(&ids, false, &mut served, now);
        }
        // Between passes: no key of a pass is held any more.
        if let Some(base) = self.tenants.rebase() {
            for id in self.envs.ids() {
                if let Some(queue) = self.envs.queue_mut(id) {
                    queue.rebase_tenants(base);
                }
            }
        }
        let mut undelivered = Vec::new();
        for (w, first) in served {
            let grants = self.grant_now(&w.order, first, now);
            // The receiver lives until its guard has removed the waiter under
            // this lock, so this only fails if that invariant is broken.
            if let Err(Ok(grants)) = w.tx.send(Ok(grants)) {
                undelivered.extend(grants.iter().map(|g| g.id));
            }
        }
        if !undelivered.is_empty() {
            let mut fx = Effects::default();
            for id in undelivered {
                self.remove_grant(id, GrantEnd::Undelivered, &mut fx);
            }
            self.apply(fx, now);
        }
    }

    /// One pass of [`State::serve`]: first grants to queued calls, pushed on
    /// `served`. With `caps`, tenants at their `max_share` are passed
    /// over; returns true if one was.
    fn serve_pass(
        &mut self,
        ids: &[EnvId],
        caps: bool,
        served: &mut Vec<(Waiter, Vec<Grant>)>,
        now: Instant,
    ) -> bool {
        let mut capped = false;
        let mut heap = BinaryHeap::new();
        for (i, &id) in ids.iter().enumerate() {
            if let Some(entry) = self.envs.get(id)
                && entry.has_free()
                && let Some(key) = entry.queue().next_after(None)
            {
                heap.push(Reverse((key, i)));
            }
        }
        // Per environment, the lowest min_version that found nothing: capacity
        // only shrinks during the pass, so higher ones are skipped unasked.
        let mut failed_at: Vec<Option<u32>> = vec![None; ids.len()];
        while let Some(Reverse((held, i))) = heap.pop() {
            let id = ids[i];
            let Some(entry) = self.envs.get(id) else {
                continue;
            };
            if !entry.has_free() {
                continue;
            }
            let tenant = held.tenant.tenant;
            let requester = held.turn.requester;
            let tenant_truth = TenantKey {
                vtime: self.tenants.vtime(tenant),
                tenant,
            };
            let mut next = None;
            if tenant_truth != held.tenant {
                // Stale: put the tenant in its true place, look again.
                if let Some(queue) = self.envs.queue_mut(id) {
                    queue.rekey_tenant(tenant_truth);
                }
            } else if caps && self.tenants.at_cap(tenant, self.slots()) {
                capped = true;
                next = Some(entry.queue().first_of_tenant_after(Some(held.tenant)));
            } else {
                let stamp = self.requesters.last_served(&requester);
                match entry.queue().true_key(tenant, requester, stamp) {
                    Some(truth) if truth != held.turn => {
                        if let Some(queue) = self.envs.queue_mut(id) {
                            queue.rekey(tenant, requester, truth);
                        }
                    }
                    Some(_) => {
                        if let Some(w) = self.serve_requester(id, i, held, &mut failed_at, now) {
                            served.push(w);
                        }
                    }
                    None => {}
                }
            }
            if let Some(entry) = self.envs.get(id)
                && entry.has_free()
                && let Some(next) = next.unwrap_or_else(|| entry.queue().next_after(Some(held)))
            {
                heap.push(Reverse((next, i)));
            }
        }
        capped
    }

    /// The first grant for the oldest call of the requester at `held` that
    /// the free capacity of environment `ids[i]` can satisfy; its tenant and
    /// itself then move back.
    fn serve_requester(
        &mut self,
        id: EnvId,
        i: usize,
        held: QueueKey,
        failed_at: &mut [Option<u32>],
        now: Instant,
    ) -> Option<(Waiter, Vec<Grant>)> {
        let tenant = held.tenant.tenant;
        let requester = held.turn.requester;
        let calls = self.envs.get(id)?.queue().calls_of(tenant, requester);
        for seq in calls {
            let Some(w) = self.envs.get(id).and_then(|e| e.queue().get(seq)) else {
                continue;
            };
            let min_version = w.order.min_version;
            if failed_at[i].is_some_and(|v| min_version >= v) {
                continue;
            }
            let Some(servant) = self.pick(id, requester.ip, min_version, now) else {
                failed_at[i] = Some(min_version);
                continue;
            };
            let w = self.take_waiter(id, seq).expect("seen above");
            let origin = Origin::Issued {
                env: id,
                owner: w.order.owner,
                requester,
                tenant,
                lease: w.order.lease,
                prefetch: w.order.immediate == 0,
            };
            let first = self.create_grant(NewGrant { servant, origin }, now);
            self.tenants
                .served_from_queue(tenant, now.saturating_duration_since(w.queued_at));
            // Their keys just grew: behind every tenant and requester
            // waiting longer.
            let stamp = self.requesters.last_served(&requester);
            let vtime = self.tenants.vtime(tenant);
            if let Some(queue) = self.envs.queue_mut(id) {
                if let Some(truth) = queue.true_key(tenant, requester, stamp) {
                    queue.rekey(tenant, requester, truth);
                }
                queue.rekey_tenant(TenantKey { vtime, tenant });
            }
            return Some((w, vec![first]));
        }
        None
    }

    /// The farm's slots now: grants held and free slots (rule "max share").
    fn slots(&self) -> u64 {
        self.grants.len() as u64 + self.servants.free_slots()
    }

    /// Takes a call out of its queue and its requester's count.
    fn take_waiter(&mut self, env: EnvId, seq: u64) -> Option<Waiter> {
        let w = self.waiters.dequeue(self.envs.queue_mut(env)?, seq)?;
        self.requesters.stopped_waiting(w.order.requester);
        self.tenants.stopped_waiting(w.order.tenant);
        Some(w)
    }

    /// Rule "environment not available mid-wait": queued requests that no
    /// accepting servant can satisfy any more are answered at once (a
    /// prefetch-only call with `NoQuotaAvailable`, as at admission).
    pub(crate) fn fail_unavailable(&mut self, id: EnvId) {
        let Some(entry) = self.envs.get(id) else {
            return;
        };
        let failing: Vec<u64> = entry
            .queue()
            .iter()
            .filter(|(_, w)| !entry.available_for(w.order.min_version))
            .map(|(seq, _)| *seq)
            .collect();
        let name = entry.name().clone();
        for seq in failing {
            if let Some(w) = self.take_waiter(id, seq) {
                let answer = self.unavailable(&name, w.order.immediate);
                let _ = w.tx.send(Err(answer));
            }
        }
    }

    /// Rule "taking over", once the fence opened: queued calls whose
    /// environment nobody offers are answered as at admission, the others
    /// get what is free now.
    pub(crate) fn serve_all(&mut self, now: Instant) {
        let queued: Vec<EnvId> = self
            .envs
            .ids()
            .into_iter()
            .filter(|&id| self.envs.get(id).is_some_and(|e| !e.queue().is_empty()))
            .collect();
        // As after any index change: fail what nobody offers, serve the
        // rest, drop the slots left unused.
        let fx = Effects {
            serve: queued.clone(),
            lost: queued.clone(),
            left: queued,
        };
        self.apply(fx, now);
    }

    /// Takes a request out of its queue; false if it was already answered.
    pub(crate) fn remove_waiter(&mut self, env: EnvId, seq: u64) -> bool {
        let removed = self.take_waiter(env, seq).is_some();
        if removed {
            self.envs.drop_if_unused(env);
        }
        removed
    }

    /// Rule "shutdown": every queued request is answered now; later requests
    /// do not queue.
    pub(crate) fn shutdown(&mut self) {
        self.shutting_down = true;
        for id in self.envs.ids() {
            let seqs: Vec<u64> = self
                .envs
                .get(id)
                .map(|e| e.queue().iter().map(|(seq, _)| *seq).collect())
                .unwrap_or_default();
            for seq in seqs {
                if let Some(w) = self.take_waiter(id, seq) {
                    self.waiters.count_no_quota();
                    let _ = w.tx.send(Err(Rejection::NoQuotaAvailable));
                }
            }
            self.envs.drop_if_unused(id);
        }
    }
}

/// Owned by a waiting `wait_for_starting_task` future. Whatever ends the wait
/// (answer, timeout, or the future being dropped because the client went
/// away), the request leaves the queue under the lock, and a grant handed to
/// it but never received is released: no grant leaks.
pub(crate) struct WaitGuard {
    shared: Arc<Shared>,
    env: EnvId,
    seq: u64,
    /// `None` once the answer has been taken.
    rx: Option<oneshot::Receiver<WaitResult>>,
}

impl WaitGuard {
    /// Guards call `seq`, queued in environment `env`.
    pub(crate) fn new(
        shared: Arc<Shared>,
        env: EnvId,
        seq: u64,
        rx: oneshot::Receiver<WaitResult>,
    ) -> Self {
        WaitGuard {
            shared,
            env,
            seq,
            rx: Some(rx),
        }
    }

    /// Waits for the answer until `deadline`.
    pub(crate) async fn wait(mut self, deadline: Instant) -> WaitResult {
        let outcome = match self.rx.as_mut() {
            Some(rx) => tokio::time::timeout_at(deadline, rx).await,
            None => return Err(Rejection::NoQuotaAvailable),
        };
        match outcome {
            Ok(answer) => {
                self.rx = None;
                answer.unwrap_or(Err(Rejection::NoQuotaAvailable))
            }
            Err(_elapsed) => self.time_out(),
        }
    }

    /// Rule "waiter timeout": leave the queue and answer NoQuotaAvailable,
    /// unless grants arrived at the same moment, which are then returned.
    fn time_out(&mut self) -> WaitResult {
        let Some(mut rx) = self.rx.take() else {
            return Err(Rejection::NoQuotaAvailable);
        };
        self.shared.with_state(|st, _now| {
            if st.remove_waiter(self.env, self.seq) {
                st.waiters.count_no_quota();
                Err(Rejection::NoQuotaAvailable)
            } else {
                rx.try_recv().unwrap_or(Err(Rejection::NoQuotaAvailable))
            }
        })
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        self.shared.with_state(|st, now| {
            if !st.remove_waiter(self.env, self.seq)
                && let Ok(Ok(grants)) = rx.try_recv()
            {
                let mut fx = Effects::default();
                for g in &grants {
                    st.remove_grant(g.id, GrantEnd::Undelivered, &mut fx);
                }
                st.apply(fx, now);
            }
        });
    }
}
