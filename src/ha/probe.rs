//! Whether the elected leader serves, asked the way the load balancer asks
//! it: `GET /readyz` at the address it proclaims, 200 or not, within
//! [`PROBE_TIMEOUT`]. A standby asks only while daemons reach it (see
//! [`super::Leadership::admits_daemons`]), so this costs nothing otherwise.

use std::time::Duration;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::timeout,
};

/// The `User-Agent` of a standby's probe, so the leader does not count it
/// as a balancer's check (`--ha_resign_unchecked_after`).
pub const PROBE_USER_AGENT: &str = "yadcc-scheduler-standby-probe";

/// A leader that cannot answer its readiness in this long is as good as
/// gone for a daemon, whose shortest call has 2 s.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// True if the instance at `name` (`host:port`) answers `/readyz` 200 in time.
pub async fn is_ready(name: &str) -> bool {
    timeout(PROBE_TIMEOUT, ask(name)).await.unwrap_or(false)
}

async fn ask(name: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(name).await else {
        return false;
    };
    let request = format!(
        "GET /readyz HTTP/1.1\r\nHost: {name}\r\nUser-Agent: {PROBE_USER_AGENT}\r\n\
         Connection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    // "HTTP/1.1 200" is all that matters.
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.is_ok() && head.ends_with(b" 200")
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    };

    use super::*;
    use tokio::net::TcpListener;

    /// A leader whose `/readyz` answers 200 while `ready` holds, else 503;
    /// its `host:port`.
    pub(in crate::ha) async fn readyz_answering(ready: Arc<AtomicBool>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let name = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = [0u8; 256];
                let _ = stream.read(&mut request).await;
                let status = if ready.load(Relaxed) {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        name
    }

    #[tokio::test]
    async fn only_a_200_is_ready() {
        let ready = Arc::new(AtomicBool::new(true));
        let leader = readyz_answering(ready.clone()).await;
        assert!(is_ready(&leader).await);
        ready.store(false, Relaxed);
        assert!(!is_ready(&leader).await);
        // Nobody listening.
        let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let name = gone.local_addr().unwrap().to_string();
        drop(gone);
        assert!(!is_ready(&name).await);
        assert!(!is_ready("no-such-host.invalid:8336").await);
    }

    #[tokio::test]
    async fn a_leader_that_accepts_but_never_answers_is_not_ready_in_time() {
        // A paused process: the kernel accepts, nobody reads.
        let paused = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let name = paused.local_addr().unwrap().to_string();
        let started = std::time::Instant::now();
        assert!(!is_ready(&name).await);
        assert!(started.elapsed() < PROBE_TIMEOUT * 3);
        drop(paused);
    }
}
