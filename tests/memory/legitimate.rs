//! The legitimate daemon on another loopback address: a servant whose
//! heartbeats must be answered during every attack.

use std::{net::SocketAddr, time::Duration};

use axum::body::Body;
use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper::client::conn::http2::SendRequest;
use prost::Message;
use tokio::task::JoinSet;
use yadcc_scheduler::sim::{
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
}

/// One legitimate daemon's connection.
pub enum Client {
    Daemon {
        connection: SerialConn,
        protocol: Wire,
        next_id: u64,
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
        }
    }

    pub async fn connect(self, addr: SocketAddr) -> Client {
        match self {
            Legitimate::Flare | Legitimate::HttpPb => {
                let protocol = match self {
                    Legitimate::Flare => Wire::Flare,
                    _ => Wire::HttpPb,
                };
                Client::Daemon {
                    connection: SerialConn::connect(Some(ip(LEGITIMATE)), addr, protocol)
                        .await
                        .expect("connect"),
                    protocol,
                    next_id: 0,
                }
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

fn heartbeat_message() -> Vec<u8> {
    heartbeat(&servant_location(LEGITIMATE, 8335), 8).encode_to_vec()
}

impl Client {
    /// One heartbeat; Err says what went wrong.
    pub async fn call(&mut self) -> Result<(), String> {
        match self {
            Client::Daemon {
                connection,
                protocol,
                next_id,
            } => {
                *next_id += 1;
                let mut request = BytesMut::new();
                match protocol {
                    Wire::Flare => wire::encode_flare_request(
                        &mut request,
                        *next_id,
                        Method::Heartbeat,
                        Duration::from_secs(2),
                        &heartbeat_message(),
                    ),
                    _ => wire::encode_http_pb_request(
                        &mut request,
                        *next_id,
                        Method::Heartbeat,
                        Duration::from_secs(2),
                        &heartbeat_message(),
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
                let request = grpc("Heartbeat", Body::from(framed(&heartbeat_message())));
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
