//! etcd's election and lease services (vendored in `proto/etcd/`) become
//! tonic client stubs, compiled by protox without a system `protoc`, for the
//! leader election of `src/ha/` (the scheduler's own protos are compiled by
//! `crates/pb/build.rs`). It also
//! embeds the commit the binary was built from (`YADCC_BUILD_COMMIT`, see
//! [`embed_commit`]).

use std::{env, fs, path::PathBuf, process::Command};

const PROTO_ROOT: &str = "proto";
/// etcd's API as the leader election calls it (client side only). Kept out
/// of the exported descriptor set too: it is etcd's API, not ours.
const ETCD_PROTO_FILES: &[&str] =
    &["etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto"];

/// What the binary reports as its commit when it was built outside a git
/// checkout (a source tarball) without `YADCC_BUILD_COMMIT` set.
const UNKNOWN_COMMIT: &str = "unknown";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO_ROOT}/etcd");
    embed_commit();
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let etcd = protox::Compiler::new([PROTO_ROOT])?
        .include_imports(true)
        .open_files(ETCD_PROTO_FILES)?
        .file_descriptor_set();
    tonic_prost_build::configure()
        .out_dir(&out_dir)
        .build_server(false)
        .build_transport(false)
        .compile_fds(etcd)?;
    Ok(())
}

/// `git` in the package's directory, its trimmed output when it succeeds.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    Some(text.trim().to_owned())
}

/// Sets `YADCC_BUILD_COMMIT` for the crate: `YADCC_BUILD_COMMIT` from the
/// environment if set (a packager's build outside git), else the short hash
/// of `HEAD`, else [`UNKNOWN_COMMIT`].
///
/// Every target of the package recompiles when this script reruns, so it
/// reruns only when the commit can have changed: when `HEAD` moves (a
/// checkout) or the branch it names moves (a commit, a reset), and when the
/// packed refs are rewritten. Not on index or work-tree changes, which
/// `git status` alone touches; the hash therefore says nothing about
/// uncommitted edits.
fn embed_commit() {
    println!("cargo:rerun-if-env-changed=YADCC_BUILD_COMMIT");
    let from_env = env::var("YADCC_BUILD_COMMIT")
        .ok()
        .filter(|value| !value.trim().is_empty());
    let commit = from_env.or_else(|| {
        let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
        let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(branch);
        }
        for name in watched {
            // A missing file would make cargo rerun this script on every
            // build: watch only what exists (a branch may live in packed-refs).
            if let Some(path) = git(&["rev-parse", "--git-path", &name])
                && fs::metadata(&path).is_ok()
            {
                println!("cargo:rerun-if-changed={path}");
            }
        }
        Some(commit)
    });
    let commit = commit.unwrap_or_else(|| UNKNOWN_COMMIT.to_owned());
    println!("cargo:rustc-env=YADCC_BUILD_COMMIT={commit}");
}
