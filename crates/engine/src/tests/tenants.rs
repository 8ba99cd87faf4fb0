//! Rules "fair shares per tenant", "max share" and "reload": weighted
//! shares of contended capacity, a tenant's cap, tokens changed at run time.

use std::collections::VecDeque;

use super::*;
use crate::tokens::digest;

/// A tenant with one token (the token is its name).
fn tenant(name: &str, weight: f64, max_share: Option<f64>) -> TenantSpec {
    TenantSpec {
        name: name.to_owned(),
        weight,
        max_share,
        token_digests: Redacted(vec![digest(name)]),
    }
}

fn with_tenants(tenants: Vec<TenantSpec>) -> Config {
    Config {
        tenancy: Some(Tenancy {
            tenants,
            servant_tokens: None,
        }),
        ..config()
    }
}

fn req_as(tenant: &str, machine: &str) -> GrantRequest {
    GrantRequest {
        token: tenant.into(),
        ..req_from(machine)
    }
}

fn view(s: &Scheduler, name: &str) -> TenantView {
    s.tenants()
        .into_iter()
        .find(|t| t.name == name)
        .expect("tenant in the view")
}

type Label = (&'static str, &'static str);

/// A saturated farm: every freed slot goes to a queued call, and the
/// tenant served queues another at once (if `requeue` says so). Frees the
/// oldest grant `rounds` times; returns who got each freed slot.
async fn churn(
    s: &Scheduler,
    held: &mut VecDeque<(u64, Label)>,
    answers: &mut mpsc::UnboundedReceiver<(Label, Result<Vec<Grant>, Rejection>)>,
    tx: &mpsc::UnboundedSender<(Label, Result<Vec<Grant>, Rejection>)>,
    rounds: usize,
    requeue: impl Fn(&str) -> bool,
) -> Vec<&'static str> {
    let mut order = Vec::new();
    for _ in 0..rounds {
        let (id, (tenant, machine)) = held.pop_front().expect("a held grant");
        s.free(tenant, ip(machine), &[id]).unwrap();
        let (label, answer) = answers.recv().await.unwrap();
        held.push_back((answer.expect("a grant")[0].id, label));
        order.push(label.0);
        if requeue(label.0) {
            spawn_labelled(s, tx, label, req_as(label.0, label.1), 1);
            settle().await;
        }
    }
    order
}

#[tokio::test(start_paused = true)]
async fn weights_three_to_one_give_three_grants_to_one_whatever_the_requesters() {
    let s = Scheduler::new(with_tenants(vec![
        tenant("developers", 3.0, None),
        tenant("ci", 1.0, None),
    ]));
    s.heartbeat(hb("10.0.0.1:8335", 4)).unwrap();
    let mut held = VecDeque::new();
    for _ in 0..4 {
        let g = grant_one(&s, req_as("developers", "10.1.1.1")).await;
        held.push_back((g.id, ("developers", "10.1.1.1")));
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    // One developer machine; CI spread over five machines with more calls.
    spawn_labelled(
        &s,
        &tx,
        ("developers", "10.1.1.1"),
        req_as("developers", "10.1.1.1"),
        8,
    );
    for machine in ["10.2.2.1", "10.2.2.2", "10.2.2.3", "10.2.2.4", "10.2.2.5"] {
        spawn_labelled(&s, &tx, ("ci", machine), req_as("ci", machine), 8);
    }
    settle().await;
    let order = churn(&s, &mut held, &mut rx, &tx, 400, |_| true).await;
    let developers = order.iter().filter(|&&t| t == "developers").count();
    assert!(
        (297..=303).contains(&developers),
        "developers got {developers} of 400 freed slots, not 3 in 4"
    );
    // In every window of 8 grants the shares already hold.
    for window in order.chunks(8) {
        let d = window.iter().filter(|&&t| t == "developers").count();
        assert!((5..=7).contains(&d), "a window of 8 gave developers {d}");
    }
    assert_eq!(view(&s, "ci").waiting + view(&s, "developers").waiting, 48);
}

#[tokio::test(start_paused = true)]
async fn max_share_holds_while_another_tenant_waits_and_gives_way_when_none_does() {
    let s = Scheduler::new(with_tenants(vec![
        tenant("ci", 3.0, Some(0.25)),
        tenant("developers", 1.0, None),
    ]));
    s.heartbeat(hb("10.0.0.1:8335", 8)).unwrap();
    let mut held = VecDeque::new();
    for _ in 0..8 {
        let g = grant_one(&s, req_as("developers", "10.1.1.1")).await;
        held.push_back((g.id, ("developers", "10.1.1.1")));
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    spawn_labelled(
        &s,
        &tx,
        ("developers", "10.1.1.1"),
        req_as("developers", "10.1.1.1"),
        8,
    );
    spawn_labelled(&s, &tx, ("ci", "10.2.2.2"), req_as("ci", "10.2.2.2"), 8);
    settle().await;
    let mut most = 0;
    for _ in 0..40 {
        churn(&s, &mut held, &mut rx, &tx, 1, |_| true).await;
        most = most.max(view(&s, "ci").held);
    }
    // Weight 3 would give CI 6 of the 8 slots; its cap is 2.
    assert_eq!(most, 2, "CI held at most a quarter of the farm");
    assert_eq!(view(&s, "ci").held, 2);
    // Developers stop asking: their queued calls are served, then CI
    // takes every slot they free.
    let order = churn(&s, &mut held, &mut rx, &tx, 30, |t| t == "ci").await;
    assert!(order.ends_with(&["ci"; 8]), "{order:?}");
    assert_eq!(
        view(&s, "ci").held,
        8,
        "nobody else waits: CI takes the farm"
    );
    assert_eq!(view(&s, "developers").waiting, 0);
}

#[tokio::test(start_paused = true)]
async fn an_idle_tenant_earns_no_credit_for_later() {
    let s = Scheduler::new(with_tenants(vec![
        tenant("a", 1.0, None),
        tenant("b", 1.0, None),
    ]));
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    let mut held = VecDeque::new();
    for _ in 0..2 {
        let g = grant_one(&s, req_as("a", "10.1.1.1")).await;
        held.push_back((g.id, ("a", "10.1.1.1")));
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    spawn_labelled(&s, &tx, ("a", "10.1.1.1"), req_as("a", "10.1.1.1"), 4);
    settle().await;
    // A alone for 100 grants, then B starts waiting: they alternate, B
    // does not get the next hundred.
    churn(&s, &mut held, &mut rx, &tx, 100, |_| true).await;
    spawn_labelled(&s, &tx, ("b", "10.2.2.2"), req_as("b", "10.2.2.2"), 4);
    settle().await;
    let order = churn(&s, &mut held, &mut rx, &tx, 20, |_| true).await;
    let b = order.iter().filter(|&&t| t == "b").count();
    assert!((9..=11).contains(&b), "B got {b} of 20: {order:?}");
}

#[tokio::test(start_paused = true)]
async fn without_a_tenants_file_the_user_tokens_are_the_default_tenant() {
    let s = Scheduler::new(config());
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    grant_one(&s, req()).await;
    let tenants = s.tenants();
    assert_eq!(tenants.len(), 1);
    let t = &tenants[0];
    assert_eq!(
        (t.name.as_str(), t.weight, t.held, t.grants_total),
        (DEFAULT_TENANT, 1.0, 1, 1)
    );
    assert_eq!(t.slots, 2, "one held, one free");
    assert_eq!(t.wait_buckets[0], 1, "granted at once: a wait of zero");
}

#[tokio::test(start_paused = true)]
async fn a_reload_refuses_a_removed_token_and_admits_a_new_one() {
    let s = Scheduler::new(with_tenants(vec![tenant("ci", 1.0, None)]));
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    let g = grant_one(&s, req_as("ci", HOME)).await;
    assert_eq!(
        s.wait_for_starting_task(req_as("release", HOME)).await,
        Err(Rejection::AccessDenied)
    );
    s.set_tenancy(&Tenancy {
        tenants: vec![tenant("release", 2.0, None)],
        servant_tokens: None,
    });
    assert_eq!(
        s.wait_for_starting_task(req_as("ci", HOME)).await,
        Err(Rejection::AccessDenied)
    );
    assert_eq!(
        s.keep_alive("ci", ip(HOME), &[g.id], secs(15)),
        Err(Rejection::AccessDenied)
    );
    grant_one(&s, req_as("release", HOME)).await;
    // The removed tenant is shown while its grant runs, then no more.
    let names = |s: &Scheduler| {
        s.tenants()
            .into_iter()
            .map(|t| (t.name, t.configured))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(&s),
        [("ci".to_owned(), false), ("release".to_owned(), true)]
    );
    advance(secs(16)).await;
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    assert_eq!(names(&s), [("release".to_owned(), true)]);
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_the_servant_tokens_of_the_file_or_the_flag() {
    let s = Scheduler::new(with_tenants(vec![tenant("ci", 1.0, None)]));
    s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap();
    s.set_tenancy(&Tenancy {
        tenants: vec![tenant("ci", 1.0, None)],
        servant_tokens: Some(TokenSet::new(["new-servant-token"])),
    });
    assert_eq!(
        s.heartbeat(hb("10.0.0.1:8335", 2)).unwrap_err(),
        Rejection::AccessDenied
    );
    let hb2 = Heartbeat {
        token: "new-servant-token".into(),
        ..hb("10.0.0.1:8335", 2)
    };
    assert!(s.heartbeat(hb2).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_hundred_waiting_tenants_share_by_weight() {
    let specs: Vec<TenantSpec> = (0..100)
        .map(|i| tenant(&format!("t{i}"), if i == 0 { 10.0 } else { 1.0 }, None))
        .collect();
    let names: Vec<&'static str> = specs
        .iter()
        .map(|t| &*Box::leak(t.name.clone().into_boxed_str()))
        .collect();
    // A machine per tenant.
    let machines: Vec<&'static str> = (0..100)
        .map(|i| &*Box::leak(format!("10.1.0.{}", i + 1).into_boxed_str()))
        .collect();
    let s = Scheduler::new(with_tenants(specs));
    s.heartbeat(hb("10.0.0.1:8335", 1)).unwrap();
    let g = grant_one(&s, req_as(names[1], machines[1])).await;
    let mut held = VecDeque::from([(g.id, (names[1], machines[1]))]);
    let (tx, mut rx) = mpsc::unbounded_channel();
    for (&name, &machine) in names.iter().zip(&machines) {
        spawn_labelled(&s, &tx, (name, machine), req_as(name, machine), 2);
    }
    settle().await;
    let order = churn(&s, &mut held, &mut rx, &tx, 1090, |_| true).await;
    let heavy = order.iter().filter(|&&t| t == names[0]).count();
    assert!(
        (98..=102).contains(&heavy),
        "weight 10 of 109 got {heavy} of 1090"
    );
    let light = order.iter().filter(|&&t| t == names[57]).count();
    assert!(
        (9..=11).contains(&light),
        "weight 1 of 109 got {light} of 1090"
    );
}
