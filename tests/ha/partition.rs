//! Partitions, each a black hole (connections stay open and bytes go
//! nowhere, as when a route is dropped, so only time tells):
//! - a leader cut off from etcd but not from the daemons must step down
//!   within its lease, take no daemon over (it cannot win while cut off),
//!   and the daemons must reach the new leader within 5 s;
//! - a leader cut off from the balancer (so from the daemons) but not from
//!   etcd nor the standby must resign (`--ha_resign_unchecked_after`, on by
//!   default), and the daemons must reach the new leader within 5 s.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use yadcc_sim::Cluster;

use super::{FAILOVER_LIMIT, MACHINES, TTL, cluster_config, grants_issued, runtime};
use crate::support::*;

/// A TCP relay to `target` on loopback that, once `cut` is set, drops
/// every byte either way (and relays nothing on connections opened since).
struct BlackHole {
    port: u16,
    cut: Arc<AtomicBool>,
}

impl BlackHole {
    fn to(target: u16) -> BlackHole {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let cut = Arc::new(AtomicBool::new(false));
        let cutting = cut.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                for (from, to) in [
                    (client.try_clone(), server.try_clone()),
                    (server.try_clone(), client.try_clone()),
                ] {
                    if let (Ok(from), Ok(to)) = (from, to) {
                        relay(from, to, cutting.clone());
                    }
                }
            }
        });
        BlackHole { port, cut }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn relay(mut from: TcpStream, mut to: TcpStream, cut: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(_) if cut.load(Relaxed) => {}
                Ok(read) => {
                    if to.write_all(&buffer[..read]).is_err() {
                        break;
                    }
                }
            }
        }
    });
}

#[test]
fn a_leader_cut_off_from_etcd_steps_down_in_its_lease_and_daemons_reach_the_new_one_within_5_s() {
    let _turn = one_at_a_time();
    let (Some(etcd_program), Some(haproxy_program)) = (tool("etcd"), tool("haproxy")) else {
        return;
    };
    let scratch = Scratch::new("cut");
    let etcd = Etcd::start(&etcd_program, &scratch.0);
    let etcd_port: u16 = etcd.client_url.rsplit(':').next().unwrap().parse().unwrap();
    let hole = BlackHole::to(etcd_port);
    // The one reaching etcd through the black hole leads first.
    let leader = Scheduler::behind_balancer(free_port(), &hole.url());
    wait_until(Duration::from_secs(15), "the first one leads", || {
        leader.is_ready()
    });
    let standby = Scheduler::behind_balancer(free_port(), &etcd.client_url);
    let port = free_port();
    let _haproxy = haproxy(&haproxy_program, port, leader.addr(), standby.addr());
    let runtime = runtime();
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let cluster = runtime.block_on(async { Cluster::start(cluster_config(target)) });
    assert!(
        runtime.block_on(cluster.wait_ready(Duration::from_secs(10))),
        "servants register through HAProxy"
    );
    let stats = cluster.stats().clone();
    std::thread::sleep(Duration::from_secs(3));
    assert!(grants_issued(&leader) > 0.0, "the leader grants");

    hole.cut.store(true, Relaxed);
    let cut_at = Instant::now();
    let errors_at_cut = stats.total_errors();
    let received_at_cut = stats.events.grants_received.load(Relaxed);
    let mut took_over = false;
    let mut stepped_down = None;
    let watch = |took_over: &mut bool, stepped_down: &mut Option<Duration>| {
        *took_over |= leader.metric("yadcc_scheduler_taking_over") == Some(1.0);
        if stepped_down.is_none() && !leader.is_ready() {
            *stepped_down = Some(cut_at.elapsed());
        }
    };
    // Every servant has found the new leader, and it grants.
    let to_all = wait_until(
        2 * FAILOVER_LIMIT,
        "the daemons reach the new leader",
        || {
            watch(&mut took_over, &mut stepped_down);
            standby.metric("yadcc_scheduler_servants_up") == Some(MACHINES as f64)
                && grants_issued(&standby) > 0.0
                && stats.events.grants_received.load(Relaxed) > received_at_cut + 1
        },
    );
    let errors_at_failover = stats.total_errors();
    // For a few seconds more: the cut-off one takes nothing over.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        watch(&mut took_over, &mut stepped_down);
        std::thread::sleep(Duration::from_millis(100));
    }
    let report = stats.report().to_string();
    let killed = stats.events.tasks_killed.load(Relaxed);
    let errors_at_end = stats.total_errors();
    runtime.block_on(cluster.stop());
    eprintln!(
        "leader cut off from etcd: stepped down {stepped_down:?} after the cut, every daemon \
         at the new leader {to_all:?} after; {} calls failed around it ({:?}), {} later; \
         {killed} tasks killed",
        errors_at_failover - errors_at_cut,
        stats.report().total.errors,
        errors_at_end - errors_at_failover,
    );
    let logs = || {
        format!(
            "cut off:\n{}\nnew:\n{}\n{report}",
            leader.log().join("\n"),
            standby.log().join("\n")
        )
    };
    let stepped_down = stepped_down.expect("the cut-off leader stepped down");
    assert!(
        stepped_down <= TTL,
        "stepped down {stepped_down:?} after the cut: past its lease\n{}",
        logs()
    );
    assert!(
        to_all <= FAILOVER_LIMIT,
        "the daemons reached the new leader {to_all:?} after the cut\n{}",
        logs()
    );
    assert!(!took_over, "the cut-off one took daemons over\n{}", logs());
    assert_eq!(grants_issued(&leader), 0.0, "the cut-off one grants");
    // The new leader won without a takeover: it waited for the servants
    // to report rather than answer "environment not available".
    let errors = stats.report().total.errors;
    assert!(
        !errors.keys().any(|kind| kind.contains("1006")),
        "{errors:?}\n{}",
        logs()
    );
    assert_eq!(killed, 0, "{}", logs());
    assert_eq!(errors_at_end, errors_at_failover, "{}", logs());
    drop(etcd);
}

/// With the default flags (`--ha_resign_unchecked_after` 3 s).
#[test]
fn a_leader_cut_off_from_the_balancer_resigns_and_daemons_reach_the_new_one_within_5_s() {
    let _turn = one_at_a_time();
    let (Some(etcd_program), Some(haproxy_program)) = (tool("etcd"), tool("haproxy")) else {
        return;
    };
    let scratch = Scratch::new("lbcut");
    let etcd = Etcd::start(&etcd_program, &scratch.0);
    let leader = Scheduler::behind_balancer(free_port(), &etcd.client_url);
    wait_until(Duration::from_secs(15), "the first one leads", || {
        leader.is_ready()
    });
    let standby = Scheduler::behind_balancer(free_port(), &etcd.client_url);
    // The balancer reaches the leader through the black hole; the standby
    // reaches it directly (its probe says the leader answers).
    let hole = BlackHole::to(leader.port);
    let hole_addr = std::net::SocketAddr::from(([127, 0, 0, 1], hole.port));
    let port = free_port();
    let _haproxy = haproxy(&haproxy_program, port, hole_addr, standby.addr());
    let runtime = runtime();
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let cluster = runtime.block_on(async { Cluster::start(cluster_config(target)) });
    assert!(
        runtime.block_on(cluster.wait_ready(Duration::from_secs(10))),
        "servants register through HAProxy"
    );
    let stats = cluster.stats().clone();
    std::thread::sleep(Duration::from_secs(3));
    assert!(grants_issued(&leader) > 0.0, "the leader grants");
    assert!(leader.is_ready(), "checked, so it leads on");

    hole.cut.store(true, Relaxed);
    let cut_at = Instant::now();
    let errors_at_cut = stats.total_errors();
    let received_at_cut = stats.events.grants_received.load(Relaxed);
    let mut to_all = None;
    while to_all.is_none() && cut_at.elapsed() < 2 * FAILOVER_LIMIT {
        if standby.metric("yadcc_scheduler_servants_up") == Some(MACHINES as f64)
            && grants_issued(&standby) > 0.0
            && stats.events.grants_received.load(Relaxed) > received_at_cut + 1
        {
            to_all = Some(cut_at.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let errors_at_failover = stats.total_errors();
    std::thread::sleep(Duration::from_secs(2));
    let report = stats.report().to_string();
    let killed = stats.events.tasks_killed.load(Relaxed);
    let errors_at_end = stats.total_errors();
    runtime.block_on(cluster.stop());
    eprintln!(
        "leader cut off from the balancer: every daemon at the new leader {to_all:?} after \
         the cut; {} calls failed around it ({:?}), {} later; {killed} tasks killed",
        errors_at_failover - errors_at_cut,
        stats.report().total.errors,
        errors_at_end - errors_at_failover,
    );
    let logs = || {
        format!(
            "cut off:\n{}\nnew:\n{}\n{report}",
            leader.log().join("\n"),
            standby.log().join("\n")
        )
    };
    let to_all = to_all.unwrap_or_else(|| panic!("the daemons never reached it\n{}", logs()));
    assert!(
        to_all <= FAILOVER_LIMIT,
        "the daemons reached the new leader {to_all:?} after the cut\n{}",
        logs()
    );
    assert!(
        leader
            .log()
            .iter()
            .any(|line| line.contains("no balancer asked /readyz")),
        "the log says why\n{}",
        logs()
    );
    assert!(standby.is_ready() && !leader.is_ready(), "{}", logs());
    assert_eq!(killed, 0, "{}", logs());
    assert_eq!(errors_at_end, errors_at_failover, "{}", logs());
    drop(etcd);
}
