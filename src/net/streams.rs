//! What a hyper connection is doing: the requests (HTTP/2 streams) it has
//! open, counted from when hyper hands a request over until its answer's
//! body is finished or dropped. The listener closes a connection that never
//! completes a request head within the header-read timeout, and one with no
//! open request for the idle timeout, whatever bytes it moves: hyper has no
//! such timeout for HTTP/2, and its keep-alive pings (and a peer's PINGs,
//! SETTINGS or frames hyper drops) move bytes without serving anyone.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::body::Body;
use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Instant;

/// The open requests of one connection. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Streams {
    inner: Arc<Counts>,
}

#[derive(Debug)]
struct Counts {
    started: Instant,
    open: AtomicUsize,
    /// Requests handed over so far.
    requests: AtomicU64,
    /// When the last request closed (or the connection started), as
    /// milliseconds after the start.
    quiet_since_ms: AtomicU64,
}

/// Whether a connection may stay open, as [`Streams::verdict`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Serving,
    /// No complete request head within the header-read timeout.
    NoRequest,
    /// No open request for the idle timeout.
    Idle,
}

impl Streams {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Counts {
                started: Instant::now(),
                open: AtomicUsize::new(0),
                requests: AtomicU64::new(0),
                quiet_since_ms: AtomicU64::new(0),
            }),
        }
    }

    /// A request was handed over: open until the guard is dropped.
    pub fn open(&self) -> Open {
        self.inner.requests.fetch_add(1, Ordering::Relaxed);
        self.inner.open.fetch_add(1, Ordering::AcqRel);
        Open {
            counts: Arc::clone(&self.inner),
        }
    }

    pub fn verdict(&self, header_read_timeout: Duration, idle_timeout: Duration) -> Verdict {
        let counts = &*self.inner;
        if counts.open.load(Ordering::Acquire) > 0 {
            return Verdict::Serving;
        }
        let age = counts.started.elapsed();
        if counts.requests.load(Ordering::Relaxed) == 0 && age >= header_read_timeout {
            return Verdict::NoRequest;
        }
        let quiet_since = Duration::from_millis(counts.quiet_since_ms.load(Ordering::Relaxed));
        if age.saturating_sub(quiet_since) >= idle_timeout {
            return Verdict::Idle;
        }
        Verdict::Serving
    }
}

impl Default for Streams {
    fn default() -> Self {
        Self::new()
    }
}

/// One open request; closes it when dropped.
#[derive(Debug)]
pub struct Open {
    counts: Arc<Counts>,
}

impl Open {
    /// `body`, the request open until it is finished or dropped.
    pub fn until_sent(self, body: Body) -> Body {
        Body::new(Guarded {
            inner: body,
            _open: self,
        })
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let counts = &*self.counts;
        let now = counts.started.elapsed().as_millis() as u64;
        counts.quiet_since_ms.store(now, Ordering::Relaxed);
        counts.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body holding its request open.
struct Guarded {
    inner: Body,
    _open: Open,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    const HEAD: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(90);

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_a_request_ends_at_the_header_read_timeout() {
        let streams = Streams::new();
        tokio::time::advance(HEAD - Duration::from_millis(1)).await;
        assert_eq!(streams.verdict(HEAD, IDLE), Verdict::Serving);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(streams.verdict(HEAD, IDLE), Verdict::NoRequest);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_counts_from_the_last_answer_sent_never_while_one_is_open() {
        let streams = Streams::new();
        let open = streams.open();
        tokio::time::advance(IDLE * 3).await;
        assert_eq!(
            streams.verdict(HEAD, IDLE),
            Verdict::Serving,
            "a long poll is open"
        );
        let mut body = open.until_sent(Body::from("answer"));
        tokio::time::advance(IDLE).await;
        assert_eq!(streams.verdict(HEAD, IDLE), Verdict::Serving);
        while body.frame().await.is_some() {}
        drop(body);
        tokio::time::advance(IDLE - Duration::from_secs(1)).await;
        assert_eq!(streams.verdict(HEAD, IDLE), Verdict::Serving);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(streams.verdict(HEAD, IDLE), Verdict::Idle);
    }
}
