//! Rule "broken servants" against the real binary: a servant whose grants
//! come back at once, as a daemon whose serving port is refused gives them
//! back, is taken out of rotation, and the operator sees it in `/metrics`,
//! the dashboard's overview, `ListServantStates` and the audit; with
//! `--eject_broken_servants=false` it stays in rotation.

use serde_json::{Value, json};
use yadcc_pb as pb;

use crate::{
    admin::{ADMIN_TOKEN, admin_json, audit_actions},
    support::*,
};

const LOCATION: &str = "127.0.0.1:8335";

async fn start(eject: &'static str) -> Binary {
    let admin = format!("--admin_tokens={ADMIN_TOKEN}");
    tokio::task::spawn_blocking(move || {
        Launch {
            flags: &[&admin, "--debugging_no_inspect_auth", eject],
            ..Launch::default()
        }
        .start()
    })
    .await
    .expect("start the binary")
}

/// Registers the servant, and a healthy one with another compiler (the
/// last live servant is never ejected), then takes `n` grants on the first
/// and gives each back at once, before any heartbeat could list it.
async fn fail_grants(binary: &Binary, n: usize) {
    let beat = heartbeat(&servant_location("127.0.0.1", 8335), 4);
    let response = call_http_pb(binary.addr, Method::Heartbeat, &beat).await;
    assert_eq!(response.status, 200);
    let mut other = heartbeat(&servant_location("127.0.0.1", 8336), 4);
    other.env_descs = vec![pb::EnvironmentDesc {
        compiler_digest: "another-compiler".into(),
    }];
    let response = call_http_pb(binary.addr, Method::Heartbeat, &other).await;
    assert_eq!(response.status, 200);
    for _ in 0..n {
        let granted: pb::WaitForStartingTaskResponse = call_http_pb(
            binary.addr,
            Method::WaitForStartingTask,
            &wait_request(1000, 1, 0),
        )
        .await
        .decode();
        let free = pb::FreeTaskRequest {
            token: USER_TOKEN.into(),
            task_grant_ids: vec![granted.grants[0].task_grant_id],
        };
        let response = call_http_pb(binary.addr, Method::FreeTask, &free).await;
        assert_eq!(response.status, 200);
    }
}

async fn servant_row(binary: &Binary) -> Value {
    let overview: Value = http_client()
        .get(format!("http://{}/api/v1/overview", binary.addr))
        .send()
        .await
        .expect("overview")
        .json()
        .await
        .expect("overview JSON");
    overview["servants"][0].clone()
}

async fn act(binary: &Binary, method: &str) -> Value {
    let (status, answer) = admin_json(binary.addr, method, Some(ADMIN_TOKEN), json!({})).await;
    assert_eq!(status, 200, "{method}: {answer}");
    answer
}

#[tokio::test]
async fn a_servant_that_gives_every_grant_back_at_once_is_ejected_and_shown() {
    let binary = start("--eject_broken_servants").await;
    fail_grants(&binary, 5).await;
    let text = metrics_text(binary.addr).await;
    for line in [
        "yadcc_scheduler_servants_ejected 1",
        "yadcc_scheduler_servant_ejections_total 1",
        "yadcc_scheduler_broken_grants_total 5",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    let row = servant_row(&binary).await;
    assert_eq!(row["location"], LOCATION);
    assert_eq!(row["ejection"]["state"], "ejected", "{row}");
    assert!(
        row["ejection"]["why"]
            .as_str()
            .unwrap()
            .contains("before any heartbeat listed them"),
        "{row}"
    );
    let listed = act(&binary, "ListServantStates").await;
    assert_eq!(listed["ejected"][0]["location"], LOCATION, "{listed}");
    assert_eq!(listed["ejected"][0]["state"], "ejected", "{listed}");
    assert_eq!(listed["ejected"][0]["ejections"], 1, "{listed}");
    let audit = act(&binary, "ListAuditEvents").await;
    assert_eq!(audit_actions(&audit), ["EjectServant"], "{audit}");
    assert_eq!(audit["events"][0]["who"], "scheduler", "{audit}");
    // Out of rotation: a call that may not wait gets no grant.
    let response = call_http_pb(
        binary.addr,
        Method::WaitForStartingTask,
        &wait_request(0, 1, 0),
    )
    .await;
    assert_ne!(response.status, 200, "no grant while ejected");
}

#[tokio::test]
async fn with_the_flag_off_the_servant_stays_in_rotation() {
    let binary = start("--eject_broken_servants=false").await;
    fail_grants(&binary, 8).await;
    let text = metrics_text(binary.addr).await;
    for line in [
        "yadcc_scheduler_servants_ejected 0",
        "yadcc_scheduler_servant_ejections_total 0",
        "yadcc_scheduler_broken_grants_total 8",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in:\n{text}");
    }
    assert_eq!(servant_row(&binary).await["ejection"], Value::Null);
    let listed = act(&binary, "ListServantStates").await;
    assert!(
        listed["ejected"].as_array().is_none_or(Vec::is_empty),
        "{listed}"
    );
}
