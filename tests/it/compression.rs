//! Compression on the binary protocol, both ways, over a real socket, with
//! the compression crates used directly (never the server's code): requests
//! compressed with each of the framework's algorithms are inflated, a large
//! task list is compressed for callers that accept an algorithm and decoded
//! here, a bomb is refused and the connection kept; and the whole task list
//! of a large cluster is listed.

use std::{
    io::{Read, Write},
    time::Duration,
};

use prost::Message;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use yadcc_engine as engine;
use yadcc_pb::{self as pb, flare::rpc::RpcMeta};
use yadcc_scheduler::rpc::state::TransportSettings;
use yadcc_sim::wire;

use crate::support::*;

const GZIP: i32 = 2;
const LZ4_FRAME: i32 = 3;
const SNAPPY: i32 = 4;
const ZSTD: i32 = 5;
/// What stock daemons accept: none, gzip, lz4 frame, snappy and zstd.
const DAEMON_ACCEPTS: u64 = 62;
/// A caller that accepts only uncompressed answers.
const ACCEPTS_NONE: u64 = 1 << 1;

/// `message` compressed the way the framework's compressor writes it.
fn compress(algorithm: i32, message: &[u8]) -> Vec<u8> {
    match algorithm {
        GZIP => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(message).unwrap();
            encoder.finish().unwrap()
        }
        LZ4_FRAME => {
            let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
            encoder.write_all(message).unwrap();
            encoder.finish().unwrap()
        }
        SNAPPY => snap::raw::Encoder::new().compress_vec(message).unwrap(),
        ZSTD => zstd::bulk::compress(message, 3).unwrap(),
        other => panic!("no algorithm {other}"),
    }
}

/// `payload` inflated the way the daemons' framework reads it.
fn inflate(algorithm: i32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match algorithm {
        GZIP => {
            flate2::read::GzDecoder::new(payload)
                .read_to_end(&mut out)
                .unwrap();
        }
        LZ4_FRAME => {
            lz4_flex::frame::FrameDecoder::new(payload)
                .read_to_end(&mut out)
                .unwrap();
        }
        SNAPPY => out = snap::raw::Decoder::new().decompress_vec(payload).unwrap(),
        ZSTD => out = zstd::stream::decode_all(payload).unwrap(),
        other => panic!("no algorithm {other}"),
    }
    out
}

/// A request frame of call `id`, its payload compressed with `compression`
/// (as the meta says) and the answer's compressions `accepts`.
/// The deadline each call carries. These tests are about what an answer
/// holds, not how soon it comes: building and compressing a 64,000-task list
/// in a debug build on a busy 2-core machine takes seconds.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

fn request(
    id: u64,
    method: Method,
    payload: &[u8],
    compression: Option<i32>,
    accepts: u64,
) -> Vec<u8> {
    let mut meta = wire::daemon_request_meta(id, method.full_name().to_owned(), CALL_TIMEOUT);
    if let Some(request) = meta.request_meta.as_mut() {
        request.acceptable_compression_algorithms = Some(accepts);
    }
    meta.compression_algorithm = compression;
    let payload = match compression {
        Some(algorithm) if algorithm > 1 => compress(algorithm, payload),
        _ => payload.to_vec(),
    };
    flare_frame(&meta, &payload, &[])
}

/// A connection read frame by frame, as bytes: the test decodes each answer
/// itself, compressed or not.
struct Raw(TcpStream);

impl Raw {
    async fn open(server: &Server) -> Raw {
        Raw(TcpStream::connect(server.addr).await.expect("connect"))
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).await.expect("write");
    }

    /// The next answer frame: its meta and payload.
    async fn answer(&mut self) -> (RpcMeta, Vec<u8>) {
        let read = async {
            let mut header = [0u8; 16];
            self.0.read_exact(&mut header).await?;
            assert_eq!(&header[..4], b"CPRF");
            let size =
                |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap()) as usize;
            let mut meta = vec![0; size(4)];
            let mut payload = vec![0; size(8)];
            let mut attachment = vec![0; size(12)];
            self.0.read_exact(&mut meta).await?;
            self.0.read_exact(&mut payload).await?;
            self.0.read_exact(&mut attachment).await?;
            assert!(attachment.is_empty());
            std::io::Result::Ok((RpcMeta::decode(&meta[..]).expect("meta"), payload))
        };
        tokio::time::timeout(STEP, read)
            .await
            .expect("an answer in time")
            .expect("an answer")
    }

    /// One call and its answer.
    async fn call(&mut self, frame: &[u8]) -> (RpcMeta, Vec<u8>) {
        self.send(frame).await;
        self.answer().await
    }
}

fn status(meta: &RpcMeta) -> i32 {
    meta.response_meta.as_ref().map_or(-1, |meta| meta.status)
}

/// A server whose task list shows every report at once (no refresh pause).
async fn server() -> Server {
    let config = engine::Config {
        running_tasks_refresh: Duration::ZERO,
        ..engine_config()
    };
    Server::start_with(config, TransportSettings::default(), "127.0.0.1:0").await
}

/// A heartbeat of the servant on 127.0.0.1:`port` reporting `tasks` running
/// tasks, each with a random-looking 64-digit digest (as yadcc's are).
fn reporting(port: u16, tasks: u64) -> pb::HeartbeatRequest {
    let mut beat = heartbeat(&servant_location("127.0.0.1", port), 4);
    beat.running_tasks = (0..tasks)
        .map(|task| {
            let seed = (u64::from(port) << 32 | task).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            pb::RunningTask {
                servant_task_id: task + 1,
                task_grant_id: u64::from(port) << 32 | (task + 1),
                servant_location: String::new(),
                task_digest: format!("{seed:016x}{:016x}{seed:016x}{:016x}", !seed, seed ^ 7),
            }
        })
        .collect();
    beat
}

/// Servants on ports 9000.. reporting `total` tasks in all, `per_servant` each.
async fn report_tasks(server: &Server, raw: &mut Raw, total: u64, per_servant: u64) {
    let mut id = 1000;
    let mut left = total;
    let mut port = 9000;
    while left > 0 {
        let tasks = left.min(per_servant);
        let beat = reporting(port, tasks).encode_to_vec();
        let (meta, _) = raw
            .call(&request(id, Method::Heartbeat, &beat, None, DAEMON_ACCEPTS))
            .await;
        assert_eq!(status(&meta), 0, "{meta:?}");
        left -= tasks;
        port += 1;
        id += 1;
    }
    assert_eq!(server.engine.running_tasks().len() as u64, total);
}

/// A `GetConfigRequest` of the user token, encoded.
fn get_config() -> Vec<u8> {
    pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    }
    .encode_to_vec()
}

fn listed(payload: &[u8]) -> Vec<pb::RunningTask> {
    pb::GetRunningTasksResponse::decode(payload)
        .expect("a GetRunningTasksResponse")
        .running_tasks
}

#[tokio::test]
async fn requests_compressed_with_each_algorithm_are_inflated() {
    let server = server().await;
    let mut raw = Raw::open(&server).await;
    for (index, algorithm) in [GZIP, LZ4_FRAME, SNAPPY, ZSTD].into_iter().enumerate() {
        let port = 8000 + index as u16;
        let beat = reporting(port, 300).encode_to_vec();
        let frame = request(1, Method::Heartbeat, &beat, Some(algorithm), DAEMON_ACCEPTS);
        assert!(frame.len() < beat.len(), "algorithm {algorithm} compressed");
        let (meta, payload) = raw.call(&frame).await;
        assert_eq!(status(&meta), 0, "algorithm {algorithm}: {meta:?}");
        assert_eq!(
            meta.compression_algorithm, None,
            "a small answer goes plain"
        );
        let reply = pb::HeartbeatResponse::decode(&payload[..]).unwrap();
        assert!(!reply.acceptable_tokens.is_empty());
        // The engine saw the whole inflated report.
        let snapshot = server.engine.snapshot();
        let servant = snapshot
            .servants
            .iter()
            .find(|servant| servant.observed_location.port() == port)
            .expect("registered");
        assert_eq!(servant.environments, vec![DIGEST.to_owned()]);
    }
    assert_eq!(server.engine.running_tasks().len(), 4 * 300);

    // "None" (1) is a plain message.
    let config = get_config();
    let (meta, _) = raw
        .call(&request(
            2,
            Method::GetConfig,
            &config,
            Some(1),
            DAEMON_ACCEPTS,
        ))
        .await;
    assert_eq!(status(&meta), 0);
    server.stop().await;
}

#[tokio::test]
async fn a_large_task_list_is_compressed_for_callers_that_accept_it() {
    let server = server().await;
    let mut raw = Raw::open(&server).await;
    report_tasks(&server, &mut raw, 2000, 1000).await;
    let ask = |id, accepts| request(id, Method::GetRunningTasks, &[], None, accepts);

    let (meta, plain) = raw.call(&ask(1, ACCEPTS_NONE)).await;
    assert_eq!((status(&meta), meta.compression_algorithm), (0, None));
    assert!(plain.len() >= 64 << 10, "{} bytes", plain.len());
    assert_eq!(listed(&plain).len(), 2000);

    // A stock daemon accepts everything and gets zstd.
    let (meta, zstd) = raw.call(&ask(2, DAEMON_ACCEPTS)).await;
    assert_eq!(status(&meta), 0);
    assert_eq!(meta.compression_algorithm, Some(ZSTD));
    assert_eq!(
        meta.attachment_compressed,
        Some(true),
        "as the original sets it"
    );
    assert!(
        zstd.len() * 2 <= plain.len(),
        "{} of {} bytes",
        zstd.len(),
        plain.len()
    );
    assert_eq!(inflate(ZSTD, &zstd), plain);

    // A caller accepting one algorithm gets that one.
    for algorithm in [GZIP, LZ4_FRAME, SNAPPY, ZSTD] {
        let (meta, payload) = raw.call(&ask(3, 1 << algorithm)).await;
        assert_eq!(meta.compression_algorithm, Some(algorithm));
        assert!(payload.len() < plain.len(), "algorithm {algorithm}");
        assert_eq!(inflate(algorithm, &payload), plain, "algorithm {algorithm}");
    }
    // Preference: zstd, then lz4, then gzip.
    let (meta, _) = raw
        .call(&ask(4, 1 << GZIP | 1 << LZ4_FRAME | 1 << SNAPPY))
        .await;
    assert_eq!(meta.compression_algorithm, Some(LZ4_FRAME));
    let (meta, _) = raw.call(&ask(5, 1 << GZIP | 1 << SNAPPY)).await;
    assert_eq!(meta.compression_algorithm, Some(GZIP));

    // A small answer goes plain even to a caller accepting everything.
    let config = get_config();
    let (meta, _) = raw
        .call(&request(
            6,
            Method::GetConfig,
            &config,
            None,
            DAEMON_ACCEPTS,
        ))
        .await;
    assert_eq!((status(&meta), meta.compression_algorithm), (0, None));
    server.stop().await;
}

#[tokio::test]
async fn a_compression_bomb_or_broken_data_is_refused_and_the_connection_kept() {
    let server = server().await;
    let mut raw = Raw::open(&server).await;
    let config = get_config();

    // 8 MiB of zeros: a few hundred bytes compressed, twice the frame limit
    // inflated.
    let zeros = vec![0u8; 8 << 20];
    let bomb_meta = {
        let mut meta =
            wire::daemon_request_meta(1, Method::GetConfig.full_name().to_owned(), CALL_TIMEOUT);
        meta.compression_algorithm = Some(ZSTD);
        meta
    };
    let bomb = compress(ZSTD, &zeros);
    assert!(bomb.len() < 4096, "{}", bomb.len());
    let (meta, payload) = raw.call(&flare_frame(&bomb_meta, &bomb, &[])).await;
    assert_eq!((meta.correlation_id, status(&meta)), (1, 5), "{meta:?}");
    let description = meta.response_meta.unwrap().description.unwrap_or_default();
    assert!(description.contains("beyond"), "{description}");
    assert!(payload.is_empty());

    // Bytes that are not what the meta says: "does not parse" (5).
    let broken = {
        let mut meta = bomb_meta.clone();
        meta.correlation_id = 2;
        meta.compression_algorithm = Some(GZIP);
        flare_frame(&meta, &config, &[])
    };
    let (meta, _) = raw.call(&broken).await;
    assert_eq!((meta.correlation_id, status(&meta)), (2, 5));

    // An algorithm the framework does not define: "not supported" (101).
    let unknown = {
        let mut meta = bomb_meta.clone();
        meta.correlation_id = 3;
        meta.compression_algorithm = Some(9);
        flare_frame(&meta, &config, &[])
    };
    let (meta, _) = raw.call(&unknown).await;
    assert_eq!((meta.correlation_id, status(&meta)), (3, 101));

    // The connection still serves compressed and plain calls.
    let (meta, payload) = raw
        .call(&request(
            4,
            Method::GetConfig,
            &config,
            Some(GZIP),
            DAEMON_ACCEPTS,
        ))
        .await;
    assert_eq!((meta.correlation_id, status(&meta)), (4, 0));
    assert!(
        !pb::GetConfigResponse::decode(&payload[..])
            .unwrap()
            .serving_daemon_token
            .is_empty()
    );
    server.stop().await;
}

/// The whole list, however long: the 64,000 tasks were cut to
/// 47,465 at 4 MiB. Stock daemons take answers up to 512 MiB.
#[tokio::test]
async fn sixty_four_thousand_running_tasks_are_listed_whole() {
    let server = server().await;
    let mut raw = Raw::open(&server).await;
    report_tasks(&server, &mut raw, 64_000, 8000).await;

    let (meta, plain) = raw
        .call(&request(
            1,
            Method::GetRunningTasks,
            &[],
            None,
            ACCEPTS_NONE,
        ))
        .await;
    assert_eq!((status(&meta), meta.compression_algorithm), (0, None));
    assert!(plain.len() > 4 << 20, "{} bytes", plain.len());
    let tasks = listed(&plain);
    assert_eq!(tasks.len(), 64_000);
    let mut ids: Vec<(String, u64)> = tasks
        .iter()
        .map(|task| (task.servant_location.clone(), task.servant_task_id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 64_000, "every task once");

    // Compressed for a stock daemon, the same list.
    let (meta, zstd) = raw
        .call(&request(
            2,
            Method::GetRunningTasks,
            &[],
            None,
            DAEMON_ACCEPTS,
        ))
        .await;
    assert_eq!(meta.compression_algorithm, Some(ZSTD));
    assert_eq!(inflate(ZSTD, &zstd), plain);

    // And over http+pb, whole.
    let answer = call_http_pb(
        server.addr,
        Method::GetRunningTasks,
        &pb::GetRunningTasksRequest {},
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(&answer.body[..], &plain[..]);
    server.stop().await;
}
