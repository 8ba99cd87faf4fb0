//! Issue 20's hot standby with its real parts: Debian's etcd and HAProxy
//! (with `scripts/deploy/haproxy.cfg`), the scheduler binary twice, and the
//! simulated stock daemons of `yadcc-loadgen cluster` over flare. One test
//! at a time; every external program under `timeout`.
//!
//! `failover_time_over_10_runs` (ignored; `scripts/bench_failover.sh`) is
//! the BENCHMARKS.md figure.

mod admin;
mod deploy;
mod failsafe;
mod frozen;
mod partition;
mod secure;
mod support;

use yadcc_testkit::processes;

use std::{
    io::{Read, Write},
    net::TcpStream,
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use bytes::BytesMut;
use prost::Message;
use yadcc_pb::{self as pb, Method};
use yadcc_sim::{
    Cluster, ClusterConfig, Wire, Workload, stats::Stats, wire::flare::encode_flare_request,
};

use support::*;

/// The default lease.
const TTL: Duration = Duration::from_secs(3);
/// The bound on kill-to-granting.
const FAILOVER_LIMIT: Duration = Duration::from_secs(5);

fn heartbeat_frame() -> Vec<u8> {
    let request = pb::HeartbeatRequest {
        token: SERVANT_TOKEN.to_owned(),
        next_heartbeat_in_ms: 10_000,
        version: 1,
        location: "127.0.0.1:8335".to_owned(),
        num_processors: 4,
        capacity: 2,
        ..Default::default()
    };
    let mut frame = BytesMut::new();
    encode_flare_request(
        &mut frame,
        1,
        Method::Heartbeat,
        Duration::from_secs(5),
        &request.encode_to_vec(),
    );
    frame.to_vec()
}

/// Sends one flare heartbeat; the bytes that came back before the
/// connection closed or a second passed.
fn flare_exchange(port: u16) -> Vec<u8> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .expect("timeout");
    stream.write_all(&heartbeat_frame()).expect("send");
    let mut answer = vec![0; 4096];
    let read = stream.read(&mut answer).unwrap_or(0);
    answer.truncate(read);
    answer
}

/// `grpc.health.v1.Health/Check` of the whole server over Connect (unary,
/// binary): the `status` field (1 SERVING, 2 NOT_SERVING).
fn health_check(port: u16) -> Option<u8> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    // An empty HealthCheckRequest: the server as a whole.
    write!(
        stream,
        "POST /grpc.health.v1.Health/Check HTTP/1.1\r\nHost: x\r\n\
         Content-Type: application/proto\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let body = answer.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    // HealthCheckResponse{status}: field 1, varint.
    match &answer[body..] {
        [0x08, status] => Some(*status),
        _ => None,
    }
}

/// A JSON GetConfig over HTTP: the status line and the `Rpc-Error-Code`.
fn json_get_config(port: u16) -> (u16, Option<String>) {
    let body = format!("{{\"token\":\"{USER_TOKEN}\"}}");
    json_call(port, "GetConfig", &body, Duration::from_secs(2))
}

#[test]
fn two_schedulers_one_etcd_exactly_one_serves_and_the_standby_takes_no_daemon_call() {
    let Some(mut setup) = Setup::start("one", false) else {
        return;
    };
    let (leader, standby) = roles(&mut setup.a, &mut setup.b);
    // Over three leases: still exactly one.
    let until = Instant::now() + 3 * TTL;
    while Instant::now() < until {
        assert!(leader.is_ready(), "the leader stays ready");
        assert!(!standby.is_ready(), "the standby never is");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        standby.readyz(),
        Some((503, format!("standby, leader is {}", leader.name())))
    );
    assert_eq!(leader.readyz(), Some((200, "ready".to_owned())));
    // The gRPC health service reports the same readiness.
    assert_eq!(health_check(standby.port), Some(2), "NOT_SERVING");
    assert_eq!(health_check(leader.port), Some(1), "SERVING");
    assert_eq!(leader.metric("yadcc_scheduler_leader"), Some(1.0));
    assert_eq!(standby.metric("yadcc_scheduler_leader"), Some(0.0));
    assert_eq!(standby.metric("yadcc_scheduler_taking_over"), Some(0.0));
    assert_eq!(
        leader.metric("yadcc_scheduler_elections_won_total"),
        Some(1.0)
    );
    assert_eq!(
        standby.metric("yadcc_scheduler_elections_won_total"),
        Some(0.0)
    );
    assert!(
        leader
            .metric("yadcc_scheduler_lease_renew_duration_seconds_count")
            .is_some_and(|renewals| renewals >= 3.0),
        "renewals are timed"
    );
    // A daemon's connection to the standby is closed unanswered; the
    // leader answers the same call.
    assert!(flare_exchange(standby.port).is_empty(), "closed at once");
    assert!(!flare_exchange(leader.port).is_empty(), "answered");
    // Any other client's RPC: overloaded (503, code 11), not served.
    assert_eq!(json_get_config(standby.port), (503, Some("11".to_owned())));
    assert_eq!(json_get_config(leader.port).0, 200);
    // The dashboard says so.
    let (status, overview) = http_get(standby.port, "/api/v1/overview").expect("overview");
    assert_eq!(status, 200);
    assert!(
        overview.contains(&format!(
            "\"leadership\":\"standby, leader is {}\"",
            leader.name()
        )),
        "{overview}"
    );
}

/// What happened to the load around a kill of the leader.
struct Failover {
    /// From the kill to the first grant of the new leader.
    to_first_grant: Duration,
    /// From the kill to the new leader's `/readyz` 200.
    to_ready: Duration,
    report: String,
    /// The load generator's errors by kind (none before the kill).
    errors_by_kind: std::collections::BTreeMap<String, u64>,
    running_at_kill: usize,
    /// Calls the dead leader's connections failed when they broke: those in
    /// flight at the kill (and any sent before the daemon saw the close).
    in_flight_at_kill: usize,
    errors_before_kill: u64,
    errors_around_failover: u64,
    errors_once_settled: u64,
    tasks_killed: u64,
    renewals_refused: u64,
    grants_after: u64,
    /// The standby reported taking over before it led.
    took_over: bool,
}

const MACHINES: usize = 30;
/// From a daemon's connect to its connection's reader (see `in_flight_at_kill`).
const HANDOFF: Duration = Duration::from_millis(20);
/// At most from a kill to HAProxy's marking the server down with
/// `scripts/deploy/haproxy.cfg`: a check every 300 ms (`inter`), then
/// `fall 2` at `fastinter 200ms`, a refused port failing each at once.
const BALANCER_MARKS_DOWN: Duration = Duration::from_millis(300 + 2 * 200 + 100);
/// HAProxy's retries of a refused connection (`retries 3`, each after
/// `min(timeout connect, 1 s)` = 500 ms), and a little.
const BALANCER_RETRIES: Duration = Duration::from_millis(3 * 500 + 100);
/// Load before the kill, once every servant has registered.
const LOAD_BEFORE_KILL: Duration = Duration::from_secs(4);

fn cluster_config(target: std::net::SocketAddr) -> ClusterConfig {
    let mut config = ClusterConfig::new(
        target,
        USER_TOKEN,
        SERVANT_TOKEN,
        MACHINES,
        MACHINES,
        Workload::Rate {
            jobs_per_second: 1.0,
        },
    );
    config.protocol = Wire::Flare;
    config.servant_capacity = Some(4);
    config.delegate.task_duration = Duration::from_millis(1500)..=Duration::from_millis(4500);
    config.seed = Some(20);
    config
}

fn grants_issued(scheduler: &Scheduler) -> f64 {
    scheduler
        .metric("yadcc_scheduler_grants_issued_total")
        .unwrap_or(0.0)
}

/// Load through HAProxy, kill -9 the leader, watch the standby take over.
fn kill_the_leader_under_load(
    runtime: &tokio::runtime::Runtime,
    haproxy_port: u16,
    leader: &mut Scheduler,
    standby: &Scheduler,
    settle: Duration,
    only_the_new_window_adopts: bool,
) -> Failover {
    let since_change = || {
        standby
            .metric("yadcc_scheduler_seconds_since_leadership_change")
            .unwrap_or(0.0)
    };
    if only_the_new_window_adopts {
        // The standby's first adoption window (from its start) must be over
        // at the kill: only the window it opens on winning may save a task.
        let wait = ADOPTION_WINDOW.as_secs_f64() + 1.0 - LOAD_BEFORE_KILL.as_secs_f64();
        wait_until(
            2 * ADOPTION_WINDOW,
            "the standby's first window ends",
            || since_change() > wait,
        );
    }
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], haproxy_port));
    let cluster = runtime.block_on(async { Cluster::start(cluster_config(target)) });
    assert!(
        runtime.block_on(cluster.wait_ready(Duration::from_secs(10))),
        "servants register through HAProxy"
    );
    let stats: std::sync::Arc<Stats> = cluster.stats().clone();
    std::thread::sleep(LOAD_BEFORE_KILL);
    if only_the_new_window_adopts {
        assert!(
            since_change() > ADOPTION_WINDOW.as_secs_f64(),
            "the standby's first adoption window is over"
        );
    }
    assert!(grants_issued(leader) > 0.0, "the leader grants");
    assert_eq!(grants_issued(standby), 0.0, "the standby does not");

    let running_at_kill = cluster.running_tasks();
    let errors_before_kill = stats.total_errors();
    let grants_before = stats.events.grants_received.load(Relaxed);
    let killed_at = Instant::now();
    leader.kill_9();
    // Reaped: its sockets are gone. A daemon that connected a moment before
    // may have been put by HAProxy on one of them (accepted by the dying
    // leader's kernel, then reset): such connections are the leader's too.
    // One opened later, until HAProxy marks the leader down, may meet the
    // refused port and be closed at once (the leader's too); after that,
    // connections go to the standby.
    let reaped_at = Instant::now();
    let (mut to_first_grant, mut to_ready) = (None, None);
    let mut took_over = false;
    wait_until(FAILOVER_LIMIT * 2, "the standby grants", || {
        took_over |=
            to_ready.is_none() && standby.metric("yadcc_scheduler_taking_over") == Some(1.0);
        if to_ready.is_none() && standby.is_ready() {
            to_ready = Some(killed_at.elapsed());
        }
        if to_first_grant.is_none() && grants_issued(standby) > 0.0 {
            to_first_grant = Some(killed_at.elapsed());
        }
        to_ready.is_some() && to_first_grant.is_some()
    });
    let (to_first_grant, to_ready) = (to_first_grant.unwrap(), to_ready.unwrap());
    std::thread::sleep(settle);
    let errors_at_settled = stats.total_errors();
    std::thread::sleep(settle);
    let errors_at_end = stats.total_errors();
    runtime.block_on(cluster.stop());
    // What the dead leader's connections held when they broke: the calls in
    // flight at the kill, and any a daemon sent before it saw the close.
    // Connections opened up to the reaping, and the moment it takes the
    // load generator to hand a connected socket to its reader, may be his.
    let losses = stats.connection_losses();
    let since_kill = |at: Instant| at.saturating_duration_since(killed_at).as_secs_f64() * 1e3;
    let timeline = losses
        .iter()
        .map(|loss| {
            format!(
                "opened {:+.0} ms, lost {:+.0} ms, {} calls",
                loss.opened
                    .saturating_duration_since(killed_at)
                    .as_secs_f64()
                    * 1e3
                    - killed_at
                        .saturating_duration_since(loss.opened)
                        .as_secs_f64()
                        * 1e3,
                since_kill(loss.lost),
                loss.calls
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    let signed_ms =
        |at: Instant| since_kill(at) - killed_at.saturating_duration_since(at).as_secs_f64() * 1e3;
    let kills = stats
        .events
        .kills()
        .iter()
        .map(|kill| {
            format!(
                "grant {} on servant {}: started {:+.0} ms, killed {:+.0} ms",
                kill.grant,
                kill.servant,
                signed_ms(kill.started.into_std()),
                signed_ms(kill.killed.into_std()),
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    let timeline = format!(
        "reaped {:+.0} ms after the kill; connections lost with calls waiting:\n{timeline}\n\
         tasks killed:\n{kills}",
        since_kill(reaped_at)
    );
    let in_flight_at_kill = losses
        .iter()
        .filter(|loss| {
            let the_leaders = loss.opened <= reaped_at + HANDOFF;
            // Until HAProxy marks the dead leader down, it may still send a
            // new connection there; refused, and refused again on its
            // retries, it closes the daemon's side: no scheduler saw the call.
            let refused_by_the_balancer = loss.opened <= reaped_at + BALANCER_MARKS_DOWN
                && loss.lost.saturating_duration_since(loss.opened) <= BALANCER_RETRIES;
            loss.lost >= killed_at && (the_leaders || refused_by_the_balancer)
        })
        .map(|loss| loss.calls)
        .sum();
    Failover {
        to_first_grant,
        to_ready,
        report: format!("{}\n{timeline}", stats.report()),
        errors_by_kind: stats.report().total.errors,
        running_at_kill,
        in_flight_at_kill,
        errors_before_kill,
        errors_around_failover: errors_at_settled - errors_before_kill,
        errors_once_settled: errors_at_end - errors_at_settled,
        tasks_killed: stats.events.tasks_killed.load(Relaxed),
        renewals_refused: stats.events.renewals_refused.load(Relaxed),
        grants_after: stats.events.grants_received.load(Relaxed) - grants_before,
        took_over,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn kill_9_the_leader_under_load_through_haproxy_and_the_standby_grants_within_5_s() {
    let Some(mut setup) = Setup::start("kill", true) else {
        return;
    };
    let haproxy_port = setup.haproxy_port();
    let (leader, standby) = roles(&mut setup.a, &mut setup.b);
    let runtime = runtime();
    let outcome = kill_the_leader_under_load(
        &runtime,
        haproxy_port,
        leader,
        standby,
        Duration::from_secs(4),
        true,
    );
    let report = &outcome.report;
    eprintln!("{report}");
    eprintln!(
        "failover: granting {:?} and ready {:?} after the kill; {} running and {} calls in \
         flight at the kill; {} calls failed around it, {} once settled; {} tasks killed, \
         {} renewals refused",
        outcome.to_first_grant,
        outcome.to_ready,
        outcome.running_at_kill,
        outcome.in_flight_at_kill,
        outcome.errors_around_failover,
        outcome.errors_once_settled,
        outcome.tasks_killed,
        outcome.renewals_refused,
    );
    assert!(
        outcome.to_first_grant <= FAILOVER_LIMIT,
        "granting {:?} after the kill\n{report}",
        outcome.to_first_grant
    );
    assert!(outcome.took_over, "the standby took the daemons over");
    assert!(outcome.running_at_kill >= 10, "{report}");
    assert!(outcome.grants_after > 0, "{report}");
    assert_eq!(outcome.errors_before_kill, 0, "{report}");
    // Only what the dead leader held fails: later calls reach the standby,
    // which takes them over until it leads.
    assert!(
        outcome.errors_around_failover <= outcome.in_flight_at_kill as u64,
        "{} calls failed around the failover, {} were in flight at the kill\n{report}\n\
         the standby's log:\n{}",
        outcome.errors_around_failover,
        outcome.in_flight_at_kill,
        standby.log().join("\n")
    );
    assert_eq!(
        outcome.tasks_killed,
        0,
        "{report}\nthe standby's log:\n{}",
        standby.log().join("\n")
    );
    assert_eq!(outcome.renewals_refused, 0, "{report}");
    assert_eq!(
        outcome.errors_once_settled, 0,
        "{} errors around the failover, then more:\n{report}",
        outcome.errors_around_failover
    );
    assert_eq!(standby.metric("yadcc_scheduler_leader"), Some(1.0));
}

#[test]
fn a_leader_paused_past_its_lease_resumes_as_a_standby_and_never_grants_again() {
    let Some(mut setup) = Setup::start("stop", true) else {
        return;
    };
    let haproxy_port = setup.haproxy_port();
    let (leader, standby) = roles(&mut setup.a, &mut setup.b);
    let runtime = runtime();
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], haproxy_port));
    let cluster = runtime.block_on(async { Cluster::start(cluster_config(target)) });
    assert!(runtime.block_on(cluster.wait_ready(Duration::from_secs(10))));
    std::thread::sleep(Duration::from_secs(3));
    let granted_before_pause = grants_issued(leader);
    assert!(granted_before_pause > 0.0, "the leader grants");

    leader.signal("STOP");
    let paused_at = Instant::now();
    // The other takes over while it sleeps.
    wait_until(2 * TTL, "the standby leads", || standby.is_ready());
    std::thread::sleep((2 * TTL).saturating_sub(paused_at.elapsed()));
    leader.signal("CONT");
    let resumed_at = Instant::now();
    let came_to = wait_until(
        Duration::from_secs(1),
        "the resumed one is a standby",
        || {
            leader
                .readyz()
                .is_some_and(|(status, why)| status == 503 && why.starts_with("standby"))
        },
    );
    eprintln!("paused leader reported standby {came_to:?} after SIGCONT");
    // Both, every quarter second for 6 s: only the new leader's count of
    // grants moves (so no two grant in the same second).
    let mut samples = Vec::new();
    while resumed_at.elapsed() < Duration::from_secs(6) {
        samples.push((grants_issued(leader), grants_issued(standby)));
        std::thread::sleep(Duration::from_millis(250));
    }
    let report = cluster.stats().report().to_string();
    runtime.block_on(cluster.stop());
    let new_at_resume = samples[0].1;
    // Its count never rises (it restarts from 0 if it takes daemons over).
    assert!(
        samples.windows(2).all(|pair| pair[1].0 <= pair[0].0),
        "the paused leader granted after resuming: {samples:?}"
    );
    assert!(
        samples.last().unwrap().1 > new_at_resume,
        "the new leader grants: {samples:?}\nold:\n{}\nnew:\n{}\n{report}",
        leader.log().join("\n"),
        standby.log().join("\n"),
    );
    assert_eq!(leader.metric("yadcc_scheduler_leader"), Some(0.0));
    assert!(
        leader
            .log()
            .iter()
            .any(|line| line.contains("stepped down")),
        "the log says why"
    );
}

#[test]
fn with_etcd_gone_the_leader_serves_until_its_lease_could_expire_and_leads_again_after() {
    let Some(mut setup) = Setup::start("etcd", false) else {
        return;
    };
    let Setup { a, b, etcd, .. } = &mut setup;
    let (leader, standby) = roles(a, b);
    // Just after a renewal: the lease then runs a whole TTL from it.
    let renewals = || {
        leader
            .metric("yadcc_scheduler_lease_renew_duration_seconds_count")
            .unwrap_or(0.0)
    };
    let seen = renewals();
    wait_until(TTL, "a renewal", || renewals() > seen);
    etcd.process.kill_9();
    let killed_at = Instant::now();
    // Serving while the lease certainly runs: at least a period of renewal
    // (a third of the TTL) after the last one.
    let stepped_down_after = wait_until(2 * TTL, "the leader steps down", || !leader.is_ready());
    assert!(
        stepped_down_after >= TTL / 3,
        "stepped down {stepped_down_after:?} after etcd died: too early"
    );
    assert!(
        stepped_down_after <= TTL,
        "served {stepped_down_after:?} after etcd died: past the lease"
    );
    assert!(
        !leader.is_ready() && !standby.is_ready(),
        "nobody leads without etcd"
    );
    eprintln!("etcd killed: stepped down after {stepped_down_after:?}");
    std::thread::sleep(Duration::from_secs(1));
    *etcd = etcd.restart();
    let back_after = killed_at.elapsed();
    let led_again = wait_until(5 * TTL, "one leads again", || {
        leader.is_ready() != standby.is_ready()
    });
    eprintln!("etcd back {back_after:?} after the kill: one leads again {led_again:?} later");
}

#[test]
fn sigterm_resigns_so_the_standby_leads_before_the_lease_would_have_expired() {
    let Some(mut setup) = Setup::start("term", false) else {
        return;
    };
    let (leader, standby) = roles(&mut setup.a, &mut setup.b);
    leader.signal("TERM");
    // Without the resignation the standby would wait for the lease: at
    // least two thirds of the TTL after the last renewal.
    let took = wait_until(TTL, "the standby leads", || standby.is_ready());
    eprintln!("SIGTERM: the standby leads {took:?} later");
    assert!(took < TTL / 2, "{took:?}: the leader did not resign");
    assert!(leader.log().iter().any(|line| line.contains("resigned")));
}

/// `scripts/bench_failover.sh`: kill -9 the leader under load 10 times,
/// restarting it each time as the new standby; kill to first grant, min /
/// median / max.
#[test]
#[ignore = "a benchmark: scripts/bench_failover.sh"]
fn failover_time_over_10_runs() {
    let Some(mut setup) = Setup::start("bench", true) else {
        return;
    };
    let haproxy_port = setup.haproxy_port();
    let etcd_url = setup.etcd.client_url.clone();
    let runtime = runtime();
    let mut times = Vec::new();
    for run in 1..=10 {
        let (leader, standby) = roles(&mut setup.a, &mut setup.b);
        let outcome = kill_the_leader_under_load(
            &runtime,
            haproxy_port,
            leader,
            standby,
            Duration::from_secs(2),
            false,
        );
        println!(
            "run {run}: first grant {:.2} s after the kill, ready {:.2} s; {} calls failed \
             {:?} ({} in flight at the kill); {} tasks killed, {} renewals refused",
            outcome.to_first_grant.as_secs_f64(),
            outcome.to_ready.as_secs_f64(),
            outcome.errors_around_failover,
            outcome.errors_by_kind,
            outcome.in_flight_at_kill,
            outcome.tasks_killed,
            outcome.renewals_refused
        );
        times.push(outcome.to_first_grant);
        let port = leader.port;
        *leader = Scheduler::behind_balancer(port, &etcd_url);
    }
    times.sort();
    println!(
        "failover (kill -9 to first grant) over {} runs: min {:.2} s, median {:.2} s, max {:.2} s",
        times.len(),
        times[0].as_secs_f64(),
        (times[4] + times[5]).as_secs_f64() / 2.0,
        times[9].as_secs_f64()
    );
}
