//! Health, readiness and Prometheus metrics.

use yadcc_scheduler::pb;

use crate::support::*;

#[tokio::test]
async fn health_and_readiness_answer() {
    let server = Server::start().await;
    let client = http_client();
    for path in ["/healthz", "/readyz"] {
        let response = client.get(server.url(path)).send().await.expect("send");
        assert_eq!(response.status().as_u16(), 200, "{path}");
    }
    server.stop().await;
}

#[tokio::test]
async fn metrics_count_requests_and_show_the_cluster() {
    let server = Server::start().await;
    register_servant(&server, 8335, 4).await;
    let granted = call_http_pb(
        server.addr,
        Method::WaitForStartingTask,
        &wait_request(0, 1, 0),
    )
    .await;
    assert_eq!(granted.status, 200);
    let denied = call_http_pb(
        server.addr,
        Method::GetConfig,
        &pb::GetConfigRequest { token: "x".into() },
    )
    .await;
    assert_eq!(denied.status, 403);

    let response = http_client()
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    let text = response.text().await.unwrap();
    assert!(
        text.contains(r#"yadcc_scheduler_rpc_requests_total{protocol="http+pb",method="Heartbeat",encoding="binary",code="200"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"yadcc_scheduler_rpc_requests_total{protocol="http+pb",method="GetConfig",encoding="binary",code="403"} 1"#), "{text}");
    assert!(text.contains("yadcc_scheduler_servants_up 1"), "{text}");
    assert!(
        text.contains("yadcc_scheduler_capacity_available 3"),
        "{text}"
    );
    assert!(
        text.contains("yadcc_scheduler_rpc_duration_seconds_bucket"),
        "{text}"
    );
    assert!(
        text.contains(r#"yadcc_scheduler_grant_wait_seconds_count{outcome="granted"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("yadcc_scheduler_grants_issued_total 1"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("# EOF"));
    server.stop().await;
}
