use std::net::SocketAddr;

use super::{probe::tests::readyz_answering as leader_answering, *};
use crate::engine::{
    Config, GrantRequest, Heartbeat, Redacted, Rejection, ServantPriority, TokenSet,
};

const SERVANT: &str = "servant-token";
const USER: &str = "user-token";

fn engine(fence: &GrantFence) -> Scheduler {
    Scheduler::new(Config {
        servant_tokens: TokenSet::new([SERVANT]),
        user_tokens: TokenSet::new([USER]),
        grant_fence: fence.clone(),
        ..Config::default()
    })
}

/// An instance whose election holds a lease and campaigns with it.
fn elected() -> (Leadership, Scheduler) {
    let fence = GrantFence::closed();
    let engine = engine(&fence);
    let leadership = Leadership::elected(engine.clone(), fence);
    leadership.set_campaigning(true);
    (leadership, engine)
}

fn heartbeat(engine: &Scheduler, location: &str) {
    let at: SocketAddr = location.parse().unwrap();
    engine
        .heartbeat(Heartbeat {
            token: SERVANT.into(),
            observed_ip: at.ip(),
            location: location.to_owned(),
            next_heartbeat_in: Duration::from_secs(10),
            version: 1,
            num_processors: 4,
            current_load: 0,
            priority: ServantPriority::User,
            not_accepting_reason: None,
            capacity: 4,
            total_memory: 0,
            memory_available: 0,
            environments: vec!["gcc".to_owned()],
            running_tasks: Vec::new(),
        })
        .unwrap();
}

fn servants(engine: &Scheduler) -> usize {
    engine.snapshot().servants.len()
}

/// Runs a daemon connection that never ends by itself.
fn hold_connection(leadership: &Leadership) -> tokio::task::JoinHandle<()> {
    let leadership = leadership.clone();
    tokio::spawn(async move {
        leadership
            .while_serving_daemons(std::future::pending::<()>())
            .await;
    })
}

#[tokio::test(start_paused = true)]
async fn a_solo_scheduler_always_serves() {
    let solo = Leadership::solo();
    assert!(solo.is_serving());
    assert_eq!(solo.refusal(), None);
    assert!(solo.stats().is_none());
    assert!(solo.admits_daemons().await);
    let mut ran = false;
    solo.while_serving_daemons(async { ran = true }).await;
    assert!(ran);
}

#[tokio::test(start_paused = true)]
async fn an_elected_instance_serves_only_while_its_lease_certainly_runs() {
    let (leadership, _engine) = elected();
    assert!(!leadership.is_serving());
    assert_eq!(
        leadership.refusal().as_deref(),
        Some("standby, no leader elected")
    );
    assert_eq!(leadership.readiness().current(), Err(NotReady::Standby));
    leadership.lead(Instant::now() + Duration::from_secs(2));
    assert!(leadership.is_serving());
    assert_eq!(leadership.readiness().current(), Ok(()));
    assert_eq!(leadership.stats().unwrap().elections_won.get(), 1);
    // Paused past the deadline: not serving, before anyone noticed.
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(leadership.role().is_leader());
    assert!(!leadership.is_serving());
    assert_eq!(leadership.current(), Role::standby());
    leadership.stand_by(Some("b:8336".to_owned()));
    assert_eq!(leadership.readiness().current(), Err(NotReady::Standby));
    assert_eq!(
        leadership.refusal().as_deref(),
        Some("standby, leader is b:8336")
    );
}

#[tokio::test(start_paused = true)]
async fn a_daemon_connection_ends_when_leadership_is_lost() {
    let (leadership, _engine) = elected();
    leadership.lead(Instant::now() + Duration::from_secs(60));
    let held = hold_connection(&leadership);
    tokio::task::yield_now().await;
    assert!(!held.is_finished());
    leadership.stand_by(None);
    tokio::time::timeout(Duration::from_secs(1), held)
        .await
        .expect("closed at once")
        .unwrap();
    // A leader that stepped down takes no daemon over by itself.
    assert!(!leadership.role().serves_daemons());
}

#[tokio::test(start_paused = true)]
async fn a_win_without_a_takeover_starts_from_a_fresh_engine() {
    let (leadership, engine) = elected();
    heartbeat(&engine, "10.0.0.1:8335");
    leadership.lead(Instant::now() + Duration::from_secs(60));
    assert_eq!(servants(&engine), 0, "what it held before is stale");
}

#[tokio::test]
async fn a_standby_refuses_daemons_while_its_leader_answers() {
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (leadership, engine) = elected();
    leadership.stand_by(Some(leader_answering(ready).await));
    heartbeat(&engine, "10.0.0.1:8335");
    assert!(!leadership.admits_daemons().await);
    assert!(leadership.refusal().is_some());
    assert_eq!(servants(&engine), 1, "no takeover, no restart");
}

#[tokio::test]
async fn a_standby_takes_over_from_a_silent_leader_keeps_what_it_learnt_when_it_wins() {
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (leadership, engine) = elected();
    leadership.stand_by(Some(leader_answering(ready).await));
    heartbeat(&engine, "10.0.0.9:8335");
    assert!(leadership.admits_daemons().await, "taken over");
    assert_eq!(servants(&engine), 0, "started as a restarted scheduler");
    assert_eq!(leadership.refusal(), None, "calls are served");
    assert!(!leadership.is_serving(), "but nothing is granted");
    assert_eq!(
        leadership.readiness().current(),
        Err(NotReady::Standby),
        "and the balancer still sees no leader here"
    );
    assert!(
        leadership
            .current()
            .describe()
            .starts_with("standby taking over")
    );
    let held = hold_connection(&leadership);
    heartbeat(&engine, "10.0.0.1:8335");
    // The election's observations go on; the takeover with them.
    leadership.stand_by(None);
    assert!(leadership.role().serves_daemons());
    leadership.lead(Instant::now() + Duration::from_secs(60));
    assert!(leadership.is_serving());
    assert_eq!(
        servants(&engine),
        1,
        "kept what it learnt while taking over"
    );
    tokio::task::yield_now().await;
    assert!(!held.is_finished(), "the daemon's connection goes on");
    held.abort();
}

#[tokio::test]
async fn a_takeover_ends_when_the_leader_answers_again() {
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (leadership, _engine) = elected();
    leadership.stand_by(Some(leader_answering(ready.clone()).await));
    assert!(leadership.admits_daemons().await);
    let mut held = hold_connection(&leadership);
    assert!(
        tokio::time::timeout(probe::PROBE_TIMEOUT * 2, &mut held)
            .await
            .is_err(),
        "served while the leader is silent"
    );
    // Resumed (SIGCONT before its lease ran out): the connections close.
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(3), held)
        .await
        .expect("closed once the leader answers")
        .unwrap();
    assert!(!leadership.role().serves_daemons());
    assert!(leadership.refusal().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_connection_held_as_leader_ends_even_if_a_takeover_follows_at_once() {
    let (leadership, _engine) = elected();
    leadership.lead(Instant::now() + Duration::from_secs(60));
    let held = hold_connection(&leadership);
    tokio::task::yield_now().await;
    // Stepped down, and before the connection's task ran, a daemon that
    // reached this instance started a takeover (no leader known).
    leadership.stand_by(None);
    assert!(leadership.admits_daemons().await);
    assert!(leadership.role().serves_daemons());
    tokio::time::timeout(Duration::from_secs(1), held)
        .await
        .expect("the leader's connection closed")
        .unwrap();
}

/// One grant for "gcc", waiting up to `wait` for it.
fn grant_request(wait: Duration) -> GrantRequest {
    GrantRequest {
        token: Redacted(USER.to_owned()),
        requester_ip: "10.0.0.2".parse().unwrap(),
        connection: None,
        wait,
        answer_within: None,
        environment: "gcc".to_owned(),
        immediate: 1,
        prefetch: 0,
        lease: Duration::from_secs(10),
        min_version: 0,
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_steps_down_answers_the_calls_it_held_at_once() {
    let (leadership, engine) = elected();
    leadership.lead(Instant::now() + Duration::from_secs(60));
    heartbeat(&engine, "10.0.0.1:8335");
    // The servant's 4 slots taken: the next call queues.
    for _ in 0..4 {
        engine
            .wait_for_starting_task(grant_request(Duration::ZERO))
            .await
            .expect("a free slot");
    }
    let held = tokio::spawn({
        let engine = engine.clone();
        async move {
            engine
                .wait_for_starting_task(grant_request(Duration::from_secs(10)))
                .await
        }
    });
    tokio::task::yield_now().await;
    assert!(!held.is_finished(), "queued");
    leadership.stand_by(Some("b:8336".to_owned()));
    let answer = tokio::time::timeout(Duration::from_millis(1), held)
        .await
        .expect("answered at once, not at the end of its wait")
        .unwrap();
    // The call core answers it "not served here" (code 11), as it now
    // refuses every call.
    assert_eq!(answer.unwrap_err(), Rejection::NoQuotaAvailable);
    assert_eq!(
        leadership.refusal().as_deref(),
        Some("standby, leader is b:8336")
    );
    assert_eq!(servants(&engine), 0, "what it held as leader is stale");
}

#[tokio::test]
async fn an_instance_cut_off_from_etcd_takes_no_daemon_over_and_ends_a_takeover() {
    let silent = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (leadership, engine) = elected();
    leadership.stand_by(Some(leader_answering(silent).await));
    // Its term ended (etcd unreachable): it cannot win, so the daemons
    // are better off at the instance that will.
    leadership.set_campaigning(false);
    heartbeat(&engine, "10.0.0.1:8335");
    assert!(!leadership.admits_daemons().await);
    assert!(!leadership.role().is_taking_over());
    assert_eq!(servants(&engine), 1, "no takeover, no restart");
    // Taking over when its term ends: the takeover ends too.
    leadership.set_campaigning(true);
    assert!(leadership.admits_daemons().await);
    let held = hold_connection(&leadership);
    leadership.set_campaigning(false);
    tokio::time::timeout(probe::PROBE_TIMEOUT * 3, held)
        .await
        .expect("closed once its term ended")
        .unwrap();
    assert!(!leadership.role().serves_daemons());
}
