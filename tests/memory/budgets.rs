//! Issue 45: bodies in flight are charged to who sends them. Five servants
//! on addresses of their own run 8,192 tasks each (40,960), and every
//! heartbeat reports them all (about 800 KB) on a new connection, as
//! daemons do after a restart, a failover or an idle close. Meanwhile an
//! attacker holds stalled gRPC bodies: without a token from one address,
//! with a proved user token from one address, and with a proved token from
//! six. No heartbeat may fail and no task may be lost (listed for killing
//! in a heartbeat's answer, or gone from the running tasks).

use std::{
    convert::Infallible,
    net::SocketAddr,
    time::{Duration, Instant},
};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use prost::Message;
use tokio::{sync::oneshot, task::JoinSet};
use yadcc_pb as pb;
use yadcc_sim::{
    client::SerialConn,
    wire::{self, Outcome, Wire},
};

use crate::{
    attacks::{framed, grpc, http2_from},
    cluster::ip,
    env_number,
    support::{
        Binary, Connection, DIGEST, Method, SERVANT_TOKEN, STEP, USER_TOKEN,
        flare_request_uncompressed, heartbeat, heavy, servant_location,
    },
};

const SERVANTS: [&str; 5] = [
    "127.0.0.2",
    "127.0.0.5",
    "127.0.0.6",
    "127.0.0.7",
    "127.0.0.8",
];
const TASKS_PER_SERVANT: usize = 8192;
/// A servant whose heartbeats fail for this long is gone, with its tasks.
const NEXT_HEARTBEAT_MS: u32 = 10_000;
/// Between two heartbeats of the farm (each servant beats every second).
const HEARTBEAT_PERIOD: Duration = Duration::from_millis(200);
/// gRPC streams the attacker holds in all, spread over its connections.
const ATTACK_STREAMS: usize = 4_000;
const STREAMS_PER_CONNECTION: usize = 200;

#[derive(Debug, Clone, Copy)]
enum Attacker {
    NoToken,
    ProvedToken,
    ProvedTokenFromSixAddresses,
}

impl Attacker {
    fn addresses(self) -> &'static [&'static str] {
        match self {
            Attacker::NoToken | Attacker::ProvedToken => &["127.0.0.1"],
            Attacker::ProvedTokenFromSixAddresses => &[
                "127.0.0.1",
                "127.0.0.3",
                "127.0.0.4",
                "127.0.0.10",
                "127.0.0.11",
                "127.0.0.12",
            ],
        }
    }

    fn proves(self) -> bool {
        !matches!(self, Attacker::NoToken)
    }
}

/// One servant of the farm: where it calls from and what it reports.
struct Servant {
    address: &'static str,
    heartbeat: Vec<u8>,
}

fn servant_heartbeat(address: &str, grants: &[u64]) -> Vec<u8> {
    let location = servant_location(address, 8335);
    pb::HeartbeatRequest {
        token: SERVANT_TOKEN.into(),
        next_heartbeat_in_ms: NEXT_HEARTBEAT_MS,
        num_processors: TASKS_PER_SERVANT as u32,
        total_memory_in_bytes: 1 << 40,
        memory_available_in_bytes: 1 << 40,
        running_tasks: grants
            .iter()
            .enumerate()
            .map(|(index, &grant)| pb::RunningTask {
                servant_task_id: index as u64 + 1,
                task_grant_id: grant,
                servant_location: location.clone(),
                task_digest: format!("{grant:064x}"),
            })
            .collect(),
        ..heartbeat(&location, TASKS_PER_SERVANT as u32)
    }
    .encode_to_vec()
}

/// One heartbeat of `servant` on a new flare connection: the grant ids the
/// scheduler says to kill, or what went wrong.
async fn beat(addr: SocketAddr, servant: &Servant) -> Result<Vec<u64>, String> {
    let call = async {
        let mut connection = SerialConn::connect(Some(ip(servant.address)), addr, Wire::Flare)
            .await
            .map_err(|error| format!("connect: {error}"))?;
        let mut request = BytesMut::new();
        wire::encode_flare_request(
            &mut request,
            1,
            Method::Heartbeat,
            Duration::from_secs(5),
            &servant.heartbeat,
        );
        let answer = connection
            .exchange(&request)
            .await
            .map_err(|error| format!("{error}"))?;
        match answer.outcome {
            Outcome::Ok(payload) => pb::HeartbeatResponse::decode(payload)
                .map(|response| response.expired_tasks)
                .map_err(|error| format!("the answer: {error}")),
            failed => Err(format!("{failed:?}")),
        }
    };
    tokio::time::timeout(STEP, call)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {STEP:?}")))
}

/// The farm of [`SERVANTS`], each running [`TASKS_PER_SERVANT`] tasks
/// granted to a delegate, on the binary at `addr`.
async fn farm(addr: SocketAddr) -> Vec<Servant> {
    let mut servants: Vec<Servant> = SERVANTS
        .iter()
        .map(|&address| Servant {
            address,
            heartbeat: servant_heartbeat(address, &[]),
        })
        .collect();
    for servant in &servants {
        beat(addr, servant).await.expect("an empty heartbeat");
    }
    let mut delegate = Connection::open_from(addr, Some(ip("127.0.0.9"))).await;
    let mut granted: Vec<Vec<u64>> = vec![Vec::new(); SERVANTS.len()];
    let locations: Vec<String> = SERVANTS
        .iter()
        .map(|address| servant_location(address, 8335))
        .collect();
    for id in 1.. {
        if granted.iter().map(Vec::len).sum::<usize>() >= SERVANTS.len() * TASKS_PER_SERVANT {
            break;
        }
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
        delegate
            .send(&flare_request_uncompressed(
                id,
                Method::WaitForStartingTask,
                30_000,
                &request.encode_to_vec(),
            ))
            .await;
        let answer = delegate.read_flare().await;
        assert_eq!(answer.status(), 0, "grants: {}", answer.description());
        let answer = pb::WaitForStartingTaskResponse::decode(answer.payload).expect("grants");
        assert!(!answer.grants.is_empty(), "the servants have room");
        for grant in answer.grants {
            let at = locations
                .iter()
                .position(|location| *location == grant.servant_location)
                .expect("a grant on one of the servants");
            granted[at].push(grant.task_grant_id);
        }
    }
    for (servant, grants) in servants.iter_mut().zip(&granted) {
        servant.heartbeat = servant_heartbeat(servant.address, grants);
        let killed = beat(addr, servant).await.expect("a full heartbeat");
        assert!(killed.is_empty(), "no task is dead yet");
    }
    servants
}

/// Holds stalled gRPC bodies from `attacker`'s addresses until dropped.
struct Attacking {
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Attacking {
    /// Starts the attack from a thread and runtime of its own; returns once
    /// every stream is sent (and, with a token, every connection proved).
    fn start(attacker: Attacker, addr: SocketAddr) -> Attacking {
        let (stop, stopped) = oneshot::channel::<()>();
        let (started, ready) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the attacker's runtime");
            runtime.block_on(async move {
                let mut held = JoinSet::new();
                let addresses = attacker.addresses();
                let connections = ATTACK_STREAMS / STREAMS_PER_CONNECTION;
                for index in 0..connections {
                    let from = addresses[index % addresses.len()];
                    let mut sender = http2_from(&mut held, from, addr, None).await;
                    if attacker.proves() {
                        let config = pb::GetConfigRequest {
                            token: USER_TOKEN.into(),
                        }
                        .encode_to_vec();
                        let answer = sender
                            .send_request(grpc("GetConfig", Body::from(framed(&config))))
                            .await
                            .expect("GetConfig");
                        let trailers = answer.into_body().collect().await.expect("answered");
                        let status = trailers.trailers().and_then(|t| t.get("grpc-status"));
                        assert_eq!(
                            status.map(|s| s.as_bytes()),
                            Some(&b"0"[..]),
                            "the token proved"
                        );
                    }
                    for _ in 0..STREAMS_PER_CONNECTION {
                        // A message announced larger than what is sent.
                        let mut first = vec![0u8; 62_000];
                        first[1..5].copy_from_slice(&100_000u32.to_be_bytes());
                        let body = futures_util::stream::once(async move {
                            Ok::<_, Infallible>(Bytes::from(first))
                        })
                        .chain(futures_util::stream::pending());
                        let mut sender = sender.clone();
                        held.spawn(async move {
                            let answer = sender
                                .send_request(grpc("Heartbeat", Body::from_stream(body)))
                                .await;
                            std::future::pending::<()>().await;
                            drop(answer);
                        });
                    }
                }
                // Let the streams' bodies reach the server.
                tokio::time::sleep(Duration::from_secs(2)).await;
                let _ = started.send(());
                let _ = stopped.await;
                drop(held);
            });
        });
        ready.recv_timeout(STEP * 6).expect("the attack started");
        Attacking { stop, thread }
    }

    fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().expect("the attacker's thread");
    }
}

/// Runs `attacker` against a fresh scheduler's farm: every heartbeat
/// answered, no task killed.
async fn heartbeats_survive(attacker: Attacker) {
    let _alone = heavy().await;
    let binary = tokio::task::spawn_blocking(|| {
        Binary::start(&["--servant_min_memory_for_accepting_new_task=0"], None)
    })
    .await
    .expect("start the binary");
    let servants = farm(binary.addr).await;
    // The farm beats on while the attack builds up (a servant silent for
    // longer than its announced interval is gone with its tasks), and for
    // `length` once it is on.
    let addr = binary.addr;
    let mut starting = tokio::task::spawn_blocking(move || Attacking::start(attacker, addr));
    let mut attacking = None;
    let length = Duration::from_secs(env_number("YADCC_MEMORY_ATTACK_SECONDS", 10));
    let mut attacked_since = None;
    let (mut beats, mut failed, mut killed) = (0, Vec::new(), 0);
    for servant in servants.iter().cycle() {
        if attacked_since.is_some_and(|since: Instant| since.elapsed() >= length) {
            break;
        }
        let sent = Instant::now();
        beats += 1;
        match beat(binary.addr, servant).await {
            Ok(expired) => killed += expired.len(),
            Err(error) => failed.push(format!("{}: {error}", servant.address)),
        }
        if attacking.is_none() && starting.is_finished() {
            attacking = Some((&mut starting).await.expect("the attack started"));
            attacked_since = Some(Instant::now());
        }
        tokio::time::sleep(HEARTBEAT_PERIOD.saturating_sub(sent.elapsed())).await;
    }
    let attacking = attacking.expect("the attack ran");
    attacking.stop();
    // After the attack: whatever the scheduler lost, it now tells the
    // servants to kill.
    for servant in &servants {
        killed += beat(binary.addr, servant)
            .await
            .expect("a heartbeat after the attack")
            .len();
    }
    println!(
        "budgets: {attacker:?}: {beats} heartbeats of {TASKS_PER_SERVANT} tasks on new \
         connections, {} failed, {killed} of {} tasks killed{}",
        failed.len(),
        SERVANTS.len() * TASKS_PER_SERVANT,
        failed
            .first()
            .map(|error| format!("; first failure: {error}"))
            .unwrap_or_default()
    );
    assert_eq!(
        failed,
        Vec::<String>::new(),
        "{attacker:?}: heartbeats failed"
    );
    assert_eq!(killed, 0, "{attacker:?}: tasks killed");
}

#[tokio::test]
async fn servants_heartbeats_on_new_connections_fit_beside_a_strangers_stalled_bodies() {
    heartbeats_survive(Attacker::NoToken).await;
}

#[tokio::test]
async fn servants_heartbeats_on_new_connections_fit_beside_stalled_bodies_with_a_proved_token() {
    heartbeats_survive(Attacker::ProvedToken).await;
}

#[tokio::test]
async fn servants_heartbeats_fit_beside_stalled_bodies_from_six_addresses_with_a_proved_token() {
    heartbeats_survive(Attacker::ProvedTokenFromSixAddresses).await;
}
