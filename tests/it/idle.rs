//! Connections that do nothing useful end, on every protocol (issue 29):
//! an HTTP/2 connection with no open stream for the idle timeout, whatever
//! else it sends, and a daemon connection that sends only frames the server
//! drops. The idle timeout is shortened here (the flag refuses less than
//! 60 s); `tests/memory/strangers.rs` has the same attacks on the binary.

use std::time::Duration;

use axum::body::Body;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::{io::AsyncWriteExt, net::TcpStream, time::Instant};
use yadcc_pb::{self as pb, flare::rpc::RpcMeta};
use yadcc_scheduler::{edge::EdgeSettings, rpc::state::TransportSettings};
use yadcc_sim::wire;

use crate::support::*;

const IDLE: Duration = Duration::from_millis(400);

async fn server_idle_after(idle_timeout: Duration) -> Server {
    Server::start_with(
        engine_config(),
        TransportSettings {
            edge: EdgeSettings {
                idle_timeout,
                ..EdgeSettings::default()
            },
            ..TransportSettings::default()
        },
        "127.0.0.1:0",
    )
    .await
}

#[tokio::test]
async fn an_http2_connection_without_an_open_stream_closes_after_the_idle_timeout() {
    let server = server_idle_after(IDLE).await;
    let stream = TcpStream::connect(server.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    let config = pb::GetConfigRequest {
        token: USER_TOKEN.into(),
    }
    .encode_to_vec();
    let mut framed = vec![0];
    framed.extend((config.len() as u32).to_be_bytes());
    framed.extend(config);
    let request = axum::http::Request::post(format!("http://x/{SERVICE}/GetConfig"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Body::from(framed))
        .unwrap();
    let answer = sender.send_request(request).await.expect("an answer");
    assert_eq!(answer.status(), 200);
    answer
        .into_body()
        .collect()
        .await
        .expect("the whole answer");
    let answered = Instant::now();
    tokio::time::timeout(STEP, connection)
        .await
        .expect("the server closes the idle connection")
        .ok();
    let after = answered.elapsed();
    assert!(
        after >= IDLE / 2 && after < IDLE * 5,
        "closed {after:?} after the last answer"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_daemon_connection_sending_only_dropped_frames_idles_out() {
    let server = server_idle_after(IDLE).await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let meta = RpcMeta {
        request_meta: None,
        ..wire::daemon_request_meta(1, format!("{SERVICE}.GetConfig"), Duration::from_secs(2))
    };
    let dropped = flare_frame(&meta, &[], &[]);
    // One a while, fewer than a burst: only the idle timeout closes it,
    // while they still come.
    stream.write_all(&dropped).await.unwrap();
    let started = Instant::now();
    let (mut reader, mut writer) = stream.into_split();
    let sending = async move {
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            if writer.write_all(&dropped).await.is_err() {
                break;
            }
        }
    };
    let closing = async move {
        let mut chunk = [0u8; 256];
        let _ = tokio::time::timeout(STEP, tokio::io::AsyncReadExt::read(&mut reader, &mut chunk))
            .await;
        started.elapsed()
    };
    let ((), closed) = tokio::join!(sending, closing);
    assert!(
        closed >= IDLE / 2 && closed < Duration::from_millis(800),
        "closed after {closed:?}, frames coming every 150 ms until 900 ms"
    );
    server.stop().await;
}
