//! A LAN of its own per test: a bridge on the host (the scheduler's side,
//! `.1`) and one network namespace per daemon (`.2`, `.3`, ...), named after
//! this branch and process so that concurrent runs never share one, on a
//! 10.x.y.0/24 no interface or route of the host uses. Everything is removed
//! when the [`Lan`] is dropped. Daemons and clients run inside their
//! namespace under `timeout`.

use std::{
    fs::File,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use crate::support::{bounded, run_bounded};

use super::{DAEMON_TOKEN, Peers};

/// Ports every daemon uses inside its own namespace (the original's
/// defaults): for its local compiler wrapper, and for other daemons.
pub const LOCAL_PORT: u16 = 8334;
pub const SERVING_PORT: u16 = 8335;
/// Longest a daemon may run in a test; `timeout` stops it after that.
const DAEMON_LIMIT: Duration = Duration::from_secs(900);
/// Longest one `ip` command may take.
const IP_LIMIT: Duration = Duration::from_secs(30);

/// Runs `ip` with `args`, bounded, panicking with its error if it fails.
fn ip(args: &[&str]) -> String {
    let output = bounded(IP_LIMIT, "ip")
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("ip does not run (install iproute2): {error}"));
    assert!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `ip` to undo something; a failure only means it was not there.
fn ip_quietly(args: &[&str]) {
    let _ = bounded(IP_LIMIT, "ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

pub struct Lan {
    bridge: String,
    net: [u8; 3],
    namespaces: Vec<(String, String)>,
    pub work: PathBuf,
}

impl Lan {
    /// A bridge and one namespace per role, in order: `roles[0]` is `.2`.
    pub fn new(roles: &[&str]) -> Lan {
        static MADE: AtomicU32 = AtomicU32::new(0);
        let made = MADE.fetch_add(1, Ordering::Relaxed);
        // Short: interface names have at most 15 bytes.
        let id = format!("{}{made}", std::process::id() % 100_000);
        let work = std::env::temp_dir().join(format!("yadcc-ci-peers-{id}"));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).expect("a work directory");
        let mut lan = Lan {
            bridge: format!("ycb{id}"),
            net: free_subnet(),
            namespaces: Vec::new(),
            work,
        };
        ip(&["link", "add", &lan.bridge, "type", "bridge"]);
        let host = format!("{}/24", lan.host_ip());
        ip(&["addr", "add", &host, "dev", &lan.bridge]);
        ip(&["link", "set", &lan.bridge, "up"]);
        for (index, role) in roles.iter().enumerate() {
            let namespace = format!("yadcc-ci-{id}-{role}");
            let outside = format!("yc{id}n{index}");
            let inside = format!("yc{id}n{index}p");
            ip(&["netns", "add", &namespace]);
            lan.namespaces.push((role.to_string(), namespace.clone()));
            ip(&[
                "link", "add", &outside, "type", "veth", "peer", "name", &inside,
            ]);
            ip(&["link", "set", &inside, "netns", &namespace]);
            ip(&["link", "set", &outside, "master", &lan.bridge, "up"]);
            let address = format!("{}/24", lan.ip(role));
            let inside_ip = |args: &[&str]| {
                let mut all = vec!["-n", namespace.as_str()];
                all.extend_from_slice(args);
                ip(&all);
            };
            inside_ip(&["addr", "add", &address, "dev", &inside]);
            inside_ip(&["link", "set", &inside, "up"]);
            inside_ip(&["link", "set", "lo", "up"]);
        }
        lan
    }

    /// The host's address on the LAN, where the scheduler listens.
    pub fn host_ip(&self) -> Ipv4Addr {
        let [a, b, c] = self.net;
        Ipv4Addr::new(a, b, c, 1)
    }

    fn index(&self, role: &str) -> usize {
        self.namespaces
            .iter()
            .position(|(name, _)| name == role)
            .unwrap_or_else(|| panic!("no role {role} on this LAN"))
    }

    pub fn ip(&self, role: &str) -> Ipv4Addr {
        let [a, b, c] = self.net;
        Ipv4Addr::new(a, b, c, 2 + self.index(role) as u8)
    }

    pub fn namespace(&self, role: &str) -> &str {
        &self.namespaces[self.index(role)].1
    }

    /// `program` inside `role`'s namespace, under `timeout`.
    pub fn command(&self, role: &str, limit: Duration, program: impl AsRef<Path>) -> Command {
        let mut command = bounded(limit, "ip");
        command
            .args(["netns", "exec", self.namespace(role)])
            .arg(program.as_ref());
        command
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        // A namespace's end takes its veth pair with it.
        for (_, namespace) in &self.namespaces {
            ip_quietly(&["netns", "del", namespace]);
        }
        ip_quietly(&["link", "del", &self.bridge]);
        if std::env::var_os("YADCC_PEERS_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.work);
        } else {
            eprintln!("logs kept in {}", self.work.display());
        }
    }
}

/// A 10.x.y.0/24 that no address or route of the host mentions.
fn free_subnet() -> [u8; 3] {
    let taken = format!(
        "{}\n{}",
        ip(&["-4", "-o", "addr", "show"]),
        ip(&["-4", "route", "show", "table", "all"])
    );
    let mut seed = std::process::id()
        ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |now| now.subsec_nanos()));
    for _ in 0..1000 {
        // xorshift: any spread will do.
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let net = [10, 200 + (seed % 55) as u8, (seed >> 8) as u8];
        if !taken.contains(&format!("10.{}.{}.", net[1], net[2])) {
            return net;
        }
    }
    panic!("no free 10.x.y.0/24 for the test LAN")
}

/// What a daemon does besides talking to the scheduler.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum DaemonRole {
    /// Accepts compilations from other daemons (two at a time).
    Servant,
    /// Only sends its own machine's compilations out.
    Delegate,
}

/// A real `yadcc-daemon` in its namespace, its log in a file.
pub struct Daemon {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the daemon of `role` on the LAN's machine `machine`, pointed at
    /// `scheduler` (a `flare://` URI).
    pub fn start(
        peers: &Peers,
        lan: &Lan,
        machine: &str,
        role: DaemonRole,
        scheduler: &str,
    ) -> Daemon {
        let log = lan.work.join(format!("{machine}.log"));
        let mut flags = vec![
            format!("--scheduler_uri={scheduler}"),
            format!("--token={DAEMON_TOKEN}"),
            format!("--serving_ip={}", lan.ip(machine)),
            format!("--local_port={LOCAL_PORT}"),
            format!("--serving_port={SERVING_PORT}"),
            "--logtostderr".to_owned(),
            // Logs "Executing: ..." for each compilation it runs.
            "--vmodule=execution_engine=1".to_owned(),
        ];
        // `--foreground`: `timeout` passes a signal to the daemon alone. By
        // default it also signals its own process group, the daemon again,
        // and the original crashes on a second quit signal.
        // In a process group of its own that dies with the test
        // (`crate::processes`); the daemon, `timeout`'s child, dies with
        // `timeout` too.
        let mut command = crate::processes::command("timeout");
        command
            .args(["--foreground", "--kill-after=5"])
            .arg(DAEMON_LIMIT.as_secs().to_string())
            .args(crate::processes::dies_with_parent())
            .args(["ip", "netns", "exec", lan.namespace(machine), "unshare"]);
        match role {
            DaemonRole::Servant => {
                flags.extend([
                    "--servant_priority=dedicated".to_owned(),
                    "--max_remote_tasks=2".to_owned(),
                    // The daemon reports this machine's load, which on a
                    // shared CI machine is often above its two processors:
                    // the scheduler would then rightly give it no task. In
                    // its own mount namespace it sees 64 processors (the
                    // count it reads from sysfs), and it measures load by
                    // the load average only (its other measure needs fewer
                    // than 61 seconds here), so it reports a machine with
                    // room, as a dedicated servant of a real cluster is.
                    "--cpu_load_average_seconds=100000".to_owned(),
                    "--min_memory_for_starting_new_task=1G".to_owned(),
                ]);
                let online = lan.work.join(format!("{machine}.cpus"));
                std::fs::write(&online, "0-63\n").expect("the processor list");
                command
                    .args(["--mount", "--propagation", "private", "sh", "-c"])
                    .arg("mount --bind \"$0\" /sys/devices/system/cpu/online && exec \"$@\"")
                    .arg(&online);
            }
            DaemonRole::Delegate => {
                flags.push("--max_remote_tasks=0".to_owned());
                // The same mount namespace as the servant's, nothing changed.
                command.args(["--mount", "--propagation", "private"]);
            }
        }
        let output = File::create(&log).expect("the daemon's log");
        command
            .arg(peers.daemon())
            .args(&flags)
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("the log, twice"))
            .stderr(output);
        let child = crate::processes::spawn(command).expect("start the daemon");
        Daemon {
            child: Some(child),
            log,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Asks the daemon to leave, as an operator's SIGTERM does (`timeout`
    /// passes the signal on), and waits until it is gone.
    pub async fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("a running daemon");
        signal("-TERM", child.id()).await;
        tokio::task::spawn_blocking(move || {
            // `timeout` kills it 5 s after passing on the signal, at worst.
            let give_up_at = Instant::now() + Duration::from_secs(60);
            loop {
                if let Some(status) = child.try_wait().expect("poll the daemon") {
                    return status;
                }
                assert!(Instant::now() < give_up_at, "the daemon does not stop");
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await
        .expect("wait for the daemon")
    }
}

async fn signal(signal: &str, pid: u32) {
    let _ = run_bounded({
        let mut command = bounded(IP_LIMIT, "kill");
        command.args([signal, &pid.to_string()]);
        command
    })
    .await;
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // The daemon itself is `timeout`'s child: SIGTERM to `timeout`
        // reaches it, and 5 s later SIGKILL does.
        let _ = bounded(IP_LIMIT, "kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let give_up_at = Instant::now() + Duration::from_secs(15);
        while Instant::now() < give_up_at {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // `timeout` and the daemon: their group.
        let _ = bounded(IP_LIMIT, "kill")
            .args(["-KILL", "--", &format!("-{}", child.id())])
            .status();
        let _ = child.kill();
        let _ = child.wait();
    }
}
