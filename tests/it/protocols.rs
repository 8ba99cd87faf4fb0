//! Every protocol ends in the same dispatch: its calls are counted under
//! their protocol label, and the overview names each peer's latest protocol.

use prost::Message;
use serde_json::Value;
use yadcc_pb as pb;

use crate::support::*;

pub(crate) async fn overview(server: &Server) -> Value {
    http_client()
        .get(server.url("/api/v1/overview"))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("JSON")
}

async fn metrics(server: &Server) -> String {
    http_client()
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn each_peer_shows_the_protocol_of_its_latest_call() {
    // The overview is an inspection page: open it as `--debugging_no_inspect_auth` does.
    let server = Server::start_inspectable().await;
    // Connect from 127.0.0.2, the /rpc/ route from 127.0.0.3.
    let mut connect = Connection::open_from(server.addr, Some("127.0.0.2".parse().unwrap())).await;
    let body = heartbeat(&servant_location("127.0.0.2", 8335), 2).encode_to_vec();
    let headers = [("Host", "x"), ("Content-Type", "application/proto")];
    let request = http_request(&format!("/{SERVICE}/Heartbeat"), &headers, &body);
    connect.send(&request).await;
    assert_eq!(connect.read_response().await.status, 200);
    // A script's JSON call on the /rpc/ route from 127.0.0.3.
    let mut script = Connection::open_from(server.addr, Some("127.0.0.3".parse().unwrap())).await;
    let body = format!(r#"{{"token":"{USER_TOKEN}"}}"#);
    let headers = [("Host", "x"), ("Content-Type", "application/json")];
    script
        .send(&http_request(
            Method::GetConfig.rpc_path(),
            &headers,
            body.as_bytes(),
        ))
        .await;
    assert_eq!(script.read_response().await.status, 200);

    // The daemons' binary protocol from 127.0.0.4, their http+pb from 127.0.0.5.
    let mut flare = Connection::open_from(server.addr, Some("127.0.0.4".parse().unwrap())).await;
    let config = pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    }
    .encode_to_vec();
    flare
        .send(&flare_request(1, Method::GetConfig, 2000, &config))
        .await;
    assert_eq!(flare.read_flare().await.status(), 0);
    heartbeat_from(
        &server,
        "127.0.0.5",
        &servant_location("127.0.0.5", 8335),
        2,
    )
    .await;

    let overview = overview(&server).await;
    let protocols = &overview["peerProtocols"];
    assert_eq!(protocols["127.0.0.2"], "connect", "{protocols}");
    assert_eq!(
        protocols["127.0.0.3"], "http+pb",
        "the /rpc/ route's wire, whichever server took it: {protocols}"
    );
    assert_eq!(protocols["127.0.0.4"], "flare", "{protocols}");
    assert_eq!(protocols["127.0.0.5"], "http+pb", "{protocols}");

    let text = metrics(&server).await;
    assert!(
        text.contains(r#"yadcc_scheduler_rpc_requests_total{protocol="connect",method="Heartbeat",encoding="binary",code="200"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"yadcc_scheduler_rpc_requests_total{protocol="flare",method="GetConfig",encoding="binary",code="200"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"yadcc_scheduler_connections_accepted_total{protocol="flare"} 1"#),
        "{text}"
    );
    // Both servants report version 1 (the support heartbeat's).
    assert!(
        text.contains(r#"yadcc_scheduler_servants_by_version{version="1"} 2"#),
        "{text}"
    );
    server.stop().await;
}
