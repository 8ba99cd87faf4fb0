//! Operators acting on a busy farm, against the real binary: simulated
//! stock daemons (the `yadcc-loadgen` cluster, flare, each machine from its
//! own 127.x address) compile while a servant is cordoned (no new grant
//! from then on, its tasks finish, none killed), drained (`drained` once
//! they have) and uncordoned (it gets grants again); and a restart with
//! `--state_file` keeps every cordon and the audit list.

use std::{
    net::SocketAddr,
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use yadcc_sim::{Cluster, ClusterConfig, Wire, Workload};

use crate::{
    admin::{ADMIN_TOKEN, admin_json, audit_actions},
    support::*,
    tools::ScratchDir,
};

const MACHINES: usize = 12;
/// The longest simulated compilation.
const LONGEST_TASK: Duration = Duration::from_millis(4000);
/// The bound: no new grant to a cordoned servant after this.
const WITHIN: Duration = Duration::from_secs(1);
/// How old a dashboard overview may be (`OVERVIEW_MAX_AGE`), and a margin.
const OVERVIEW_AGE: Duration = Duration::from_millis(1100);
/// Bound on every wait for the farm to get somewhere.
const PATIENCE: Duration = Duration::from_secs(60);

async fn overview(addr: SocketAddr) -> Value {
    http_client()
        .get(format!("http://{addr}/api/v1/overview"))
        .send()
        .await
        .expect("overview")
        .json()
        .await
        .expect("overview JSON")
}

/// The servant row at `location`.
async fn servant(addr: SocketAddr, location: &str) -> Value {
    overview(addr).await["servants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|servant| servant["location"] == location)
        .cloned()
        .unwrap_or_else(|| panic!("no servant at {location}"))
}

/// Grants ever made on the servant at `location`.
async fn ever_assigned(addr: SocketAddr, location: &str) -> u64 {
    servant(addr, location).await["everAssigned"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Polls `done` every 100 ms for at most [`PATIENCE`]; how long it took.
async fn until<F: Future<Output = bool>>(mut done: impl FnMut() -> F) -> Option<Duration> {
    let started = Instant::now();
    while !done().await {
        if started.elapsed() > PATIENCE {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Some(started.elapsed())
}

async fn act(addr: SocketAddr, method: &str, body: Value) -> Value {
    let (status, answer) = admin_json(addr, method, Some(ADMIN_TOKEN), body).await;
    assert_eq!(status, 200, "{method}: {answer}");
    answer
}

/// The state of the location in `ListServantStates`, if listed.
async fn state_of(addr: SocketAddr, location: &str) -> Option<Value> {
    let listed = act(addr, "ListServantStates", json!({})).await;
    listed["servants"]
        .as_array()?
        .iter()
        .find(|servant| servant["location"] == location)
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordon_drain_and_uncordon_a_servant_of_a_busy_farm() {
    let _heavy = heavy().await;
    let admin_flag = format!("--admin_tokens={ADMIN_TOKEN}");
    let binary = tokio::task::spawn_blocking(move || {
        Launch {
            flags: &[&admin_flag, "--debugging_no_inspect_auth"],
            rust_log: "info,yadcc_scheduler::access=warn,yadcc_scheduler::audit=info",
            ..Launch::default()
        }
        .start()
    })
    .await
    .expect("start the binary");
    let addr = binary.addr;
    let mut config = ClusterConfig::new(
        addr,
        USER_TOKEN,
        SERVANT_TOKEN,
        MACHINES,
        MACHINES,
        // 12 machines x 1 compilation/s x ~2.75 s = ~33 of 48 slots: busy.
        Workload::Rate {
            jobs_per_second: 1.0,
        },
    );
    config.protocol = Wire::Flare;
    config.servant_capacity = Some(4);
    config.delegate.task_duration = Duration::from_millis(1500)..=LONGEST_TASK;
    config.seed = Some(32);
    let cluster = Cluster::start(config);
    assert!(cluster.wait_ready(STEP).await, "servants register");
    let stats = cluster.stats().clone();

    // The busiest servant, once tasks run everywhere.
    let busiest = |overview: Value| {
        overview["servants"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|servant| servant["running"].as_u64() >= Some(2))
            .max_by_key(|servant| servant["running"].as_u64())
            .map(|servant| servant["location"].as_str().unwrap().to_owned())
    };
    let chosen = std::sync::Mutex::new(None);
    let found = until(|| async {
        let location = busiest(overview(addr).await);
        let found = location.is_some();
        *chosen.lock().unwrap() = location;
        found
    })
    .await;
    assert!(
        found.is_some(),
        "no servant ran two tasks:\n{}",
        stats.report()
    );
    let location = chosen.into_inner().unwrap().unwrap();

    // Cordon: no new grant there a second after the answer (there is none
    // after it at all; the bound is a second), while the farm goes
    // on granting elsewhere.
    let grants_before = stats.events.grants_received.load(Relaxed);
    let cordoned = act(
        addr,
        "CordonServant",
        json!({ "location": location, "reason": "compiler broken" }),
    )
    .await;
    let cordoned_at = Instant::now();
    assert_eq!(cordoned["servant"]["state"], "CORDON_STATE_CORDONED");
    let running_at_cordon = cordoned["servant"]["runningTasks"].as_u64().unwrap_or(0);
    // The overview is built at most once a second: read it once it must
    // have been built after the bound.
    tokio::time::sleep((WITHIN + OVERVIEW_AGE).saturating_sub(cordoned_at.elapsed())).await;
    let after_the_bound = ever_assigned(addr, &location).await;

    // Drain: its state reports what still runs there until nothing does.
    let drained = act(
        addr,
        "DrainServant",
        json!({ "location": location, "reason": "disk replacement" }),
    )
    .await;
    let running_at_drain = drained["servant"]["runningTasks"].as_u64().unwrap_or(0);
    let expected = if running_at_drain > 0 {
        "CORDON_STATE_DRAINING"
    } else {
        "CORDON_STATE_DRAINED"
    };
    assert_eq!(drained["servant"]["state"], expected, "{drained}");
    let drained_after = until(|| async {
        state_of(addr, &location)
            .await
            .is_some_and(|state| state["state"] == "CORDON_STATE_DRAINED")
    })
    .await;
    assert!(
        drained_after.is_some(),
        "{location} never drained: {:?}",
        state_of(addr, &location).await
    );
    tokio::time::sleep(OVERVIEW_AGE).await;
    let row = servant(addr, &location).await;
    assert_eq!(row["running"], 0, "{row}");
    assert_eq!(row["cordon"]["state"], "drained", "{row}");
    assert_eq!(row["cordon"]["reason"], "disk replacement", "{row}");
    let grants_elsewhere = stats.events.grants_received.load(Relaxed) - grants_before;
    let at_drained = ever_assigned(addr, &location).await;
    eprintln!(
        "cordoned {location} running {running_at_cordon}; drained {:?} later with \
         {running_at_drain} still running at the drain; {} grants there after the bound; \
         {grants_elsewhere} grants to the farm meanwhile",
        cordoned_at.elapsed(),
        at_drained - after_the_bound,
    );
    assert_eq!(
        at_drained, after_the_bound,
        "a grant went to {location} over a second after its cordon"
    );
    assert!(grants_elsewhere > 0, "the farm stopped granting");

    // Uncordon: it takes tasks again.
    let uncordoned = act(addr, "UncordonServant", json!({ "location": location })).await;
    assert_eq!(uncordoned["wasCordoned"], true);
    let back = until(|| async { ever_assigned(addr, &location).await > at_drained }).await;
    assert!(back.is_some(), "{location} got no grant after its uncordon");
    let report = stats.report().to_string();
    cluster.stop().await;
    eprintln!(
        "drained {:?} after the drain; granted again {:?} after the uncordon",
        drained_after.unwrap(),
        back.unwrap()
    );

    // Nothing running there was killed, no renewal refused, no call failed.
    assert_eq!(stats.events.tasks_killed.load(Relaxed), 0, "{report}");
    assert_eq!(stats.events.renewals_refused.load(Relaxed), 0, "{report}");
    assert_eq!(stats.total_errors(), 0, "{report}");

    // Every action is in the audit list, newest first, and in the log.
    let events = act(addr, "ListAuditEvents", json!({})).await;
    assert_eq!(
        audit_actions(&events),
        ["UncordonServant", "DrainServant", "CordonServant"]
    );
    let who = "token:admin-token-1";
    for event in events["events"].as_array().unwrap() {
        assert_eq!(event["who"], who);
        assert_eq!(event["location"], location.as_str());
        assert_eq!(event["peer"], "127.0.0.1");
    }
    let log = binary.log();
    for action in ["CordonServant", "DrainServant", "UncordonServant"] {
        assert!(
            log.iter().any(|line| line.contains("admin action")
                && line.contains(&format!("action={action}"))
                && line.contains(&format!("who={who}"))
                && line.contains(&format!("location={location}"))
                && line.contains("peer=127.0.0.1")),
            "no log line of {action}:\n{}",
            log.join("\n")
        );
    }
}

#[tokio::test]
async fn a_restart_with_the_state_file_keeps_the_cordons_and_the_audit() {
    let scratch = ScratchDir::new("admin-state");
    let state_flag = format!("--state_file={}", scratch.0.join("admin.json").display());
    let admin_flag = format!("--admin_tokens={ADMIN_TOKEN}");
    let start = |flags: Vec<String>, listen: Option<SocketAddr>| {
        tokio::task::spawn_blocking(move || {
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            Launch {
                listen: listen.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap()),
                flags: &flags,
                ..Launch::default()
            }
            .start()
        })
    };
    let flags = vec![admin_flag.clone(), state_flag.clone()];
    let mut first = start(flags.clone(), None).await.unwrap();
    let addr = first.addr;
    act(
        addr,
        "CordonServant",
        json!({ "location": "127.0.0.2:8335", "reason": "rack 4 power" }),
    )
    .await;
    act(
        addr,
        "DrainServant",
        json!({ "location": "127.0.0.3:8335" }),
    )
    .await;
    // SIGKILL: nothing is written on the way out.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    // What the running scheduler wrote: the file alone (no temporary file
    // left beside it), readable by its owner only.
    let names: Vec<_> = std::fs::read_dir(&scratch.0)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(names, ["admin.json"]);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(scratch.0.join("admin.json"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the state file is {mode:o}");

    let second = start(flags, Some(addr)).await.unwrap();
    let kept = state_of(addr, "127.0.0.2:8335")
        .await
        .expect("still cordoned");
    assert_eq!(kept["state"], "CORDON_STATE_CORDONED");
    assert_eq!(kept["reason"], "rack 4 power");
    assert_eq!(
        state_of(addr, "127.0.0.3:8335").await.unwrap()["state"],
        "CORDON_STATE_DRAINED"
    );
    let events = act(addr, "ListAuditEvents", json!({})).await;
    assert_eq!(
        events["events"].as_array().map(Vec::len),
        Some(2),
        "{events}"
    );
    // The servant that registers there gets no grant...
    let mut connection =
        Connection::open_from(second.addr, Some("127.0.0.2".parse().unwrap())).await;
    let beat = heartbeat("127.0.0.2:8335", 4);
    connection
        .send(&daemon_request(
            Method::Heartbeat,
            1,
            &prost::Message::encode_to_vec(&beat),
            None,
        ))
        .await;
    assert_eq!(connection.read_response().await.status, 200);
    let wait = |ms| async move {
        let request = wait_request(ms, 1, 0);
        call_http_pb(addr, Method::WaitForStartingTask, &request).await
    };
    assert_eq!(
        wait(0).await.status,
        429,
        "no quota: the only servant is cordoned"
    );
    // ...until it is uncordoned.
    act(
        addr,
        "UncordonServant",
        json!({ "location": "127.0.0.2:8335" }),
    )
    .await;
    assert_eq!(wait(1000).await.status, 200);
    drop(second);

    // Without the file the same restart forgets them: the file is what kept them.
    let third = start(vec![admin_flag], Some(addr)).await.unwrap();
    let listed = act(third.addr, "ListServantStates", json!({})).await;
    assert_eq!(listed, json!({}), "nothing cordoned without --state_file");
    drop(third);

    // A file holding more cordons than the scheduler holds is refused whole
    // at start: cutting it would put servants back into rotation unsaid.
    let path = scratch.0.join("admin.json");
    let mut saved: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let one = saved["cordons"][0].clone();
    saved["cordons"] = (0..1001)
        .map(|i| {
            let mut cordon = one.clone();
            cordon["location"] = json!(format!("10.0.{}.{}:8335", i / 250, i % 250));
            cordon
        })
        .collect();
    std::fs::write(&path, serde_json::to_vec(&saved).unwrap()).unwrap();
    let mut refused = bounded(STEP, env!("CARGO_BIN_EXE_yadcc-scheduler"));
    refused.args([
        "--listen=127.0.0.1:0".to_owned(),
        "--acceptable_user_tokens=u".to_owned(),
        "--acceptable_servant_tokens=s".to_owned(),
        state_flag,
    ]);
    let output = run_bounded(refused).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "started with 1001 cordons");
    assert!(
        stderr.contains("1001 cordons, more than the 1000"),
        "{stderr}"
    );
}
