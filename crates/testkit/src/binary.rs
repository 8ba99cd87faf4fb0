//! The real scheduler binary as a process: started with a test's flags,
//! its stderr kept as a [`Log`], stopped with the test.

use std::{
    io::{BufRead, BufReader},
    net::SocketAddr,
    process::{Child, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use super::*;

/// What a started process wrote to stderr so far, line by line.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn lines(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(|error| error.into_inner())
            .clone()
    }

    pub fn contains(&self, text: &str) -> bool {
        self.lines().iter().any(|line| line.contains(text))
    }

    fn push(&self, line: String) {
        self.0
            .lock()
            .unwrap_or_else(|error| error.into_inner())
            .push(line);
    }
}

/// How to start the real binary.
pub struct Launch<'a> {
    /// `--listen`: port 0 unless a test restarts on the port a killed
    /// instance held.
    pub listen: SocketAddr,
    pub flags: &'a [&'a str],
    /// `ulimit -n` for the process, if any.
    pub nofile: Option<u32>,
    pub rust_log: &'a str,
    /// Whether to add the test tokens to the token lists (the flags may
    /// still override them: the last one wins).
    pub tokens: bool,
    /// Environment variables set for the process.
    pub env: &'a [(&'a str, &'a str)],
}

impl Default for Launch<'_> {
    fn default() -> Self {
        Launch {
            listen: "127.0.0.1:0".parse().expect("address"),
            flags: &[],
            nofile: None,
            rust_log: "info,yadcc_scheduler::access=warn",
            tokens: true,
            env: &[],
        }
    }
}

/// A started binary that may not listen yet.
pub struct Starting {
    pub child: Child,
    pub log: Log,
    listening: std::sync::mpsc::Receiver<SocketAddr>,
}

impl Starting {
    /// The address it reports once bound, or None if it did not within `limit`.
    pub fn listening_within(&self, limit: Duration) -> Option<SocketAddr> {
        self.listening.recv_timeout(limit).ok()
    }
}

/// The scheduler binary a test starts: the one `YADCC_SCHEDULER_BINARY`
/// names, else the one cargo built beside the running test binary
/// (`target/<profile>/deps/<test>` next to `target/<profile>/yadcc-scheduler`).
pub fn scheduler_binary() -> std::path::PathBuf {
    if let Some(named) = std::env::var_os("YADCC_SCHEDULER_BINARY") {
        return named.into();
    }
    let test = std::env::current_exe().expect("the test binary's path");
    let profile_dir = test
        .parent()
        .and_then(std::path::Path::parent)
        .expect("the test binary sits in target/<profile>/deps");
    profile_dir.join("yadcc-scheduler")
}

impl Launch<'_> {
    /// Starts `yadcc-scheduler` with stderr drained into a [`Log`] (so a
    /// chatty log never blocks it on a full pipe): this build's, or the one
    /// `YADCC_SCHEDULER_BINARY` names.
    pub fn spawn(&self) -> Starting {
        // Another build may stand in, to see a test fail on older code.
        let program = scheduler_binary();
        let mut args = vec![format!("--listen={}", self.listen)];
        if self.tokens {
            args.push(format!("--acceptable_user_tokens={USER_TOKEN}"));
            args.push(format!("--acceptable_servant_tokens={SERVANT_TOKEN}"));
        }
        args.extend(self.flags.iter().map(|flag| (*flag).to_owned()));
        let mut command = match self.nofile {
            Some(limit) => {
                let mut command = crate::processes::command("sh");
                command
                    .arg("-c")
                    .arg(format!(
                        "ulimit -Sn {limit} && ulimit -Hn {limit} && exec \"$0\" \"$@\""
                    ))
                    .arg(program);
                command
            }
            // Its own process group, killed by the kernel when the test's
            // thread ends: a killed test runner leaves no scheduler behind.
            None => crate::processes::command(program),
        };
        command
            .args(&args)
            .envs(self.env.iter().copied())
            .env("RUST_LOG", self.rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = crate::processes::spawn(command).expect("start the binary");
        let stderr = child.stderr.take().expect("stderr");
        let log = Log::default();
        let (found, listening) = std::sync::mpsc::channel();
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find(LISTENING) {
                    let rest = &line[at + LISTENING.len()..];
                    if let Some(addr) = rest
                        .split_whitespace()
                        .next()
                        .and_then(|addr| addr.parse().ok())
                    {
                        let _ = found.send(addr);
                    }
                }
                kept.push(line);
            }
        });
        Starting {
            child,
            log,
            listening,
        }
    }

    /// [`Launch::spawn`], then waits until it listens (a panic with its log
    /// if it does not within [`STEP`]).
    pub fn start(&self) -> Binary {
        let mut starting = self.spawn();
        let Some(addr) = starting.listening_within(STEP) else {
            let _ = starting.child.kill();
            let _ = starting.child.wait();
            panic!(
                "the binary did not say where it listens:\n{}",
                starting.log.lines().join("\n")
            );
        };
        Binary {
            child: starting.child,
            addr,
            log: starting.log,
        }
    }
}

/// The log line that tells where the binary listens (scripts read it too).
const LISTENING: &str = "listening on http://";

/// The real binary, listening, killed when dropped.
pub struct Binary {
    pub child: Child,
    pub addr: SocketAddr,
    log: Log,
}

impl Binary {
    /// Starts `yadcc-scheduler` on a free loopback port with `flags`, under
    /// `ulimit -n nofile` if given.
    pub fn start(flags: &[&str], nofile: Option<u32>) -> Binary {
        Launch {
            flags,
            nofile,
            ..Launch::default()
        }
        .start()
    }

    /// Starts `yadcc-scheduler` on `listen` with exactly `flags` (no token
    /// flags added) and the variables `env` set.
    pub fn start_exactly(
        listen: SocketAddr,
        flags: &[&str],
        env: &[(&str, &str)],
        nofile: Option<u32>,
    ) -> Binary {
        Launch {
            listen,
            flags,
            nofile,
            tokens: false,
            env,
            ..Launch::default()
        }
        .start()
    }

    /// The lines it has logged so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lines()
    }

    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("process status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .expect("VmRSS")
    }

    pub fn open_files_limit(&self) -> u64 {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.child.id()))
            .expect("process limits");
        limits
            .lines()
            .find(|line| line.starts_with("Max open files"))
            .and_then(|line| line.split_whitespace().nth(3))
            .and_then(|soft| soft.parse().ok())
            .expect("Max open files")
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Resolves when the server closes `stream` (reading and dropping what it
/// sends); the time it took, or None if it stayed open for `limit`.
pub async fn closed_within(mut stream: tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt as _;
    let started = tokio::time::Instant::now();
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}
