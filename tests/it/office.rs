//! An office behind one NAT address: many daemons, one address. On the
//! daemons' protocols a requester is its connection, so every daemon has its
//! own share and its own waiter cap, while its grants stay its address's and
//! token's; every cap has a flag, and the metrics and the Requesters data
//! show when one bites. The real binary, over real sockets.

use std::time::Duration;

use prost::Message;
use tokio::time::Instant;
use yadcc_pb as pb;

use crate::support::*;

/// The binary's `/metrics`, read with one client (one connection: the
/// tests cap connections per address).
async fn metrics(server: &Binary, client: &reqwest::Client) -> String {
    client
        .get(format!("http://{}/metrics", server.addr))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text")
}

/// Polls `/metrics` until it contains `line`, within [`STEP`].
async fn metrics_show(server: &Binary, client: &reqwest::Client, line: &str) -> String {
    let deadline = Instant::now() + STEP;
    loop {
        let text = metrics(server, client).await;
        if text.lines().any(|l| l == line) || Instant::now() > deadline {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A servant with one slot on 127.0.0.1:8335, and that slot taken, so every
/// `WaitForStartingTask` queues.
async fn take_the_only_slot(server: &Binary) {
    let registered = call_http_pb(
        server.addr,
        Method::Heartbeat,
        &heartbeat(&servant_location("127.0.0.1", 8335), 1),
    )
    .await;
    assert_eq!(registered.status, 200);
    let taken = call_http_pb(
        server.addr,
        Method::WaitForStartingTask,
        &wait_request(1000, 1, 0),
    )
    .await;
    let taken: pb::WaitForStartingTaskResponse = taken.decode();
    assert_eq!(taken.grants.len(), 1);
}

/// A long poll as a daemon sends it: wait 10 s for one grant.
async fn long_poll(connection: &mut Connection, id: u64) {
    connection
        .send_flare_call(
            id,
            Method::WaitForStartingTask,
            15_000,
            &wait_request(10_000, 1, 0),
        )
        .await;
}

fn config() -> pb::GetConfigRequest {
    pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    }
}

#[tokio::test]
async fn three_hundred_daemons_behind_one_address_each_hold_a_long_poll() {
    const DAEMONS: usize = 300;
    // 600 connections here and 600 in the server.
    yadcc_scheduler::edge::raise_fd_limit().expect("raise this process's descriptor limit");
    // The defaults: no cap flag.
    let server = Binary::start(&[], None);
    assert!(
        server.open_files_limit() >= 4 * DAEMONS as u64 + 64,
        "this machine's descriptor limit is too low for an office of {DAEMONS} daemons"
    );
    take_the_only_slot(&server).await;
    // Every daemon holds its two connections, as stock daemons do, all from
    // the office's one address.
    let mut daemons = Vec::with_capacity(DAEMONS);
    for _ in 0..DAEMONS {
        let polling = Connection::open(server.addr).await;
        let other = Connection::open(server.addr).await;
        daemons.push((polling, other));
    }
    for (polling, _) in &mut daemons {
        long_poll(polling, 1).await;
    }
    let client = http_client();
    let text = metrics_show(&server, &client, "yadcc_scheduler_waiters 300").await;
    assert!(
        text.lines().any(|l| l == "yadcc_scheduler_waiters 300"),
        "every long poll waits: {}",
        text.lines()
            .filter(|l| l.contains("waiters") || l.contains("refused"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // No connection was closed: each daemon's other connection still answers.
    for (_, other) in &mut daemons {
        let answer = other.flare_call(2, Method::GetConfig, &config()).await;
        assert_eq!((answer.meta.correlation_id, answer.status()), (2, 0));
    }
    let text = metrics(&server, &client).await;
    for cap in [
        r#"yadcc_scheduler_waiters_refused_total{reason="max_waiters_per_requester"} 0"#,
        r#"yadcc_scheduler_waiters_refused_total{reason="max_waiters"} 0"#,
        r#"yadcc_scheduler_connections_refused_total{reason="max_connections_per_ip"} 0"#,
        r#"yadcc_scheduler_connections_refused_total{reason="max_connections"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == cap), "{cap} in\n{text}");
    }
}

#[tokio::test]
async fn each_cap_flag_bites_where_it_says_and_shows() {
    let server = Binary::start(
        &[
            "--max_connections_per_ip=3",
            "--max_waiters_per_requester=2",
            "--max_waiters=3",
            "--debugging_no_inspect_auth",
        ],
        None,
    );
    take_the_only_slot(&server).await;
    let office = Some("127.0.0.3".parse().unwrap());
    let mut a = Connection::open_from(server.addr, office).await;
    let mut b = Connection::open_from(server.addr, office).await;
    let mut c = Connection::open_from(server.addr, office).await;
    // The fourth connection from the address is closed at once.
    let mut d = Connection::open_from(server.addr, office).await;
    d.expect_closed().await;
    assert_eq!(
        c.flare_call(9, Method::GetConfig, &config()).await.status(),
        0,
        "the first three are served"
    );

    // Connection a: two long polls queue (each call that waits runs on its
    // own, so they are let in one at a time), the third is over its cap.
    let client = http_client();
    let started = Instant::now();
    for id in [1, 2] {
        long_poll(&mut a, id).await;
        let line = format!("yadcc_scheduler_waiters {id}");
        let text = metrics_show(&server, &client, &line).await;
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    long_poll(&mut a, 3).await;
    let refused = a.read_flare().await;
    assert_eq!((refused.meta.correlation_id, refused.status()), (3, 1001));
    // Connection b of the same address is a requester of its own: one more
    // queues, up to the total of 3; then the total is full.
    long_poll(&mut b, 4).await;
    let text = metrics_show(&server, &client, "yadcc_scheduler_waiters 3").await;
    assert!(
        text.lines().any(|l| l == "yadcc_scheduler_waiters 3"),
        "{text}"
    );
    long_poll(&mut b, 5).await;
    let refused = b.read_flare().await;
    assert_eq!((refused.meta.correlation_id, refused.status()), (5, 1001));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once, not after the 10 s wait: {:?}",
        started.elapsed()
    );

    let text = metrics(&server, &client).await;
    for line in [
        "yadcc_scheduler_waiters 3",
        r#"yadcc_scheduler_waiters_refused_total{reason="max_waiters_per_requester"} 1"#,
        r#"yadcc_scheduler_waiters_refused_total{reason="max_waiters"} 1"#,
        r#"yadcc_scheduler_connections_refused_total{reason="max_connections_per_ip"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    let overview: serde_json::Value = client
        .get(format!("http://{}/api/v1/overview", server.addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let office_row = overview["requesters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["ip"] == "127.0.0.3")
        .cloned()
        .expect("the office is a requester");
    assert_eq!(office_row["waiting"], 3);
    assert_eq!(office_row["waitingRequesters"], 2, "two daemon connections");
    assert_eq!(office_row["waitCapRefusals"], "2", "the caps bit twice");
}

#[tokio::test]
async fn the_calls_in_flight_flag_caps_a_connection() {
    let server = Binary::start(&["--max_calls_in_flight_per_connection=2"], None);
    take_the_only_slot(&server).await;
    let mut connection = Connection::open(server.addr).await;
    for id in 1..=3 {
        long_poll(&mut connection, id).await;
    }
    let overloaded = connection.read_flare().await;
    assert_eq!(
        (overloaded.meta.correlation_id, overloaded.status()),
        (3, 11)
    );
}

/// Rule "grant ownership" over the wire: a daemon's grant, received on one
/// of its connections, is renewed and freed on the other.
#[tokio::test]
async fn a_daemon_renews_and_frees_on_its_other_connection() {
    let server = Server::start().await;
    register_servant(&server, 8335, 2).await;
    let mut polling = Connection::open(server.addr).await;
    let mut other = Connection::open(server.addr).await;
    let granted = polling
        .flare_call(1, Method::WaitForStartingTask, &wait_request(1000, 1, 0))
        .await;
    assert_eq!(granted.status(), 0);
    let ids: Vec<u64> = pb::WaitForStartingTaskResponse::decode(granted.payload)
        .unwrap()
        .grants
        .iter()
        .map(|grant| grant.task_grant_id)
        .collect();
    assert_eq!(ids.len(), 1);
    let renew = pb::KeepTaskAliveRequest {
        token: USER_TOKEN.into(),
        task_grant_ids: ids.clone(),
        next_keep_alive_in_ms: 10_000,
    };
    let renewed = other.flare_call(2, Method::KeepTaskAlive, &renew).await;
    let statuses = pb::KeepTaskAliveResponse::decode(renewed.payload)
        .unwrap()
        .statuses;
    assert_eq!(statuses, vec![true]);
    let free = pb::FreeTaskRequest {
        token: USER_TOKEN.into(),
        task_grant_ids: ids,
    };
    assert_eq!(
        other.flare_call(3, Method::FreeTask, &free).await.status(),
        0
    );
    assert_eq!(server.engine.totals().0.grants, 0, "freed");
    let counters = server.engine.totals().1;
    assert_eq!((counters.renewals_refused, counters.frees_refused), (0, 0));
    server.stop().await;
}
