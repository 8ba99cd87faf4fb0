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
/// rename itself lasts).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let failed = |what: &str, error: std::io::Error| format!("{what} {}: {error}", path.display());
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut name = path
        .file_name()
        .ok_or_else(|| format!("{} names no file", path.display()))?
        .to_owned();
    name.push(format!(".tmp-{}", std::process::id()));
    let temporary = directory.join(name);
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()
    })();
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
}
