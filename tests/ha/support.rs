//! The real parts of a hot standby on loopback ports of their own: Debian's
//! `etcd` and `haproxy` (each in a process group that ends with the test:
//! [`crate::processes`]),
//! the real scheduler binary twice, and probes of what each says.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use crate::processes::{self, Group};

pub const USER_TOKEN: &str = "ha-user-token";
pub const SERVANT_TOKEN: &str = "ha-servant-token";
pub const SECRET: &str = "ha-test-secret";
/// The operators' token of every instance (`--admin_tokens`).
pub const ADMIN_TOKEN: &str = "ha-admin-token";
/// The schedulers' `--adoption_window` (the default): long enough for a
/// delegate's prefetched spare grant, issued by the old leader, to be used.
pub const ADOPTION_WINDOW: Duration = Duration::from_secs(15);
/// Until HAProxy has checked every server enough to know which is down.
const HAPROXY_FIRST_CHECKS: Duration = Duration::from_millis(1500);
/// How long a program may take to come up.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The tests of this binary run one at a time: each starts etcd, two
/// schedulers and maybe HAProxy and load, and timings are what they test.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `name`'s path, or None: outside CI a test without it skips, in CI it
/// fails (scripts/test.sh installs Debian's `etcd-server` and `haproxy`).
pub fn tool(name: &str) -> Option<PathBuf> {
    let dirs = std::env::var("PATH").unwrap_or_default();
    let found = dirs
        .split(':')
        .chain(["/usr/sbin", "/usr/bin"])
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is missing: scripts/test.sh installs it"
        );
        eprintln!("skipped: {name} is not installed (scripts/test.sh installs it)");
    }
    found
}

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "yadcc-ha-{what}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An external program in a process group of its own that dies with the
/// test ([`crate::processes`]).
pub struct External {
    group: Group,
}

impl External {
    pub fn spawn(mut command: Command) -> External {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let group = Group::spawn(command).expect("start the program");
        External { group }
    }

    /// Like [`External::spawn`], with the program's standard error in `log`.
    pub fn spawn_logged(mut command: Command, log: &Path) -> External {
        let file = std::fs::File::create(log).expect("a log file");
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        let group = Group::spawn(command).expect("start the program");
        External { group }
    }

    /// Whether the program has exited.
    pub fn has_exited(&mut self) -> bool {
        matches!(self.group.child.try_wait(), Ok(Some(_)))
    }

    /// SIGKILL, and waits until it is gone.
    pub fn kill_9(&mut self) {
        self.group.kill();
    }

    /// `STOP`, `CONT`, ... to the program.
    pub fn signal(&self, signal: &str) {
        assert!(self.group.signal(signal), "kill -{signal}");
    }
}

/// `program` to be started as an [`External`].
pub fn guarded(program: &Path) -> Command {
    processes::command(program)
}

/// One etcd member on loopback ports of its own, its data in `dir`.
pub struct Etcd {
    pub process: External,
    pub client_url: String,
    peer_port: u16,
    dir: PathBuf,
    program: PathBuf,
}

/// Times an etcd whose ports were taken is started again on fresh ones.
pub const ETCD_STARTS: usize = 3;

/// Waits until the etcd in `process` answers `/health` on `health_port`.
/// `Err(its log)` if it exited first: a port [`free_port`] picked may be
/// taken by another test before etcd binds it, and etcd then exits. One that
/// runs without answering within [`START_TIMEOUT`] fails the test, with its log.
pub fn etcd_answers(process: &mut External, health_port: u16, log: &Path) -> Result<(), String> {
    let started = Instant::now();
    loop {
        if http_get(health_port, "/health").is_some_and(|(status, _)| status == 200) {
            return Ok(());
        }
        let text = || {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let start = text.len().saturating_sub(4000);
            text.get(start..).unwrap_or_default().to_owned()
        };
        if process.has_exited() {
            return Err(text());
        }
        assert!(
            started.elapsed() < START_TIMEOUT,
            "etcd answers: not within {START_TIMEOUT:?}; its log:\n{}",
            text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Etcd {
    pub fn start(program: &Path, dir: &Path) -> Etcd {
        for attempt in 1..=ETCD_STARTS {
            // A member that exited may have begun its data under the old ports.
            let _ = std::fs::remove_dir_all(dir.join("etcd"));
            match Etcd::try_start_on(program, dir, free_port(), free_port()) {
                Ok(etcd) => return etcd,
                Err(log) if attempt < ETCD_STARTS => {
                    eprintln!(
                        "etcd exited before answering; again on fresh ports. Its log:\n{log}"
                    );
                }
                Err(log) => {
                    panic!("etcd exited before answering, {attempt} times; its log:\n{log}")
                }
            }
        }
        unreachable!("the last start returns or panics")
    }

    fn start_on(program: &Path, dir: &Path, client_port: u16, peer_port: u16) -> Etcd {
        Etcd::try_start_on(program, dir, client_port, peer_port)
            .unwrap_or_else(|log| panic!("etcd exited before answering; its log:\n{log}"))
    }

    fn try_start_on(
        program: &Path,
        dir: &Path,
        client_port: u16,
        peer_port: u16,
    ) -> Result<Etcd, String> {
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut command = guarded(program);
        command.args([
            "--name=ha-test",
            &format!("--data-dir={}", dir.join("etcd").display()),
            &format!("--listen-client-urls={client_url}"),
            &format!("--advertise-client-urls={client_url}"),
            &format!("--listen-peer-urls={peer_url}"),
            &format!("--initial-advertise-peer-urls={peer_url}"),
            &format!("--initial-cluster=ha-test={peer_url}"),
            "--log-level=error",
        ]);
        let log = dir.join("etcd.log");
        let mut etcd = Etcd {
            process: External::spawn_logged(command, &log),
            client_url,
            peer_port,
            dir: dir.to_owned(),
            program: program.to_owned(),
        };
        etcd_answers(&mut etcd.process, client_port, &log)?;
        Ok(etcd)
    }

    /// The same member again, on the same ports and data (after a kill).
    pub fn restart(&self) -> Etcd {
        let port: u16 = self.client_url.rsplit(':').next().unwrap().parse().unwrap();
        Etcd::start_on(&self.program, &self.dir, port, self.peer_port)
    }
}

/// The scheduler binary, elected on etcd, listening on `port`; in a
/// process group of its own that dies with the test ([`crate::processes`]).
pub struct Scheduler {
    pub child: Child,
    pub port: u16,
    log: Arc<Mutex<Vec<String>>>,
}

/// A scheduler with no balancer checking its `/readyz` would resign as a
/// leader no balancer reaches (`--ha_resign_unchecked_after`, on by
/// default), as it must in a deployment without one.
pub const NO_BALANCER: &str = "--ha_resign_unchecked_after=0s";

impl Scheduler {
    /// Without HAProxy in front ([`NO_BALANCER`]).
    pub fn start(port: u16, etcd_url: &str) -> Scheduler {
        Scheduler::start_with(port, etcd_url, &[NO_BALANCER])
    }

    /// Behind HAProxy, with the default flags.
    pub fn behind_balancer(port: u16, etcd_url: &str) -> Scheduler {
        Scheduler::start_with(port, etcd_url, &[])
    }

    /// With `extra` flags after the usual ones.
    pub fn start_with(port: u16, etcd_url: &str, extra: &[&str]) -> Scheduler {
        let mut command = crate::processes::command(env!("CARGO_BIN_EXE_yadcc-scheduler"));
        command
            .args([
                format!("--listen=127.0.0.1:{port}"),
                format!("--acceptable_user_tokens={USER_TOKEN}"),
                format!("--acceptable_servant_tokens={SERVANT_TOKEN}"),
                format!("--serving_daemon_token_secret={SECRET}"),
                format!("--ha_etcd_endpoints={etcd_url}"),
                format!("--admin_tokens={ADMIN_TOKEN}"),
                // HAProxy's PROXY headers name the daemons.
                "--trusted_proxies=127.0.0.1".to_owned(),
                "--debugging_no_inspect_auth".to_owned(),
            ])
            .args(extra)
            .env("RUST_LOG", "info,yadcc_scheduler::access=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = crate::processes::spawn(command).expect("start the scheduler");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                lines.lock().expect("log").push(line);
            }
        });
        let scheduler = Scheduler { child, port, log };
        wait_until(START_TIMEOUT, "the scheduler answers", || {
            http_get(port, "/healthz").is_some()
        });
        scheduler
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The name it proclaims when it leads.
    pub fn name(&self) -> String {
        self.addr().to_string()
    }

    /// `/readyz`: the status and the first line; None if it does not answer.
    pub fn readyz(&self) -> Option<(u16, String)> {
        http_get(self.port, "/readyz")
            .map(|(status, body)| (status, body.lines().next().unwrap_or("").to_owned()))
    }

    pub fn is_ready(&self) -> bool {
        self.readyz().is_some_and(|(status, _)| status == 200)
    }

    /// A metric's value (a gauge or a counter's total), None if absent.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, text) = http_get(self.port, "/metrics")?;
        text.lines().find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == name).then(|| value.parse().ok())?
        })
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().expect("log").clone()
    }

    pub fn kill_9(&mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.signal_quietly();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Scheduler {
    /// A stopped process cannot die of SIGKILL until it is continued.
    fn signal_quietly(&self) -> std::io::Result<std::process::ExitStatus> {
        Command::new("kill")
            .arg("-CONT")
            .arg(self.child.id().to_string())
            .stderr(Stdio::null())
            .status()
    }
}

/// HAProxy with `scripts/deploy/haproxy.cfg`, on `port`, in front of `a`
/// and `b`.
pub fn haproxy(program: &Path, port: u16, a: SocketAddr, b: SocketAddr) -> External {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/deploy/haproxy.cfg");
    let mut command = guarded(program);
    command
        .arg("-db")
        .arg("-f")
        .arg(config)
        .env("YADCC_LB_BIND", format!("127.0.0.1:{port}"))
        // Within a test machine's descriptor limit.
        .env("YADCC_LB_MAXCONN", "4000")
        .env("YADCC_SCHEDULER_A", a.to_string())
        .env("YADCC_SCHEDULER_B", b.to_string());
    let haproxy = External::spawn(command);
    wait_until(START_TIMEOUT, "haproxy listens", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    // HAProxy starts with every server up, until its first checks (`inter`
    // 300 ms, `fall` 2) say otherwise.
    std::thread::sleep(HAPROXY_FIRST_CHECKS);
    haproxy
}

/// A plain HTTP/1.0 GET on loopback: the status and the body.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(500),
    )
    .ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let status = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())?;
    Some((status, body))
}

/// Polls `done` every 20 ms until it holds; panics after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if done() {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Of the two, the one that leads, after exactly one became ready.
pub fn leader_of(a: &Scheduler, b: &Scheduler) -> bool {
    wait_until(Duration::from_secs(15), "one of two leads", || {
        a.is_ready() != b.is_ready()
    });
    a.is_ready()
}

/// (leader, standby) of the two, once exactly one is ready.
pub fn roles<'s>(
    a: &'s mut Scheduler,
    b: &'s mut Scheduler,
) -> (&'s mut Scheduler, &'s mut Scheduler) {
    if leader_of(a, b) { (a, b) } else { (b, a) }
}

/// What a test runs on: one etcd, two schedulers elected on it, HAProxy in
/// front of them if asked for; the tests' turn held until it is dropped
/// (the schedulers first, the turn last).
pub struct Setup {
    pub a: Scheduler,
    pub b: Scheduler,
    /// HAProxy and the port daemons connect to.
    pub haproxy: Option<(External, u16)>,
    pub etcd: Etcd,
    _scratch: Scratch,
    _turn: MutexGuard<'static, ()>,
}

impl Setup {
    /// None (a skip, outside CI) when etcd, or HAProxy if asked for, is
    /// not installed.
    pub fn start(name: &str, with_haproxy: bool) -> Option<Setup> {
        let turn = one_at_a_time();
        let etcd_program = tool("etcd")?;
        let haproxy_program = if with_haproxy {
            Some(tool("haproxy")?)
        } else {
            None
        };
        let scratch = Scratch::new(name);
        let etcd = Etcd::start(&etcd_program, &scratch.0);
        let start = if with_haproxy {
            Scheduler::behind_balancer
        } else {
            Scheduler::start
        };
        let a = start(free_port(), &etcd.client_url);
        let b = start(free_port(), &etcd.client_url);
        let haproxy = haproxy_program.map(|program| {
            let port = free_port();
            (haproxy(&program, port, a.addr(), b.addr()), port)
        });
        Some(Setup {
            a,
            b,
            haproxy,
            etcd,
            _scratch: scratch,
            _turn: turn,
        })
    }

    /// Where daemons connect: HAProxy.
    pub fn haproxy_port(&self) -> u16 {
        self.haproxy.as_ref().expect("started with HAProxy").1
    }
}

/// A JSON RPC over HTTP/1.1 to `port`, answered within `within`: the status
/// and the `Rpc-Error-Code` (None on success).
pub fn json_call(port: u16, rpc: &str, body: &str, within: Duration) -> (u16, Option<String>) {
    let path = format!("/rpc/yadcc.scheduler.SchedulerService.{rpc}");
    let (status, answer) = json_post(port, &path, "", body, within);
    let code = answer
        .lines()
        .find_map(|line| line.strip_prefix("rpc-error-code: "))
        .map(str::to_owned);
    (status, code)
}

/// A JSON POST of `body` to `path` on loopback `port` over HTTP/1.1 (one
/// call, then the connection closes), with `headers` (each line ending in
/// CRLF) added: the status (0 if none came within `within`) and the whole
/// answer, head and body.
pub fn json_post(
    port: u16,
    path: &str,
    headers: &str,
    body: &str,
    within: Duration,
) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(within)).expect("timeout");
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}
