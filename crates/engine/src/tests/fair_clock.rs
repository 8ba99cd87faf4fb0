//! Rule "fair shares per tenant" over a long life: the virtual clock is
//! rebased, so no history of grants and no weight in the accepted range
//! saturates it (it used to: a `u64` never rebased, after which the first
//! tenant in the file won every grant until a restart).
//!
//! 30 days at 1,000 contended grants/s is 2.6e9 grants, too many to run one
//! by one. The clock moves fastest when only a tenant of the smallest
//! weight is served: every grant then adds the largest step. That is the
//! arithmetic worst case; 30 days of it is 2.6e9 such steps, far past
//! `u64::MAX`. Rebasing makes the clock's state after any history one that
//! is reached again every few hundred grants of that worst case, so the
//! test runs it (through the engine's queues, on a paused clock) long
//! enough to cross the rebase many times, and past the point where the old
//! clock saturated (~16,800 such grants), asserting the clock stays
//! bounded; then it runs contended windows at both ends of the weight
//! range and in the middle and measures each tenant's share.

use std::collections::VecDeque;

use tokio::task::JoinHandle;

use super::*;
use crate::tenants::{KEPT_LAG, MAX_STEP, REBASE_AT};
use crate::tokens::digest;

type Answers = mpsc::UnboundedReceiver<(&'static str, Result<Vec<Grant>, Rejection>)>;
type Sender = mpsc::UnboundedSender<(&'static str, Result<Vec<Grant>, Rejection>)>;

/// The tenants, one token each (the token is the name).
const TENANTS: [(&str, f64); 6] = [
    ("tiny", 0.001),
    ("tiny3", 0.003),
    ("one", 1.0),
    ("three", 3.0),
    ("big", 1000.0 / 3.0),
    ("max", 1000.0),
];

fn farm() -> Scheduler {
    let tenants = TENANTS
        .iter()
        .map(|&(name, weight)| TenantSpec {
            name: name.to_owned(),
            weight,
            max_share: None,
            token_digests: Redacted(vec![digest(name)]),
        })
        .collect();
    Scheduler::new(Config {
        tenancy: Some(Tenancy {
            tenants,
            servant_tokens: None,
        }),
        ..config()
    })
}

fn req_as(tenant: &str) -> GrantRequest {
    GrantRequest {
        token: tenant.into(),
        wait: secs(10),
        answer_within: None,
        ..req_from("10.1.1.1")
    }
}

/// One queued call of `tenant` on its own task; its handle ends it.
fn queue_one(s: &Scheduler, tx: &Sender, tenant: &'static str) -> JoinHandle<()> {
    let s = s.clone();
    let tx = tx.clone();
    tokio::spawn(async move {
        let _ = tx.send((tenant, s.wait_for_starting_task(req_as(tenant)).await));
    })
}

fn clock(s: &Scheduler) -> u64 {
    s.shared().with_state(|st, _| st.tenants.virtual_now())
}

/// A saturated farm of 4 slots with `tenants` each keeping 4 calls queued
/// (calls of others are ended first): frees the oldest grant `rounds`
/// times, the tenant served queues again at once. Returns who got each
/// freed slot, and the highest clock reading seen.
async fn window(
    s: &Scheduler,
    held: &mut VecDeque<(u64, &'static str)>,
    queued: &mut Vec<JoinHandle<()>>,
    (tx, rx): (&Sender, &mut Answers),
    tenants: &[&'static str],
    rounds: usize,
) -> (Vec<&'static str>, u64) {
    for call in queued.drain(..) {
        call.abort();
    }
    settle().await;
    for &tenant in tenants {
        for _ in 0..4 {
            queued.push(queue_one(s, tx, tenant));
        }
    }
    settle().await;
    let mut order = Vec::with_capacity(rounds);
    let mut highest = 0;
    for _ in 0..rounds {
        let (id, owner) = held.pop_front().expect("a held grant");
        s.free(owner, ip("10.1.1.1"), &[id]).unwrap();
        let (tenant, answer) = rx.recv().await.unwrap();
        held.push_back((answer.expect("a grant")[0].id, tenant));
        order.push(tenant);
        highest = highest.max(clock(s));
        queued.push(queue_one(s, tx, tenant));
        settle().await;
        // Finished calls' handles are dropped as they go, not kept for ever.
        queued.retain(|call| !call.is_finished());
    }
    (order, highest)
}

fn count(order: &[&str], tenant: &str) -> usize {
    order.iter().filter(|&&t| t == tenant).count()
}

/// `hi` and `lo` (weights 3:1) shared `order`'s grants 3:1 within 5 %.
fn assert_three_to_one(order: &[&str], hi: &str, lo: &str) {
    let (h, l) = (count(order, hi), count(order, lo));
    let share = h as f64 / (h + l) as f64;
    assert!(
        (share / 0.75 - 1.0).abs() <= 0.05
            && ((l as f64 / (h + l) as f64) / 0.25 - 1.0).abs() <= 0.05,
        "{hi} got {h} and {lo} {l} of {} grants, not 3:1 within 5 %",
        h + l
    );
}

#[tokio::test(start_paused = true)]
async fn after_the_worst_case_history_shares_hold_across_the_whole_weight_range() {
    let s = farm();
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    let mut held = VecDeque::new();
    for _ in 0..4 {
        held.push_back((grant_one(&s, req_as("tiny")).await.id, "tiny"));
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut queued = Vec::new();
    // The worst case: every grant moves the clock by the largest step. The
    // old clock saturated after ~16,800 of them; this one is rebased every
    // ~770 and stays within its bound.
    let (alone, highest) = window(
        &s,
        &mut held,
        &mut queued,
        (&tx, &mut rx),
        &["tiny"],
        20_000,
    )
    .await;
    assert_eq!(count(&alone, "tiny"), 20_000);
    assert!(
        highest <= REBASE_AT + 4 * MAX_STEP,
        "the clock reached {highest}, past its bound"
    );
    assert!(
        clock(&s) < REBASE_AT && clock(&s) >= KEPT_LAG / 2,
        "{} is not a rebased reading",
        clock(&s)
    );
    // Both ends of the weight range and its middle, in turn; each window
    // crosses at least one rebase at the small end.
    for (hi, lo) in [("tiny3", "tiny"), ("three", "one"), ("max", "big")] {
        let (order, _) = window(&s, &mut held, &mut queued, (&tx, &mut rx), &[lo, hi], 2_000).await;
        assert_three_to_one(&order, hi, lo);
        // Already in every stretch of 40 grants.
        for stretch in order.chunks(40) {
            let h = count(stretch, hi);
            assert!((28..=32).contains(&h), "a stretch of 40 gave {hi} {h}");
        }
    }
    // All six at once: weights in proportion, the largest within 5 %, and
    // the smallest get nothing they are not owed (10^-6 of the grants).
    let everyone: Vec<&'static str> = TENANTS.iter().map(|t| t.0).collect();
    let (order, _) = window(&s, &mut held, &mut queued, (&tx, &mut rx), &everyone, 2_000).await;
    let total: f64 = TENANTS.iter().map(|t| t.1).sum();
    for (name, weight) in TENANTS {
        let owed = weight / total * order.len() as f64;
        let got = count(&order, name) as f64;
        // A tenant's first grant comes at once (it starts at the clock's
        // reading), so a count is off by a grant or two at most; the large
        // ones are within 5 %.
        assert!(
            (got - owed).abs() <= (0.05 * owed).max(2.0),
            "{name} (weight {weight}) got {got} of {} grants, owed {owed:.1}",
            order.len()
        );
    }
}
