//! Engine tests, one file per topic; this file holds the shared fixtures.
//! Time is paused (`start_paused`) and moved with `tokio::time::advance`; no
//! test sleeps for real. Each test's name says the rule it checks.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::*;

mod adoption;
mod cordons;
mod ejection;
mod expiry;
mod fair_clock;
mod fencing;
mod grants;
mod own_load;
mod placement;
mod running_tasks;
mod servants;
mod snapshot;
mod speed;
mod tenants;
mod tokens;
mod waiters;

const USER: &str = "user-token-1";
const SERVANT: &str = "servant-token-1";
const ENV: &str = "gcc-12-digest";
/// The requesting machine of `req()` (no servant there).
const HOME: &str = "10.9.9.9";

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test IP")
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("test socket address")
}

/// User and servant token sets without intersection; no adoption (so unknown
/// reported ids are expired at once, as in the reference). No ejections:
/// most tests give grants back at once, unlisted, which is what rule
/// "broken servants" takes for a broken servant (`ejection` turns it on).
fn config() -> Config {
    Config {
        user_tokens: TokenSet::new([USER]),
        servant_tokens: TokenSet::new([SERVANT]),
        adoption_window: Duration::ZERO,
        eject_broken_servants: false,
        ..Config::default()
    }
}

/// A servant at `location`, seen from the same address, with `capacity`
/// slots, as many processors, no load, and the one test environment.
fn hb(location: &str, capacity: u32) -> Heartbeat {
    let a = addr(location);
    Heartbeat {
        token: SERVANT.into(),
        observed_ip: a.ip(),
        location: location.to_owned(),
        next_heartbeat_in: secs(10),
        version: 1,
        num_processors: capacity,
        current_load: 0,
        priority: ServantPriority::User,
        not_accepting_reason: None,
        capacity,
        total_memory: 0,
        memory_available: 0,
        environments: vec![ENV.to_owned()],
        running_tasks: Vec::new(),
    }
}

fn task(grant_id: u64) -> ReportedTask {
    ReportedTask {
        servant_task_id: grant_id ^ 0xffff,
        grant_id,
        task_digest: format!("task-{grant_id}"),
    }
}

/// One immediate grant, no waiting, 15 s lease, from 10.9.9.9 (no servant there).
/// A one-grant request from the machine at `requester`.
fn req_from(requester: &str) -> GrantRequest {
    GrantRequest {
        requester_ip: ip(requester),
        ..req()
    }
}

/// A one-grant request from daemon connection `connection` of the machine
/// (or office) at `requester`.
fn req_on(requester: &str, connection: u64) -> GrantRequest {
    GrantRequest {
        connection: Some(connection),
        ..req_from(requester)
    }
}

fn req() -> GrantRequest {
    GrantRequest {
        token: USER.into(),
        requester_ip: ip(HOME),
        connection: None,
        wait: Duration::ZERO,
        answer_within: None,
        environment: ENV.to_owned(),
        immediate: 1,
        prefetch: 0,
        lease: secs(15),
        min_version: 0,
    }
}

fn req_wait(wait: Duration) -> GrantRequest {
    GrantRequest { wait, ..req() }
}

/// Lets spawned tasks (the expiry task, waiters) run.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Moves the paused clock and lets the expiry task react.
async fn advance(d: Duration) {
    tokio::time::advance(d).await;
    settle().await;
}

async fn grant_one(s: &Scheduler, r: GrantRequest) -> Grant {
    let grants = s.wait_for_starting_task(r).await.expect("a grant");
    assert_eq!(grants.len(), 1);
    grants[0]
}

/// A `WaitForStartingTask` call running on its own task, as a queued client.
fn spawn_wait(
    s: &Scheduler,
    r: GrantRequest,
) -> tokio::task::JoinHandle<Result<Vec<Grant>, Rejection>> {
    let s = s.clone();
    tokio::spawn(async move { s.wait_for_starting_task(r).await })
}

/// `n` queued calls of `r` (waiting 10 s) on tasks of their own, each
/// sending `label` and its answer to `answers` when answered: the order in
/// which queued callers are served.
fn spawn_labelled<L: Copy + Send + 'static>(
    s: &Scheduler,
    answers: &tokio::sync::mpsc::UnboundedSender<(L, Result<Vec<Grant>, Rejection>)>,
    label: L,
    r: GrantRequest,
    n: usize,
) {
    for _ in 0..n {
        let s = s.clone();
        let answers = answers.clone();
        let r = GrantRequest {
            wait: secs(10),
            answer_within: None,
            ..r.clone()
        };
        tokio::spawn(async move {
            let _ = answers.send((label, s.wait_for_starting_task(r).await));
        });
    }
}

fn free_one(s: &Scheduler, id: u64) {
    s.free(USER, ip(HOME), &[id]).expect("free");
}

fn servant_view(s: &Scheduler, location: &str) -> ServantView {
    s.snapshot()
        .servants
        .into_iter()
        .find(|v| v.observed_location == addr(location))
        .expect("servant in snapshot")
}

/// A restarted engine with a 15 s adoption window.
fn restarted() -> Config {
    Config {
        adoption_window: secs(15),
        adopted_lease: secs(15),
        ..config()
    }
}

fn beat_with(location: &str, tasks: &[u64]) -> Heartbeat {
    let mut b = hb(location, 2);
    b.next_heartbeat_in = secs(30);
    b.running_tasks = tasks.iter().map(|&id| task(id)).collect();
    b
}
