//! One watcher for every file the scheduler reads again while it runs: the
//! TLS certificate, key and client CA (`net::tls`) and `--tenants_file`
//! (`config::tenants_file`). On SIGHUP every source reloads; every
//! [`POLL`] each source whose files changed does. Each source logs what it
//! did (loaded, or kept the running configuration and why).
//!
//! The SIGHUP handler is installed whatever is configured: without one the
//! signal's default action ends the process, and `systemctl reload` of a
//! scheduler started without `--tenants_file` stopped the farm. A SIGHUP
//! with nothing to reload is logged and otherwise ignored.

use std::{
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

const LOG: &str = "yadcc_scheduler::reload";

/// How often the sources look at their files for a change (their
/// modification time and length).
pub const POLL: Duration = Duration::from_secs(1);

/// What a change of a file is detected by.
pub type Stamp = Option<(SystemTime, u64)>;

/// The file's modification time and length, if it can be read.
pub fn stamp(path: &Path) -> Stamp {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// Why a source is asked to look at its files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// SIGHUP: read everything again, changed or not.
    Hangup,
    /// The periodic look: read again only what changed.
    Poll,
}

impl Why {
    /// As the log says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Hangup => "SIGHUP",
            Why::Poll => "a change of the file",
        }
    }
}

/// Something read again while the scheduler runs.
pub trait Reloadable: Send + Sync {
    /// What the log calls it.
    fn name(&self) -> String;
    /// Reads its files again as `why` says, applies what loads and keeps
    /// the running configuration for what does not, and logs which.
    fn reload(&self, why: Why);
}

/// The sources one watcher serves. Cheap to clone; the sources live as
/// long as the last clone (the server's state).
#[derive(Clone, Default)]
pub struct Reloads {
    sources: Arc<Mutex<Vec<Arc<dyn Reloadable>>>>,
}

impl std::fmt::Debug for Reloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloads").finish_non_exhaustive()
    }
}

impl Reloads {
    /// Watches `source` from now on.
    pub fn add(&self, source: Arc<dyn Reloadable>) {
        self.lock().push(source);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<dyn Reloadable>>> {
        self.sources.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The sources, outside the lock (a reload reads files).
    fn sources(&self) -> Vec<Arc<dyn Reloadable>> {
        self.lock().clone()
    }

    /// Installs the SIGHUP handler now (before this returns, a SIGHUP no
    /// longer ends the process) and starts the one watcher, which runs
    /// while a clone of these reloads lives. Must run inside a tokio runtime.
    pub fn watch(&self) {
        #[cfg(unix)]
        let mut hangups =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
                Ok(signal) => Some(signal),
                Err(error) => {
                    tracing::warn!(target: LOG, "cannot handle SIGHUP: {error}");
                    None
                }
            };
        let watched = Arc::downgrade(&self.sources);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                #[cfg(unix)]
                let hangup = async {
                    match hangups.as_mut() {
                        Some(signal) => signal.recv().await,
                        None => std::future::pending().await,
                    }
                };
                #[cfg(not(unix))]
                let hangup = std::future::pending::<Option<()>>();
                let why = tokio::select! {
                    _ = hangup => Why::Hangup,
                    _ = tick.tick() => Why::Poll,
                };
                let Some(sources) = watched.upgrade() else {
                    return;
                };
                let live = Reloads { sources }.sources();
                if why == Why::Hangup {
                    if live.is_empty() {
                        tracing::info!(
                            target: LOG,
                            "SIGHUP: nothing to reload (no --tenants_file, no TLS files); still serving"
                        );
                    } else {
                        let names: Vec<String> = live.iter().map(|s| s.name()).collect();
                        tracing::info!(target: LOG, "SIGHUP: reloading {}", names.join(" and "));
                    }
                }
                for source in live {
                    source.reload(why);
                }
            }
        });
    }
}
