//! Requests waiting for capacity: admission, the fair serving pass, timeouts
//! and cancellation.
//!
//! Each environment keeps its queued requests in a `BTreeMap` keyed by one
//! global arrival sequence number. Whenever capacity appears (a free, a zombie
//! reaped, a servant gaining capacity or joining) the engine, still under the
//! lock, walks the queues of the affected environments merged in arrival
//! order and hands each request it can satisfy its first grant through a
//! oneshot channel. So capacity that is free at any moment is capacity no
//! queued request can use, and a new call may take it at once.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::IpAddr;
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Shared;
use super::placement::EnvId;
use super::state::{State, later};
use super::types::{Grant, GrantRequest, Rejection};

/// The answer a queued request receives.
pub(crate) type Answer = Result<Vec<Grant>, Rejection>;

/// A queued `WaitForStartingTask` call.
pub(crate) struct Waiter {
    pub env: EnvId,
    pub requester: IpAddr,
    pub min_version: u32,
    pub lease: Duration,
    pub immediate: u32,
    pub total: u32,
    pub tx: oneshot::Sender<Answer>,
}

/// Outcome of admitting a request under the lock.
pub(crate) enum Admission {
    /// Capacity was free right now.
    Granted(Vec<Grant>),
    /// Queued; wait on `rx` until `deadline`.
    Queued {
        env: EnvId,
        seq: u64,
        rx: oneshot::Receiver<Answer>,
        deadline: Instant,
    },
}

impl State {
    /// Rule "WaitForStartingTask" (the part under the lock): environment not
    /// available fails at once; otherwise take what is free now (immediate
    /// grants first, then prefetch); if nothing is free, queue the request
    /// for its first grant unless it may not wait.
    pub(crate) fn admit(
        &mut self,
        req: &GrantRequest,
        total: u32,
        now: Instant,
    ) -> Result<Admission, Rejection> {
        let env = match self.envs.lookup(&req.environment) {
            Some(id)
                if self
                    .envs
                    .get(id)
                    .is_some_and(|e| e.available_for(req.min_version)) =>
            {
                id
            }
            _ => {
                return Err(Rejection::EnvironmentNotAvailable {
                    environment: req.environment.clone(),
                });
            }
        };
        let requester = req.requester_ip.to_canonical();
        let grants = self.grant_now(
            env,
            requester,
            req.min_version,
            req.lease,
            req.immediate,
            total,
            Vec::new(),
            now,
        );
        if !grants.is_empty() {
            return Ok(Admission::Granted(grants));
        }
        if self.shutting_down || req.wait.is_zero() || self.waiter_count >= self.max_waiters {
            self.counters.no_quota += 1;
            return Err(Rejection::NoQuotaAvailable);
        }
        let seq = self.next_waiter_seq;
        self.next_waiter_seq += 1;
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter {
            env,
            requester,
            min_version: req.min_version,
            lease: req.lease,
            immediate: req.immediate,
            total,
            tx,
        };
        self.envs
            .get_mut(env)
            .expect("looked up above")
            .waiters
            .insert(seq, waiter);
        self.waiter_count += 1;
        Ok(Admission::Queued {
            env,
            seq,
            rx,
            deadline: later(now, req.wait),
        })
    }

    /// Grants one by one from capacity free right now until `total` grants
    /// are held or nothing fits. Grant `i` is a prefetch grant if `i >= immediate`.
    #[allow(clippy::too_many_arguments)]
    fn grant_now(
        &mut self,
        env: EnvId,
        requester: IpAddr,
        min_version: u32,
        lease: Duration,
        immediate: u32,
        total: u32,
        mut grants: Vec<Grant>,
        now: Instant,
    ) -> Vec<Grant> {
        while grants.len() < total as usize {
            let Some(key) = self.pick(env, requester, min_version) else {
                break;
            };
            let prefetch = grants.len() >= immediate as usize;
            grants.push(self.grant_on(key, env, requester, lease, prefetch, now));
        }
        grants
    }

    /// Rule "fairness": serves queued requests of the given environments in
    /// global arrival order, skipping (not blocking on) those that the free
    /// capacity cannot satisfy (min_version). Each served request gets its
    /// first grant in that order; only then do served requests take their
    /// extra grants, from capacity no queued request can use.
    pub(crate) fn serve(&mut self, mut ids: Vec<EnvId>, now: Instant) {
        ids.sort_unstable();
        ids.dedup();
        let mut heap = BinaryHeap::new();
        for (i, &id) in ids.iter().enumerate() {
            if let Some(entry) = self.envs.get(id) {
                if !entry.free.is_empty() {
                    if let Some((&seq, _)) = entry.waiters.first_key_value() {
                        heap.push(Reverse((seq, i)));
                    }
                }
            }
        }
        let mut served: Vec<(Waiter, Vec<Grant>)> = Vec::new();
        // Per environment, the lowest min_version that found nothing: capacity
        // only shrinks during the pass, so higher ones are skipped unasked.
        let mut failed_at: Vec<Option<u32>> = vec![None; ids.len()];
        while let Some(Reverse((seq, i))) = heap.pop() {
            let id = ids[i];
            let Some(entry) = self.envs.get(id) else {
                continue;
            };
            if entry.free.is_empty() {
                continue;
            }
            if let Some(w) = entry.waiters.get(&seq) {
                let (requester, min_version) = (w.requester, w.min_version);
                let hopeless = failed_at[i].is_some_and(|v| min_version >= v);
                let picked = if hopeless {
                    None
                } else {
                    self.pick(id, requester, min_version)
                };
                if picked.is_none() && !hopeless {
                    failed_at[i] = Some(min_version);
                }
                if let Some(key) = picked {
                    let w = self
                        .envs
                        .get_mut(id)
                        .and_then(|e| e.waiters.remove(&seq))
                        .expect("seen above");
                    self.waiter_count -= 1;
                    let first = self.grant_on(key, id, w.requester, w.lease, w.immediate == 0, now);
                    served.push((w, vec![first]));
                }
            }
            if let Some(entry) = self.envs.get(id) {
                if !entry.free.is_empty() {
                    if let Some((&next, _)) = entry.waiters.range((Excluded(seq), Unbounded)).next()
                    {
                        heap.push(Reverse((next, i)));
                    }
                }
            }
        }
        let mut undelivered = Vec::new();
        for (w, first) in served {
            let grants = self.grant_now(
                w.env,
                w.requester,
                w.min_version,
                w.lease,
                w.immediate,
                w.total,
                first,
                now,
            );
            // The receiver lives until its guard has removed the waiter under
            // this lock, so this only fails if that invariant is broken.
            if let Err(Ok(grants)) = w.tx.send(Ok(grants)) {
                undelivered.extend(grants.iter().map(|g| g.id));
            }
        }
        if !undelivered.is_empty() {
            self.free_ids(&undelivered, now);
        }
    }

    /// Rule "environment not available mid-wait": queued requests that no
    /// accepting servant can satisfy any more are answered at once.
    pub(crate) fn fail_unavailable(&mut self, id: EnvId) {
        let Some(entry) = self.envs.get_mut(id) else {
            return;
        };
        let failing: Vec<u64> = entry
            .waiters
            .iter()
            .filter(|(_, w)| !entry.available_for(w.min_version))
            .map(|(seq, _)| *seq)
            .collect();
        for seq in failing {
            if let Some(w) = entry.waiters.remove(&seq) {
                self.waiter_count -= 1;
                let _ = w.tx.send(Err(Rejection::EnvironmentNotAvailable {
                    environment: entry.name.to_string(),
                }));
            }
        }
    }

    /// Takes a request out of its queue; false if it was already answered.
    pub(crate) fn remove_waiter(&mut self, env: EnvId, seq: u64) -> bool {
        let removed = self
            .envs
            .get_mut(env)
            .and_then(|e| e.waiters.remove(&seq))
            .is_some();
        if removed {
            self.waiter_count -= 1;
            self.envs.drop_if_unused(env);
        }
        removed
    }

    /// Rule "shutdown": every queued request is answered now; later requests
    /// do not queue.
    pub(crate) fn shutdown(&mut self) {
        self.shutting_down = true;
        for id in self.envs.ids() {
            let Some(entry) = self.envs.get_mut(id) else {
                continue;
            };
            let waiters = std::mem::take(&mut entry.waiters);
            for (_, w) in waiters {
                self.waiter_count -= 1;
                self.counters.no_quota += 1;
                let _ = w.tx.send(Err(Rejection::NoQuotaAvailable));
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
    pub shared: Arc<Shared>,
    pub env: EnvId,
    pub seq: u64,
    /// `None` once the answer has been taken.
    pub rx: Option<oneshot::Receiver<Answer>>,
}

impl WaitGuard {
    /// Waits for the answer until `deadline`.
    pub(crate) async fn wait(mut self, deadline: Instant) -> Answer {
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
    fn time_out(&mut self) -> Answer {
        let Some(mut rx) = self.rx.take() else {
            return Err(Rejection::NoQuotaAvailable);
        };
        self.shared.with_state(|st, _now| {
            if st.remove_waiter(self.env, self.seq) {
                st.counters.no_quota += 1;
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
            if !st.remove_waiter(self.env, self.seq) {
                if let Ok(Ok(grants)) = rx.try_recv() {
                    let ids: Vec<u64> = grants.iter().map(|g| g.id).collect();
                    st.free_ids(&ids, now);
                }
            }
        });
    }
}
