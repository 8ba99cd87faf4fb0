//! The legitimate daemon on another loopback address: a servant whose
//! heartbeats must be answered during every attack.

use std::{net::SocketAddr, time::Duration};

use axum::body::Body;
use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper::client::conn::http2::SendRequest;
use prost::Message;
use tokio::task::JoinSet;
use yadcc_pb as pb;
use yadcc_sim::{
    client::SerialConn,
    wire::{self, Outcome, Wire},
};

use crate::{
    attacks::{framed, grpc, http2_from},
    cluster::{LEGITIMATE, ip},
    support::{Method, heartbeat, servant_location},
};

#[derive(Debug, Clone, Copy)]
pub enum Legitimate {
    Flare,
    HttpPb,
    /// gRPC over HTTP/2, as the attacker of the HTTP/2 rows speaks.
    Grpc,
    /// A servant running 1,200 tasks: each flare heartbeat reports them
    /// all (about 100 KB, over a connection's own 64 KiB allowance; at
    /// 80 KB the calls that beat the flood to a freed byte often fit even
    /// without the strangers' share); its
    /// connection proved its token with a first, small heartbeat.
    LargeFlare,
}

/// One legitimate daemon's connection.
pub enum Client {
    Daemon {
        connection: SerialConn,
        protocol: Wire,
        next_id: u64,
        /// The running tasks each heartbeat reports.
        tasks: usize,
    },
    Grpc {
        sender: SendRequest<Body>,
        _driver: JoinSet<()>,
    },
}

impl Legitimate {
    pub fn label(self) -> &'static str {
        match self {
            Legitimate::Flare => "legitimate flare heartbeats",
            Legitimate::HttpPb => "legitimate http+pb heartbeats",
            Legitimate::Grpc => "legitimate gRPC heartbeats",
            Legitimate::LargeFlare => "legitimate 100 KB flare heartbeats",
        }
    }

    pub async fn connect(self, addr: SocketAddr) -> Client {
        match self {
            Legitimate::Flare | Legitimate::HttpPb | Legitimate::LargeFlare => {
                let protocol = match self {
                    Legitimate::HttpPb => Wire::HttpPb,
                    _ => Wire::Flare,
                };
                let mut client = Client::Daemon {
                    connection: SerialConn::connect(Some(ip(LEGITIMATE)), addr, protocol)
                        .await
                        .expect("connect"),
                    protocol,
                    next_id: 0,
                    tasks: 0,
                };
                if matches!(self, Legitimate::LargeFlare) {
                    // Proves the connection's token before the attack.
                    client.call().await.expect("the first, small heartbeat");
                    if let Client::Daemon { tasks, .. } = &mut client {
                        *tasks = LARGE_HEARTBEAT_TASKS;
                    }
                }
                client
            }
            Legitimate::Grpc => {
                let mut driver = JoinSet::new();
                let sender = http2_from(&mut driver, LEGITIMATE, addr, None).await;
                Client::Grpc {
                    sender,
                    _driver: driver,
                }
            }
        }
    }
}

/// Running tasks a large heartbeat reports.
const LARGE_HEARTBEAT_TASKS: usize = 1200;

fn heartbeat_message(tasks: usize) -> Vec<u8> {
    pb::HeartbeatRequest {
        running_tasks: (1..=tasks as u64)
            .map(|id| pb::RunningTask {
                servant_task_id: id,
                task_grant_id: id,
                servant_location: String::new(),
                task_digest: format!("{id:064x}"),
            })
            .collect(),
        ..heartbeat(&servant_location(LEGITIMATE, 8335), 8)
    }
    .encode_to_vec()
}

impl Client {
    /// One heartbeat; Err says what went wrong.
    pub async fn call(&mut self) -> Result<(), String> {
        match self {
            Client::Daemon {
                connection,
                protocol,
                next_id,
                tasks,
            } => {
                *next_id += 1;
                let mut request = BytesMut::new();
                match protocol {
                    Wire::Flare => wire::encode_flare_request(
                        &mut request,
                        *next_id,
                        Method::Heartbeat,
                        Duration::from_secs(2),
                        &heartbeat_message(*tasks),
                    ),
                    _ => wire::encode_http_pb_request(
                        &mut request,
                        *next_id,
                        Method::Heartbeat,
                        Duration::from_secs(2),
                        &heartbeat_message(*tasks),
                    ),
                }
                let answer = connection
                    .exchange(&request)
                    .await
                    .map_err(|error| format!("{}: {error}", protocol.label()))?;
                match answer.outcome {
                    Outcome::Ok(_) => Ok(()),
                    failed => Err(format!("{}: {failed:?}", protocol.label())),
                }
            }
            Client::Grpc { sender, .. } => {
                let request = grpc("Heartbeat", Body::from(framed(&heartbeat_message(0))));
                let answer = sender
                    .send_request(request)
                    .await
                    .map_err(|error| format!("gRPC: {error}"))?;
                let collected = answer
                    .into_body()
                    .collect()
                    .await
                    .map_err(|error| format!("gRPC body: {error}"))?;
                let status = collected
                    .trailers()
                    .and_then(|trailers| trailers.get("grpc-status"))
                    .and_then(|status| status.to_str().ok())
                    .unwrap_or("none")
                    .to_owned();
                (status == "0")
                    .then_some(())
                    .ok_or_else(|| format!("grpc-status {status}"))
            }
        }
    }
}
