//! Differential test of the proto3 JSON mapping against Google's own
//! implementation (PyPI `protobuf`), run by `scripts/differential.py`.
//!
//! The server here is the real application plus two routes that exist only in
//! this test harness, never in the product:
//! - `POST /test/decode/<request type>`: JSON through the server's own
//!   decoder (`codec::decode`, what every RPC uses), answered as binary
//!   protobuf, so the script sees exactly the message the server understood;
//! - `POST /test/encode/<response type>`: binary protobuf in, the server's
//!   JSON (`codec::encode`) out, for Google's `json_format.Parse`.
//!
//! The script also calls the real RPC routes. It needs `python3` with
//! `protobuf`, which `scripts/test.sh` installs; without them the test is
//! skipped outside CI and fails in CI.

use std::net::SocketAddr;

use axum::{
    Router,
    body::Bytes,
    extract::Path,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::post,
};
use prost::Message;
use tokio::net::TcpListener;
use yadcc_engine::{Config, Scheduler, TokenSet};
use yadcc_pb::{self as pb, Encoding};
use yadcc_scheduler::{
    AppState, app,
    rpc::{
        codec::{decode, encode},
        state::TransportSettings,
    },
};

use crate::{
    support::{TOOL_LIMIT, bounded, heavy, run_bounded},
    tools::python_program,
};

/// Generated messages per type and check: with six request and six response
/// types, thousands in all.
const PER_TYPE: &str = "400";
/// The environment variable that pins the script's random seed.
const SEED_VARIABLE: &str = "DIFFERENTIAL_SEED";

fn python_with_protobuf() -> Option<std::ffi::OsString> {
    let python = python_program();
    let ok = bounded(TOOL_LIMIT, &python)
        .args(["-c", "import google.protobuf.json_format"])
        .output()
        .is_ok_and(|output| output.status.success());
    ok.then_some(python)
}

/// JSON in, the decoded message out as binary.
fn decode_echo<T>(body: &[u8]) -> Response
where
    T: Message + prost::Name + Default + serde::de::DeserializeOwned,
{
    match decode::<T>(Encoding::Json, body) {
        Ok(message) => message.encode_to_vec().into_response(),
        Err(error) => (StatusCode::BAD_REQUEST, error.message).into_response(),
    }
}

/// Binary in, the server's JSON out.
fn encode_echo<T>(body: &[u8]) -> Response
where
    T: Message + Default + serde::Serialize,
{
    match T::decode(body) {
        Ok(message) => match encode(Encoding::Json, &message) {
            Ok(json) => json.into_response(),
            Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, error.message).into_response(),
        },
        Err(error) => (StatusCode::BAD_REQUEST, error.to_string()).into_response(),
    }
}

async fn decode_route(Path(name): Path<String>, body: Bytes) -> Response {
    match name.as_str() {
        "yadcc.scheduler.HeartbeatRequest" => decode_echo::<pb::HeartbeatRequest>(&body),
        "yadcc.scheduler.GetConfigRequest" => decode_echo::<pb::GetConfigRequest>(&body),
        "yadcc.scheduler.WaitForStartingTaskRequest" => {
            decode_echo::<pb::WaitForStartingTaskRequest>(&body)
        }
        "yadcc.scheduler.KeepTaskAliveRequest" => decode_echo::<pb::KeepTaskAliveRequest>(&body),
        "yadcc.scheduler.FreeTaskRequest" => decode_echo::<pb::FreeTaskRequest>(&body),
        "yadcc.scheduler.GetRunningTasksRequest" => {
            decode_echo::<pb::GetRunningTasksRequest>(&body)
        }
        other => (StatusCode::NOT_FOUND, format!("no request type {other}")).into_response(),
    }
}

async fn encode_route(Path(name): Path<String>, body: Bytes) -> Response {
    match name.as_str() {
        "yadcc.scheduler.HeartbeatResponse" => encode_echo::<pb::HeartbeatResponse>(&body),
        "yadcc.scheduler.GetConfigResponse" => encode_echo::<pb::GetConfigResponse>(&body),
        "yadcc.scheduler.WaitForStartingTaskResponse" => {
            encode_echo::<pb::WaitForStartingTaskResponse>(&body)
        }
        "yadcc.scheduler.KeepTaskAliveResponse" => encode_echo::<pb::KeepTaskAliveResponse>(&body),
        "yadcc.scheduler.FreeTaskResponse" => encode_echo::<pb::FreeTaskResponse>(&body),
        "yadcc.scheduler.GetRunningTasksResponse" => {
            encode_echo::<pb::GetRunningTasksResponse>(&body)
        }
        other => (StatusCode::NOT_FOUND, format!("no response type {other}")).into_response(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_mapping_agrees_with_googles_protobuf() {
    let _heavy = heavy().await;
    let Some(python) = python_with_protobuf() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install python3 with protobuf (scripts/test.sh does)"
        );
        eprintln!("SKIPPED: no python3 with protobuf; scripts/test.sh installs it");
        return;
    };

    // Anyone's token is accepted, so the live calls reach the service.
    let engine = Scheduler::new(Config {
        user_tokens: TokenSet::anyone(),
        servant_tokens: TokenSet::anyone(),
        ..Config::default()
    });
    let state = AppState::new(engine, TransportSettings::default());
    let harness = Router::new()
        .route("/test/decode/{name}", post(decode_route))
        .route("/test/encode/{name}", post(encode_route));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app(state)
                .merge(harness)
                .into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("server");
    });

    let descriptors = std::env::temp_dir().join(format!(
        "yadcc-descriptors-{}-{}.bin",
        std::process::id(),
        addr.port()
    ));
    std::fs::write(&descriptors, pb::FILE_DESCRIPTOR_SET).expect("write descriptors");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/differential.py");
    let url = format!("http://{addr}");
    let mut command = bounded(TOOL_LIMIT, python);
    command
        .arg(script)
        .args(["--url", &url, "--count", PER_TYPE])
        .arg("--descriptors")
        .arg(&descriptors)
        .arg("--readme")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md"));
    // A failure names its seed; this replays it.
    if let Some(seed) = std::env::var_os(SEED_VARIABLE) {
        command.arg("--seed").arg(seed);
    }
    let output = run_bounded(command).await;
    let _ = std::fs::remove_file(&descriptors);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    let seed = stdout
        .lines()
        .find_map(|line| line.strip_prefix("differential: seed "))
        .unwrap_or("(not printed)");
    assert!(
        output.status.success(),
        "differential test failed with seed {seed}; replay it with \
         {SEED_VARIABLE}={seed} cargo test --test it differential\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(" 0 failed"),
        "no summary from the script:\n{stdout}"
    );
}
