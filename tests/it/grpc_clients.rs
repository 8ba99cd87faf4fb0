//! Stock gRPC clients against the server: a Python grpcio client calling
//! every RPC, and `buf curl` listing and calling by server reflection alone
//! over gRPC and gRPC-Web. Both are installed by scripts/test.sh into
//! target/test-tools.

use std::{path::Path, process::Command};

use crate::{
    grpc::{rpc_path, server},
    support::*,
    tools::{installed, python, run, tool},
};

#[tokio::test]
async fn a_python_grpcio_client_calls_every_rpc_and_gets_the_table_codes() {
    let Some(python_path) = installed("python/grpc_tools") else {
        return;
    };
    let _heavy = heavy().await;
    let server = server().await;
    python_client_passes(&python_path, &server.addr.to_string(), None).await;
    server.stop().await;
}

/// Runs tests/grpc/client.py (grpcio, from `python_path`) against `target`,
/// over TLS trusting `ca_file` if one is given, and asserts that every
/// check in it passed.
pub async fn python_client_passes(python_path: &Path, target: &str, ca_file: Option<&Path>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut command = python();
    command
        .arg(root.join("tests/grpc/client.py"))
        .arg(target)
        .arg(root.join("proto"))
        .args(ca_file)
        .env("PYTHONPATH", python_path.parent().unwrap());
    let output = run(command).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("all gRPC checks passed"), "{stdout}");
}

fn buf_curl(buf: &Path, args: &[&str]) -> Command {
    let mut command = tool(buf);
    command
        .arg("curl")
        .arg("--http2-prior-knowledge")
        .args(args);
    command
}

#[tokio::test]
async fn buf_curl_lists_and_calls_over_grpc_and_grpc_web_by_reflection_alone() {
    let Some(buf) = installed("npm/node_modules/.bin/buf") else {
        return;
    };
    let server = server().await;
    let base = server.url("");
    for protocol in ["grpc", "grpcweb"] {
        for reflect in ["grpc-v1", "grpc-v1alpha"] {
            let output = run(buf_curl(
                &buf,
                &[
                    "--protocol",
                    protocol,
                    "--reflect-protocol",
                    reflect,
                    "--list-methods",
                    &base,
                ],
            ))
            .await;
            let listed = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "{protocol} {reflect}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            for method in [
                "Heartbeat",
                "GetConfig",
                "WaitForStartingTask",
                "KeepTaskAlive",
                "FreeTask",
                "GetRunningTasks",
            ] {
                assert!(
                    listed.contains(&format!("{SERVICE}/{method}")),
                    "{protocol}: {listed}"
                );
            }
        }

        let data = format!(r#"{{"token":"{USER_TOKEN}"}}"#);
        let output = run(buf_curl(
            &buf,
            &[
                "--protocol",
                protocol,
                "-d",
                &data,
                &server.url(&rpc_path("GetConfig")),
            ],
        ))
        .await;
        assert!(
            output.status.success(),
            "{protocol}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert!(answer["servingDaemonToken"].is_string(), "{answer}");

        let output = run(buf_curl(
            &buf,
            &[
                "--protocol",
                protocol,
                "-d",
                r#"{"token":"wrong"}"#,
                &server.url(&rpc_path("GetConfig")),
            ],
        ))
        .await;
        assert!(!output.status.success());
        let error: serde_json::Value = serde_json::from_slice(&output.stderr).unwrap();
        assert_eq!(error["code"], "permission_denied", "{protocol}: {error}");
    }
    server.stop().await;
}
