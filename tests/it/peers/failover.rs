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
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use super::{COMPILE_LIMIT, DAEMON_TOKEN, Lan, Peers, cloud_compile_command, servant_and_delegate};
use crate::processes::{self, Group};
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
/// The shared secret both instances derive the serving-daemon tokens from.
const SECRET: &str = "failover-secret";

/// The wrapper's own words when a compilation does not run remotely.
const FELL_BACK: &str = "Failing back to local machine";
/// The servant's words when it kills tasks (expired grants, or orphans).
const KILLED: &str = "Killed ";

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
async fn etcd(work: &Path) -> (Group, String) {
    let (client, peer) = (
        free_port([127, 0, 0, 1].into()),
        free_port([127, 0, 0, 1].into()),
    );
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut command = processes::command(tool("etcd"));
    command
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
        .stderr(Stdio::null());
    let etcd = Group::spawn(command).expect("start etcd");
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
async fn haproxy(bind: SocketAddr, a: SocketAddr, b: SocketAddr) -> Group {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/deploy/haproxy.cfg");
    let mut command = processes::command(tool("haproxy"));
    command
        .arg("-db")
        .arg("-f")
        .arg(config)
        .env("YADCC_LB_BIND", bind.to_string())
        .env("YADCC_LB_MAXCONN", "4000")
        .env("YADCC_SCHEDULER_A", a.to_string())
        .env("YADCC_SCHEDULER_B", b.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let guarded = Group::spawn(command).expect("start haproxy");
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
    let mut command = cloud_compile_command(peers, lan);
    command
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

/// One of [`CONCURRENT`] workers: compilation after compilation of its
/// variant until `stop` is set, so that one begins as soon as the last
/// ended, whatever the others do.
async fn compile_loop(
    peers: Arc<Peers>,
    lan: Arc<Lan>,
    variant: usize,
    stop: Arc<AtomicBool>,
    done: Arc<Mutex<Vec<Compile>>>,
) {
    let mut count = 0;
    while !stop.load(Relaxed) {
        count += 1;
        let object = format!("w{variant}n{count}.o");
        let finished = compile(&peers, &lan, variant, object).await;
        done.lock().expect("compiles").push(finished);
    }
}

/// From a fault: the first grant of the instance that leads next, and the
/// end of the first compilation begun after the fault that ran remotely.
struct Resumed {
    to_grant: Duration,
    to_compile: Option<Duration>,
}

impl Resumed {
    fn of(fault: Instant, to_grant: Duration, compiles: &[Compile]) -> Resumed {
        let to_compile = compiles
            .iter()
            .filter(|c| c.started >= fault && c.succeeded && !c.fell_back)
            .map(|c| c.ended - fault)
            .min();
        Resumed {
            to_grant,
            to_compile,
        }
    }
}

/// Waits until `next` grants; the time from `fault`.
async fn granting(fault: Instant, next: SocketAddr) -> Duration {
    until(2 * RESUME_LIMIT, "the new leader grants", || async {
        grants(next).await > 0.0
    })
    .await;
    fault.elapsed()
}

/// `kill -SIGNAL pid`.
async fn signal(name: &str, pid: u32) {
    let mut command = bounded(Duration::from_secs(10), "kill");
    command.args([name, &pid.to_string()]);
    assert!(run_bounded(command).await.status.success(), "kill {name}");
}

/// Faults of each kind in one run: 1, or `YADCC_FAILOVER_CYCLES` (the
/// BENCHMARKS.md figures).
fn cycles() -> usize {
    std::env::var("YADCC_FAILOVER_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

fn min_median_max(times: &[Duration]) -> String {
    let mut sorted: Vec<f64> = times.iter().map(Duration::as_secs_f64).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return "none".to_owned();
    }
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    format!(
        "min {:.2} s, median {median:.2} s, max {:.2} s over {n}",
        sorted[0],
        sorted[n - 1]
    )
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
    let addrs = [
        SocketAddr::new(host, free_port(host)),
        SocketAddr::new(host, free_port(host)),
    ];
    let lb = SocketAddr::new(host, free_port(host));
    let mut instances = addrs.map(|addr| Some(instance(addr, &etcd_url)));
    let _haproxy = haproxy(lb, addrs[0], addrs[1]).await;
    until(Duration::from_secs(15), "one instance leads", || async {
        is_ready(addrs[0]).await != is_ready(addrs[1]).await
    })
    .await;
    let (mut servant, mut delegate) = servant_and_delegate(&peers, &lan, lb, lb).await;
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

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (1..=CONCURRENT)
        .map(|variant| {
            tokio::spawn(compile_loop(
                peers.clone(),
                lan.clone(),
                variant,
                stop.clone(),
                done.clone(),
            ))
        })
        .collect();
    let compiled = || done.lock().expect("compiles").len();
    // Compiling on, `count` more compilations than now.
    let flowing = |count: usize| {
        let target = compiled() + count;
        until(COMPILE_LIMIT, "compilations go on", move || async move {
            compiled() >= target
        })
    };
    flowing(CONCURRENT).await;

    let mut faults: Vec<(&str, Instant, Duration)> = Vec::new();
    for _ in 0..cycles() {
        // kill -9 of the leader while compilations run; it comes back as
        // the standby.
        let leader = usize::from(!is_ready(addrs[0]).await);
        let next = 1 - leader;
        let fault = Instant::now();
        drop(instances[leader].take());
        faults.push(("kill -9", fault, granting(fault, addrs[next]).await));
        instances[leader] = Some(instance(addrs[leader], &etcd_url));
        flowing(CONCURRENT).await;

        // SIGSTOP of the new leader, longer than any timeout; then resumed.
        let (frozen, next) = (next, leader);
        let pid = instances[frozen].as_ref().expect("the leader").child.id();
        let fault = Instant::now();
        signal("-STOP", pid).await;
        faults.push(("SIGSTOP", fault, granting(fault, addrs[next]).await));
        tokio::time::sleep(FREEZE.saturating_sub(fault.elapsed())).await;
        signal("-CONT", pid).await;
        flowing(CONCURRENT).await;
        // Resumed, it is a standby: not ready, and granting nothing (its
        // count restarts from 0 when it steps down).
        assert!(!is_ready(addrs[frozen]).await, "the resumed one is ready");
        assert_eq!(grants(addrs[frozen]).await, 0.0, "the resumed one grants");
    }
    stop.store(true, Relaxed);
    for worker in workers {
        worker.await.expect("a compile worker");
    }

    let compiles = std::mem::take(&mut *done.lock().expect("compiles"));
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
    let killed: Vec<&str> = servant_log
        .lines()
        .filter(|line| line.contains(KILLED) && line.contains("tasks"))
        .collect();
    if !killed.is_empty() {
        failures.push(format!("the servant killed tasks: {killed:?}"));
    }
    let mut figures = Vec::new();
    for kind in ["kill -9", "SIGSTOP"] {
        let resumed: Vec<Resumed> = faults
            .iter()
            .filter(|(what, ..)| *what == kind)
            .map(|&(_, fault, to_grant)| Resumed::of(fault, to_grant, &compiles))
            .collect();
        for r in &resumed {
            if r.to_grant > RESUME_LIMIT {
                failures.push(format!(
                    "{kind}: the new leader granted {:?} after the fault",
                    r.to_grant
                ));
            }
        }
        let grants: Vec<Duration> = resumed.iter().map(|r| r.to_grant).collect();
        let compiles: Vec<Duration> = resumed.iter().filter_map(|r| r.to_compile).collect();
        figures.push(format!(
            "{kind}: to the new leader's first grant {}; to the first remote compilation \
             begun after the fault {}",
            min_median_max(&grants),
            min_median_max(&compiles)
        ));
    }
    println!(
        "failover with the stock daemons: {} compilations ({CONCURRENT} at once), {remote} ran on \
         the servant, {} fell back, {} failed, {} tasks killed; freezes of {FREEZE:?}; daemons \
         ready after {:.1} s, all {:.1} s\n{}",
        compiles.len(),
        compiles.iter().filter(|c| c.fell_back).count(),
        compiles.iter().filter(|c| !c.succeeded).count(),
        killed.len(),
        ready_after.as_secs_f64(),
        began.elapsed().as_secs_f64(),
        figures.join("\n"),
    );
    assert!(
        failures.is_empty(),
        "{}\n\nservant:\n{servant_log}\ndelegate:\n{delegate_log}",
        failures.join("\n")
    );
}
