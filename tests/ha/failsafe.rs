//! Failsafe (`--ha_failsafe_secret_file`, docs/failover.md "Failsafe"):
//! while etcd does not answer, the leader goes on while the standby
//! confirms it does not lead; never are both ready (both granting) at
//! once. `/readyz` of both is sampled throughout: 200 only while the fence
//! is open, i.e. while the instance may grant.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use super::TTL;
use crate::support::*;

/// The shared secret, in a file both instances read.
fn secret_file(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("failsafe-secret");
    std::fs::write(&path, "a-failsafe-secret-of-32-bytes-xx\n").expect("secret");
    path
}

/// What sampling both `/readyz` every 50 ms for `length` saw.
#[derive(Debug, Default)]
struct Sampled {
    /// Samples in which both were ready: must be 0.
    both: usize,
    /// The longest stretch in which neither was ready.
    longest_gap: Duration,
    /// Samples in which each was ready.
    ready: [usize; 2],
    samples: usize,
}

fn sample(a: &Scheduler, b: &Scheduler, length: Duration) -> Sampled {
    let mut seen = Sampled::default();
    let started = Instant::now();
    let mut gap_since: Option<Instant> = None;
    while started.elapsed() < length {
        let ready = [a.is_ready(), b.is_ready()];
        seen.samples += 1;
        for (count, is) in seen.ready.iter_mut().zip(ready) {
            *count += usize::from(is);
        }
        if ready == [true, true] {
            seen.both += 1;
        }
        if ready == [false, false] {
            let since = *gap_since.get_or_insert_with(Instant::now);
            seen.longest_gap = seen.longest_gap.max(since.elapsed());
        } else {
            gap_since = None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    seen
}

/// Two instances with failsafe on, one etcd; the leader first.
fn pair(name: &str) -> Option<(Scratch, Etcd, Scheduler, Scheduler)> {
    let etcd_program = tool("etcd")?;
    let scratch = Scratch::new(name);
    let etcd = Etcd::start(&etcd_program, &scratch.0);
    let flag = format!(
        "--ha_failsafe_secret_file={}",
        secret_file(&scratch.0).display()
    );
    let mut a = Scheduler::start_with(free_port(), &etcd.client_url, &[NO_BALANCER, &flag]);
    let mut b = Scheduler::start_with(free_port(), &etcd.client_url, &[NO_BALANCER, &flag]);
    let a_leads = leader_of(&a, &b);
    if !a_leads {
        std::mem::swap(&mut a, &mut b);
    }
    // The leader has read the election's members.
    std::thread::sleep(Duration::from_secs(2));
    Some((scratch, etcd, a, b))
}

#[test]
fn with_etcd_frozen_the_leader_leads_on_and_never_are_two_ready() {
    let _turn = one_at_a_time();
    let Some((_scratch, etcd, leader, standby)) = pair("failsafe-frozen") else {
        return;
    };
    // Only a question signed with the shared secret is answered.
    let forged = format!("q1 {} 1 2 {}", leader.name(), "00".repeat(32));
    let (status, _) = json_post(
        standby.port,
        "/ha/failsafe",
        "",
        &forged,
        Duration::from_secs(2),
    );
    assert_eq!(status, 403, "a question not signed with the secret");
    etcd.process.signal("STOP");
    let frozen = sample(&leader, &standby, Duration::from_secs(10));
    etcd.process.signal("CONT");
    let after = sample(&leader, &standby, 3 * TTL);
    let logs = || {
        format!(
            "leader:\n{}\nstandby:\n{}",
            leader.log().join("\n"),
            standby.log().join("\n")
        )
    };
    eprintln!(
        "failsafe, etcd frozen 10 s: {frozen:?}; after it resumed ({:?}): {after:?}",
        3 * TTL
    );
    assert_eq!(frozen.both, 0, "two ready at once\n{}", logs());
    assert_eq!(after.both, 0, "two ready at once\n{}", logs());
    assert_eq!(
        frozen.ready[0],
        frozen.samples,
        "the leader led on throughout the freeze\n{}",
        logs()
    );
    assert!(
        leader
            .log()
            .iter()
            .any(|line| line.contains("leading on in failsafe")),
        "{}",
        logs()
    );
    assert!(
        after.longest_gap <= TTL + Duration::from_millis(500),
        "nobody ready for {:?} after etcd resumed\n{}",
        after.longest_gap,
        logs()
    );
    assert!(
        leader.is_ready() != standby.is_ready(),
        "one leads\n{}",
        logs()
    );
}

#[test]
fn without_the_secret_a_leader_etcd_does_not_answer_steps_down_within_its_lease() {
    // Setup holds the tests' turn itself.
    let Some(mut setup) = Setup::start("failsafe-off", false) else {
        return;
    };
    let (leader, standby) = roles(&mut setup.a, &mut setup.b);
    let (status, _) = json_post(
        standby.port,
        "/ha/failsafe",
        "",
        "q1",
        Duration::from_secs(2),
    );
    assert_eq!(status, 404, "no failsafe without the secret");
    setup.etcd.process.signal("STOP");
    let started = Instant::now();
    let stepped_down = wait_until(2 * TTL, "the leader steps down", || !leader.is_ready());
    let frozen = sample(leader, standby, Duration::from_secs(3));
    setup.etcd.process.signal("CONT");
    eprintln!("no failsafe, etcd frozen: stepped down after {stepped_down:?}; {frozen:?}");
    assert!(started.elapsed() >= stepped_down);
    assert!(stepped_down <= TTL, "{stepped_down:?}");
    assert_eq!(frozen.ready, [0, 0], "nobody leads without etcd");
}
