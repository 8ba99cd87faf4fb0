//! Every external process a test starts ends with the test: when it is
//! dropped (the test ended, passed or panicked), and when the test runner
//! itself is killed (CI's timeout, a developer's ^C twice, an OOM kill).
//!
//! Two mechanisms, because each covers what the other cannot:
//! - its own process group (`setsid`-like, `process_group(0)`), killed whole
//!   on drop: a wrapper (`timeout`, `ip netns exec`, `sh -c`) and whatever
//!   it started go together. Killing the wrapper alone is how an `haproxy`
//!   outlived CI (`timeout` cannot pass SIGKILL on);
//! - a parent-death signal (`PR_SET_DEATHSIG`, set by util-linux `setpriv
//!   --pdeathsig KILL`, which then execs the program, so the setting is the
//!   program's own): the kernel kills it when its parent ends, so a test
//!   runner killed with SIGKILL, whose destructors never run, takes its
//!   programs along. Set through `setpriv` because the crate forbids
//!   `unsafe` (a `pre_exec` calling `prctl` would need it). The kernel
//!   counts the *thread* that spawned it as the parent, and tests start
//!   programs from `spawn_blocking` threads that end after 10 s idle, so
//!   every program is spawned by one thread that lives as long as the
//!   runner ([`spawn`]).

use std::{
    ffi::OsStr,
    io,
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command},
    sync::{Mutex, OnceLock, mpsc},
};

/// Where `setpriv` is looked for (util-linux: on every Debian system).
const SETPRIV: [&str; 2] = ["/usr/bin/setpriv", "/bin/setpriv"];

/// `program` (with the arguments added later) in a process group of its own,
/// killed by the kernel when the calling thread ends. Spawn it with
/// [`Group::spawn`], whose drop kills the group.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut command = match SETPRIV.iter().map(Path::new).find(|path| path.is_file()) {
        Some(setpriv) => {
            let mut command = Command::new(setpriv);
            command.args(["--pdeathsig", "KILL", "--"]).arg(program);
            command
        }
        // Without util-linux: the group still ends on drop.
        None => Command::new(program),
    };
    command.process_group(0);
    command
}

/// The arguments that make the rest of a command line die with its parent:
/// for a wrapper that forks (`timeout`), put between it and its program so
/// the program dies when the wrapper does.
pub fn dies_with_parent() -> Vec<String> {
    match SETPRIV.iter().find(|path| Path::new(path).is_file()) {
        Some(setpriv) => vec![
            (*setpriv).to_owned(),
            "--pdeathsig".to_owned(),
            "KILL".to_owned(),
            "--".to_owned(),
        ],
        None => Vec::new(),
    }
}

/// What the spawning thread is asked: a command, and where its child goes.
type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `command` from the one thread that lives as long as the test
/// runner, so a parent-death signal ([`command`]) fires when the runner
/// ends and not when the calling thread does.
pub fn spawn(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, queue) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("test-process-spawner".to_owned())
            .spawn(move || {
                for (mut command, answer) in queue {
                    let _ = answer.send(command.spawn());
                }
            })
            .expect("the spawning thread");
        Mutex::new(requests)
    });
    let (answer, answered) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((command, answer))
        .map_err(|_| io::Error::other("the spawning thread is gone"))?;
    answered
        .recv()
        .map_err(|_| io::Error::other("the spawning thread is gone"))?
}

/// A process started by [`command`], its whole group killed on drop.
#[derive(Debug)]
pub struct Group {
    pub child: Child,
}

impl Group {
    pub fn spawn(command: Command) -> io::Result<Group> {
        spawn(command).map(|child| Group { child })
    }

    /// The program's pid (`setpriv` execs it: the same process), which is
    /// also its group's id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`, ...) to the program alone.
    pub fn signal(&self, signal: &str) -> bool {
        send(signal, &self.pid().to_string())
    }

    /// Sends `signal` to every process of the group.
    pub fn signal_group(&self, signal: &str) -> bool {
        send(signal, &format!("-{}", self.pid()))
    }

    /// SIGKILL to the whole group, then reaps the program.
    pub fn kill(&mut self) {
        self.signal_group("KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SIGKILL ends stopped (SIGSTOP) processes too.
        self.kill();
    }
}

/// `kill -SIGNAL -- target` (a pid, or `-pgid` for a group).
fn send(signal: &str, target: &str) -> bool {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(target)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Whether `pid` is a process that has not ended (a zombie has ended).
pub fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command's closing parenthesis.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// The pid a `sh` started by the test printed, once it did.
    fn pid_written(file: &Path) -> u32 {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(pid) = std::fs::read_to_string(file)
                .ok()
                .and_then(|text| text.trim().parse().ok())
            {
                return pid;
            }
            assert!(Instant::now() < until, "the grandchild never started");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn scratch(what: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("processes-{what}-{}", std::process::id()))
    }

    /// Behind a wrapper that forks and waits, as `timeout` does (etcd and
    /// HAProxy were behind one): dropping the guard ends the program too,
    /// not only the wrapper. (`timeout` makes a group of its own; `sh`
    /// does not, so only the guard's group can take its child along.)
    #[test]
    fn a_program_behind_a_wrapper_ends_when_its_guard_drops() {
        let file = scratch("wrapped");
        let _ = std::fs::remove_file(&file);
        let mut wrapped = command("sh");
        wrapped
            .arg("-c")
            .arg("sleep 300 & echo $! > \"$0\"; wait")
            .arg(&file);
        let guard = Group::spawn(wrapped).expect("spawn");
        let grandchild = pid_written(&file);
        assert!(is_running(grandchild));
        drop(guard);
        let until = Instant::now() + Duration::from_secs(5);
        while is_running(grandchild) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(&file);
        assert!(
            !is_running(grandchild),
            "pid {grandchild} outlived its guard"
        );
    }

    /// Set by the test below for the runner it starts.
    const RUNNER_PID_FILE: &str = "YADCC_TEST_PROCESSES_PID_FILE";

    /// Not a test by itself: the runner the test below starts and kills. It
    /// starts a program from a thread that ends at once (as `spawn_blocking`
    /// threads do), writes the program's pid and waits to be killed.
    #[test]
    #[ignore = "started by a_killed_test_runner_takes_its_programs_along"]
    fn runner_that_is_killed() {
        let Some(file) = std::env::var_os(RUNNER_PID_FILE) else {
            return;
        };
        let pid = std::thread::spawn(|| {
            let mut sleeper = command("sleep");
            sleeper.arg("300");
            let group = Group::spawn(sleeper).expect("spawn");
            let pid = group.pid();
            // As a killed runner: no drop.
            std::mem::forget(group);
            pid
        })
        .join()
        .expect("the spawning thread");
        // `setpriv` sets the signal before it execs the program.
        while std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|name| name.trim() != "sleep")
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::write(&file, pid.to_string()).expect("the pid file");
        std::thread::sleep(Duration::from_secs(300));
    }

    /// A test runner killed with SIGKILL runs no destructor: the kernel
    /// ends its programs, even one started by a thread that ended long
    /// before the runner did.
    #[test]
    fn a_killed_test_runner_takes_its_programs_along() {
        let file = scratch("runner");
        let _ = std::fs::remove_file(&file);
        let mut runner = Command::new(std::env::current_exe().expect("this test binary"));
        runner
            .args(["--exact", "--ignored", "--nocapture"])
            .arg(format!(
                "{}::runner_that_is_killed",
                module_path!().split_once("::").map_or("", |(_, rest)| rest)
            ))
            .env(RUNNER_PID_FILE, &file)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut runner = runner.spawn().expect("the runner");
        let program = pid_written(&file);
        assert!(is_running(program));
        // The spawning thread has ended: the program lives on meanwhile.
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            is_running(program),
            "killed with the thread, not the runner"
        );
        runner.kill().expect("SIGKILL to the runner");
        let _ = runner.wait();
        let until = Instant::now() + Duration::from_secs(5);
        while is_running(program) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(&file);
        assert!(
            !is_running(program),
            "pid {program} outlived its killed runner"
        );
    }

    /// Stopped (as a frozen etcd is): SIGKILL to the group still ends it.
    #[test]
    fn a_stopped_program_ends_when_its_guard_drops() {
        let mut sleeper = command("sleep");
        sleeper.arg("300");
        let group = Group::spawn(sleeper).expect("spawn");
        let pid = group.pid();
        assert!(group.signal("STOP"));
        drop(group);
        assert!(!is_running(pid), "pid {pid} outlived its guard");
    }
}
