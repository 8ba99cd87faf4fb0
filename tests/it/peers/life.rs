//! One stock daemon's whole life against this scheduler, every call it makes
//! and every answer it gets recorded by a proxy between the two (the proxy
//! forwards bytes unchanged and decodes copies of the flare frames): it
//! registers with its first heartbeat, heartbeats every second, fetches the
//! serving-daemon token with `GetConfig`, is granted a slot for its own
//! compilation and renews and frees it, gets from `GetRunningTasks` the task
//! running on the other daemon (the servant), and when stopped leaves with a
//! last heartbeat whose `next_heartbeat_in_ms` is 0, which the scheduler
//! honours at once instead of waiting for the previous heartbeat to expire.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::{Buf, Bytes, BytesMut};
use prost::Message;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use yadcc_pb::{self as pb, Method, flare::rpc::RpcMeta};

use super::{
    Lan, Peers, location, remote_compile, scheduler, scheduler_complaints, servant_and_delegate,
    servant_at, until_dump,
};
use crate::support::{bounded, heavy, run_bounded};

/// How long the slow compilation should run: long enough for the servant to
/// report it and the delegate to ask for the list a few times (both do so
/// every second).
const SLOW_COMPILE: Duration = Duration::from_secs(8);
/// Rounds of `slow.cc` timed locally to size the slow compilation.
const CALIBRATION_ROUNDS: u64 = 50_000;
const SLOW_SOURCE: &str = include_str!("slow.cc");
/// The heartbeat period the daemon announces (`next_heartbeat_in_ms`) while
/// it lives.
const DAEMON_HEARTBEAT_EXPIRY_MS: u32 = 10_000;

/// One call through the proxy, and its answer once it came.
struct Exchange {
    connection: usize,
    id: u64,
    method: Option<Method>,
    request: Bytes,
    answer: Option<StreamAnswer>,
}

struct StreamAnswer {
    status: i32,
    compressed: bool,
    payload: Bytes,
    at: Instant,
}

#[derive(Default)]
struct Recording {
    exchanges: Vec<Exchange>,
    /// Frames that did not parse, which fail the test.
    garbled: Vec<String>,
}

type Shared = Arc<Mutex<Recording>>;

/// Takes whole flare frames off the front of `buffer`: (meta, payload).
fn frames(buffer: &mut BytesMut) -> Result<Vec<(RpcMeta, Bytes)>, String> {
    let mut out = Vec::new();
    while buffer.len() >= 16 {
        if &buffer[..4] != b"CPRF" {
            return Err(format!("no frame magic: {:02x?}", &buffer[..4]));
        }
        let word = |at: usize| u32::from_le_bytes(buffer[at..at + 4].try_into().unwrap()) as usize;
        let (meta_len, payload_len, attachment_len) = (word(4), word(8), word(12));
        let total = 16 + meta_len + payload_len + attachment_len;
        if buffer.len() < total {
            break;
        }
        let mut frame = buffer.split_to(total).freeze();
        frame.advance(16);
        let meta = RpcMeta::decode(frame.split_to(meta_len)).map_err(|error| error.to_string())?;
        out.push((meta, frame.split_to(payload_len)));
    }
    Ok(out)
}

/// Copies `from` to `to` until either side ends, recording each frame.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    connection: usize,
    requests: bool,
    recording: Shared,
) {
    let mut buffer = BytesMut::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        // Recorded before it is forwarded: the answer to a request may
        // otherwise come back, on the other pump, before the request is
        // recorded, and look like an answer to no call.
        buffer.extend_from_slice(&chunk[..read]);
        let parsed = frames(&mut buffer);
        record(&recording, parsed, &mut buffer, connection, requests);
        if to.write_all(&chunk[..read]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Records the frames one pump read: requests as new exchanges, answers
/// into the exchange they answer.
fn record(
    recording: &Shared,
    parsed: Result<Vec<(RpcMeta, Bytes)>, String>,
    buffer: &mut BytesMut,
    connection: usize,
    requests: bool,
) {
    let mut recording = recording.lock().unwrap();
    match parsed {
        Err(error) => {
            recording.garbled.push(error);
            buffer.clear();
        }
        Ok(parsed) => {
            for (meta, payload) in parsed {
                if requests {
                    let method = meta.request_meta.as_ref().and_then(|request| {
                        Method::ALL
                            .into_iter()
                            .find(|method| method.full_name() == request.method_name)
                    });
                    recording.exchanges.push(Exchange {
                        connection,
                        id: meta.correlation_id,
                        method,
                        request: payload,
                        answer: None,
                    });
                } else {
                    let answer = StreamAnswer {
                        status: meta.response_meta.as_ref().map_or(-1, |meta| meta.status),
                        compressed: meta
                            .compression_algorithm
                            .is_some_and(|algorithm| algorithm > 1),
                        payload,
                        at: Instant::now(),
                    };
                    match recording.exchanges.iter_mut().rev().find(|exchange| {
                        exchange.connection == connection && exchange.id == meta.correlation_id
                    }) {
                        Some(exchange) => exchange.answer = Some(answer),
                        None => recording
                            .garbled
                            .push(format!("an answer to no call: {}", meta.correlation_id)),
                    }
                }
            }
        }
    }
}

/// A proxy on `listener` to `upstream`, recording both directions.
fn start_proxy(listener: TcpListener, upstream: SocketAddr, recording: Shared) {
    tokio::spawn(async move {
        let mut connections = 0;
        while let Ok((downstream, _)) = listener.accept().await {
            let Ok(upstream) = TcpStream::connect(upstream).await else {
                continue;
            };
            connections += 1;
            let (down_read, down_write) = downstream.into_split();
            let (up_read, up_write) = upstream.into_split();
            tokio::spawn(pump(
                down_read,
                up_write,
                connections,
                true,
                recording.clone(),
            ));
            tokio::spawn(pump(
                up_read,
                down_write,
                connections,
                false,
                recording.clone(),
            ));
        }
    });
}

/// A recorded call, decoded.
struct Call<Request, Reply> {
    request: Request,
    /// The answer's status, message (default unless the status is 0) and
    /// when it passed the proxy.
    answer: Option<(i32, Reply, Instant)>,
}

/// The daemon's calls of `method` in order.
fn calls_of<Request: Message + Default, Reply: Message + Default>(
    recording: &Recording,
    method: Method,
) -> Vec<Call<Request, Reply>> {
    recording
        .exchanges
        .iter()
        .filter(|exchange| exchange.method == Some(method))
        .map(|exchange| Call {
            request: Request::decode(exchange.request.clone()).expect("a request"),
            answer: exchange.answer.as_ref().map(|answer| {
                let reply = if answer.status == 0 {
                    Reply::decode(answer.payload.clone()).expect("an answer")
                } else {
                    Reply::default()
                };
                (answer.status, reply, answer.at)
            }),
        })
        .collect()
}

/// Whether some `GetRunningTasks` answer so far listed a task running at
/// `servant`.
fn listed_at(recording: &Recording, servant: &str) -> bool {
    calls_of::<pb::GetRunningTasksRequest, pb::GetRunningTasksResponse>(
        recording,
        Method::GetRunningTasks,
    )
    .iter()
    .filter_map(|call| call.answer.as_ref())
    .any(|(_, reply, _)| {
        reply
            .running_tasks
            .iter()
            .any(|task| task.servant_location == servant)
    })
}

/// `SLOW_COMPILE`'s worth of `slow.cc` rounds on this machine now, from a
/// local compilation of [`CALIBRATION_ROUNDS`].
async fn slow_rounds(lan: &Lan) -> u64 {
    let started = Instant::now();
    let mut command = bounded(super::COMPILE_LIMIT, "g++");
    command
        .current_dir(&lan.work)
        .args(slow_flags(CALIBRATION_ROUNDS))
        .args(["-o", "calibration.o"]);
    let output = run_bounded(command).await;
    assert!(
        output.status.success(),
        "g++ slow.cc: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let took = started.elapsed().as_secs_f64().max(0.01);
    ((CALIBRATION_ROUNDS as f64 * SLOW_COMPILE.as_secs_f64() / took) as u64)
        .clamp(CALIBRATION_ROUNDS, 100 * CALIBRATION_ROUNDS)
}

fn slow_flags(rounds: u64) -> Vec<String> {
    vec![
        "-std=c++17".to_owned(),
        format!("-DSPIN={rounds}"),
        "-fconstexpr-loop-limit=2000000000".to_owned(),
        "-fconstexpr-ops-limit=1000000000000".to_owned(),
        "-c".to_owned(),
        "slow.cc".to_owned(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the original yadcc ($YADCC_PEERS), root and network namespaces: scripts/test.sh runs it"]
async fn a_real_daemon_lives_registers_heartbeats_lists_tasks_and_leaves_gracefully() {
    let _heavy = heavy().await;
    let peers = Peers::required();
    let started = Instant::now();
    let lan = Lan::new(&["servant", "delegate"]);
    let scheduler = scheduler(&lan);
    let recording = Shared::default();
    let proxy = TcpListener::bind(SocketAddr::from((lan.host_ip(), 0)))
        .await
        .expect("the proxy's port");
    let proxy_addr = proxy.local_addr().expect("the proxy's address");
    start_proxy(proxy, scheduler.addr, recording.clone());

    let (mut servant, mut delegate) =
        servant_and_delegate(&peers, &lan, scheduler.addr, proxy_addr).await;
    let (servant_location, delegate_location) =
        (location(lan.ip("servant")), location(lan.ip("delegate")));

    // The delegate's own compilation, running on the servant for seconds.
    std::fs::write(lan.work.join("slow.cc"), SLOW_SOURCE).expect("the source");
    // The machine's load changes between the calibration and the
    // compilation: one that ended too soon to be seen running is done again
    // twice as long (the assertion on the listing below is unchanged).
    let mut rounds = slow_rounds(&lan).await;
    let (compiled, compile_took) = loop {
        let mut args = slow_flags(rounds);
        args.extend(["-o".to_owned(), "slow.o".to_owned()]);
        let compiled_at = Instant::now();
        let compiled = remote_compile(&peers, &lan, &args).await;
        let took = compiled_at.elapsed();
        let seen = listed_at(&recording.lock().unwrap(), &servant_location);
        if compiled.is_err()
            || seen
            || took >= SLOW_COMPILE / 2
            || rounds >= 64 * CALIBRATION_ROUNDS
        {
            break (compiled, took);
        }
        rounds *= 2;
    };

    let exit = delegate.stop().await;
    let stopped_at = Instant::now();
    // What the scheduler made of the leave: the delegate gone before the
    // expiry its previous heartbeat announced.
    let gone = until_dump(
        scheduler.addr,
        Duration::from_millis(u64::from(DAEMON_HEARTBEAT_EXPIRY_MS)),
        |dump| servant_at(dump, &delegate_location).is_none(),
    )
    .await;
    let gone_at = Instant::now();
    servant.stop().await;
    let delegate_log = delegate.log_text();
    let recording = recording.lock().unwrap();

    let mut failures = Vec::new();
    if let Err(error) = &compiled {
        failures.push(format!("the compilation failed: {error}"));
    }
    if !exit.success() {
        failures.push(format!("the daemon stopped with {exit}"));
    }
    failures.extend(
        recording
            .garbled
            .iter()
            .map(|garbled| format!("garbled: {garbled}")),
    );
    for exchange in &recording.exchanges {
        let method = exchange.method.map_or("an unknown method", Method::name);
        match &exchange.answer {
            None if exchange.method != Some(Method::WaitForStartingTask) => {
                failures.push(format!("{method} call {} was never answered", exchange.id))
            }
            Some(answer) if answer.compressed => failures.push(format!(
                "{method} answered compressed, which this test cannot read"
            )),
            Some(answer)
                if answer.status != 0
                    && !(exchange.method == Some(Method::WaitForStartingTask)
                        && answer.status == 1001) =>
            {
                failures.push(format!("{method} answered with status {}", answer.status))
            }
            _ => {}
        }
    }

    // Registration, heartbeats and the leave.
    let heartbeats =
        calls_of::<pb::HeartbeatRequest, pb::HeartbeatResponse>(&recording, Method::Heartbeat);
    let periods: Vec<u32> = heartbeats
        .iter()
        .map(|call| call.request.next_heartbeat_in_ms)
        .collect();
    match periods.split_last() {
        Some((&last, living)) if living.len() >= 2 => {
            if living
                .iter()
                .any(|&period| period != DAEMON_HEARTBEAT_EXPIRY_MS)
            {
                failures.push(format!("heartbeats announced {periods:?}"));
            }
            if last != 0 {
                failures.push(format!(
                    "the last heartbeat announced {last} ms, not a leave: {periods:?}"
                ));
            }
        }
        _ => failures.push(format!("too few heartbeats: {periods:?}")),
    }
    if heartbeats
        .iter()
        .any(|call| call.request.location != delegate_location)
    {
        failures.push("a heartbeat reported another location".to_owned());
    }
    let accepted_tokens: Vec<String> = heartbeats
        .iter()
        .filter_map(|call| call.answer.as_ref())
        .flat_map(|(_, reply, _)| reply.acceptable_tokens.clone())
        .collect();
    if accepted_tokens.is_empty() {
        failures.push("no heartbeat answer named the tokens servants accept".to_owned());
    }
    let last_living_answer = heartbeats
        .iter()
        .rev()
        .nth(1)
        .and_then(|call| call.answer.as_ref().map(|(_, _, at)| *at));
    match (gone, last_living_answer) {
        (Ok(_), Some(last_living)) => {
            // The expiry the last living heartbeat set; removal before it is
            // the leave honoured.
            if gone_at >= last_living + Duration::from_millis(u64::from(DAEMON_HEARTBEAT_EXPIRY_MS))
            {
                failures.push(
                    "the scheduler dropped the daemon only when its heartbeat expired".to_owned(),
                );
            }
        }
        (Err(dump), _) => failures.push(format!(
            "the scheduler still lists the daemon {:?} after it left: {dump}",
            gone_at - stopped_at
        )),
        (Ok(_), None) => {}
    }

    // GetConfig: the token other daemons accept from it.
    let configs =
        calls_of::<pb::GetConfigRequest, pb::GetConfigResponse>(&recording, Method::GetConfig);
    let tokens: Vec<&str> = configs
        .iter()
        .filter_map(|call| call.answer.as_ref())
        .map(|(_, reply, _)| reply.serving_daemon_token.as_str())
        .collect();
    if tokens.is_empty() || tokens.iter().any(|token| token.is_empty()) {
        failures.push(format!(
            "GetConfig gave no serving-daemon token: {} calls",
            configs.len()
        ));
    } else if !tokens
        .iter()
        .any(|token| accepted_tokens.iter().any(|accepted| accepted == token))
    {
        failures.push("GetConfig's token is not one servants are told to accept".to_owned());
    }

    // Its own compilation: granted on the servant, renewed, freed.
    let waits = calls_of::<pb::WaitForStartingTaskRequest, pb::WaitForStartingTaskResponse>(
        &recording,
        Method::WaitForStartingTask,
    );
    let grants: Vec<pb::StartingTaskGrant> = waits
        .iter()
        .filter_map(|call| call.answer.as_ref())
        .flat_map(|(_, reply, _)| reply.grants.clone())
        .collect();
    if !grants
        .iter()
        .any(|grant| grant.servant_location == servant_location)
    {
        failures.push(format!("no grant on the servant: {grants:?}"));
    }
    let freed: Vec<u64> =
        calls_of::<pb::FreeTaskRequest, pb::FreeTaskResponse>(&recording, Method::FreeTask)
            .into_iter()
            .flat_map(|call| call.request.task_grant_ids)
            .collect();
    let used: Vec<u64> = grants
        .iter()
        .filter(|grant| grant.servant_location == servant_location)
        .map(|grant| grant.task_grant_id)
        .collect();
    if !used.iter().any(|id| freed.contains(id)) {
        failures.push(format!(
            "none of the grants {used:?} was freed (freed: {freed:?})"
        ));
    }
    let renewals = calls_of::<pb::KeepTaskAliveRequest, pb::KeepTaskAliveResponse>(
        &recording,
        Method::KeepTaskAlive,
    );
    if !renewals.iter().any(|call| {
        call.answer
            .as_ref()
            .is_some_and(|(_, reply, _)| reply.statuses.contains(&true))
    }) {
        failures.push(format!(
            "no renewal granted in {} KeepTaskAlive calls",
            renewals.len()
        ));
    }

    // GetRunningTasks: the task running on the servant, as delegates need it.
    let lists = calls_of::<pb::GetRunningTasksRequest, pb::GetRunningTasksResponse>(
        &recording,
        Method::GetRunningTasks,
    );
    let listed = lists
        .iter()
        .filter_map(|call| call.answer.as_ref())
        .flat_map(|(_, reply, _)| reply.running_tasks.clone())
        .find(|task| task.servant_location == servant_location);
    match &listed {
        None => failures.push(format!(
            "none of {} GetRunningTasks answers listed the task running on the servant \
             (the compilation took {compile_took:?})",
            lists.len()
        )),
        Some(task) => {
            if task.task_digest.is_empty() || task.servant_task_id == 0 || task.task_grant_id != 0 {
                failures.push(format!(
                    "the listed task is not as delegates need it: {task:?}"
                ));
            }
        }
    }

    for complaint in scheduler_complaints(&delegate_log) {
        failures.push(format!("the daemon logged: {complaint}"));
    }
    println!(
        "daemon life: {} heartbeats (last announcing {} ms), {} GetConfig, {} GetRunningTasks \
         (the servant's task listed: {}), {} WaitForStartingTask, {} KeepTaskAlive, {} FreeTask; \
         compilation {:.1} s; gone from the scheduler {:.1} s after the daemon exited; all {:.1} s",
        heartbeats.len(),
        periods.last().copied().unwrap_or_default(),
        configs.len(),
        lists.len(),
        if listed.is_some() { "yes" } else { "NO" },
        waits.len(),
        renewals.len(),
        freed.len(),
        compile_took.as_secs_f64(),
        (gone_at - stopped_at).as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    assert!(
        failures.is_empty(),
        "{}\n\ndelegate:\n{delegate_log}\nservant:\n{}",
        failures.join("\n"),
        servant.log_text()
    );
}
