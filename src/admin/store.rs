//! What lasts: the cordons and the audit list as one document
//! ([`SavedState`], JSON), saved before an action takes effect, so that a
//! restart or a failover never undoes one. Without a hot standby in
//! `--state_file` (written atomically: a temporary file beside it, fsync,
//! rename, fsync of the directory; read at start); with one in etcd
//! ([`crate::ha::Leadership::save_state`], read by each new leader).

use std::{
    io::Write,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::audit::AuditEvent;
use crate::{engine::Cordon, ha::Leadership};

/// The format of [`SavedState`]; a file of another version stops the start.
pub const STATE_VERSION: u32 = 1;

/// Largest saved state, well under etcd's default request limit (1.5 MiB):
/// the engine's bounds (cordons, reason length) and the audit list's keep
/// it under this, which is checked before saving.
pub const MAX_STATE_BYTES: usize = 1 << 20;

/// The cordons and the audit list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedState {
    pub version: u32,
    pub cordons: Vec<SavedCordon>,
    /// Newest first.
    pub audit: Vec<AuditEvent>,
}

/// One cordoned location.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedCordon {
    pub location: SocketAddr,
    pub drain: bool,
    #[serde(default)]
    pub reason: String,
    pub by: String,
    pub since_unix_ms: u64,
}

impl SavedCordon {
    pub fn new(location: SocketAddr, cordon: &Cordon) -> Self {
        SavedCordon {
            location,
            drain: cordon.drain,
            reason: cordon.reason.clone(),
            by: cordon.by.clone(),
            since_unix_ms: cordon.since_unix_ms,
        }
    }

    pub fn entry(&self) -> (SocketAddr, Cordon) {
        (
            self.location,
            Cordon {
                drain: self.drain,
                reason: self.reason.clone(),
                by: self.by.clone(),
                since_unix_ms: self.since_unix_ms,
            },
        )
    }
}

impl SavedState {
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let bytes = serde_json::to_vec(self).map_err(|error| error.to_string())?;
        if bytes.len() > MAX_STATE_BYTES {
            return Err(format!(
                "the state would take {} bytes, more than the {MAX_STATE_BYTES}-byte limit",
                bytes.len()
            ));
        }
        Ok(bytes)
    }

    pub fn decode(bytes: &[u8]) -> Result<SavedState, String> {
        let state: SavedState =
            serde_json::from_slice(bytes).map_err(|error| format!("not a saved state: {error}"))?;
        if state.version != STATE_VERSION {
            return Err(format!(
                "saved by another version of the format ({}, this one reads {STATE_VERSION})",
                state.version
            ));
        }
        // Refused whole rather than cut: dropping cordons would put servants
        // an operator took out back into rotation without a word.
        let most = crate::engine::Limits::default().max_cordons;
        if state.cordons.len() > most {
            return Err(format!(
                "{} cordons, more than the {most} the scheduler holds: uncordon some in the \
                 file (or remove it) and start again",
                state.cordons.len()
            ));
        }
        Ok(state)
    }
}

/// Where the state lasts.
#[derive(Debug, Clone)]
pub enum Store {
    /// Nowhere: a restart forgets every cordon (no `--state_file`, no etcd).
    Memory,
    /// `--state_file`.
    File(PathBuf),
    /// etcd, under the election's name, written only while leading.
    Etcd(Leadership),
}

impl Store {
    /// Saves `state` durably before the action it holds takes effect.
    pub async fn save(&self, state: &SavedState) -> Result<(), String> {
        let bytes = state.encode()?;
        match self {
            Store::Memory => Ok(()),
            Store::File(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
                    .await
                    .map_err(|error| format!("the writer stopped: {error}"))?
            }
            Store::Etcd(leadership) => leadership.save_state(bytes).await,
        }
    }

    /// What describes it in the start-up log.
    pub fn describe(&self) -> String {
        match self {
            Store::Memory => {
                "in memory only (a restart forgets them: pass --state_file)".to_owned()
            }
            Store::File(path) => format!("in {}", path.display()),
            Store::Etcd(_) => "in etcd, beside the election".to_owned(),
        }
    }
}

/// `--state_file` as the previous run left it: None if there is none yet.
pub fn read_file(path: &Path) -> Result<Option<SavedState>, String> {
    match std::fs::read(path) {
        Ok(bytes) => SavedState::decode(&bytes)
            .map(Some)
            .map_err(|error| format!("{}: {error}", path.display())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(format!("cannot read {}: {error}", path.display())),
    }
}

/// Replaces `path` with `bytes` so that a crash at any moment leaves the old
/// file or the new one, whole: a temporary file in the same directory,
/// written and fsynced, renamed over it, then the directory fsynced (the
/// rename itself lasts). The temporary file is created exclusively (a name
/// that exists, a planted symlink included, is never opened: another name
/// is tried) with mode 0600, as the state is (the audit names operators).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let failed = |what: &str, error: std::io::Error| format!("{what} {}: {error}", path.display());
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| format!("{} names no file", path.display()))?
        .to_owned();
    let (temporary, written) = (0..TEMPORARY_ATTEMPTS)
        .map(|attempt| {
            let mut name = name.clone();
            name.push(format!(".tmp-{}-{attempt}", std::process::id()));
            let temporary = directory.join(name);
            let written = create_exclusive(&temporary).and_then(|mut file| {
                file.write_all(bytes)?;
                file.sync_all()
            });
            (temporary, written)
        })
        .find(|(_, written)| {
            !matches!(written, Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists)
        })
        .ok_or_else(|| {
            format!(
                "cannot write the state beside {}: {TEMPORARY_ATTEMPTS} temporary names are taken",
                path.display()
            )
        })?;
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(failed("cannot write the state beside", error));
    }
    if let Err(error) = std::fs::rename(&temporary, path) {
        let _ = std::fs::remove_file(&temporary);
        return Err(failed("cannot replace", error));
    }
    std::fs::File::open(&directory)
        .and_then(|dir| dir.sync_all())
        .map_err(|error| failed("cannot sync the directory of", error))
}

/// Temporary names tried before the write gives up (they only exist after
/// a crash mid-write, or when planted).
const TEMPORARY_ATTEMPTS: u32 = 16;

/// A new file at `path`, never an existing one (`O_CREAT | O_EXCL`, which
/// does not follow a symlink), readable by the owner only.
fn create_exclusive(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("yadcc-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn state() -> SavedState {
        SavedState {
            version: STATE_VERSION,
            cordons: vec![SavedCordon {
                location: "10.0.0.1:8335".parse().unwrap(),
                drain: true,
                reason: "disk".into(),
                by: "token:0123456789ab".into(),
                since_unix_ms: 1,
            }],
            audit: Vec::new(),
        }
    }

    #[test]
    fn a_written_state_reads_back_and_leaves_no_temporary_file() {
        let dir = scratch("roundtrip");
        let path = dir.join("state.json");
        assert_eq!(read_file(&path), Ok(None), "no file yet");
        write_atomically(&path, &state().encode().unwrap()).unwrap();
        let mut second = state();
        second.cordons.clear();
        write_atomically(&path, &second.encode().unwrap()).unwrap();
        assert_eq!(read_file(&path), Ok(Some(second)));
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_or_foreign_file_is_an_error_not_an_empty_state() {
        let dir = scratch("damaged");
        let path = dir.join("state.json");
        std::fs::write(&path, b"{\"version\":1,\"cordons\":[").unwrap();
        assert!(read_file(&path).unwrap_err().contains("not a saved state"));
        std::fs::write(&path, br#"{"version":7,"cordons":[],"audit":[]}"#).unwrap();
        assert!(read_file(&path).unwrap_err().contains("another version"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_state_over_its_bound_is_refused() {
        let mut big = state();
        big.cordons[0].reason = "x".repeat(MAX_STATE_BYTES);
        assert!(big.encode().unwrap_err().contains("limit"));
    }

    #[cfg(unix)]
    #[test]
    fn a_planted_symlink_is_never_followed_and_the_state_is_the_owner_s_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("symlink");
        let path = dir.join("state.json");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        // Every name the writer tries first, planted.
        for attempt in 0..3 {
            let planted = dir.join(format!("state.json.tmp-{}-{attempt}", std::process::id()));
            std::os::unix::fs::symlink(&victim, planted).unwrap();
        }
        write_atomically(&path, &state().encode().unwrap()).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(read_file(&path), Ok(Some(state())));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the state file is {mode:o}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_with_more_cordons_than_the_limit_is_refused_whole() {
        let most = crate::engine::Limits::default().max_cordons;
        let cordons = |n: usize| SavedState {
            cordons: (0..n)
                .map(|i| SavedCordon {
                    location: format!("10.0.{}.{}:8335", i / 250, i % 250)
                        .parse()
                        .unwrap(),
                    ..state().cordons[0].clone()
                })
                .collect(),
            ..state()
        };
        let at_limit = cordons(most).encode().unwrap();
        assert_eq!(SavedState::decode(&at_limit).unwrap().cordons.len(), most);
        let over = cordons(1500).encode().unwrap();
        let error = SavedState::decode(&over).unwrap_err();
        assert!(
            error.contains("1500 cordons") && error.contains("1000"),
            "{error}"
        );
    }
}
