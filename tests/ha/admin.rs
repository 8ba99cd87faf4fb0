//! Issue 32's cordons across failovers: the operators' state lives in etcd
//! beside the election, and each instance reads it when it starts to lead,
//! so a kill -9 of the leader never uncordons a servant; a standby does not
//! act; the saved key does not disturb the next election.

use std::time::Duration;

use serde_json::{Value, json};

use crate::{TTL, support::*};

/// One JSON call of the operators' service: the status and the body.
fn admin(port: u16, method: &str, body: Value) -> (u16, Value) {
    post(
        port,
        &format!("/rpc/yadcc.scheduler.AdminService.{method}"),
        Some(ADMIN_TOKEN),
        &body,
    )
}

/// A JSON POST on loopback: the status and the JSON body (Null if none).
fn post(port: u16, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let authorization = token.map_or(String::new(), |token| {
        format!("Authorization: Bearer {token}\r\n")
    });
    let (status, answer) = json_post(
        port,
        path,
        &authorization,
        &body.to_string(),
        Duration::from_secs(5),
    );
    let body = answer
        .split_once("\r\n\r\n")
        .and_then(|(_, body)| serde_json::from_str(body).ok())
        .unwrap_or(Value::Null);
    (status, body)
}

/// Location -> state name of `ListServantStates` on `port`.
fn states(port: u16) -> Vec<(String, String)> {
    let (status, listed) = admin(port, "ListServantStates", json!({}));
    assert_eq!(status, 200, "{listed}");
    listed["servants"]
        .as_array()
        .map(|servants| {
            servants
                .iter()
                .map(|servant| {
                    (
                        servant["location"].as_str().unwrap().to_owned(),
                        servant["state"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A servant at 127.0.0.1:`servant_port` with 4 slots, then one grant
/// asked for at once: the status of the ask (200 granted, 429 no quota).
fn register_and_ask(port: u16, servant_port: u16) -> u16 {
    let beat = json!({
        "token": SERVANT_TOKEN,
        "nextHeartbeatInMs": 10000,
        "version": 1,
        "location": format!("127.0.0.1:{servant_port}"),
        "numProcessors": 4,
        "capacity": 4,
        "envDescs": [{ "compilerDigest": "c0ffee" }],
    });
    let (status, answer) = post(
        port,
        "/rpc/yadcc.scheduler.SchedulerService.Heartbeat",
        None,
        &beat,
    );
    assert_eq!(status, 200, "{answer}");
    let ask = json!({
        "token": USER_TOKEN,
        "millisecondsToWait": 0,
        "envDesc": { "compilerDigest": "c0ffee" },
        "immediateReqs": 1,
        "nextKeepAliveInMs": 15000,
    });
    post(
        port,
        "/rpc/yadcc.scheduler.SchedulerService.WaitForStartingTask",
        None,
        &ask,
    )
    .0
}

#[test]
fn kill_9_the_leader_and_the_new_leader_keeps_every_cordon() {
    let Some(mut setup) = Setup::start("admin", false) else {
        return;
    };
    let etcd_url = setup.etcd.client_url.clone();
    let (leader, standby) = roles(&mut setup.a, &mut setup.b);
    let (status, _) = admin(
        leader.port,
        "CordonServant",
        json!({ "location": "127.0.0.1:9001", "reason": "before the failover" }),
    );
    assert_eq!(status, 200);
    let (status, _) = admin(
        leader.port,
        "DrainServant",
        json!({ "location": "127.0.0.1:9002" }),
    );
    assert_eq!(status, 200);
    // A standby acts on nothing (its daemons and clients go to the leader).
    let (status, refused) = admin(
        standby.port,
        "UncordonServant",
        json!({ "location": "127.0.0.1:9001" }),
    );
    assert_eq!(status, 503, "{refused}");

    leader.kill_9();
    wait_until(5 * TTL, "the standby leads", || standby.is_ready());
    assert_eq!(
        states(standby.port),
        [
            (
                "127.0.0.1:9001".to_owned(),
                "CORDON_STATE_CORDONED".to_owned()
            ),
            (
                "127.0.0.1:9002".to_owned(),
                "CORDON_STATE_DRAINED".to_owned()
            ),
        ],
        "the new leader read the cordons"
    );
    let (_, events) = admin(standby.port, "ListAuditEvents", json!({}));
    let actions: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["DrainServant", "CordonServant"],
        "and the audit list"
    );
    // The cordon holds: the servant that registers there gets nothing.
    assert_eq!(register_and_ask(standby.port, 9001), 429);
    let (status, _) = admin(
        standby.port,
        "UncordonServant",
        json!({ "location": "127.0.0.1:9001" }),
    );
    assert_eq!(status, 200);
    assert_eq!(register_and_ask(standby.port, 9001), 200);

    // The killed one comes back as the standby; when the new leader dies
    // in turn, it leads with what its successor saved, so every win reads
    // the state and the saved key holds up no election.
    let port = leader.port;
    *leader = Scheduler::start(port, &etcd_url);
    wait_until(3 * TTL, "the restarted one stands by", || {
        leader
            .readyz()
            .is_some_and(|(status, why)| status == 503 && why.starts_with("standby, leader is"))
    });
    standby.kill_9();
    wait_until(5 * TTL, "the first one leads again", || leader.is_ready());
    assert_eq!(
        states(leader.port),
        [(
            "127.0.0.1:9002".to_owned(),
            "CORDON_STATE_DRAINED".to_owned()
        )],
        "the uncordon lasted too"
    );
    assert!(
        leader
            .log()
            .iter()
            .any(|line| line.contains("restored the saved state")),
        "{}",
        leader.log().join("\n")
    );
}
