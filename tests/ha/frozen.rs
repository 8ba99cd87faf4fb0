//! A leader frozen (SIGSTOP: a VM paused or migrated, a machine swapping):
//! its kernel still accepts and acknowledges, so nothing but time tells the
//! others it is gone. The daemons must reach the new leader within 5 s of
//! the freeze however long it lasts, and the frozen one, resumed, must
//! serve and grant nothing: what it held is answered "not served here"
//! (code 11).

use std::{
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use yadcc_sim::Cluster;

use super::{FAILOVER_LIMIT, TTL, cluster_config, grants_issued, runtime};
use crate::support::*;

/// The servant's memory, over any `--servant_min_memory_for_accepting_new_task`.
const MEMORY: u64 = 32 << 30;

fn wait_for_one_grant(wait_ms: u32) -> String {
    format!(
        "{{\"token\":\"{USER_TOKEN}\",\"millisecondsToWait\":{wait_ms},\
         \"envDescs\":null,\"envDesc\":{{\"compilerDigest\":\"gcc\"}},\
         \"immediateReqs\":1,\"nextKeepAliveInMs\":10000}}"
    )
}

#[test]
fn a_call_held_by_a_leader_frozen_past_its_lease_is_answered_code_11_when_it_resumes() {
    let Some(mut setup) = Setup::start("held", false) else {
        return;
    };
    let (leader, _standby) = roles(&mut setup.a, &mut setup.b);
    let port = leader.port;
    // One servant with one slot, taken: the next call waits for it.
    let heartbeat = format!(
        "{{\"token\":\"{SERVANT_TOKEN}\",\"nextHeartbeatInMs\":10000,\"version\":1,\
         \"location\":\"127.0.0.1:8335\",\"numProcessors\":8,\"capacity\":1,\
         \"servantPriority\":\"SERVANT_PRIORITY_DEDICATED\",\
         \"envDescs\":[{{\"compilerDigest\":\"gcc\"}}],\
         \"totalMemoryInBytes\":\"{MEMORY}\",\"memoryAvailableInBytes\":\"{MEMORY}\"}}"
    );
    let second = Duration::from_secs(1);
    assert_eq!(
        json_call(port, "Heartbeat", &heartbeat, second),
        (200, None)
    );
    assert_eq!(
        json_call(port, "WaitForStartingTask", &wait_for_one_grant(0), second),
        (200, None),
        "the slot"
    );
    let sent_at = Instant::now();
    let held = std::thread::spawn(move || {
        let answer = json_call(
            port,
            "WaitForStartingTask",
            &wait_for_one_grant(10_000),
            Duration::from_secs(20),
        );
        (answer, sent_at.elapsed())
    });
    // Queued on the leader before it freezes.
    wait_until(second, "the call is queued", || {
        leader
            .metric("yadcc_scheduler_waiters")
            .is_some_and(|waiting| waiting >= 1.0)
    });
    leader.signal("STOP");
    std::thread::sleep(TTL + second);
    leader.signal("CONT");
    let ((status, code), after) = held.join().expect("the held call");
    assert_eq!(
        (status, code.as_deref()),
        (503, Some("11")),
        "held across stepping down: not served here\n{}",
        leader.log().join("\n")
    );
    assert!(
        after < Duration::from_secs(8),
        "answered {after:?} after it was sent: when the leader stepped down, not at the \
         end of its 10 s wait"
    );
}

/// From the freeze to the first grant the daemons got (all from the new
/// leader: the frozen one answers nothing), over HAProxy; the frozen one
/// grants nothing once resumed.
#[test]
fn a_frozen_leader_loses_its_daemons_to_the_new_leader_within_5_s_and_grants_nothing_after() {
    let Some(mut setup) = Setup::start("frozen", true) else {
        return;
    };
    let haproxy_port = setup.haproxy_port();
    let (leader, standby) = roles(&mut setup.a, &mut setup.b);
    let runtime = runtime();
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], haproxy_port));
    let cluster = runtime.block_on(async { Cluster::start(cluster_config(target)) });
    assert!(
        runtime.block_on(cluster.wait_ready(Duration::from_secs(10))),
        "servants register through HAProxy"
    );
    let stats = cluster.stats().clone();
    std::thread::sleep(Duration::from_secs(3));
    assert!(grants_issued(leader) > 0.0, "the leader grants");
    let errors_before = stats.total_errors();
    assert_eq!(errors_before, 0, "{}", stats.report());

    // Longer than any timeout of the daemons' or the balancer's: only the
    // balancer's checks and the standby's can end it for the daemons.
    let freeze = 4 * FAILOVER_LIMIT;
    leader.signal("STOP");
    let frozen_at = Instant::now();
    let received_at_freeze = stats.events.grants_received.load(Relaxed);
    let to_first_grant = wait_until(2 * FAILOVER_LIMIT, "the daemons get grants again", || {
        stats.events.grants_received.load(Relaxed) > received_at_freeze + 1
            && grants_issued(standby) > 0.0
    });
    let errors_at_failover = stats.total_errors();
    std::thread::sleep(freeze.saturating_sub(frozen_at.elapsed()));
    let errors_while_frozen = stats.total_errors();
    let granted_by_frozen = grants_issued(leader);
    leader.signal("CONT");
    let resumed_at = Instant::now();
    // Its count of grants never rises again (it restarts from 0 if it
    // takes daemons over), while the new leader's does.
    let mut samples = Vec::new();
    while resumed_at.elapsed() < Duration::from_secs(4) {
        samples.push((grants_issued(leader), grants_issued(standby)));
        std::thread::sleep(Duration::from_millis(250));
    }
    let errors_at_end = stats.total_errors();
    let report = stats.report().to_string();
    let killed = stats.events.tasks_killed.load(Relaxed);
    runtime.block_on(cluster.stop());
    eprintln!(
        "frozen leader: daemons granted {to_first_grant:?} after SIGSTOP; {} calls failed \
         around the failover ({:?}), {} more while frozen, {} after it resumed; {killed} tasks \
         killed",
        errors_at_failover - errors_before,
        stats.report().total.errors,
        errors_while_frozen - errors_at_failover,
        errors_at_end - errors_while_frozen,
    );
    let logs = || {
        format!(
            "frozen:\n{}\nnew:\n{}\n{report}",
            leader.log().join("\n"),
            standby.log().join("\n")
        )
    };
    assert!(
        to_first_grant <= FAILOVER_LIMIT,
        "granted {to_first_grant:?} after the freeze\n{}",
        logs()
    );
    assert!(
        samples
            .iter()
            .all(|&(frozen, _)| frozen <= granted_by_frozen),
        "the resumed leader granted: {samples:?}\n{}",
        logs()
    );
    assert!(
        samples.last().unwrap().1 > samples[0].1,
        "the new leader grants on: {samples:?}\n{}",
        logs()
    );
    assert_eq!(killed, 0, "{}", logs());
    assert_eq!(
        errors_while_frozen,
        errors_at_failover,
        "calls failed after the failover while the old leader was frozen\n{}",
        logs()
    );
    assert_eq!(
        errors_at_end,
        errors_while_frozen,
        "calls failed when the frozen leader resumed\n{}",
        logs()
    );
    // Taking over, the new leader named the one that did not answer.
    let took_over = standby
        .log()
        .into_iter()
        .find(|line| line.contains("taking over, leader"));
    if let Some(line) = took_over {
        assert!(line.contains(&leader.name()), "{line}");
        assert!(!line.contains(&standby.name()), "{line}");
    }
}
