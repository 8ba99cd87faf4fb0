//! The hot standby under the stock daemons: two instances of this scheduler
//! elected on one etcd, HAProxy in front with `scripts/deploy/haproxy.cfg`,
//! a servant daemon and a delegate daemon (each in its network namespace,
//! both pointed at the balancer), and the stock compiler wrapper compiling
//! `sample.cc` four at a time in a loop. The leader is killed with -9, the
//! killed one comes back as the standby, then the new leader is frozen
//! (SIGSTOP) for longer than any of the daemons' timeouts and resumed.
//!
//! Every compilation must succeed remotely (the wrapper says `Failing back
//! to local machine` when it does not), give an object identical to a local
//! `g++ -c`, no task may be killed (the servant logs `Killed N tasks`), and
//! after each fault the new leader must grant within 5 s.
//!
//! The servant reports an idle machine whatever the CI machine's load: in
//! its own mount namespace it sees 64 processors and measures load by the
//! load average only (see [`super::lan::Daemon::start`]), so it always has
//! room for its two compilations, as a dedicated servant of a real farm.

use std::{
    net::{IpAddr, SocketAddr, TcpListener},
    path::Path,
    process::{Child, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{COMPILE_LIMIT, DAEMON_TOKEN, Lan, Peers, lan, servant_and_delegate};
use crate::support::{
    Binary, Launch, SERVANT_TOKEN, USER_TOKEN, bounded, heavy, http_client, run_bounded,
};

/// Compilations at once, per round.
const CONCURRENT: usize = 4;
const SOURCE: &str = include_str!("sample.cc");
const FLAGS: [&str; 2] = ["-std=c++17", "-O2"];
/// The bound from a fault to the new leader's first grant.
const RESUME_LIMIT: Duration = Duration::from_secs(5);
/// Longer than every timeout of the daemons' (their calls have 2 to 10 s)
/// and of the balancer's: only the checks can end it for the daemons.
const FREEZE: Duration = Duration::from_secs(10);
/// Longest an external program of this test lives.
const PROGRAM_LIMIT: Duration = Duration::from_secs(600);
/// The shared secret both instances derive the serving-daemon tokens from.
const SECRET: &str = "failover-secret";

/// The wrapper's own words when a compilation does not run remotely.
const FELL_BACK: &str = "Failing back to local machine";
/// The servant's words when it kills tasks (expired grants, or orphans).
const KILLED: &str = "Killed ";

/// A child killed on drop.
struct Guarded(Child);

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port(ip: IpAddr) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

fn tool(name: &str) -> std::path::PathBuf {
    ["/usr/bin", "/usr/sbin", "/usr/local/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("no {name}: scripts/test.sh installs it"))
}

/// One etcd member on loopback; its client URL.
async fn etcd(work: &Path) -> (Guarded, String) {
    let (client, peer) = (
        free_port([127, 0, 0, 1].into()),
        free_port([127, 0, 0, 1].into()),
    );
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = bounded(PROGRAM_LIMIT, tool("etcd"))
        .args([
            "--name=failover",
            &format!("--data-dir={}", work.join("etcd").display()),
            &format!("--listen-client-urls={client_url}"),
            &format!("--advertise-client-urls={client_url}"),
            &format!("--listen-peer-urls={peer_url}"),
            &format!("--initial-advertise-peer-urls={peer_url}"),
            &format!("--initial-cluster=failover={peer_url}"),
            "--log-level=error",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd");
    let etcd = Guarded(child);
    until(Duration::from_secs(30), "etcd answers", || async {
        status(&format!("{client_url}/health")).await == Some(200)
    })
    .await;
    (etcd, client_url)
}

/// One instance on the LAN's host address, elected on `etcd`.
fn instance(addr: SocketAddr, etcd: &str) -> Binary {
    let users = format!("--acceptable_user_tokens={USER_TOKEN},{DAEMON_TOKEN}");
    let endpoints = format!("--ha_etcd_endpoints={etcd}");
    let secret = format!("--serving_daemon_token_secret={SECRET}");
    // HAProxy connects from the host's LAN address; its PROXY header names
    // each daemon.
    let proxies = format!("--trusted_proxies={}", addr.ip());
    Launch {
        listen: addr,
        flags: &[
            &users,
            &format!("--acceptable_servant_tokens={SERVANT_TOKEN}"),
            &endpoints,
            &secret,
            &proxies,
            "--debugging_no_inspect_auth",
            "--servant_min_memory_for_accepting_new_task=1G",
        ],
        rust_log: "info,yadcc_scheduler::access=warn",
        tokens: false,
        ..Launch::default()
    }
    .start()
}

/// HAProxy with the deployment's configuration, on `bind`, before `a` and `b`.
async fn haproxy(bind: SocketAddr, a: SocketAddr, b: SocketAddr) -> Guarded {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/deploy/haproxy.cfg");
    let child = bounded(PROGRAM_LIMIT, tool("haproxy"))
        .arg("-db")
        .arg("-f")
        .arg(config)
        .env("YADCC_LB_BIND", bind.to_string())
        .env("YADCC_LB_MAXCONN", "4000")
        .env("YADCC_SCHEDULER_A", a.to_string())
        .env("YADCC_SCHEDULER_B", b.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start haproxy");
    let guarded = Guarded(child);
    until(Duration::from_secs(10), "haproxy listens", || async {
        tokio::net::TcpStream::connect(bind).await.is_ok()
    })
    .await;
    guarded
}

async fn status(url: &str) -> Option<u16> {
    let answer = http_client().get(url).send().await.ok()?;
    Some(answer.status().as_u16())
}

async fn is_ready(addr: SocketAddr) -> bool {
    status(&format!("http://{addr}/readyz")).await == Some(200)
}

/// The instance's count of grants (0 if it does not answer).
async fn grants(addr: SocketAddr) -> f64 {
    let Ok(answer) = http_client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
    else {
        return 0.0;
    };
    let text = answer.text().await.unwrap_or_default();
    text.lines()
        .find_map(|line| {
            line.strip_prefix("yadcc_scheduler_grants_issued_total ")
                .and_then(|value| value.parse().ok())
        })
        .unwrap_or(0.0)
}

/// Polls `done` every 50 ms; panics after `limit`. How long it took.
async fn until<F, Fut>(limit: Duration, what: &str, mut done: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if done().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One compilation of the loop.
struct Compile {
    started: Instant,
    ended: Instant,
    variant: usize,
    object: String,
    succeeded: bool,
    fell_back: bool,
    stderr: String,
}

/// `sample.cc` with `-DVARIANT=variant` through the delegate daemon.
async fn compile(peers: &Peers, lan: &Lan, variant: usize, object: String) -> Compile {
    let started = Instant::now();
    let mut command = lan.command("delegate", COMPILE_LIMIT, "env");
    command
        .current_dir(&lan.work)
        .arg(format!("HOME={}", lan.work.display()))
        .arg("YADCC_COMPILE_ON_CLOUD_SIZE_THRESHOLD=0")
        .arg("YADCC_CACHE_CONTROL=0")
        .arg(format!("YADCC_DAEMON_PORT={}", lan::LOCAL_PORT))
        .arg(peers.cxx())
        .arg("/usr/bin/g++")
        .args(FLAGS)
        .arg(format!("-DVARIANT={variant}"))
        .args(["-c", "sample.cc", "-o", &object]);
    let output = run_bounded(command).await;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    Compile {
        started,
        ended: Instant::now(),
        variant,
        object,
        succeeded: output.status.success(),
        fell_back: stderr.contains(FELL_BACK),
        stderr,
    }
}

/// Rounds of [`CONCURRENT`] compilations until `stop` is set.
async fn compile_loop(
    peers: Arc<Peers>,
    lan: Arc<Lan>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    done: Arc<Mutex<Vec<Compile>>>,
) {
    let mut round = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        round += 1;
        let compiles = (1..=CONCURRENT)
            .map(|variant| compile(&peers, &lan, variant, format!("r{round}v{variant}.o")));
        let finished = futures_util::future::join_all(compiles).await;
        done.lock().expect("compiles").extend(finished);
    }
}

/// From `fault`: the first grant of `next`, and the end of the first
/// compilation begun after the fault that succeeded remotely.
struct Resumed {
    to_grant: Duration,
    to_compile: Option<Duration>,
}

async fn resumed_after(fault: Instant, next: SocketAddr) -> Duration {
    until(2 * RESUME_LIMIT, "the new leader grants", || async {
        grants(next).await > 0.0
    })
    .await;
    fault.elapsed()
}

fn first_compile_after(compiles: &[Compile], fault: Instant) -> Option<Duration> {
    compiles
        .iter()
        .filter(|c| c.started >= fault && c.succeeded && !c.fell_back)
        .map(|c| c.ended - fault)
        .min()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the original yadcc ($YADCC_PEERS), root, network namespaces, etcd and haproxy: scripts/test.sh runs it"]
async fn stock_daemons_compile_through_a_kill_9_and_a_freeze_of_the_leader() {
    let _heavy = heavy().await;
    let peers = Arc::new(Peers::required());
    let began = Instant::now();
    let lan = Arc::new(Lan::new(&["servant", "delegate"]));
    let host = IpAddr::V4(lan.host_ip());
    let (_etcd, etcd_url) = etcd(&lan.work).await;
    let (a_addr, b_addr, lb) = (
        SocketAddr::new(host, free_port(host)),
        SocketAddr::new(host, free_port(host)),
        SocketAddr::new(host, free_port(host)),
    );
    let mut a = Some(instance(a_addr, &etcd_url));
    let mut b = Some(instance(b_addr, &etcd_url));
    let _haproxy = haproxy(lb, a_addr, b_addr).await;
    until(Duration::from_secs(15), "one instance leads", || async {
        is_ready(a_addr).await != is_ready(b_addr).await
    })
    .await;
    let (servant, delegate) = servant_and_delegate(&peers, &lan, lb, lb).await;
    std::fs::write(lan.work.join("sample.cc"), SOURCE).expect("the source");
    for variant in 1..=CONCURRENT {
        let mut command = bounded(COMPILE_LIMIT, "g++");
        command
            .current_dir(&lan.work)
            .args(FLAGS)
            .arg(format!("-DVARIANT={variant}"))
            .args(["-c", "sample.cc", "-o", &format!("local{variant}.o")]);
        assert!(run_bounded(command).await.status.success(), "g++ -c");
    }
    let ready_after = began.elapsed();

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::new(Mutex::new(Vec::new()));
    let looping = tokio::spawn(compile_loop(
        peers.clone(),
        lan.clone(),
        stop.clone(),
        done.clone(),
    ));
    let compiled = || done.lock().expect("compiles").len();
    until(COMPILE_LIMIT, "a first round compiles", || async {
        compiled() >= CONCURRENT
    })
    .await;

    // 1. kill -9 of the leader, in the middle of a round.
    let a_leads = is_ready(a_addr).await;
    let (killed_addr, next) = if a_leads {
        (a_addr, b_addr)
    } else {
        (b_addr, a_addr)
    };
    let killed = if a_leads { &mut a } else { &mut b };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fault = Instant::now();
    drop(killed.take());
    let kill_to_grant = resumed_after(fault, next).await;
    let kill_fault = fault;
    // Back as the standby.
    *killed = Some(instance(killed_addr, &etcd_url));
    let round_after = compiled() + CONCURRENT;
    until(COMPILE_LIMIT, "a round after the kill", || async {
        compiled() >= round_after
    })
    .await;

    // 2. SIGSTOP of the new leader for longer than any timeout.
    let frozen = if a_leads { &b } else { &a };
    let frozen_pid = frozen.as_ref().expect("the new leader").child.id();
    let signal = |name: &'static str| async move {
        let mut command = bounded(Duration::from_secs(10), "kill");
        command.args([name, &frozen_pid.to_string()]);
        assert!(run_bounded(command).await.status.success(), "kill {name}");
    };
    let fault = Instant::now();
    signal("-STOP").await;
    let freeze_to_grant = resumed_after(fault, killed_addr).await;
    tokio::time::sleep(FREEZE.saturating_sub(fault.elapsed())).await;
    signal("-CONT").await;
    let freeze_fault = fault;
    let granted_by_frozen = grants(next).await;
    let round_after = compiled() + 2 * CONCURRENT;
    until(COMPILE_LIMIT, "two rounds after the freeze", || async {
        compiled() >= round_after
    })
    .await;
    let resumed_one_granted =
        grants(next).await > granted_by_frozen.max(0.0) && !is_ready(next).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    looping.await.expect("the compile loop");

    let compiles = std::mem::take(&mut *done.lock().expect("compiles"));
    let kill = Resumed {
        to_grant: kill_to_grant,
        to_compile: first_compile_after(&compiles, kill_fault),
    };
    let freeze = Resumed {
        to_grant: freeze_to_grant,
        to_compile: first_compile_after(&compiles, freeze_fault),
    };
    let (mut servant, mut delegate) = (servant, delegate);
    servant.stop().await;
    delegate.stop().await;
    let (servant_log, delegate_log) = (servant.log_text(), delegate.log_text());

    let mut failures = Vec::new();
    let read = |name: &str| std::fs::read(lan.work.join(name)).unwrap_or_default();
    for c in &compiles {
        if !c.succeeded {
            failures.push(format!("{} failed: {}", c.object, c.stderr));
        } else if c.fell_back {
            failures.push(format!("{} fell back to local: {}", c.object, c.stderr));
        } else if read(&c.object).is_empty()
            || read(&c.object) != read(&format!("local{}.o", c.variant))
        {
            failures.push(format!("{} differs from a local g++ -c", c.object));
        }
    }
    let remote = servant_log.matches("Executing:").count();
    if remote < compiles.len() {
        failures.push(format!(
            "only {remote} of {} compilations ran on the servant",
            compiles.len()
        ));
    }
    let killed_lines: Vec<&str> = servant_log
        .lines()
        .filter(|line| line.contains(KILLED) && line.contains("tasks"))
        .collect();
    if !killed_lines.is_empty() {
        failures.push(format!("the servant killed tasks: {killed_lines:?}"));
    }
    for (what, resumed) in [("kill -9", &kill), ("SIGSTOP", &freeze)] {
        if resumed.to_grant > RESUME_LIMIT {
            failures.push(format!(
                "{what}: the new leader granted {:?} after the fault",
                resumed.to_grant
            ));
        }
    }
    if resumed_one_granted {
        failures.push("the resumed leader granted, or is ready again".to_owned());
    }
    let secs =
        |d: Option<Duration>| d.map_or("none".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
    println!(
        "failover with the stock daemons: {} compilations ({} at once), {} remote, {} fell back, \
         {} failed, {} tasks killed; kill -9: new leader granting {:.2} s after, first remote \
         compile {} after; SIGSTOP ({:?}): granting {:.2} s after, first remote compile {} after; \
         daemons ready after {:.1} s, all {:.1} s",
        compiles.len(),
        CONCURRENT,
        remote,
        compiles.iter().filter(|c| c.fell_back).count(),
        compiles.iter().filter(|c| !c.succeeded).count(),
        killed_lines.len(),
        kill.to_grant.as_secs_f64(),
        secs(kill.to_compile),
        FREEZE,
        freeze.to_grant.as_secs_f64(),
        secs(freeze.to_compile),
        ready_after.as_secs_f64(),
        began.elapsed().as_secs_f64(),
    );
    assert!(
        failures.is_empty(),
        "{}\n\nservant:\n{servant_log}\ndelegate:\n{delegate_log}",
        failures.join("\n")
    );
}
