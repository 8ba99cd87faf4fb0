//! A real server on a real socket, and clients that speak to it the way the
//! daemons, scripts and browsers do.

use std::{
    io::{BufRead, BufReader},
    net::{IpAddr, SocketAddr},
    process::{Child, Command, Stdio},
    time::Duration,
};

use prost::Message;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
    sync::oneshot,
    task::JoinHandle,
};
use yadcc_scheduler::{
    AppState, app,
    engine::{self, Scheduler},
    http::state::HttpSettings,
    net, pb,
};

pub const USER_TOKEN: &str = "user-token";
pub const SERVANT_TOKEN: &str = "servant-token";
pub const DIGEST: &str = "c0ffee";
pub const SERVICE: &str = "yadcc.scheduler.SchedulerService";

/// Upper bound on any single network step, so a bug shows as a failure, not a hang.
pub const STEP: Duration = Duration::from_secs(10);

pub fn engine_config() -> engine::Config {
    engine::Config {
        user_tokens: engine::TokenSet::new([USER_TOKEN]),
        servant_tokens: engine::TokenSet::new([SERVANT_TOKEN]),
        ..engine::Config::default()
    }
}

/// Settings of a scheduler started with `--debugging_no_inspect_auth`.
pub fn open_inspection() -> HttpSettings {
    HttpSettings {
        inspect: yadcc_scheduler::dashboard::InspectAccess::Open,
        ..HttpSettings::default()
    }
}

pub struct Server {
    pub addr: SocketAddr,
    pub engine: Scheduler,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start() -> Server {
        Server::start_with(engine_config(), HttpSettings::default(), "127.0.0.1:0").await
    }

    /// A server whose dashboard and inspection pages are open
    /// (`--debugging_no_inspect_auth`).
    pub async fn start_inspectable() -> Server {
        Server::start_with(engine_config(), open_inspection(), "127.0.0.1:0").await
    }

    pub async fn start_with(config: engine::Config, settings: HttpSettings, bind: &str) -> Server {
        let engine = Scheduler::new(config);
        let listener = TcpListener::bind(bind).await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();
        let state = AppState::new(engine.clone(), settings);
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
        next_heartbeat_in_ms: 10_000,
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

/// One HTTP/1.1 response as read off the socket.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    pub fn decode<T: Message + Default>(&self) -> T {
        T::decode(self.body.as_slice()).expect("response is valid protobuf")
    }
}

/// A raw TCP connection, for writing requests byte for byte as the original
/// `http+pb` client does.
pub struct RawConnection {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl RawConnection {
    pub async fn open(addr: SocketAddr) -> RawConnection {
        RawConnection::open_from(addr, None).await
    }

    /// Connects from a chosen local address (127.0.0.x), so one test can play
    /// several machines.
    pub async fn open_from(addr: SocketAddr, local: Option<IpAddr>) -> RawConnection {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()
        } else {
            TcpSocket::new_v6()
        }
        .expect("socket");
        if let Some(local) = local {
            socket.bind(SocketAddr::new(local, 0)).expect("bind local");
        }
        let stream = tokio::time::timeout(STEP, socket.connect(addr))
            .await
            .expect("connect in time")
            .expect("connect");
        RawConnection {
            stream,
            buffer: Vec::new(),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Sends `bytes` (ignoring a write the server cuts short) while reading
    /// the answer, for answers that come before the request is all sent.
    pub async fn read_response_while_sending(&mut self, bytes: &[u8]) -> RawResponse {
        let (mut read, mut write) = self.stream.split();
        let mut buffer = std::mem::take(&mut self.buffer);
        let sending = async {
            let _ = write.write_all(bytes).await;
        };
        let reading = async {
            let mut chunk = [0u8; 8192];
            while !buffer.windows(4).any(|w| w == b"\r\n\r\n") {
                let got = read.read(&mut chunk).await.expect("read");
                assert!(got > 0, "closed before an answer");
                buffer.extend_from_slice(&chunk[..got]);
            }
        };
        tokio::time::timeout(STEP, async {
            tokio::select! {
                () = reading => {}
                () = async { sending.await; std::future::pending::<()>().await } => {}
            }
        })
        .await
        .expect("answer in time");
        self.buffer = buffer;
        self.read_response().await
    }

    /// Reads exactly `len` bytes (for protocols other than HTTP).
    pub async fn read_exact(&mut self, len: usize) -> Vec<u8> {
        tokio::time::timeout(STEP, async {
            while self.buffer.len() < len {
                self.fill().await;
            }
        })
        .await
        .expect("bytes in time");
        self.buffer.drain(..len).collect()
    }

    pub async fn read_response(&mut self) -> RawResponse {
        tokio::time::timeout(STEP, self.read_response_inner())
            .await
            .expect("response in time")
    }

    async fn fill(&mut self) {
        let mut chunk = [0u8; 8192];
        let read = self.stream.read(&mut chunk).await.expect("read");
        assert!(read > 0, "connection closed before a full response");
        self.buffer.extend_from_slice(&chunk[..read]);
    }

    async fn read_response_inner(&mut self) -> RawResponse {
        let head_end = loop {
            if let Some(at) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            self.fill().await;
        };
        let head = String::from_utf8(self.buffer[..head_end].to_vec()).expect("ascii head");
        self.buffer.drain(..head_end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().expect("status line");
        assert!(status_line.starts_with("HTTP/1.1 "), "{status_line}");
        let status = status_line[9..12].parse().expect("status code");
        let headers: Vec<(String, String)> = lines
            .map(|line| {
                let (name, value) = line.split_once(':').expect("header line");
                (name.trim().to_owned(), value.trim().to_owned())
            })
            .collect();
        let response = RawResponse {
            status,
            headers,
            body: Vec::new(),
        };
        assert!(
            response.header("transfer-encoding").is_none(),
            "unary answers are never chunked: {:?}",
            response.headers
        );
        let length: usize = response
            .header("content-length")
            .expect("every answer has Content-Length")
            .parse()
            .expect("numeric Content-Length");
        while self.buffer.len() < length {
            self.fill().await;
        }
        let body = self.buffer.drain(..length).collect();
        RawResponse { body, ..response }
    }
}

/// A request exactly as the original `http+pb` client writes it: no Host
/// header, sequence number, binary body.
pub fn http_pb_request(
    method: &str,
    seq_no: u64,
    body: &[u8],
    extra_headers: &[(&str, &str)],
) -> Vec<u8> {
    let mut head = format!(
        "POST /rpc/{SERVICE}.{method} HTTP/1.1\r\nRpc-SeqNo: {seq_no}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in extra_headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// One raw `http+pb` call on a fresh connection.
pub async fn call_raw(addr: SocketAddr, method: &str, message: &impl Message) -> RawResponse {
    let mut connection = RawConnection::open(addr).await;
    connection
        .send(&http_pb_request(method, 1, &message.encode_to_vec(), &[]))
        .await;
    connection.read_response().await
}

/// Registers one servant on 127.0.0.1 with the given capacity.
pub async fn register_servant(server: &Server, port: u16, capacity: u32) {
    let response = call_raw(
        server.addr,
        "Heartbeat",
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
    let response = call_raw(
        server.addr,
        "WaitForStartingTask",
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
    let mut connection = RawConnection::open_from(server.addr, Some(ip.parse().unwrap())).await;
    let body = heartbeat(location, capacity).encode_to_vec();
    connection
        .send(&http_pb_request("Heartbeat", 1, &body, &[]))
        .await;
    assert_eq!(connection.read_response().await.status, 200);
}

pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(STEP)
        .build()
        .expect("client")
}

/// The real binary, on a port of its own, with its stderr drained (so a
/// chatty log never blocks it on a full pipe).
pub struct Binary {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Binary {
    /// Starts `yadcc-scheduler` on a free loopback port with `flags`, under
    /// `ulimit -n nofile` if given.
    pub fn start(flags: &[&str], nofile: Option<u32>) -> Binary {
        Binary::start_on("127.0.0.1:0".parse().expect("address"), flags, nofile)
    }

    /// Starts `yadcc-scheduler` listening on `listen` (e.g. the port a killed
    /// instance held) with `flags`, under `ulimit -n nofile` if given.
    pub fn start_on(listen: SocketAddr, flags: &[&str], nofile: Option<u32>) -> Binary {
        let program = env!("CARGO_BIN_EXE_yadcc-scheduler");
        let mut args: Vec<String> = vec![
            format!("--listen={listen}"),
            format!("--acceptable_user_tokens={USER_TOKEN}"),
            format!("--acceptable_servant_tokens={SERVANT_TOKEN}"),
        ];
        args.extend(flags.iter().map(|flag| (*flag).to_owned()));
        let mut command = match nofile {
            Some(limit) => {
                let mut command = Command::new("sh");
                command
                    .arg("-c")
                    .arg(format!(
                        "ulimit -Sn {limit} && ulimit -Hn {limit} && exec \"$0\" \"$@\""
                    ))
                    .arg(program);
                command
            }
            None => Command::new(program),
        };
        let mut child = command
            .args(&args)
            .env("RUST_LOG", "info,yadcc_scheduler::access=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the binary");
        let stderr = child.stderr.take().expect("stderr");
        let (found, address) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut found = Some(found);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("listening on http://") {
                    let rest = &line[at + "listening on http://".len()..];
                    let addr = rest.split_whitespace().next().unwrap_or("").to_owned();
                    if let Some(found) = found.take() {
                        let _ = found.send(addr);
                    }
                }
            }
        });
        let addr = address
            .recv_timeout(STEP)
            .expect("the binary says where it listens")
            .parse()
            .expect("socket address");
        Binary { child, addr }
    }

    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("process status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|value| value.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .expect("VmRSS")
    }

    pub fn open_files_limit(&self) -> u64 {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.child.id()))
            .expect("process limits");
        limits
            .lines()
            .find(|line| line.starts_with("Max open files"))
            .and_then(|line| line.split_whitespace().nth(3))
            .and_then(|soft| soft.parse().ok())
            .expect("Max open files")
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
