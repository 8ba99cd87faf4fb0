//! `--demo` as a new user runs it: the real binary, its simulated cluster,
//! and every feature the docs show open with the demo's public credentials.

use serde_json::{Value, json};

use crate::docs::started_demo;
use crate::support::{heavy, http_client, metrics_text};

const ADMIN: &str = "/rpc/yadcc.scheduler.AdminService.";
const SCHEDULER: &str = "/rpc/yadcc.scheduler.SchedulerService.";

async fn call(base: &str, path: &str, bearer: Option<&str>, body: Value) -> (u16, Value) {
    let mut request = http_client()
        .post(format!("{base}{path}"))
        .header("Content-Type", "application/json")
        .body(body.to_string());
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let answer = request.send().await.expect("call the demo");
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_opens_the_admin_api_and_two_tenants_with_public_tokens() {
    let _heavy = heavy().await;
    let (demo, base) = started_demo().await;

    // The operators' service: the demo's token acts, no token is 401.
    let location = json!({"location": "127.1.0.7:8335", "reason": "demo test"});
    let (status, _) = call(
        &base,
        &format!("{ADMIN}CordonServant"),
        None,
        location.clone(),
    )
    .await;
    assert_eq!(status, 401, "no token must not act on the demo's farm");
    let (status, answer) = call(
        &base,
        &format!("{ADMIN}CordonServant"),
        Some("demo-admin-token"),
        location.clone(),
    )
    .await;
    assert_eq!(status, 200, "cordon with the demo's admin token: {answer}");
    let (status, states) = call(
        &base,
        &format!("{ADMIN}ListServantStates"),
        Some("demo-admin-token"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{states}");
    assert!(
        states.to_string().contains("127.1.0.7:8335"),
        "the cordon is listed: {states}"
    );

    // The tenants: the simulated daemons are `developers`, a reader's own
    // calls with the ci token are `ci`.
    let (status, config) = call(
        &base,
        &format!("{SCHEDULER}GetConfig"),
        None,
        json!({"token": "demo-ci-token"}),
    )
    .await;
    assert_eq!(status, 200, "the ci tenant's token is accepted: {config}");
    let tenants: Value = http_client()
        .get(format!("{base}/api/v1/tenants"))
        .send()
        .await
        .expect("GET /api/v1/tenants")
        .json()
        .await
        .expect("JSON");
    let names: Vec<&str> = tenants["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .filter_map(|tenant| tenant["name"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "{tenants}");
    assert!(
        names.contains(&"developers") && names.contains(&"ci"),
        "{tenants}"
    );

    // The log tells a new user which tokens open what.
    let log = demo.log().join("\n");
    assert!(log.contains("\"demo-admin-token\""), "{log}");
    assert!(log.contains("\"demo-ci-token\""), "{log}");
    assert!(!log.contains("the admin API is closed"), "{log}");
}

/// Series only a hot standby serves (`--ha_etcd_endpoints`), which the demo
/// cannot run with.
const HA_ONLY: [&str; 5] = [
    "yadcc_scheduler_leader",
    "yadcc_scheduler_taking_over",
    "yadcc_scheduler_elections_won_total",
    "yadcc_scheduler_lease_renew_duration_seconds",
    "yadcc_scheduler_seconds_since_leadership_change",
];

/// The series docs/endpoints.md's metrics table names: its first column,
/// where `_name` shortens `yadcc_scheduler_name`.
fn documented_series() -> std::collections::BTreeSet<String> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/endpoints.md"))
        .expect("docs/endpoints.md");
    let table = page.split("## Metrics").nth(1).expect("a Metrics section");
    table
        .lines()
        .filter(|line| line.starts_with("| `"))
        .flat_map(|line| {
            let first = line.split('|').nth(1).unwrap_or_default().to_owned();
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|name| match name.strip_prefix('_') {
                    Some(rest) => format!("yadcc_scheduler_{rest}"),
                    None => name.to_owned(),
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_series_the_demo_serves_is_documented_and_every_documented_one_served() {
    let documented = documented_series();
    assert!(
        documented.contains("yadcc_scheduler_servants_accepting"),
        "{documented:?}"
    );
    let _heavy = heavy().await;
    let (demo, base) = started_demo().await;
    // A wait, so that the waits' histogram has a child to show.
    let (status, answer) = call(
        &base,
        &format!("{SCHEDULER}WaitForStartingTask"),
        None,
        json!({"token": "demo-ci-token", "millisecondsToWait": 100,
               "envDesc": {"compilerDigest": yadcc_sim::environment_digest(0)},
               "immediateReqs": 1, "nextKeepAliveInMs": 15000}),
    )
    .await;
    assert!(status == 200 || status == 503, "{status} {answer}");
    let text = metrics_text(demo.addr).await;
    let served: std::collections::BTreeSet<String> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let undocumented: Vec<&String> = served.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "/metrics serves series docs/endpoints.md does not list: {undocumented:?}"
    );
    let unserved: Vec<&String> = documented
        .difference(&served)
        .filter(|name| !HA_ONLY.contains(&name.as_str()))
        .collect();
    assert!(
        unserved.is_empty(),
        "docs/endpoints.md lists series the demo does not serve: {unserved:?}"
    );
}
