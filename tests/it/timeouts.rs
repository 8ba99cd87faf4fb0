//! Connection timeouts on a real socket: idle daemon connections, the
//! shutdown grace, bodies stalled past the body-read timeout, and answers
//! nobody reads past the write timeout, on every protocol.

use std::time::Duration;

use prost::Message;
use tokio::{io::AsyncWriteExt, net::TcpStream, time::Instant};
use yadcc_pb as pb;
use yadcc_scheduler::{edge::EdgeSettings, rpc::state::TransportSettings};

use crate::{edge::read_some, support::*};

async fn server_with_edge(edge: EdgeSettings) -> Server {
    Server::start_with(
        engine_config(),
        TransportSettings {
            edge,
            ..TransportSettings::default()
        },
        "127.0.0.1:0",
    )
    .await
}

#[tokio::test]
async fn idle_daemon_connections_close_after_the_idle_timeout_but_not_during_a_long_poll() {
    // The flag refuses less than 60 s; the setting itself is shortened here
    // so the test is quick.
    let idle = Duration::from_millis(400);
    let server = server_with_edge(EdgeSettings {
        idle_timeout: idle,
        ..EdgeSettings::default()
    })
    .await;
    register_servant(&server, 8335, 1).await;
    let taken = call_http_pb(
        server.addr,
        Method::WaitForStartingTask,
        &wait_request(0, 1, 0),
    )
    .await;
    assert_eq!(taken.status, 200);

    let config = pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    }
    .encode_to_vec();
    // Idle after one call: closed near the idle timeout.
    let mut quiet = TcpStream::connect(server.addr).await.unwrap();
    quiet
        .write_all(&flare_request(1, Method::GetConfig, 2000, &config))
        .await
        .unwrap();
    assert_eq!(&read_some(&mut quiet).await[..4], b"CPRF");
    let closed = closed_within(quiet, Duration::from_secs(5)).await;
    assert!(
        closed.is_some_and(|after| after >= idle / 2),
        "closed after {closed:?}"
    );

    // Quiet for longer than the idle timeout, but a long poll is in flight.
    let mut waiting = TcpStream::connect(server.addr).await.unwrap();
    let wait = wait_request(1500, 1, 0).encode_to_vec();
    waiting
        .write_all(&flare_request(2, Method::WaitForStartingTask, 5000, &wait))
        .await
        .unwrap();
    let answer = read_some(&mut waiting).await;
    assert_eq!(
        &answer[..4],
        b"CPRF",
        "the long poll is answered, not cut off"
    );
    server.stop().await;
}

#[tokio::test]
async fn shutdown_closes_what_has_not_drained_within_the_grace() {
    let grace = Duration::from_millis(300);
    let server = server_with_edge(EdgeSettings {
        shutdown_grace: grace,
        ..EdgeSettings::default()
    })
    .await;
    // A script's request whose body never comes (body-read timeout: 30 s).
    let mut stalled = TcpStream::connect(server.addr).await.unwrap();
    stalled
        .write_all(
            format!(
                "POST /rpc/{SERVICE}.GetConfig HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    server.stop().await;
    // Well before the 30 s body-read timeout would have ended it.
    assert!(
        started.elapsed() < grace + Duration::from_secs(5),
        "stopped after {:?}",
        started.elapsed()
    );
    assert!(closed_within(stalled, STEP).await.is_some());
}

#[tokio::test]
async fn stalled_bodies_are_cut_at_the_body_read_timeout_on_every_protocol() {
    let body_timeout = Duration::from_secs(1);
    let server = server_with_edge(EdgeSettings {
        body_read_timeout: body_timeout,
        ..EdgeSettings::default()
    })
    .await;
    let config = pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    }
    .encode_to_vec();
    let started = Instant::now();

    // Binary protocol: header and meta arrive, the payload stalls: closed.
    let frame = flare_request(1, Method::GetConfig, 60_000, &config);
    let mut flare = TcpStream::connect(server.addr).await.unwrap();
    flare.write_all(&frame[..frame.len() - 2]).await.unwrap();

    // Daemon http+pb and a script: answered "deadline" (code 3), then closed.
    let mut daemon = Connection::open(server.addr).await;
    let request = daemon_request(Method::GetConfig, 5, &config, None);
    daemon.send(&request[..request.len() - 2]).await;
    let mut script = Connection::open(server.addr).await;
    script
        .send(
            format!("POST /rpc/{SERVICE}.GetConfig HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\nContent-Length: 100\r\n\r\nabc")
                .as_bytes(),
        )
        .await;

    for (name, connection) in [("daemon", &mut daemon), ("script", &mut script)] {
        let answer = connection.read_response().await;
        assert_eq!(answer.status, 504, "{name}");
        assert_eq!(answer.header("rpc-error-code"), Some("3"), "{name}");
    }
    let closed = closed_within(flare, STEP).await;
    assert!(closed.is_some(), "the stalled frame's connection is closed");
    let elapsed = started.elapsed();
    // Not before the timeout, and long before the default 30 s.
    assert!(
        elapsed >= body_timeout && elapsed < body_timeout + Duration::from_secs(5),
        "cut near the body-read timeout: {elapsed:?}"
    );
    server.stop().await;
}

/// A server whose writes may stall for `write_timeout` at most (the
/// body-read timeout), with everything else long enough not to interfere.
async fn server_with_write_timeout(write_timeout: Duration) -> Server {
    server_with_edge(EdgeSettings {
        body_read_timeout: write_timeout,
        header_read_timeout: Duration::from_secs(60),
        ..EdgeSettings::default()
    })
    .await
}

#[tokio::test]
async fn an_http2_answer_held_by_a_shut_window_closes_its_connection_after_the_write_timeout() {
    use axum::body::Body;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let write_timeout = Duration::from_secs(1);
    let server = server_with_write_timeout(write_timeout).await;
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
    // The server may send headers, never a byte of any answer's body.
    builder.initial_stream_window_size(0);
    let (mut sender, connection) = builder.handshake(TokioIo::new(stream)).await.unwrap();
    let started = Instant::now();
    let connection = tokio::spawn(connection);
    let request = axum::http::Request::post(format!("http://x/{SERVICE}/GetRunningTasks"))
        .header("content-type", "application/grpc")
        .body(Body::from(vec![0u8; 5]))
        .unwrap();
    let answer = tokio::time::timeout(STEP, sender.send_request(request))
        .await
        .expect("the answer's headers in time")
        .expect("headers");
    assert_eq!(answer.status(), 200);
    let _ = tokio::time::timeout(STEP, connection)
        .await
        .expect("the server closes the connection");
    let closed_after = started.elapsed();
    assert!(
        closed_after >= write_timeout,
        "closed after {closed_after:?}, before the write timeout"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_http1_client_that_reads_nothing_is_closed_after_the_write_timeout() {
    let write_timeout = Duration::from_secs(1);
    let server = server_with_write_timeout(write_timeout).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    // Far more answer bytes than the sockets' buffers hold.
    let request = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n".repeat(400);
    let writing = tokio::spawn(async move {
        let _ = stream.write_all(&request).await;
        stream
    });
    let stream = tokio::time::timeout(STEP, writing)
        .await
        .expect("the requests are taken")
        .unwrap();
    // Nothing read for the write timeout (and the listener's check period):
    // the server has given up the connection, so reading now drains what
    // was sent and meets its end, where a live connection would send on.
    tokio::time::sleep(write_timeout * 3).await;
    assert!(
        closed_within(stream, STEP).await.is_some(),
        "the connection is closed"
    );
    server.stop().await;
}
