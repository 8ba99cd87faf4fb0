//! The external client tools the tests drive (Python grpcio and its health
//! checker, buf, the OpenAPI linters and client generators), installed,
//! pinned, by scripts/test.sh into target/test-tools; each run under
//! `timeout` ([`TOOL_LIMIT`]).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::support::{TOOL_LIMIT, bounded, run_bounded};

/// Where scripts/test.sh installs the Python and npm test tools.
pub fn test_tools() -> PathBuf {
    std::env::var_os("YADCC_TEST_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools"))
}

/// The tool at `relative`, or None (and a skip) when it is not installed;
/// in CI a missing tool is a failure.
pub fn installed(relative: &str) -> Option<PathBuf> {
    let path = test_tools().join(relative);
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must install {relative} (scripts/test.sh does)"
    );
    eprintln!(
        "SKIPPED: {} is missing; scripts/test.sh installs it",
        path.display()
    );
    None
}

/// The Python the tests run: `$PYTHON`, else the environment
/// scripts/python_deps.sh makes, else `python3`.
pub fn python_program() -> std::ffi::OsString {
    if let Some(python) = std::env::var_os("PYTHON") {
        return python;
    }
    let venv = test_tools().join("venv/bin/python");
    if venv.exists() {
        venv.into_os_string()
    } else {
        "python3".into()
    }
}

/// The Python interpreter the tests run their Python clients with, under
/// `timeout`.
pub fn python() -> Command {
    tool(python_program())
}

/// An external tool, under `timeout` ([`TOOL_LIMIT`]).
pub fn tool(program: impl AsRef<std::ffi::OsStr>) -> Command {
    bounded(TOOL_LIMIT, program)
}

/// Runs a client to its end off the runtime, so the server keeps serving;
/// a client stopped for taking too long fails the test.
pub async fn run(command: Command) -> std::process::Output {
    run_bounded(command).await
}

/// A client's output, for a failure message.
pub fn said(output: &std::process::Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A fresh directory for one test's files, removed when dropped.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(purpose: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "yadcc-it-{purpose}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("scratch directory");
        Self(path)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
