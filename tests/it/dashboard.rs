//! The inspection API over a real socket, and its optional basic auth.

use base64::Engine as _;
use serde_json::Value;
use yadcc_scheduler::{http::routes::HttpSettings, pb};

use crate::support::*;

async fn get_json(server: &Server, path: &str) -> Value {
    let response = http_client()
        .get(server.url(path))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 200, "{path}");
    response.json().await.expect("JSON")
}

#[tokio::test]
async fn overview_shows_servants_grants_environments_and_totals() {
    let server = Server::start().await;
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
        .map(|grant| grant.task_grant_id.to_string())
        .collect();
    let grants = overview["grants"].as_array().expect("grants");
    for grant in grants {
        let id = grant["id"].as_str().expect("ids are strings");
        assert!(ids.contains(&id.to_owned()), "{id}");
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
    assert!(
        !overview.to_string().contains(SERVANT_TOKEN),
        "tokens never shown"
    );
    assert!(
        !overview.to_string().contains(USER_TOKEN),
        "tokens never shown"
    );
    server.stop().await;
}

#[tokio::test]
async fn history_is_sampled_every_second() {
    let server = Server::start().await;
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
        HttpSettings {
            inspect_credential: Some("ops:s3cret".into()),
            ..HttpSettings::default()
        },
        "127.0.0.1:0",
    )
    .await;
    let client = http_client();
    for path in ["/", "/app.js", "/api/v1/overview", "/api/v1/history"] {
        let anonymous = client.get(server.url(path)).send().await.expect("send");
        assert_eq!(anonymous.status().as_u16(), 401, "{path}");
        assert!(
            anonymous.headers()["www-authenticate"]
                .to_str()
                .unwrap()
                .starts_with("Basic")
        );
        let wrong = client
            .get(server.url(path))
            .basic_auth("ops", Some("guess"))
            .send()
            .await
            .expect("send");
        assert_eq!(wrong.status().as_u16(), 401, "{path}");
        let right = client
            .get(server.url(path))
            .header(
                "authorization",
                format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode("ops:s3cret")
                ),
            )
            .send()
            .await
            .expect("send");
        assert_eq!(right.status().as_u16(), 200, "{path}");
    }
    let rpc = call_raw(
        server.addr,
        "GetConfig",
        &pb::GetConfigRequest {
            token: USER_TOKEN.into(),
        },
    )
    .await;
    assert_eq!(rpc.status, 200, "RPCs do not need the dashboard credential");
    server.stop().await;
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_from_the_binary() {
    let server = Server::start().await;
    let client = http_client();
    for (path, content_type, marker) in [
        ("/", "text/html", "<html"),
        ("/app.js", "text/javascript", "api/v1/overview"),
        ("/style.css", "text/css", "{"),
    ] {
        let response = client.get(server.url(path)).send().await.expect("send");
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
    server.stop().await;
}
