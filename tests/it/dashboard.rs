//! The inspection API over a real socket: the dashboard's JSON, the
//! original's dump, the original's posture (closed unless a flag opens it)
//! and the security headers.

use base64::Engine as _;
use serde_json::Value;
use yadcc_pb as pb;
use yadcc_scheduler::{
    dashboard::{ASSETS, InspectAccess, SECURITY_HEADERS},
    rpc::state::TransportSettings,
};

use crate::support::*;

/// The pages and the inspection API a credential or the default posture
/// closes.
const INSPECTION_PAGES: [&str; 6] = [
    "/",
    "/app.js",
    "/api/v1/overview",
    "/api/v1/history",
    "/api/v1/tenants",
    "/inspect/vars/yadcc/task_dispatcher",
];

/// An anonymous GET.
async fn get(server: &Server, path: &str) -> reqwest::Response {
    send(http_client().get(server.url(path)), path).await
}

/// A GET with Basic credentials `user:password`, the scheme spelled `scheme`.
async fn get_as(server: &Server, path: &str, scheme: &str, credentials: &str) -> reqwest::Response {
    let encoded = base64::engine::general_purpose::STANDARD.encode(credentials);
    let request = http_client()
        .get(server.url(path))
        .header("authorization", format!("{scheme} {encoded}"));
    send(request, path).await
}

async fn send(request: reqwest::RequestBuilder, path: &str) -> reqwest::Response {
    request
        .send()
        .await
        .unwrap_or_else(|error| panic!("GET {path}: {error}"))
}

async fn get_json(server: &Server, path: &str) -> Value {
    let response = get(server, path).await;
    assert_eq!(response.status().as_u16(), 200, "{path}");
    response.json().await.expect("JSON")
}

/// The status of a `GetConfig` RPC with the user's token.
async fn get_config_status(server: &Server) -> u16 {
    let request = pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    };
    call_http_pb(server.addr, Method::GetConfig, &request)
        .await
        .status
}

/// Without a tenants file the token flags are one tenant, `default`.
#[tokio::test]
async fn the_tenants_view_shows_the_default_tenant_s_share_and_grants() {
    let server = Server::start_inspectable().await;
    register_servant(&server, 8335, 4).await;
    assert_eq!(acquire(&server, 1, 0).await.grants.len(), 1);
    let view = get_json(&server, "/api/v1/tenants").await;
    assert_eq!(view["slots"], 4, "{view}");
    let tenants = view["tenants"].as_array().expect("tenants");
    assert_eq!(tenants.len(), 1, "{view}");
    let t = &tenants[0];
    assert_eq!(t["name"], "default");
    assert_eq!(
        (t["weight"].as_f64(), t["weightShare"].as_f64()),
        (Some(1.0), Some(1.0))
    );
    assert_eq!(
        (t["held"].as_u64(), t["grantsTotal"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(t["share"].as_f64(), Some(0.25));
    assert_eq!(
        t["waitP50Seconds"].as_f64(),
        Some(0.0025),
        "granted at once: the first bucket"
    );
    assert_eq!(t["maxShare"], Value::Null);
}

#[tokio::test]
async fn overview_shows_servants_grants_environments_and_totals() {
    let server = Server::start_inspectable().await;
    register_servant(&server, 8335, 4).await;
    let granted = acquire(&server, 1, 1).await;
    assert_eq!(granted.grants.len(), 2);

    let overview = get_json(&server, "/api/v1/overview").await;
    let totals = &overview["totals"];
    assert_eq!(totals["servantsUp"], 1);
    assert_eq!(totals["grants"], 2);
    assert_eq!(totals["running"], 2);
    assert_eq!(totals["capacityAvailable"], 2);

    let servant = &overview["servants"][0];
    assert_eq!(servant["location"], "127.0.0.1:8335");
    assert_eq!(servant["priority"], "USER");
    assert_eq!(servant["maxTasks"], 4);
    assert_eq!(servant["running"], 2);
    assert_eq!(servant["everAssigned"], "2", "64-bit counters are strings");
    assert!(servant["notAcceptingReason"].is_null());
    assert!(servant["expiresAtMs"].as_u64() > servant["discoveredAtMs"].as_u64());

    let ids: Vec<String> = granted
        .grants
        .iter()
        .map(|grant| yadcc_scheduler::dashboard::grant_fingerprint(grant.task_grant_id))
        .collect();
    let grants = overview["grants"].as_array().expect("grants");
    for grant in grants {
        let id = grant["id"].as_str().expect("ids are strings");
        assert!(
            ids.contains(&id.to_owned()),
            "a fingerprint of a granted id: {id}"
        );
        assert_eq!(grant["requester"], "127.0.0.1");
        assert_eq!(grant["environment"], DIGEST);
        assert_eq!(grant["zombie"], false);
    }
    assert_eq!(
        grants
            .iter()
            .filter(|grant| grant["prefetch"] == true)
            .count(),
        1
    );

    assert_eq!(overview["environments"][0]["digest"], DIGEST);
    assert_eq!(overview["environments"][0]["servants"], 1);
    for token in [SERVANT_TOKEN, USER_TOKEN] {
        assert!(!overview.to_string().contains(token), "tokens never shown");
    }
    for grant in &granted.grants {
        assert!(
            !overview
                .to_string()
                .contains(&grant.task_grant_id.to_string()),
            "grant ids never shown whole"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn history_is_sampled_every_second() {
    let server = Server::start_inspectable().await;
    register_servant(&server, 8335, 4).await;
    let mut samples = Vec::new();
    let deadline = tokio::time::Instant::now() + STEP;
    while samples.len() < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        samples = get_json(&server, "/api/v1/history").await["samples"]
            .as_array()
            .cloned()
            .unwrap_or_default();
    }
    assert!(samples.len() >= 2, "a sample per second");
    let last = samples.last().unwrap();
    assert_eq!(last["capacity"], 4);
    assert!(last["atMs"].as_u64() > samples[0]["atMs"].as_u64());
    server.stop().await;
}

#[tokio::test]
async fn a_credential_guards_the_dashboard_but_not_the_rpcs() {
    let server = Server::start_with(
        engine_config(),
        TransportSettings {
            inspect: InspectAccess::Credential("ops:s3cret".into()),
            ..TransportSettings::default()
        },
        "127.0.0.1:0",
    )
    .await;
    for path in INSPECTION_PAGES {
        let anonymous = get(&server, path).await;
        assert_eq!(anonymous.status().as_u16(), 401, "{path}");
        assert!(
            anonymous.headers()["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Basic")
        );
        let wrong = get_as(&server, path, "Basic", "ops:guess").await;
        assert_eq!(wrong.status().as_u16(), 401, "{path}");
        // The scheme name is case-insensitive: some clients send `basic`.
        for scheme in ["Basic", "basic", "BASIC"] {
            let right = get_as(&server, path, scheme, "ops:s3cret").await;
            assert_eq!(right.status().as_u16(), 200, "{path} with {scheme}");
        }
    }
    assert_eq!(
        get_config_status(&server).await,
        200,
        "RPCs do not need the dashboard credential"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_from_the_binary() {
    let server = Server::start_inspectable().await;
    for (path, content_type, marker) in [
        ("/", "text/html", "<html"),
        ("/app.js", "text/javascript", "api/v1/overview"),
        ("/style.css", "text/css", "{"),
    ] {
        let response = get(&server, path).await;
        assert_eq!(response.status().as_u16(), 200, "{path}");
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with(content_type),
            "{path}"
        );
        assert!(response.text().await.unwrap().contains(marker), "{path}");
    }
    // Every ES module, as browsers require them: JavaScript, byte for byte.
    let modules: Vec<_> = ASSETS
        .iter()
        .filter(|asset| asset.path.ends_with(".js"))
        .collect();
    assert!(modules.len() > 5, "the page is split into modules");
    for asset in modules {
        let path = asset.url_path();
        let response = get(&server, &path).await;
        assert_eq!(response.status().as_u16(), 200, "{path}");
        assert_eq!(
            response.headers()["content-type"],
            "text/javascript; charset=utf-8",
            "{path}"
        );
        assert_eq!(response.text().await.unwrap(), asset.body, "{path}");
    }
    server.stop().await;
}

#[tokio::test]
async fn inspection_is_closed_by_default_and_says_which_flag_opens_it() {
    let server = Server::start().await;
    for path in INSPECTION_PAGES
        .into_iter()
        .chain(["/inspect/vars", "/inspect/anything"])
    {
        let response = get(&server, path).await;
        // The original's answer: 401 and a challenge, as for a wrong credential.
        assert_eq!(response.status().as_u16(), 401, "{path}");
        assert!(
            response.headers()["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Basic "),
            "{path}"
        );
        let message = response.text().await.unwrap();
        assert!(
            message.contains("--inspect_credential"),
            "{path}: {message}"
        );
        assert!(
            message.contains("--debugging_no_inspect_auth"),
            "{path}: {message}"
        );
    }
    assert_eq!(
        get_config_status(&server).await,
        200,
        "RPCs are not inspection pages"
    );
    assert_eq!(get(&server, "/healthz").await.status().as_u16(), 200);
    server.stop().await;
}

#[tokio::test]
async fn every_dashboard_and_inspection_answer_carries_the_security_headers() {
    let open = Server::start_inspectable().await;
    let closed = Server::start().await;
    for (server, path) in [
        (&open, "/"),
        (&open, "/app.js"),
        (&open, "/api/v1/overview"),
        (&open, "/inspect/vars/yadcc/task_dispatcher"),
        (&open, "/inspect/nothing-here"),
        (&closed, "/"),
        (&closed, "/api/v1/overview"),
    ] {
        let response = get(server, path).await;
        for (name, value) in SECURITY_HEADERS {
            assert_eq!(
                response.headers().get(name).and_then(|v| v.to_str().ok()),
                Some(value),
                "{path}: {name}"
            );
        }
    }
    let csp = SECURITY_HEADERS[0].1;
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    open.stop().await;
    closed.stop().await;
}

#[tokio::test]
async fn the_originals_dump_has_its_shape_and_field_names() {
    let server = Server::start_inspectable().await;
    heartbeat_from(&server, "127.0.0.2", "127.0.0.2:8335", 4).await;
    // Behind NAT: observed 127.0.0.3, reported a private address.
    heartbeat_from(&server, "127.0.0.3", "192.168.7.9:8335", 4).await;
    let granted = acquire(&server, 1, 1).await;
    assert_eq!(granted.grants.len(), 2);

    let dump = get_json(&server, "/inspect/vars/yadcc/task_dispatcher").await;
    assert_eq!(dump["servants_up"], 2);
    assert_eq!(dump["running_tasks"], 2);
    assert_eq!(dump["capacity"], 4, "the NAT servant offers nothing");
    assert_eq!(dump["capacity_available"], 2);
    assert!(dump["capacity_unavailable"].is_u64());

    let servants = dump["servants"].as_array().expect("servants array");
    assert_eq!(servants.len(), 2);
    let direct = &servants[0];
    assert_eq!(direct["location"], "127.0.0.2:8335");
    assert!(direct.get("observed_location").is_none());
    assert_eq!(direct["max_tasks"], 4);
    assert!(direct.get("not_accepting_task_reason").is_none());
    assert_eq!(direct["priority"], "SERVANT_PRIORITY_USER");
    assert_eq!(direct["environments"], serde_json::json!([DIGEST]));
    assert_eq!(direct["running_tasks"], 2);
    assert_eq!(direct["ever_assigned_tasks"], 2);
    for field in [
        "version",
        "num_processors",
        "current_load",
        "capacity_available",
        "total_memory_mb",
        "memory_available_mb",
    ] {
        assert!(direct[field].is_u64(), "{field}: {direct}");
    }
    for field in ["discovered_at", "expires_at"] {
        let time = direct[field].as_str().expect("times are strings");
        assert_eq!(time.len(), "2024-01-01 00:00:00".len(), "{field}: {time}");
        assert_eq!(&time[4..5], "-");
        assert_eq!(&time[10..11], " ");
    }
    let nat = &servants[1];
    assert!(nat.get("location").is_none());
    assert_eq!(nat["observed_location"], "127.0.0.3:8335");
    assert_eq!(nat["reported_location"], "192.168.7.9:8335");
    assert!(nat.get("max_tasks").is_none());
    assert_eq!(
        nat["not_accepting_task_reason"],
        "NOT_ACCEPTING_TASK_REASON_BEHIND_NAT"
    );

    let tasks = dump["tasks"].as_object().expect("tasks keyed by grant id");
    assert_eq!(tasks.len(), 2);
    for grant in &granted.grants {
        let task = &tasks[&grant.task_grant_id.to_string()];
        assert_eq!(task["task_id"].as_u64(), Some(grant.task_grant_id));
        assert_eq!(task["requestor_ip"], "127.0.0.1");
        assert_eq!(task["compiler_digest"], DIGEST);
        assert_eq!(task["servant_location"], "127.0.0.2:8335");
        assert_eq!(task["zombie"], false);
        assert!(task["started_at"].is_string() && task["expires_at"].is_string());
    }
    assert_eq!(
        tasks
            .values()
            .filter(|task| task["prefetched_task"] == true)
            .count(),
        1
    );
    // The framework nests exposed variables by path.
    let vars = get_json(&server, "/inspect/vars").await;
    assert_eq!(vars["yadcc"]["task_dispatcher"]["servants_up"], 2);
    assert!(!dump.to_string().contains(USER_TOKEN));
    server.stop().await;
}

/// Below the dump and with a trailing slash, as the original's framework
/// answers: a field alone (a number as text, an object as JSON), the same
/// page, and 404 for what the dump does not hold.
#[tokio::test]
async fn a_path_below_the_dump_answers_that_field_and_a_trailing_slash_the_same_page() {
    let server = Server::start_inspectable().await;
    heartbeat_from(&server, "127.0.0.2", "127.0.0.2:8335", 4).await;
    let granted = acquire(&server, 1, 0).await;
    let grant = granted.grants[0].task_grant_id;

    let up = get(&server, "/inspect/vars/yadcc/task_dispatcher/servants_up").await;
    assert_eq!(up.status().as_u16(), 200);
    assert!(
        up.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    assert_eq!(up.text().await.unwrap(), "1");
    let location = get(
        &server,
        "/inspect/vars/yadcc/task_dispatcher/servants/0/location",
    )
    .await;
    assert_eq!(
        location.text().await.unwrap(),
        "127.0.0.2:8335",
        "no quotes"
    );

    let task = get_json(
        &server,
        &format!("/inspect/vars/yadcc/task_dispatcher/tasks/{grant}/"),
    )
    .await;
    assert_eq!(task["task_id"].as_u64(), Some(grant));
    assert_eq!(task["servant_location"], "127.0.0.2:8335");

    let page = get_json(&server, "/inspect/vars/yadcc/task_dispatcher").await;
    for same in [
        "/inspect/vars/yadcc/task_dispatcher/",
        "/inspect/vars//yadcc/task_dispatcher",
    ] {
        let again = get_json(&server, same).await;
        assert_eq!(again["servants"], page["servants"], "{same}");
        assert_eq!(again["tasks"], page["tasks"], "{same}");
        assert_eq!(again["servants_up"], 1, "{same}");
    }
    assert_eq!(
        get_json(&server, "/inspect/vars/").await["yadcc"]["task_dispatcher"]["running_tasks"],
        1
    );
    assert_eq!(
        get_json(&server, "/inspect/vars/yadcc/").await["task_dispatcher"]["capacity"],
        4
    );
    for missing in [
        "/inspect/vars/yadcc/task_dispatcher/no_such_field",
        "/inspect/vars/yadcc/task_dispatcher/servants_up/deeper",
        "/inspect/vars/yadcc/task_dispatcher/servants/7",
    ] {
        assert_eq!(
            get(&server, missing).await.status().as_u16(),
            404,
            "{missing}"
        );
    }
    server.stop().await;
}

/// A servant short of memory shows its running count as `capacity_available`,
/// as the original computes it, and the totals still add up to its capacity.
#[tokio::test]
async fn a_servant_short_of_memory_shows_its_running_count_as_capacity_available() {
    let server = Server::start_inspectable().await;
    heartbeat_from(&server, "127.0.0.2", "127.0.0.2:8335", 4).await;
    let granted = acquire(&server, 1, 1).await;
    assert_eq!(granted.grants.len(), 2);
    // Now it reports 1 GiB of 64 GiB free, under the 10 GiB floor.
    let mut connection =
        Connection::open_from(server.addr, Some("127.0.0.2".parse().unwrap())).await;
    let short = pb::HeartbeatRequest {
        total_memory_in_bytes: 64 << 30,
        memory_available_in_bytes: 1 << 30,
        ..heartbeat("127.0.0.2:8335", 4)
    };
    connection
        .send(&daemon_request(
            Method::Heartbeat,
            2,
            &prost::Message::encode_to_vec(&short),
            None,
        ))
        .await;
    assert_eq!(connection.read_response().await.status, 200);

    let dump = get_json(&server, "/inspect/vars/yadcc/task_dispatcher").await;
    let servant = &dump["servants"][0];
    assert_eq!(servant["memory_available_mb"], 1024);
    assert_eq!(servant["running_tasks"], 2);
    assert_eq!(servant["capacity_available"], 2, "{servant}");
    assert_eq!(dump["capacity"], 4);
    assert_eq!(dump["capacity_available"], 0, "no new task goes there");
    assert_eq!(dump["capacity_unavailable"], 2);
    server.stop().await;
}
