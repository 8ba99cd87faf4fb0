//! Issue 10 on the wire: what stock daemons notice (capped grants, the
//! prefetch-only answer, the order of checks, what `GetRunningTasks` lists),
//! trust between clients, fair shares between machines, a quiet restart and
//! the Requesters data of the overview.

use std::net::IpAddr;
use std::time::Duration;

use prost::Message;
use yadcc_engine as engine;
use yadcc_pb as pb;
use yadcc_scheduler::rpc::state::TransportSettings;

use crate::{fixtures::eventually, support::*};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// One raw `http+pb` call from the machine at `from` (a 127.0.0.x address).
async fn call_from(
    server: &Server,
    from: &str,
    method: Method,
    message: &impl Message,
) -> HttpResponse {
    call_at(server.addr, from, method, message).await
}

/// One raw `http+pb` call to the scheduler at `addr` from the machine at `from`.
async fn call_at(
    addr: std::net::SocketAddr,
    from: &str,
    method: Method,
    message: &impl Message,
) -> HttpResponse {
    let mut connection = Connection::open_from(addr, Some(ip(from))).await;
    connection
        .send(&daemon_request(method, 1, &message.encode_to_vec(), None))
        .await;
    connection.read_response().await
}

fn error_code(response: &HttpResponse) -> Option<&str> {
    response.header("rpc-error-code")
}

#[tokio::test]
async fn a_call_asking_for_more_than_the_per_call_limit_is_capped_not_refused() {
    let server = Server::start().await;
    register_servant(&server, 8335, 4).await;
    // A delegate running `make -j1100`.
    let response = call_http_pb(
        server.addr,
        Method::WaitForStartingTask,
        &wait_request(1000, 1100, 1),
    )
    .await;
    assert_eq!(response.status, 200, "{:?}", error_code(&response));
    let granted: pb::WaitForStartingTaskResponse = response.decode();
    assert_eq!(granted.grants.len(), 4, "what the cluster has");
    server.stop().await;
}

#[tokio::test]
async fn a_prefetch_only_call_for_an_environment_nobody_offers_gets_no_quota() {
    let server = Server::start().await;
    let mut idle_prefetch = wait_request(0, 0, 1);
    idle_prefetch.env_desc = Some(pb::EnvironmentDesc {
        compiler_digest: "nobody-offers-this".into(),
    });
    let response = call_http_pb(server.addr, Method::WaitForStartingTask, &idle_prefetch).await;
    assert_eq!(error_code(&response), Some("1001"));
    idle_prefetch.immediate_reqs = 1;
    let response = call_http_pb(server.addr, Method::WaitForStartingTask, &idle_prefetch).await;
    assert_eq!(error_code(&response), Some("1006"));
    server.stop().await;
}

/// As the original answers them: an empty (or missing) compiler digest is
/// an environment nobody offers, and a call asking for no grant gets none,
/// never "invalid argument", on the daemons' protocols and on JSON alike.
#[tokio::test]
async fn an_empty_digest_and_a_call_for_no_grant_are_answered_as_the_original_does() {
    let server = Server::start().await;
    register_servant(&server, 8335, 4).await;
    let without_digest = |immediate, prefetch, env_desc| pb::WaitForStartingTaskRequest {
        env_desc,
        ..wait_request(1000, immediate, prefetch)
    };
    let empty = Some(pb::EnvironmentDesc::default());
    for (request, code) in [
        (without_digest(1, 1, empty.clone()), 1006),
        (without_digest(1, 0, None), 1006),
        (without_digest(0, 1, empty), 1001),
        (without_digest(0, 1, None), 1001),
        (wait_request(1000, 0, 0), 1001),
    ] {
        let context = format!("{request:?}");
        let response = call_http_pb(server.addr, Method::WaitForStartingTask, &request).await;
        assert_eq!(
            error_code(&response),
            Some(code.to_string().as_str()),
            "{context}"
        );
        let mut connection = Connection::open(server.addr).await;
        let answer = connection
            .flare_call(1, Method::WaitForStartingTask, &request)
            .await;
        assert_eq!(answer.status(), code, "{context}");
    }
    let json = http_client()
        .post(server.url(&format!("/rpc/{SERVICE}.WaitForStartingTask")))
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"token":"{USER_TOKEN}","immediateReqs":1,"envDesc":{{"compilerDigest":""}}}}"#
        ))
        .send()
        .await
        .expect("JSON call");
    let body: serde_json::Value = json.json().await.expect("error body");
    assert_eq!(body["rpcErrorCode"], 1006);
    assert_eq!(body["message"], "No matched servant environment.");
    // Nothing was granted by any of them.
    assert_eq!(server.engine.snapshot().grants.len(), 0);
    server.stop().await;
}

/// The original's parser reads a port with leading zeros (`:080` is 80);
/// the servant is listed at its normalised location and is not behind NAT.
#[tokio::test]
async fn a_location_with_leading_zeros_in_its_port_is_accepted() {
    let server = Server::start().await;
    let beat = heartbeat("127.0.0.1:008335", 4);
    let response = call_http_pb(server.addr, Method::Heartbeat, &beat).await;
    assert_eq!(
        response.status,
        200,
        "{:?}",
        response.header("rpc-error-reason")
    );
    let snapshot = server.engine.snapshot();
    let servant = &snapshot.servants[0];
    assert_eq!(servant.reported_location.to_string(), "127.0.0.1:8335");
    assert_eq!(
        servant.max_tasks, 4,
        "observed and reported agree: not behind NAT"
    );
    let too_large = heartbeat("127.0.0.1:065536", 4);
    let response = call_http_pb(server.addr, Method::Heartbeat, &too_large).await;
    assert_eq!(error_code(&response), Some("1004"));
    server.stop().await;
}

#[tokio::test]
async fn the_token_is_checked_before_anything_else() {
    let server = Server::start_with(
        engine::Config {
            min_daemon_version: 5,
            ..engine_config()
        },
        TransportSettings::default(),
        "127.0.0.1:0",
    )
    .await;
    let mut beat = heartbeat("not-a-location", 4);
    beat.version = 1;
    beat.next_heartbeat_in_ms = 40_000;
    beat.token = "outsider".into();
    let response = call_http_pb(server.addr, Method::Heartbeat, &beat).await;
    assert_eq!(error_code(&response), Some("1003"), "access denied first");
    beat.token = SERVANT_TOKEN.into();
    let response = call_http_pb(server.addr, Method::Heartbeat, &beat).await;
    assert_eq!(error_code(&response), Some("1005"), "then the version");
    beat.version = 5;
    let response = call_http_pb(server.addr, Method::Heartbeat, &beat).await;
    assert_eq!(error_code(&response), Some("1004"));
    assert!(
        response
            .header("rpc-error-reason")
            .unwrap()
            .contains("location"),
        "then the location"
    );

    // A wait without env_desc and with a bad token learns only "denied".
    let mut wait = wait_request(20_000, 0, 0);
    wait.env_desc = None;
    wait.token = "outsider".into();
    let response = call_http_pb(server.addr, Method::WaitForStartingTask, &wait).await;
    assert_eq!(error_code(&response), Some("1003"));
    server.stop().await;
}

#[tokio::test]
async fn get_running_tasks_lists_live_grants_of_trusted_servants_without_grant_ids() {
    // Not just restarted: unknown ids are killed, not adopted.
    let server = Server::start_with(
        engine::Config {
            adoption_window: Duration::ZERO,
            ..engine_config()
        },
        TransportSettings::default(),
        "127.0.0.1:0",
    )
    .await;
    register_servant(&server, 8335, 4).await;
    let granted = acquire(&server, 1, 0).await;
    let id = granted.grants[0].task_grant_id;
    let task = |grant: u64, servant_task_id: u64| pb::RunningTask {
        servant_task_id,
        task_grant_id: grant,
        servant_location: String::new(),
        task_digest: format!("digest-{servant_task_id}"),
    };
    // The servant reports our task and one this scheduler never granted.
    let mut beat = heartbeat(&servant_location("127.0.0.1", 8335), 4);
    beat.running_tasks = vec![task(id, 1), task(12_345, 2)];
    let reply: pb::HeartbeatResponse = call_http_pb(server.addr, Method::Heartbeat, &beat)
        .await
        .decode();
    assert_eq!(reply.expired_tasks, [12_345]);
    // A servant behind NAT (reports 127.0.0.9, seen as 127.0.0.2) and one
    // with only a user token report tasks too.
    let mut nat = heartbeat(&servant_location("127.0.0.9", 8336), 4);
    nat.running_tasks = vec![task(id, 3)];
    assert_eq!(
        call_from(&server, "127.0.0.2", Method::Heartbeat, &nat)
            .await
            .status,
        200
    );
    let mut unverified = heartbeat(&servant_location("127.0.0.3", 8337), 4);
    unverified.token = USER_TOKEN.into();
    unverified.running_tasks = vec![task(id, 4)];
    assert_eq!(
        call_from(&server, "127.0.0.3", Method::Heartbeat, &unverified)
            .await
            .status,
        200
    );

    let running: pb::GetRunningTasksResponse = call_http_pb(
        server.addr,
        Method::GetRunningTasks,
        &pb::GetRunningTasksRequest {},
    )
    .await
    .decode();
    assert_eq!(
        running.running_tasks,
        [pb::RunningTask {
            servant_task_id: 1,
            task_grant_id: 0,
            servant_location: "127.0.0.1:8335".into(),
            task_digest: "digest-1".into(),
        }]
    );
    server.stop().await;
}

/// A delegate whose calls leave from two addresses (a NAT pool that is not
/// sticky) keeps its task: the token and the grant id prove the holder. The
/// real binary, so the flags and the wire are the ones users run.
#[tokio::test]
async fn a_holder_renews_from_a_second_address_and_a_stranger_cannot() {
    let tokens = format!("--acceptable_user_tokens={USER_TOKEN},other-token");
    let servants = format!("--acceptable_servant_tokens={SERVANT_TOKEN}");
    let binary = Binary::start_exactly(
        "127.0.0.1:0".parse().unwrap(),
        &[&tokens, &servants],
        &[],
        None,
    );
    let addr = binary.addr;
    let beat = heartbeat(&servant_location("127.0.0.1", 8335), 4);
    assert_eq!(
        call_at(addr, "127.0.0.1", Method::Heartbeat, &beat)
            .await
            .status,
        200
    );
    let granted: pb::WaitForStartingTaskResponse = call_at(
        addr,
        "127.0.0.1",
        Method::WaitForStartingTask,
        &wait_request(1000, 1, 0),
    )
    .await
    .decode();
    let id = granted.grants[0].task_grant_id;
    let renew = |token: &str| pb::KeepTaskAliveRequest {
        token: token.into(),
        task_grant_ids: vec![id],
        next_keep_alive_in_ms: 1_000,
    };
    // Three leases of 1 s, renewed every half lease from either address.
    for round in 0..6 {
        let from = ["127.0.0.2", "127.0.0.1"][round % 2];
        let reply: pb::KeepTaskAliveResponse =
            call_at(addr, from, Method::KeepTaskAlive, &renew(USER_TOKEN))
                .await
                .decode();
        assert_eq!(reply.statuses, [true], "renewal {round} from {from}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Another token is a stranger on either address: refused, nothing freed.
    for from in ["127.0.0.2", "127.0.0.1"] {
        let reply: pb::KeepTaskAliveResponse =
            call_at(addr, from, Method::KeepTaskAlive, &renew("other-token"))
                .await
                .decode();
        assert_eq!(reply.statuses, [false], "a stranger from {from}");
        let free = pb::FreeTaskRequest {
            token: "other-token".into(),
            task_grant_ids: vec![id],
        };
        assert_eq!(
            call_at(addr, from, Method::FreeTask, &free).await.status,
            200
        );
    }
    // Still the holder's: it frees it from the second address, and it is gone.
    let free = pb::FreeTaskRequest {
        token: USER_TOKEN.into(),
        task_grant_ids: vec![id],
    };
    assert_eq!(
        call_at(addr, "127.0.0.2", Method::FreeTask, &free)
            .await
            .status,
        200
    );
    let reply: pb::KeepTaskAliveResponse =
        call_at(addr, "127.0.0.1", Method::KeepTaskAlive, &renew(USER_TOKEN))
            .await
            .decode();
    assert_eq!(reply.statuses, [false], "freed by its holder");
}

/// Starts long poll `seq_no` on a daemon's `connection`; returns once the
/// engine counts `queued` waiters.
async fn long_poll_on(server: &Server, connection: &mut Connection, seq_no: u64, queued: usize) {
    connection
        .send(&daemon_request(
            Method::WaitForStartingTask,
            seq_no,
            &wait_request(8000, 1, 0).encode_to_vec(),
            None,
        ))
        .await;
    assert!(eventually(|| server.engine.snapshot().totals.waiters == queued).await);
}

/// The id of the one grant `machine` holds, once it holds one.
async fn grant_of(server: &Server, machine: &str) -> u64 {
    let mut found = None;
    assert!(
        eventually(|| {
            found = server
                .engine
                .snapshot()
                .grants
                .iter()
                .find(|g| g.requester == Some(ip(machine)))
                .map(|g| g.id);
            found.is_some()
        })
        .await,
        "{machine} was never served"
    );
    found.unwrap()
}

#[tokio::test]
async fn a_freed_slot_goes_to_the_machine_served_least_recently() {
    let server = Server::start().await;
    register_servant(&server, 8335, 1).await;
    let held = acquire(&server, 1, 0).await.grants[0].task_grant_id;
    // A build queues five long polls on its daemon's connection, then a
    // colleague's daemon one.
    let mut build = Connection::open_from(server.addr, Some(ip("127.0.0.11"))).await;
    for queued in 1..=5 {
        long_poll_on(&server, &mut build, queued as u64, queued).await;
    }
    let mut colleague = Connection::open_from(server.addr, Some(ip("127.0.0.12"))).await;
    long_poll_on(&server, &mut colleague, 1, 6).await;
    let free = |id: u64| pb::FreeTaskRequest {
        token: USER_TOKEN.into(),
        task_grant_ids: vec![id],
    };
    call_from(&server, "127.0.0.1", Method::FreeTask, &free(held)).await;
    let first = grant_of(&server, "127.0.0.11").await;
    call_from(&server, "127.0.0.11", Method::FreeTask, &free(first)).await;
    // The second slot goes to the colleague, not to the build's next poll.
    let second = grant_of(&server, "127.0.0.12").await;
    let answer: pb::WaitForStartingTaskResponse = colleague.read_response().await.decode();
    assert_eq!(answer.grants[0].task_grant_id, second);
    assert_eq!(server.engine.snapshot().totals.waiters, 4);
    server.stop().await;
}

#[tokio::test]
async fn after_a_restart_running_tasks_are_adopted_quietly() {
    let first = Server::start().await;
    register_servant(&first, 8335, 4).await;
    let id = acquire(&first, 1, 0).await.grants[0].task_grant_id;
    first.stop().await;

    let second = Server::start().await;
    // The delegate renews before the servant has reported: true.
    let renew = pb::KeepTaskAliveRequest {
        token: USER_TOKEN.into(),
        task_grant_ids: vec![id],
        next_keep_alive_in_ms: 10_000,
    };
    let reply: pb::KeepTaskAliveResponse = call_http_pb(second.addr, Method::KeepTaskAlive, &renew)
        .await
        .decode();
    assert_eq!(reply.statuses, [true]);
    // The servant reports it: adopted, not killed, owned by the renewer.
    let mut beat = heartbeat(&servant_location("127.0.0.1", 8335), 4);
    beat.running_tasks = vec![pb::RunningTask {
        servant_task_id: 1,
        task_grant_id: id,
        servant_location: String::new(),
        task_digest: "d".into(),
    }];
    let reply: pb::HeartbeatResponse = call_http_pb(second.addr, Method::Heartbeat, &beat)
        .await
        .decode();
    assert!(reply.expired_tasks.is_empty());
    let grants = second.engine.snapshot().grants;
    assert_eq!(grants.len(), 1);
    assert!(grants[0].adopted);
    assert_eq!(grants[0].requester, Some(ip("127.0.0.1")));
    let reply: pb::KeepTaskAliveResponse = call_http_pb(second.addr, Method::KeepTaskAlive, &renew)
        .await
        .decode();
    assert_eq!(reply.statuses, [true]);
    second.stop().await;
}

#[tokio::test]
async fn the_overview_lists_requesters() {
    // The overview is an inspection page: open it as `--debugging_no_inspect_auth` does.
    let server = Server::start_inspectable().await;
    register_servant(&server, 8335, 4).await;
    acquire(&server, 2, 0).await;
    let overview: serde_json::Value = http_client()
        .get(server.url("/api/v1/overview"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut requesters = overview["requesters"].clone();
    // The rate is the sampler's (once a second): whether its latest sample
    // saw these grants depends on when it ran.
    let rate = requesters[0]["grantsPerSecond"].take();
    assert!(rate.as_f64().is_some_and(|rate| rate >= 0.0), "{rate}");
    assert_eq!(
        requesters,
        serde_json::json!([{
            "ip": "127.0.0.1",
            "grantsHeld": 2,
            "waiting": 0,
            "waitingRequesters": 0,
            "grantsTotal": "2",
            "grantsPerSecond": null,
            "refusedTotal": "0",
            "waitCapRefusals": "0"
        }])
    );
    server.stop().await;
}
