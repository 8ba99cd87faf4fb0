//! The original yadcc against this scheduler: its daemon and compiler wrapper
//! (`yadcc-daemon`, `yadcc-cxx`, built unmodified from source, found at
//! `$YADCC_PEERS`, else `../shared/peers` beside the repository) run as an
//! operator runs them, each daemon in a network namespace of its own so that
//! each is a machine with its own address and ports:
//!
//! - `compile`: a C++ file compiled remotely through two real daemons, one at
//!   a time and several at once, every object byte-identical to a local
//!   `g++ -c`;
//! - `life`: one daemon's whole life as the scheduler sees it, every call
//!   and answer recorded on the way: registration, heartbeats, `GetConfig`,
//!   `GetRunningTasks` listing a task running on another daemon, and its
//!   graceful leave;
//! - `failover`: the hot standby (two instances, etcd, HAProxy) through a
//!   kill -9 and a freeze of the leader, compiling all along.
//!
//! They need root (network namespaces), `ip`, `g++` and the original's
//! runtime libraries (`failover` also Debian's `etcd` and `haproxy`), which `scripts/test.sh` installs; it runs them with
//! `--ignored` when the original is at hand and says in one line why not
//! otherwise (and fails in CI). A plain `cargo test` counts them ignored. Run
//! without their prerequisites, they fail, naming the missing one.

mod compile;
mod failover;
mod lan;
mod life;

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::support::{Launch, SERVANT_TOKEN, USER_TOKEN, http_client, run_bounded};

pub use lan::{Daemon, DaemonRole, Lan};

/// The token every daemon passes: one token serves both roles, so it is in
/// both of the scheduler's lists.
pub const DAEMON_TOKEN: &str = SERVANT_TOKEN;
/// How long a daemon may take to start and register: the original calibrates
/// its clock at start, which takes seconds on a loaded machine.
pub const DAEMON_START: Duration = Duration::from_secs(120);
/// The longest one remote compilation through the daemons may take.
pub const COMPILE_LIMIT: Duration = Duration::from_secs(240);

/// Where the original yadcc's binaries are.
pub struct Peers {
    dir: PathBuf,
}

impl Peers {
    /// The original yadcc and what running it needs, or a panic naming what
    /// is missing: these tests run only when asked to (`--ignored`).
    pub fn required() -> Peers {
        let dir = std::env::var_os("YADCC_PEERS")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/peers"));
        for binary in ["yadcc-daemon", "yadcc-cxx"] {
            assert!(
                dir.join(binary).is_file(),
                "no {binary} in {} (set YADCC_PEERS to the original yadcc)",
                dir.display()
            );
        }
        Peers { dir }
    }

    pub fn daemon(&self) -> PathBuf {
        self.dir.join("yadcc-daemon")
    }

    pub fn cxx(&self) -> PathBuf {
        self.dir.join("yadcc-cxx")
    }
}

/// This scheduler, built fresh for the test run, listening on the host's
/// address on the LAN with a port the kernel picks, its access log on.
pub fn scheduler(lan: &Lan) -> crate::support::Binary {
    let listen = SocketAddr::from((lan.host_ip(), 0));
    let both = format!("--acceptable_user_tokens={USER_TOKEN},{DAEMON_TOKEN}");
    Launch {
        listen,
        flags: &[
            &both,
            // The LAN's address is reachable only from the test's own
            // namespaces.
            "--debugging_no_inspect_auth",
            // Other builds on a shared machine must not make the servant
            // too short of memory to be given a task.
            "--servant_min_memory_for_accepting_new_task=1G",
            // The test reads which daemon calls were answered from the
            // access log: every call, not only the failed and slow ones.
            "--access_log=all",
        ],
        rust_log: "info",
        ..Launch::default()
    }
    .start()
}

/// The scheduler's inspection dump (`/inspect/vars/yadcc/task_dispatcher`).
/// A send that fails is tried again, twice at most: the client may reuse a
/// kept-alive connection the scheduler closed a moment before (a failover
/// closes connections), which hyper reports as an incomplete message.
pub async fn dump(addr: SocketAddr) -> Value {
    let url = format!("http://{addr}/inspect/vars/yadcc/task_dispatcher");
    let mut attempt = 0;
    let answer = loop {
        attempt += 1;
        match http_client().get(&url).send().await {
            Ok(answer) => break answer,
            Err(error) if attempt < 3 => {
                eprintln!("the dump, attempt {attempt}: {error}; again");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(error) => panic!("the dump: {error:?}"),
        }
    };
    answer.json().await.expect("the dump is JSON")
}

/// The servant of the dump at `location` (as the daemon reports it).
pub fn servant_at<'a>(dump: &'a Value, location: &str) -> Option<&'a Value> {
    dump["servants"]
        .as_array()?
        .iter()
        .find(|servant| servant["location"] == location || servant["reported_location"] == location)
}

/// Polls the dump until `ready` holds, for at most `limit`; the last dump.
pub async fn until_dump(
    addr: SocketAddr,
    limit: Duration,
    mut ready: impl FnMut(&Value) -> bool,
) -> Result<Value, Value> {
    let give_up_at = Instant::now() + limit;
    loop {
        let dump = dump(addr).await;
        if ready(&dump) {
            return Ok(dump);
        }
        if Instant::now() > give_up_at {
            return Err(dump);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `yadcc-cxx /usr/bin/g++` on the `delegate` machine in the LAN's work
/// directory, every file sent to the cloud and none answered from a cache;
/// the compiler's arguments are the caller's.
pub fn cloud_compile_command(peers: &Peers, lan: &Lan) -> Command {
    let mut command = lan.command("delegate", COMPILE_LIMIT, "env");
    command
        .current_dir(&lan.work)
        .arg(format!("HOME={}", lan.work.display()))
        .arg("YADCC_COMPILE_ON_CLOUD_SIZE_THRESHOLD=0")
        .arg("YADCC_CACHE_CONTROL=0")
        .arg(format!("YADCC_DAEMON_PORT={}", lan::LOCAL_PORT))
        .arg(peers.cxx())
        .arg("/usr/bin/g++");
    command
}

/// Runs the stock compiler wrapper on the `delegate` machine in the LAN's
/// work directory: `yadcc-cxx /usr/bin/g++ ARGS`, every file sent to the
/// cloud and none answered from a cache. The wrapper's output if it failed.
pub async fn remote_compile(peers: &Peers, lan: &Lan, args: &[String]) -> Result<(), String> {
    let mut command = cloud_compile_command(peers, lan);
    command.args(args);
    let output = run_bounded(command).await;
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// A servant daemon and a delegate daemon started on the LAN's machines of
/// those names, the servant talking to `scheduler`, the delegate to
/// `delegate_scheduler` (the same, or a proxy in front of it); returned once
/// both are registered and the servant has room for its two compilations.
pub async fn servant_and_delegate(
    peers: &Peers,
    lan: &Lan,
    scheduler: SocketAddr,
    delegate_scheduler: SocketAddr,
) -> (Daemon, Daemon) {
    let servant = Daemon::start(
        peers,
        lan,
        "servant",
        DaemonRole::Servant,
        &format!("flare://{scheduler}"),
    );
    let delegate = Daemon::start(
        peers,
        lan,
        "delegate",
        DaemonRole::Delegate,
        &format!("flare://{delegate_scheduler}"),
    );
    let (servant_location, delegate_location) =
        (location(lan.ip("servant")), location(lan.ip("delegate")));
    let ready = until_dump(scheduler, DAEMON_START, |dump| {
        servant_at(dump, &servant_location).is_some_and(|s| s["capacity_available"] == 2)
            && servant_at(dump, &delegate_location).is_some()
    })
    .await;
    if let Err(dump) = ready {
        panic!(
            "the daemons did not register with room to compile within {DAEMON_START:?}: {dump}\n\
             servant:\n{}\ndelegate:\n{}",
            servant.log_text(),
            delegate.log_text()
        );
    }
    (servant, delegate)
}

/// The daemon's serving location, as it reports it in heartbeats.
pub fn location(ip: Ipv4Addr) -> String {
    format!("{ip}:{}", lan::SERVING_PORT)
}

/// Lines of a daemon's log that are warnings, errors or fatal errors about
/// the scheduler (glog's `W`, `E`, `F` lines).
pub fn scheduler_complaints(log: &str) -> Vec<String> {
    log.lines()
        .filter(|line| line.starts_with(['W', 'E', 'F']))
        .filter(|line| line.to_ascii_lowercase().contains("scheduler"))
        .map(str::to_owned)
        .collect()
}

/// Access-log lines of daemon calls (`protocol="flare"`) that were not
/// answered with code 0, except the long polls that found no slot in time
/// (1001): busy is an answer, not a failure.
pub fn failed_daemon_calls(log: &[String]) -> Vec<String> {
    log.iter()
        .filter(|line| line.contains("protocol=\"flare\""))
        .filter(|line| !line.contains(" code=0 "))
        .filter(|line| {
            !(line.contains("rpc=\"WaitForStartingTask\"") && line.contains(" code=1001 "))
        })
        .cloned()
        .collect()
}

/// Daemon calls of `rpc` from `ip` in the access log, and how many were
/// answered with code 0.
pub fn daemon_calls(log: &[String], rpc: &str, ip: Ipv4Addr) -> (usize, usize) {
    let calls: Vec<&String> = log
        .iter()
        .filter(|line| line.contains("protocol=\"flare\""))
        .filter(|line| line.contains(&format!("rpc=\"{rpc}\"")))
        .filter(|line| line.contains(&format!(" peer={ip} ")))
        .collect();
    let ok = calls
        .iter()
        .filter(|line| line.contains(" code=0 "))
        .count();
    (calls.len(), ok)
}
