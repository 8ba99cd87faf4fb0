//! The stream handed to hyper: the bytes read while sniffing the protocol are
//! replayed first, and every read or write stamps the connection's last
//! activity, which the idle watchdog reads.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, Bytes};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Instant,
};

use crate::edge::BufferCharge;

/// When a connection last moved a byte, and since when its writes have been
/// blocked (the peer reads nothing), as milliseconds after its start.
#[derive(Debug, Clone)]
pub struct Activity {
    started: Instant,
    last_ms: Arc<AtomicU64>,
    /// [`NOT_BLOCKED`], or when a write first found the socket full.
    blocked_since_ms: Arc<AtomicU64>,
}

const NOT_BLOCKED: u64 = u64::MAX;

impl Activity {
    pub fn new() -> Self {
        Self {
            started: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
            blocked_since_ms: Arc::new(AtomicU64::new(NOT_BLOCKED)),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    /// A write went through: the socket is not blocked (any more).
    fn wrote(&self) {
        self.touch();
        if self.blocked_since_ms.load(Ordering::Relaxed) != NOT_BLOCKED {
            self.blocked_since_ms.store(NOT_BLOCKED, Ordering::Relaxed);
        }
    }

    /// A write found the socket full.
    fn blocked(&self) {
        if self.blocked_since_ms.load(Ordering::Relaxed) == NOT_BLOCKED {
            self.blocked_since_ms
                .store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// How long writes have found the socket full without a byte going
    /// through; zero when they are not blocked.
    pub fn write_blocked_for(&self) -> Duration {
        match self.blocked_since_ms.load(Ordering::Relaxed) {
            NOT_BLOCKED => Duration::ZERO,
            since => Duration::from_millis(self.now_ms().saturating_sub(since)),
        }
    }

    /// How long since the last byte moved.
    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

/// A stream with some already-read bytes put back in front of it.
#[derive(Debug)]
pub struct Rewind<S> {
    prefix: Bytes,
    inner: S,
    activity: Activity,
    /// Until the connection's first request, what it reads is charged here
    /// (twice: buffers grow by doubling); a read that does not fit fails.
    charge: Option<BufferCharge>,
}

impl<S> Rewind<S> {
    pub fn new(prefix: Bytes, inner: S, activity: Activity) -> Self {
        Self {
            prefix,
            inner,
            activity,
            charge: None,
        }
    }

    /// Charges what is read from `inner` to `charge` until it is released.
    pub fn charged(mut self, charge: BufferCharge) -> Self {
        self.charge = Some(charge);
        self
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        if matches!(polled, Poll::Ready(Ok(()))) && read > 0 {
            self.activity.touch();
            if let Some(charge) = &self.charge
                && !charge.grow_by(read.saturating_mul(2))
            {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "over the budget for connection buffers",
                )));
            }
        }
        polled
    }
}

impl<S> Rewind<S> {
    fn note_write(&self, polled: &Poll<io::Result<usize>>) {
        match polled {
            Poll::Ready(Ok(written)) if *written > 0 => self.activity.wrote(),
            Poll::Pending => self.activity.blocked(),
            Poll::Ready(_) => {}
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.note_write(&polled);
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.note_write(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn the_prefix_is_read_before_the_stream() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b" world").await.unwrap();
        drop(client);
        let mut rewound = Rewind::new(Bytes::from_static(b"hello"), server, Activity::new());
        let mut text = String::new();
        rewound.read_to_string(&mut text).await.unwrap();
        assert_eq!(text, "hello world");
    }

    #[tokio::test(start_paused = true)]
    async fn writes_to_a_peer_that_reads_nothing_are_blocked_from_the_first_that_waits() {
        let (mut client, server) = tokio::io::duplex(16);
        let activity = Activity::new();
        let mut rewound = Rewind::new(Bytes::new(), server, activity.clone());
        rewound.write_all(&[1; 16]).await.unwrap();
        assert_eq!(activity.write_blocked_for(), Duration::ZERO);
        let writing = tokio::spawn(async move {
            rewound.write_all(&[2; 16]).await.unwrap();
            rewound
        });
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(activity.write_blocked_for(), Duration::from_secs(4));
        let mut read = [0u8; 32];
        client.read_exact(&mut read).await.unwrap();
        let _rewound = writing.await.unwrap();
        assert_eq!(activity.write_blocked_for(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn activity_counts_from_the_last_byte() {
        let (mut client, server) = tokio::io::duplex(64);
        let activity = Activity::new();
        let mut rewound = Rewind::new(Bytes::new(), server, activity.clone());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(activity.idle_for(), Duration::from_secs(5));
        client.write_all(b"x").await.unwrap();
        let mut byte = [0u8; 1];
        rewound.read_exact(&mut byte).await.unwrap();
        assert_eq!(activity.idle_for(), Duration::ZERO);
    }
}
