//! `--log_format=json` on the real binary: every line it writes to stderr is
//! one JSON object with a timestamp, level, target and fields, the access
//! log's fields are keys of their own, and no token appears anywhere.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use prost::Message;
use yadcc_pb as pb;

use crate::support::*;

/// A token only this test uses, so finding it in the log means it leaked.
const LEAKED_IF_SEEN: &str = "wrong-token-that-must-not-be-logged";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line_without_tokens() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_yadcc-scheduler"))
        .args([
            "--listen=127.0.0.1:0",
            &format!("--acceptable_user_tokens={USER_TOKEN}"),
            &format!("--acceptable_servant_tokens={SERVANT_TOKEN}"),
            "--log_format=json",
            // Every call gets an access line, not only the failed ones.
            "--access_log=all",
            // A glog flag: its "no effect here" warning is logged too.
            "--logtostderr",
        ])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let addr = loop {
        let line = lines
            .recv_timeout(STEP)
            .expect("the binary logs its address");
        seen.push(line.clone());
        if let Some(at) = line.find("listening on http://") {
            let rest = &line[at + "listening on http://".len()..];
            break rest.split_whitespace().next().unwrap_or("").to_owned();
        }
    };
    let addr = addr.parse().expect("socket address");

    // Calls that carry tokens: a servant's heartbeat, a refused GetConfig,
    // and one over JSON.
    let heartbeat = heartbeat(&servant_location("127.0.0.1", 8335), 4);
    let mut connection = Connection::open(addr).await;
    connection
        .send(&daemon_request(
            Method::Heartbeat,
            1,
            &heartbeat.encode_to_vec(),
            None,
        ))
        .await;
    assert_eq!(connection.read_response().await.status, 200);
    let refused = pb::GetConfigRequest {
        token: LEAKED_IF_SEEN.into(),
    };
    connection
        .send(&daemon_request(
            Method::GetConfig,
            2,
            &refused.encode_to_vec(),
            None,
        ))
        .await;
    assert_eq!(connection.read_response().await.status, 403);
    let json = http_client()
        .post(format!("http://{addr}{}", Method::GetConfig.rpc_path()))
        .header("content-type", "application/json")
        .body(format!(r#"{{"token":"{LEAKED_IF_SEEN}"}}"#))
        .send()
        .await
        .expect("json call");
    assert_eq!(json.status().as_u16(), 403);

    // The access log is written after the answer: wait for all three lines.
    let mut calls = 0;
    while calls < 3 {
        let line = lines
            .recv_timeout(STEP)
            .expect("an access log line per call");
        calls += usize::from(line.contains("yadcc_scheduler::access"));
        seen.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    reader.join().expect("reader");
    seen.extend(lines.try_iter());

    let mut access = Vec::new();
    for line in &seen {
        let object: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|error| panic!("not one JSON object: {line:?}: {error}"));
        let object = object.as_object().expect("an object");
        let timestamp = object["timestamp"].as_str().expect("timestamp");
        assert!(
            timestamp.len() >= 20 && timestamp.as_bytes()[10] == b'T' && timestamp.ends_with('Z'),
            "RFC 3339 in UTC: {timestamp}"
        );
        assert!(
            ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"]
                .contains(&object["level"].as_str().unwrap()),
            "{line}"
        );
        let target = object["target"].as_str().expect("target");
        assert!(target.starts_with("yadcc_scheduler"), "{line}");
        let fields = object["fields"].as_object().expect("fields");
        if target == "yadcc_scheduler::access" {
            access.push(fields.clone());
        }
        for secret in [USER_TOKEN, SERVANT_TOKEN, LEAKED_IF_SEEN] {
            assert!(!line.contains(secret), "a token in the log: {line}");
        }
    }
    assert!(
        seen.iter()
            .any(|line| line.contains("logtostderr") && line.contains("\"WARN\"")),
        "the glog flag's warning, as JSON: {seen:#?}"
    );
    assert_eq!(access.len(), 3, "{seen:#?}");
    let statuses: Vec<u64> = access
        .iter()
        .map(|fields| fields["status"].as_u64().expect("status is a number"))
        .collect();
    assert_eq!(statuses, [200, 403, 403]);
    assert_eq!(access[0]["rpc"], "Heartbeat");
    assert_eq!(access[0]["protocol"], "http+pb");
    assert_eq!(access[2]["protocol"], "http+pb");
    assert_eq!(access[2]["encoding"], "json");
    assert!(access[0]["latency_us"].is_u64());
}

#[test]
fn an_unknown_log_format_is_refused() {
    let output = Command::new(env!("CARGO_BIN_EXE_yadcc-scheduler"))
        .args(["--listen=127.0.0.1:0", "--log_format=xml"])
        .output()
        .expect("run the binary");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--log_format") && stderr.contains("text") && stderr.contains("json"),
        "{stderr}"
    );
}

#[test]
fn the_version_names_the_commit() {
    let output = Command::new(env!("CARGO_BIN_EXE_yadcc-scheduler"))
        .arg("--version")
        .output()
        .expect("run the binary");
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout.trim(),
        format!(
            "yadcc-scheduler {} (commit {})",
            yadcc_scheduler::build_info::VERSION,
            yadcc_scheduler::build_info::COMMIT
        )
    );
    let git = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    if let Ok(git) = git
        && git.status.success()
        && std::env::var_os("YADCC_BUILD_COMMIT").is_none()
    {
        let head = String::from_utf8_lossy(&git.stdout).trim().to_owned();
        assert_eq!(
            yadcc_scheduler::build_info::COMMIT,
            head,
            "built from HEAD (build.rs reruns when HEAD moves)"
        );
    }
}
