//! A connection with one exchange at a time: written request, then its
//! answer. What scripts do, what the P1 hammer uses so every protocol costs
//! the client the same, and the raw connection of the integration tests:
//! they write any bytes (pipelined requests, a request cut short, bad input)
//! and read whole answers with the same decoders.

use std::{
    io,
    net::{IpAddr, SocketAddr},
};

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::{CallError, connect, decode_answer, fill};
use crate::sim::wire::{self, Answer, FlareResponse, HttpResponse, Protocol, WireError};

#[derive(Debug)]
pub struct SerialConn {
    stream: TcpStream,
    buffer: BytesMut,
    protocol: Protocol,
    closed: bool,
}

impl SerialConn {
    pub async fn connect(
        local: Option<IpAddr>,
        target: SocketAddr,
        protocol: Protocol,
    ) -> io::Result<SerialConn> {
        Ok(SerialConn {
            stream: connect(local, target).await?,
            buffer: BytesMut::with_capacity(8192),
            protocol,
            closed: false,
        })
    }

    /// False once the server said `Connection: close` or an exchange failed.
    pub fn is_reusable(&self) -> bool {
        !self.closed
    }

    /// Writes `request` (a whole encoded request) and reads one answer.
    pub async fn exchange(&mut self, request: &[u8]) -> Result<Answer, CallError> {
        let result = async {
            self.send(request).await?;
            let protocol = self.protocol;
            self.read_with(|buffer| decode_answer(protocol, buffer))
                .await
        }
        .await;
        match &result {
            Ok(answer) if !answer.close => {}
            _ => self.closed = true,
        }
        result
    }

    /// Writes `bytes` as they are: part of a request, several, or garbage.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), CallError> {
        self.stream
            .write_all(bytes)
            .await
            .map_err(|error| CallError::Io(error.to_string()))
    }

    /// Reads the next whole HTTP/1.1 answer, every header kept.
    pub async fn read_http(&mut self) -> Result<HttpResponse, CallError> {
        self.read_with(wire::decode_http_response).await
    }

    /// Reads the next whole flare answer frame.
    pub async fn read_flare(&mut self) -> Result<FlareResponse, CallError> {
        self.read_with(wire::decode_flare_response).await
    }

    /// Writes `bytes` while reading the HTTP answer, for a server that answers
    /// (and may stop reading) before the request is all sent; a write it cuts
    /// short is not an error.
    pub async fn send_reading_http(&mut self, bytes: &[u8]) -> Result<HttpResponse, CallError> {
        let (mut read, mut write) = self.stream.split();
        let buffer = &mut self.buffer;
        let reading = async {
            loop {
                if let Some(response) = wire::decode_http_response(buffer)? {
                    return Ok(response);
                }
                fill(&mut read, buffer)
                    .await
                    .map_err(|error| CallError::Io(error.to_string()))?;
            }
        };
        let sending = async {
            let _ = write.write_all(bytes).await;
            // Only the answer ends the exchange.
            std::future::pending().await
        };
        tokio::select! {
            answer = reading => answer,
            never = sending => never,
        }
    }

    /// Waits for the server to close the connection; what it sent instead
    /// (bytes left unread, or arriving) is the error.
    pub async fn wait_closed(&mut self) -> Result<(), Bytes> {
        if !self.buffer.is_empty() {
            return Err(self.buffer.split().freeze());
        }
        let mut chunk = [0u8; 1024];
        match self.stream.read(&mut chunk).await {
            Ok(0) | Err(_) => Ok(()),
            Ok(read) => Err(Bytes::copy_from_slice(&chunk[..read])),
        }
    }

    /// Reads until `decode` takes a whole item off the buffer.
    async fn read_with<T>(
        &mut self,
        mut decode: impl FnMut(&mut BytesMut) -> Result<Option<T>, WireError>,
    ) -> Result<T, CallError> {
        loop {
            if let Some(item) = decode(&mut self.buffer)? {
                return Ok(item);
            }
            fill(&mut self.stream, &mut self.buffer)
                .await
                .map_err(|error| CallError::Io(error.to_string()))?;
        }
    }
}
