//! Codec benchmarks: decoding the P1 Heartbeat request (the hammer's: 5
//! environments, 16 running tasks, ~1.3 KB binary, ~2.4 KB JSON) and
//! encoding answers, JSON against binary protobuf, through `codec::decode`
//! and `codec::encode`, what every RPC uses.
//!
//! - `decode/{json,binary}`: `HeartbeatRequest` from its bytes;
//! - `encode/{json,binary}/heartbeat`: a `HeartbeatResponse` (3 tokens, 4
//!   expired tasks);
//! - `encode/{json,binary}/running_tasks`: a `GetRunningTasksResponse` of
//!   1,000 tasks (the list every daemon fetches).
//!
//! After criterion, a plain timed loop prints `NS` lines (mean ns per call)
//! and `RATIO json/binary` for decoding, one command for a before/after.
//!
//! `CODEC_BENCH_SPIN=<case>:<count>` runs one case `count` times and nothing
//! else, for an instruction count: run it under callgrind with two counts
//! and divide the difference (`scripts/bench_instructions.sh codec`).

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use criterion::Criterion;
use yadcc_pb::{self as pb, Encoding};
use yadcc_scheduler::rpc::codec::{decode, encode};
use yadcc_sim::{ServantBehaviour, ServantSpec, environment_digest, servant::heartbeat_request};

/// The P1 heartbeat, as `yadcc-loadgen hammer` sends it.
fn heartbeat() -> pb::HeartbeatRequest {
    let spec = ServantSpec {
        ip: IpAddr::V4(Ipv4Addr::new(127, 3, 0, 1)),
        port: 8335,
        num_processors: 32,
        capacity: 16,
        dedicated: true,
        environments: (0..5).map(environment_digest).collect(),
        total_memory: 256 << 30,
        base_load: 0,
    };
    let behaviour = ServantBehaviour {
        token: "bench-servant-token".to_owned(),
        heartbeat_interval: Duration::from_secs(1),
        next_heartbeat_in_ms: 10_000,
        leave_on_stop: true,
    };
    let tasks = (0..16_u64)
        .map(|index| {
            // Grant ids are random 64-bit values: most need 19 or 20 digits.
            let grant = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(index + 1);
            pb::RunningTask {
                servant_task_id: index + 1,
                task_grant_id: grant,
                servant_location: String::new(),
                task_digest: format!("{:032x}", u128::from(grant) * 0x9e37_79b9_7f4a_7c15),
            }
        })
        .collect();
    heartbeat_request(
        &spec,
        &behaviour,
        &spec.location().to_string(),
        0,
        tasks,
        10_000,
    )
}

fn heartbeat_response() -> pb::HeartbeatResponse {
    pb::HeartbeatResponse {
        acceptable_tokens: (0..3).map(|i| format!("{i:064x}")).collect(),
        expired_tasks: vec![u64::MAX, 1 << 40, 12_345, 7],
    }
}

fn running_tasks() -> pb::GetRunningTasksResponse {
    pb::GetRunningTasksResponse {
        running_tasks: (0..1000_u64)
            .map(|index| pb::RunningTask {
                servant_task_id: index,
                task_grant_id: 0,
                servant_location: format!("10.0.{}.{}:8335", index / 250, index % 250),
                task_digest: format!("{:064x}", u128::from(index) * 0x9e37_79b9_7f4a_7c15),
            })
            .collect(),
    }
}

/// Every measured case: a name and one call.
struct Cases {
    json_request: Vec<u8>,
    binary_request: Vec<u8>,
    response: pb::HeartbeatResponse,
    tasks: pb::GetRunningTasksResponse,
}

impl Cases {
    fn new() -> Self {
        let request = heartbeat();
        let json_request = encode(Encoding::Json, &request).expect("encodes");
        let binary_request = encode(Encoding::Binary, &request).expect("encodes");
        // What is measured must be what the server accepts.
        for body in [&json_request, &binary_request] {
            let encoding = if body == &json_request {
                Encoding::Json
            } else {
                Encoding::Binary
            };
            let decoded: pb::HeartbeatRequest = decode(encoding, body).expect("decodes");
            assert_eq!(decoded, request);
        }
        Cases {
            json_request,
            binary_request,
            response: heartbeat_response(),
            tasks: running_tasks(),
        }
    }

    const NAMES: [&'static str; 6] = [
        "decode/json",
        "decode/binary",
        "encode/json/heartbeat",
        "encode/binary/heartbeat",
        "encode/json/running_tasks",
        "encode/binary/running_tasks",
    ];

    fn run(&self, name: &str) {
        match name {
            "decode/json" => {
                let decoded: pb::HeartbeatRequest =
                    decode(Encoding::Json, black_box(&self.json_request)).expect("decodes");
                black_box(decoded);
            }
            "decode/binary" => {
                let decoded: pb::HeartbeatRequest =
                    decode(Encoding::Binary, black_box(&self.binary_request)).expect("decodes");
                black_box(decoded);
            }
            "encode/json/heartbeat" => {
                black_box(encode(Encoding::Json, black_box(&self.response)).expect("encodes"));
            }
            "encode/binary/heartbeat" => {
                black_box(encode(Encoding::Binary, black_box(&self.response)).expect("encodes"));
            }
            "encode/json/running_tasks" => {
                black_box(encode(Encoding::Json, black_box(&self.tasks)).expect("encodes"));
            }
            "encode/binary/running_tasks" => {
                black_box(encode(Encoding::Binary, black_box(&self.tasks)).expect("encodes"));
            }
            other => panic!("no case {other}; cases: {}", Cases::NAMES.join(", ")),
        }
    }

    /// Mean ns per call over a plain loop of about `budget`.
    fn time(&self, name: &str, budget: Duration) -> f64 {
        let started = Instant::now();
        let mut calls = 0_u64;
        while started.elapsed() < budget {
            for _ in 0..100 {
                self.run(name);
            }
            calls += 100;
        }
        started.elapsed().as_nanos() as f64 / calls as f64
    }
}

fn main() {
    let cases = Cases::new();
    if let Ok(spin) = std::env::var("CODEC_BENCH_SPIN") {
        let (name, count) = spin
            .rsplit_once(':')
            .and_then(|(name, count)| Some((name.to_owned(), count.parse::<u64>().ok()?)))
            .expect("CODEC_BENCH_SPIN=<case>:<count>");
        for _ in 0..count {
            cases.run(&name);
        }
        return;
    }
    println!(
        "Heartbeat request: {} bytes JSON, {} bytes binary",
        cases.json_request.len(),
        cases.binary_request.len()
    );
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    for name in Cases::NAMES {
        c.bench_function(name, |b| b.iter(|| cases.run(name)));
    }
    c.final_summary();

    let mut ns = std::collections::HashMap::new();
    for name in Cases::NAMES {
        // Best of three: the machine is shared, and a slow moment only adds.
        let best = (0..3)
            .map(|_| cases.time(name, Duration::from_millis(500)))
            .fold(f64::INFINITY, f64::min);
        println!("NS {name} = {best:.0}");
        ns.insert(name, best);
    }
    println!(
        "RATIO decode json/binary = {:.2}",
        ns["decode/json"] / ns["decode/binary"]
    );
}
