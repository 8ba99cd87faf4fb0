//! A connection with one exchange at a time: written request, then its
//! answer. What scripts do, what the P1 heartbeat-rate benchmark uses so every protocol costs
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
use crate::wire::{self, FlareResponse, HttpResponse, Outcome, StreamAnswer, StreamError, Wire};

#[derive(Debug)]
pub struct SerialConn {
    stream: TcpStream,
    buffer: BytesMut,
    protocol: Wire,
    closed: bool,
}

impl SerialConn {
    pub async fn connect(
        local: Option<IpAddr>,
        target: SocketAddr,
        protocol: Wire,
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
    pub async fn exchange(&mut self, request: &[u8]) -> Result<StreamAnswer, CallError> {
        self.exchange_pipelined(request, 1).await
    }

    /// Writes `requests` (`count` whole requests back to back, as a daemon
    /// with many calls in flight on one connection sends them) and reads
    /// `count` answers, in whatever order they come. Returns the first answer
    /// that is not a success, else the last one; either way every answer of
    /// the window is read, so the next window starts clean.
    pub async fn exchange_pipelined(
        &mut self,
        requests: &[u8],
        count: usize,
    ) -> Result<StreamAnswer, CallError> {
        let result = self.send(requests).await;
        let protocol = self.protocol;
        let mut first_failure = None;
        let mut last = None;
        for _ in 0..count.max(1) {
            if result.is_err() {
                break;
            }
            let answer = match self
                .read_with(|buffer| decode_answer(protocol, buffer))
                .await
            {
                Ok(answer) => answer,
                Err(error) => {
                    self.closed = true;
                    return Err(error);
                }
            };
            let close = answer.close;
            if matches!(answer.outcome, Outcome::Ok(_)) {
                last = Some(answer);
            } else if first_failure.is_none() {
                first_failure = Some(answer);
            }
            if close {
                // Nothing more comes on this connection.
                self.closed = true;
                break;
            }
        }
        if let Err(error) = result {
            self.closed = true;
            return Err(error);
        }
        first_failure
            .or(last)
            .ok_or_else(|| CallError::Protocol("the connection closed mid-window".to_owned()))
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
        mut decode: impl FnMut(&mut BytesMut) -> Result<Option<T>, StreamError>,
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

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    /// A server that answers after the first bytes of a large request and
    /// stops reading: the answer is read while the write is still blocked,
    /// then the close is seen.
    #[tokio::test]
    async fn an_early_answer_is_read_while_sending_then_the_close() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut first = [0u8; 16];
            stream.read_exact(&mut first).await.unwrap();
            stream
                .write_all(b"HTTP/1.1 413 Payload Too Large\r\nRpc-SeqNo: 7\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            // Unread bytes make the kernel reset the connection: either way
            // the client sees it closed.
            drop(stream);
        });
        let mut connection = SerialConn::connect(None, addr, Wire::HttpPb).await.unwrap();
        // Far more than the socket buffers hold, so the write cannot finish.
        let request = vec![b'x'; 16 << 20];
        let answer = connection.send_reading_http(&request).await.unwrap();
        assert_eq!(
            (answer.status, answer.header("rpc-seqno")),
            (413, Some("7"))
        );
        assert!(answer.close);
        server.await.unwrap();
        assert_eq!(connection.wait_closed().await, Ok(()));
    }

    /// A window of pipelined requests: every answer is read whatever its
    /// order; a failure in the middle is what is reported, and the answers
    /// after it are still taken off the stream.
    #[tokio::test]
    async fn a_pipelined_window_reads_every_answer_and_reports_the_first_failure() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let ok = |seq: u32| {
                format!("HTTP/1.1 200 OK\r\nRpc-SeqNo: {seq}\r\nContent-Length: 0\r\n\r\n")
            };
            let mut request = [0u8; 6];
            stream.read_exact(&mut request).await.unwrap();
            let window = [ok(3), ok(1), ok(2)].concat();
            stream.write_all(window.as_bytes()).await.unwrap();
            stream.read_exact(&mut request).await.unwrap();
            let failed = "HTTP/1.1 503 Service Unavailable\r\nRpc-SeqNo: 1\r\nRpc-Error-Code: 1001\r\nContent-Length: 0\r\n\r\n";
            let window = [ok(2), failed.to_owned(), ok(3)].concat();
            stream.write_all(window.as_bytes()).await.unwrap();
            std::future::pending::<()>().await;
        });
        let mut connection = SerialConn::connect(None, addr, Wire::HttpPb).await.unwrap();
        let last = connection.exchange_pipelined(b"abcdef", 3).await.unwrap();
        assert!(matches!(last.outcome, Outcome::Ok(_)));
        assert_eq!(last.id, Some(2), "the window's last answer");
        let failure = connection.exchange_pipelined(b"abcdef", 3).await.unwrap();
        assert!(
            matches!(failure.outcome, Outcome::Failed { code: 1001, .. }),
            "{failure:?}"
        );
        assert!(connection.is_reusable());
        assert!(
            connection.buffer.is_empty(),
            "the answer after the failure was read too"
        );
    }

    /// Answers written back to back are read one at a time, each whole;
    /// bytes that are not an answer are an error, not a hang.
    #[tokio::test]
    async fn pipelined_answers_are_read_one_by_one() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabHTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\nnot an answer\r\n\r\n")
                .await
                .unwrap();
            std::future::pending::<()>().await;
        });
        let mut connection = SerialConn::connect(None, addr, Wire::HttpPb).await.unwrap();
        let first = connection.read_http().await.unwrap();
        assert_eq!((first.status, &first.body[..]), (200, &b"ab"[..]));
        assert_eq!(connection.read_http().await.unwrap().status, 204);
        let garbage = connection.read_http().await;
        assert!(
            matches!(garbage, Err(CallError::Protocol(_))),
            "{garbage:?}"
        );
    }
}
