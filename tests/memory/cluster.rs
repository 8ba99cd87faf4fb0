//! The scheduler every attack runs against: the real binary, with 40,960
//! running tasks (a `GetRunningTasks` answer of about 3.5 MB), built in a
//! few dozen calls: five servants offering 8,192 slots each, 40 grant calls
//! of 1,024 grants, then one heartbeat per servant reporting its grants.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use prost::Message;
use yadcc_pb as pb;

use yadcc_loadgen::process;

use crate::support::{
    Binary, Connection, DIGEST, Method, SERVANT_TOKEN, USER_TOKEN, flare_request_uncompressed,
    heartbeat, servant_location,
};

/// Servants, each running the most tasks one heartbeat may report.
const SERVANTS: u16 = 5;
const TASKS_PER_SERVANT: usize = 8192;
pub const RUNNING_TASKS: usize = SERVANTS as usize * TASKS_PER_SERVANT;
/// The answer these tasks make, at least (a task is about 90 bytes).
pub const MIN_ANSWER_BYTES: usize = 3 << 20;

/// Where the attackers connect from; the legitimate client is elsewhere.
pub const ATTACKER: &str = "127.0.0.1";
pub const LEGITIMATE: &str = "127.0.0.2";

pub fn ip(text: &str) -> IpAddr {
    text.parse().expect("an IP address")
}

/// A scheduler with [`RUNNING_TASKS`] running tasks. Grants live 30 s and
/// servants announce their next heartbeat in 30 s: longer than any test.
/// `extra_flags` go on its command line.
pub async fn scheduler_with_running_tasks(extra_flags: Vec<String>) -> Binary {
    let binary = tokio::task::spawn_blocking(move || {
        let mut flags = vec!["--servant_min_memory_for_accepting_new_task=0"];
        flags.extend(extra_flags.iter().map(String::as_str));
        Binary::start(&flags, None)
    })
    .await
    .expect("start the binary");
    let started = Instant::now();
    let mut servants = Connection::open_from(binary.addr, Some(ip(ATTACKER))).await;
    let locations: Vec<String> = (0..SERVANTS)
        .map(|index| servant_location(ATTACKER, 30_000 + index))
        .collect();
    let mut next_id = 1;
    let mut call = async |connection: &mut Connection, method, message: Vec<u8>| {
        next_id += 1;
        connection
            .send(&flare_request_uncompressed(
                next_id, method, 30_000, &message,
            ))
            .await;
        let answer = connection.read_flare().await;
        assert_eq!(answer.status(), 0, "{method:?}: {}", answer.description());
        answer.payload
    };
    for location in &locations {
        call(
            &mut servants,
            Method::Heartbeat,
            servant(location, Vec::new()),
        )
        .await;
    }
    let mut delegate = Connection::open_from(binary.addr, Some(ip("127.0.0.9"))).await;
    let mut granted: Vec<Vec<u64>> = vec![Vec::new(); locations.len()];
    while granted.iter().map(Vec::len).sum::<usize>() < RUNNING_TASKS {
        let request = pb::WaitForStartingTaskRequest {
            token: USER_TOKEN.into(),
            milliseconds_to_wait: 0,
            env_desc: Some(pb::EnvironmentDesc {
                compiler_digest: DIGEST.into(),
            }),
            immediate_reqs: 1024,
            prefetch_reqs: 0,
            next_keep_alive_in_ms: 30_000,
            min_version: 0,
        };
        let answer = call(
            &mut delegate,
            Method::WaitForStartingTask,
            request.encode_to_vec(),
        )
        .await;
        let answer = pb::WaitForStartingTaskResponse::decode(answer).expect("grants");
        assert!(!answer.grants.is_empty(), "the servants have room");
        for grant in answer.grants {
            let at = locations
                .iter()
                .position(|location| *location == grant.servant_location)
                .expect("a grant on one of the servants");
            granted[at].push(grant.task_grant_id);
        }
    }
    for (location, grants) in locations.iter().zip(&granted) {
        let tasks = grants
            .iter()
            .enumerate()
            .map(|(index, &grant)| pb::RunningTask {
                servant_task_id: index as u64 + 1,
                task_grant_id: grant,
                servant_location: String::new(),
                task_digest: format!("{grant:064x}"),
            })
            .collect();
        call(&mut servants, Method::Heartbeat, servant(location, tasks)).await;
    }
    // The list is rebuilt at most once a second.
    let answer_bytes = loop {
        let answer = call(&mut delegate, Method::GetRunningTasks, Vec::new()).await;
        if answer.len() >= MIN_ANSWER_BYTES || started.elapsed() > Duration::from_secs(10) {
            break answer.len();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        answer_bytes >= MIN_ANSWER_BYTES,
        "GetRunningTasks answers {answer_bytes} bytes"
    );
    println!(
        "memory: {RUNNING_TASKS} running tasks, a {answer_bytes}-byte GetRunningTasks answer, \
         set up in {} ms; peak RSS so far {} MiB",
        started.elapsed().as_millis(),
        usage(binary.child.id()).1 / 1024
    );
    binary
}

/// A heartbeat of the servant at `location` offering 8,192 slots and
/// reporting `tasks`.
fn servant(location: &str, tasks: Vec<pb::RunningTask>) -> Vec<u8> {
    pb::HeartbeatRequest {
        token: SERVANT_TOKEN.into(),
        next_heartbeat_in_ms: 30_000,
        num_processors: TASKS_PER_SERVANT as u32,
        capacity: TASKS_PER_SERVANT as u32,
        total_memory_in_bytes: 1 << 40,
        memory_available_in_bytes: 1 << 40,
        running_tasks: tasks,
        ..heartbeat(location, TASKS_PER_SERVANT as u32)
    }
    .encode_to_vec()
}

/// The scheduler's CPU time so far and its peak resident set (`VmHWM`), KiB.
pub fn usage(pid: u32) -> (Duration, u64) {
    let sample = process::sample(pid).expect("the scheduler's /proc");
    (sample.cpu, sample.peak_rss_kib)
}
