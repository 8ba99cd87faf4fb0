//! The external client tools the tests drive (Python grpcio and its health
//! checker, buf, the OpenAPI linters and client generators), installed,
//! pinned, by scripts/test.sh into target/test-tools.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

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

/// The Python interpreter the tests run their Python clients with.
pub fn python() -> Command {
    Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
}

/// Runs a blocking client off the runtime, so the server keeps serving.
pub async fn run(mut command: Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || command.output().expect("client starts"))
        .await
        .unwrap()
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
