//! A real server on a real socket, and clients that speak to it the way the
//! daemons, scripts and browsers do: the daemons' wire is the simulator's
//! (`sim::wire`, `sim::client::SerialConn`), so there is one raw client.

/// Every external program a test starts ends with the test (tests/it and
/// tests/ha share this one module, so one spawning thread).
pub mod processes;

use std::{
    net::{IpAddr, SocketAddr},
    process::Command,
    sync::LazyLock,
    time::Duration,
};

use bytes::BytesMut;
use prost::Message;
use tokio::{net::TcpListener, sync::oneshot, task::JoinHandle};
use yadcc_engine::{self as engine, Scheduler};
pub use yadcc_pb::Method;
use yadcc_pb::{self as pb, flare::rpc::RpcMeta};
use yadcc_scheduler::{AppState, app, net, readiness::Readiness, rpc::state::TransportSettings};
pub use yadcc_sim::wire::{FlareResponse, HttpResponse};
use yadcc_sim::{
    client::{CallError, SerialConn},
    wire::{self, Wire},
};

mod binary;

pub use binary::*;

pub const USER_TOKEN: &str = "user-token";
pub const SERVANT_TOKEN: &str = "servant-token";
pub const DIGEST: &str = "c0ffee";
pub const SERVICE: &str = "yadcc.scheduler.SchedulerService";

/// Upper bound on any single network step, so a bug shows as a failure, not a hang.
pub const STEP: Duration = Duration::from_secs(10);

/// Tests that load the machine (a connection flood, Chromium, emulated
/// clusters, restarts under load, hundreds of MiB of bodies, the real
/// daemons) hold this while they run: one at a time, so none starves another
/// of the two cores its timings assume. Light tests still run beside them.
pub async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(Default::default);
    HEAVY.lock().await
}

/// Longest a test waits for an external program to finish.
pub const TOOL_LIMIT: Duration = Duration::from_secs(300);

/// `program` under coreutils `timeout`: SIGTERM after `limit`, SIGKILL 5 s
/// later, so a hung tool fails its test (exit status 124) instead of
/// hanging the suite. Both die with the test runner
/// ([`crate::processes`]): `timeout` with the thread that runs it, the
/// program with `timeout`.
pub fn bounded(limit: Duration, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = crate::processes::command("timeout");
    command
        .arg("--kill-after=5")
        .arg(limit.as_secs().max(1).to_string())
        .args(crate::processes::dies_with_parent())
        .arg(program);
    command
}

/// Runs a [`bounded`] command to its end off the runtime (the server under
/// test keeps serving), and says so when it was stopped for taking too long.
pub async fn run_bounded(mut command: Command) -> std::process::Output {
    let shown = format!("{command:?}");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("a task that runs the command")
        .unwrap_or_else(|error| panic!("{shown} does not start: {error}"));
    assert_ne!(
        output.status.code(),
        Some(124),
        "{shown} took too long and was stopped:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub fn engine_config() -> engine::Config {
    engine::Config {
        user_tokens: engine::TokenSet::new([USER_TOKEN]),
        servant_tokens: engine::TokenSet::new([SERVANT_TOKEN]),
        ..engine::Config::default()
    }
}

/// Settings of a scheduler started with `--debugging_no_inspect_auth`.
pub fn open_inspection() -> TransportSettings {
    TransportSettings {
        inspect: yadcc_scheduler::dashboard::InspectAccess::Open,
        ..TransportSettings::default()
    }
}

pub struct Server {
    pub addr: SocketAddr,
    pub engine: Scheduler,
    /// What `/readyz` and the gRPC health service report.
    pub readiness: Readiness,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start() -> Server {
        Server::start_with(engine_config(), TransportSettings::default(), "127.0.0.1:0").await
    }

    /// A server whose dashboard and inspection pages are open
    /// (`--debugging_no_inspect_auth`).
    pub async fn start_inspectable() -> Server {
        Server::start_with(engine_config(), open_inspection(), "127.0.0.1:0").await
    }

    pub async fn start_with(
        config: engine::Config,
        settings: TransportSettings,
        bind: &str,
    ) -> Server {
        let engine = Scheduler::new(config);
        let state = AppState::new(engine.clone(), settings);
        Server::serve(engine, state, bind).await
    }

    /// A server whose operators' service takes `admin_tokens` (kept in
    /// memory), its inspection pages open.
    pub async fn start_with_admin(admin_tokens: &[&str]) -> Server {
        let engine = Scheduler::new(engine_config());
        let leadership = yadcc_scheduler::ha::Leadership::solo();
        let admin = yadcc_scheduler::admin::Admin::new(
            yadcc_scheduler::admin::AdminTokens::new(admin_tokens.iter().copied()),
            engine.clone(),
            leadership.clone(),
            yadcc_scheduler::admin::Store::Memory,
        );
        let state = AppState::with_admin(engine.clone(), open_inspection(), leadership, admin);
        Server::serve(engine, state, "127.0.0.1:0").await
    }

    async fn serve(engine: Scheduler, state: AppState, bind: &str) -> Server {
        let listener = TcpListener::bind(bind).await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();
        let readiness = state.readiness.clone();
        let stopping = engine.clone();
        let task = tokio::spawn(async move {
            net::serve(listener, app(state.clone()), state, async move {
                let _ = shutdown_rx.await;
                stopping.shutdown();
            })
            .await
            .expect("server");
        });
        Server {
            addr,
            engine,
            readiness,
            shutdown: Some(shutdown),
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Starts a graceful shutdown and waits until the server has drained.
    pub async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        tokio::time::timeout(STEP, &mut self.task)
            .await
            .expect("server drains in time")
            .expect("server task");
    }
}

/// A location on this host the server will see as not behind NAT.
pub fn servant_location(ip: &str, port: u16) -> String {
    match ip.parse::<IpAddr>().expect("ip") {
        IpAddr::V4(ip) => format!("{ip}:{port}"),
        IpAddr::V6(ip) => format!("[{ip}]:{port}"),
    }
}

pub fn heartbeat(location: &str, capacity: u32) -> pb::HeartbeatRequest {
    pb::HeartbeatRequest {
        token: SERVANT_TOKEN.into(),
        next_heartbeat_in_ms: yadcc_stock::NEXT_HEARTBEAT_IN_MS,
        version: 1,
        location: location.into(),
        num_processors: 16,
        current_load: 0,
        servant_priority: pb::ServantPriority::User as i32,
        not_accepting_task_reason: 0,
        capacity,
        total_memory_in_bytes: 0,
        memory_available_in_bytes: 0,
        env_descs: vec![pb::EnvironmentDesc {
            compiler_digest: DIGEST.into(),
        }],
        running_tasks: vec![],
    }
}

pub fn wait_request(wait_ms: u32, immediate: u32, prefetch: u32) -> pb::WaitForStartingTaskRequest {
    pb::WaitForStartingTaskRequest {
        token: USER_TOKEN.into(),
        milliseconds_to_wait: wait_ms,
        env_desc: Some(pb::EnvironmentDesc {
            compiler_digest: DIGEST.into(),
        }),
        immediate_reqs: immediate,
        prefetch_reqs: prefetch,
        next_keep_alive_in_ms: 15_000,
        min_version: 0,
    }
}

/// `method`'s request as a stock daemon's `http+pb` client writes it (no
/// Host header, sequence number, binary body), with `Rpc-Timeout` if given.
pub fn daemon_request(
    method: Method,
    seq_no: u64,
    body: &[u8],
    timeout_ms: Option<u64>,
) -> Vec<u8> {
    let mut out = BytesMut::new();
    wire::encode_http_pb(
        &mut out,
        method.rpc_path(),
        seq_no,
        timeout_ms.map(Duration::from_millis),
        body,
    );
    out.to_vec()
}

/// `POST path` as any HTTP/1.1 client writes it: `headers`, then
/// `Content-Length` and `body`.
pub fn http_request(path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let headers: Vec<(&str, String)> = headers
        .iter()
        .map(|(name, value)| (*name, (*value).to_owned()))
        .collect();
    let mut out = BytesMut::new();
    wire::encode_http_request(&mut out, path, &headers, body);
    out.to_vec()
}

/// Call `id` of `method` in a flare frame as a stock daemon writes it.
pub fn flare_request(id: u64, method: Method, timeout_ms: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    wire::encode_flare_request(
        &mut out,
        id,
        method,
        Duration::from_millis(timeout_ms),
        payload,
    );
    out.to_vec()
}

/// The same frame from a caller that takes only uncompressed answers: the
/// largest answers the scheduler sends (an attacker's choice).
#[allow(dead_code, reason = "used by the memory tests, which share this file")]
pub fn flare_request_uncompressed(
    id: u64,
    method: Method,
    timeout_ms: u64,
    payload: &[u8],
) -> Vec<u8> {
    let meta = wire::request_meta_accepting(
        id,
        method.full_name().to_owned(),
        Duration::from_millis(timeout_ms),
        wire::compression::ACCEPT_UNCOMPRESSED,
    );
    flare_frame(&meta, payload, &[])
}

/// One flare frame of any meta (a test's odd one), with `attachment`.
pub fn flare_frame(meta: &RpcMeta, payload: &[u8], attachment: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    wire::encode_flare_frame(&mut out, meta, payload, attachment);
    out.to_vec()
}

/// The simulator's raw connection ([`SerialConn`]), with every step bounded
/// by [`STEP`] and every failure a panic that says what went wrong.
pub struct Connection(SerialConn);

impl Connection {
    pub async fn open(addr: SocketAddr) -> Connection {
        Connection::open_from(addr, None).await
    }

    /// Connects from a chosen local address (127.0.0.x), so one test can play
    /// several machines.
    pub async fn open_from(addr: SocketAddr, local: Option<IpAddr>) -> Connection {
        // The protocol only matters to `exchange`, which tests do not use.
        let connecting = SerialConn::connect(local, addr, Wire::HttpPb);
        Connection(
            tokio::time::timeout(STEP, connecting)
                .await
                .expect("connect in time")
                .expect("connect"),
        )
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.0.send(bytes).await.expect("write");
    }

    /// The next HTTP answer, whole.
    pub async fn read_response(&mut self) -> HttpResponse {
        step("an HTTP answer", self.0.read_http()).await
    }

    /// Sends `bytes` (ignoring a write the server cuts short) while reading
    /// the answer, for answers that come before the request is all sent.
    pub async fn read_response_while_sending(&mut self, bytes: &[u8]) -> HttpResponse {
        step("an early HTTP answer", self.0.send_reading_http(bytes)).await
    }

    /// The next flare answer frame, whole.
    pub async fn read_flare(&mut self) -> FlareResponse {
        step("a flare answer", self.0.read_flare()).await
    }

    /// Sends call `id` of `method` in a flare frame with the meta timeout a
    /// daemon would set, without waiting for its answer (calls overlap).
    pub async fn send_flare_call(
        &mut self,
        id: u64,
        method: Method,
        timeout_ms: u64,
        message: &impl Message,
    ) {
        self.send(&flare_request(
            id,
            method,
            timeout_ms,
            &message.encode_to_vec(),
        ))
        .await;
    }

    /// One flare call and the next answer.
    pub async fn flare_call(
        &mut self,
        id: u64,
        method: Method,
        message: &impl Message,
    ) -> FlareResponse {
        self.send_flare_call(id, method, 2000, message).await;
        self.read_flare().await
    }

    /// The server closes the connection without sending anything more.
    pub async fn expect_closed(&mut self) {
        let closed = tokio::time::timeout(STEP, self.0.wait_closed())
            .await
            .expect("the server closes the connection in time");
        if let Err(sent) = closed {
            panic!("expected a close, got {sent:02x?}");
        }
    }
}

/// `what`, within [`STEP`].
async fn step<T>(what: &str, future: impl Future<Output = Result<T, CallError>>) -> T {
    tokio::time::timeout(STEP, future)
        .await
        .unwrap_or_else(|_| panic!("{what} in time"))
        .unwrap_or_else(|error| panic!("{what}: {error}"))
}

/// An answer's body as the message it must be.
pub trait DecodeBody {
    fn decode<T: Message + Default>(&self) -> T;
}

impl DecodeBody for HttpResponse {
    fn decode<T: Message + Default>(&self) -> T {
        T::decode(self.body.clone()).expect("response is valid protobuf")
    }
}

/// One `http+pb` call on a fresh connection.
pub async fn call_http_pb(
    addr: SocketAddr,
    method: Method,
    message: &impl Message,
) -> HttpResponse {
    let mut connection = Connection::open(addr).await;
    connection
        .send(&daemon_request(method, 1, &message.encode_to_vec(), None))
        .await;
    connection.read_response().await
}

/// Registers one servant on 127.0.0.1 with the given capacity.
pub async fn register_servant(server: &Server, port: u16, capacity: u32) {
    let response = call_http_pb(
        server.addr,
        Method::Heartbeat,
        &heartbeat(&servant_location("127.0.0.1", port), capacity),
    )
    .await;
    assert_eq!(
        response.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&response.body)
    );
}

/// Asks for grants over binary http+pb and expects them granted.
pub async fn acquire(
    server: &Server,
    immediate: u32,
    prefetch: u32,
) -> pb::WaitForStartingTaskResponse {
    let response = call_http_pb(
        server.addr,
        Method::WaitForStartingTask,
        &wait_request(1000, immediate, prefetch),
    )
    .await;
    assert_eq!(
        response.status,
        200,
        "{:?}",
        response.header("rpc-error-reason")
    );
    response.decode()
}

/// A heartbeat sent from the local address `ip`, as the machine at `ip` would.
pub async fn heartbeat_from(server: &Server, ip: &str, location: &str, capacity: u32) {
    let mut connection = Connection::open_from(server.addr, Some(ip.parse().unwrap())).await;
    let body = heartbeat(location, capacity).encode_to_vec();
    connection
        .send(&daemon_request(Method::Heartbeat, 1, &body, None))
        .await;
    assert_eq!(connection.read_response().await.status, 200);
}

pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(STEP)
        .build()
        .expect("client")
}

/// One scrape of the server's `/metrics` at `addr` (the classic text).
pub async fn metrics_text(addr: SocketAddr) -> String {
    http_client()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("the /metrics text")
}
