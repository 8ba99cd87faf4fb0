//! Real headless Chromium driven over the Chrome DevTools Protocol, for
//! tests that act on a page as a person does (type, click, confirm) rather
//! than read the DOM once (`browser.rs`'s `--dump-dom`): Chromium started
//! with `--remote-debugging-port=0`, one page target, script run in it, and
//! every console message, uncaught error and browser log entry kept.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, tungstenite::Message};

/// The longest Chromium may take to say where it listens.
const START_LIMIT: Duration = Duration::from_secs(60);
/// The longest one protocol command may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// The height of the phone `Browser::open_on_phone` emulates.
const PHONE_HEIGHT: u32 = 800;

/// Chromium with one page, killed (and its profile removed) when dropped.
pub struct Browser {
    child: Child,
    profile: std::path::PathBuf,
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    /// What the page and the browser logged: console messages, uncaught
    /// errors, log entries (a CSP violation is one), in order.
    pub logged: Vec<String>,
}

impl Browser {
    /// Starts `binary` headless and opens a page on `url`.
    pub async fn open(binary: &Path, url: &str) -> Browser {
        Browser::open_with(binary, url, None).await
    }

    /// Opens `url` in a phone's viewport `width` CSS pixels wide (a mobile
    /// one: the page's `viewport` meta applies), set before the page loads.
    pub async fn open_on_phone(binary: &Path, url: &str, width: u32) -> Browser {
        Browser::open_with(binary, url, Some((width, true))).await
    }

    /// Opens `url` in a desktop viewport `width` CSS pixels wide (a laptop's
    /// 1366, say), set before the page loads.
    pub async fn open_on_desktop(binary: &Path, url: &str, width: u32) -> Browser {
        Browser::open_with(binary, url, Some((width, false))).await
    }

    async fn open_with(binary: &Path, url: &str, viewport: Option<(u32, bool)>) -> Browser {
        static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let profile = std::env::temp_dir().join(format!("yadcc-cdp-{}-{run}", std::process::id()));
        let mut child = Command::new(binary)
            .args(crate::browser::HEADLESS)
            .args([
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=1400,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium starts");
        let stderr = child.stderr.take().expect("stderr");
        let (found, endpoint) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(at) = line.find("ws://") {
                    let _ = found.send(line[at..].trim().to_owned());
                }
            }
        });
        let endpoint = tokio::task::spawn_blocking(move || endpoint.recv_timeout(START_LIMIT))
            .await
            .expect("the reader")
            .expect("chromium says where its DevTools listen");
        let (socket, _) = tokio_tungstenite::connect_async(endpoint.as_str())
            .await
            .expect("connect to DevTools");
        let mut browser = Browser {
            child,
            profile,
            socket,
            session: String::new(),
            next_id: 0,
            logged: Vec::new(),
        };
        let target = browser
            .command(
                false,
                "Target.createTarget",
                json!({ "url": "about:blank" }),
            )
            .await;
        let attached = browser
            .command(
                false,
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_owned();
        for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
            browser.command(true, domain, json!({})).await;
        }
        if let Some((width, mobile)) = viewport {
            let scale = if mobile { 2 } else { 1 };
            browser
                .command(
                    true,
                    "Emulation.setDeviceMetricsOverride",
                    json!({ "width": width, "height": PHONE_HEIGHT, "deviceScaleFactor": scale, "mobile": mobile }),
                )
                .await;
        }
        browser
            .command(true, "Page.navigate", json!({ "url": url }))
            .await;
        browser
    }

    /// Sends one command (to the page when `on_page`) and waits for its
    /// result, keeping the events that arrive meanwhile.
    async fn command(&mut self, on_page: bool, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if on_page {
            message["sessionId"] = json!(self.session);
        }
        self.socket
            .send(Message::text(message.to_string()))
            .await
            .expect("send a command");
        let deadline = Instant::now() + COMMAND_LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = tokio::time::timeout(left, self.socket.next())
                .await
                .unwrap_or_else(|_| panic!("{method}: no answer within {COMMAND_LIMIT:?}"))
                .expect("the DevTools socket stays open")
                .expect("a DevTools message");
            let Message::Text(text) = next else { continue };
            let message: Value = serde_json::from_str(text.as_str()).expect("DevTools JSON");
            if message["id"] == id {
                assert!(message["error"].is_null(), "{method}: {}", message["error"]);
                return message["result"].clone();
            }
            self.keep_event(&message);
        }
    }

    fn keep_event(&mut self, message: &Value) {
        let params = &message["params"];
        let text = match message["method"].as_str() {
            Some("Runtime.consoleAPICalled") => format!(
                "console.{}: {}",
                params["type"].as_str().unwrap_or("?"),
                params["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|arg| arg["value"]
                        .as_str()
                        .map_or_else(|| arg.to_string(), str::to_owned))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Some("Runtime.exceptionThrown") => format!(
                "uncaught: {}",
                params["exceptionDetails"]["exception"]["description"]
                    .as_str()
                    .unwrap_or_else(|| params["exceptionDetails"]["text"].as_str().unwrap_or("?"))
            ),
            Some("Log.entryAdded") => format!(
                "log ({} {}): {}",
                params["entry"]["source"].as_str().unwrap_or("?"),
                params["entry"]["level"].as_str().unwrap_or("?"),
                params["entry"]["text"].as_str().unwrap_or("?")
            ),
            _ => return,
        };
        self.logged.push(text);
    }

    /// The value of `expression` evaluated in the page (promises awaited).
    pub async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .command(
                true,
                "Runtime.evaluate",
                json!({
                    "expression": expression,
                    "awaitPromise": true,
                    "returnByValue": true,
                }),
            )
            .await;
        assert!(
            result["exceptionDetails"].is_null(),
            "{expression}: {}",
            result["exceptionDetails"]
        );
        result["result"]["value"].clone()
    }

    /// Waits until `condition` (an expression) is true in the page, polling
    /// every 100 ms for at most `limit`; panics with `what` otherwise.
    pub async fn wait_for(&mut self, condition: &str, what: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if self.eval(condition).await == json!(true) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {limit:?} ({condition}); logged: {:#?}",
                self.logged
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A PNG of the page as it is now, written to `path`.
    pub async fn screenshot(&mut self, path: &Path) {
        use base64::Engine as _;
        let shot = self
            .command(true, "Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("PNG data"))
            .expect("base64 PNG");
        std::fs::write(path, png).expect("write the screenshot");
    }

    /// Reloads the page (the same tab: its session storage stays).
    pub async fn reload(&mut self) {
        self.command(true, "Page.reload", json!({})).await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
