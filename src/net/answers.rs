//! The answers of one connection on the general HTTP path (hyper). Every
//! response body is counted on the connection's [`QueuedAnswers`] until
//! hyper has taken its bytes, handed over in slices of at most
//! [`ANSWER_SLICE`] bytes (a shared payload is sliced, not copied), and each
//! slice hyper takes stamps the body's progress. Hyper takes a slice only
//! once the one before is on its way (HTTP/2: within the stream's window and
//! hyper's send buffer; HTTP/1: within its write buffer), so a body that
//! makes no progress for the write timeout is one nobody reads: an HTTP/2
//! stream whose window stays shut, or a socket whose peer stopped reading.
//! The listener then closes the connection ([`AnswerTracker::stalled_for`]).

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::body::Body;
use bytes::{Buf, Bytes};
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Instant;

use crate::edge::QueuedAnswers;

/// The most a response body hands hyper at once.
pub const ANSWER_SLICE: usize = 64 * 1024;

/// When a body last handed hyper a slice that hyper has not come back for
/// since: milliseconds after the connection's start, or [`NOT_WAITING`]
/// (it is waiting for its own next bytes, as a streaming answer does, or is
/// done).
type Stamp = AtomicU64;
const NOT_WAITING: u64 = u64::MAX;

/// The answers of one connection: what is queued, and each body's progress.
#[derive(Debug)]
pub struct AnswerTracker {
    queued: QueuedAnswers,
    started: Instant,
    /// The stamps of the bodies alive; dead ones are pruned as it is read.
    bodies: Mutex<Vec<Weak<Stamp>>>,
}

impl AnswerTracker {
    pub fn new(queued: QueuedAnswers) -> Arc<Self> {
        Arc::new(Self {
            queued,
            started: Instant::now(),
            bodies: Mutex::default(),
        })
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// `body`, counted on the connection until hyper has taken it.
    pub fn track(self: &Arc<Self>, body: Body) -> Body {
        let counted = body.size_hint().lower() as usize;
        self.queued.add(counted);
        let stamp = Arc::new(Stamp::new(self.now_ms()));
        self.bodies
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Arc::downgrade(&stamp));
        Body::new(Counted {
            inner: body,
            answers: Arc::clone(self),
            stamp,
            counted,
            rest: Bytes::new(),
        })
    }

    /// How long the body that has waited longest has made no progress.
    pub fn stalled_for(&self) -> Duration {
        let now = self.now_ms();
        let mut bodies = self
            .bodies
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut oldest = now;
        bodies.retain(|body| match body.upgrade() {
            Some(stamp) => {
                let last = stamp.load(Ordering::Relaxed);
                if last != NOT_WAITING {
                    oldest = oldest.min(last);
                }
                true
            }
            None => false,
        });
        Duration::from_millis(now - oldest)
    }
}

/// A response body counted on its connection until taken.
struct Counted {
    inner: Body,
    answers: Arc<AnswerTracker>,
    stamp: Arc<Stamp>,
    /// Bytes still counted on the connection.
    counted: usize,
    /// What is left of a data frame larger than a slice.
    rest: Bytes,
}

impl Counted {
    /// Hands over `slice`: it is taken, and that is progress.
    fn hand_over(&mut self, slice: Bytes) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let taken = slice.len().min(self.counted);
        self.counted -= taken;
        self.answers.queued.remove(taken);
        self.stamp.store(self.answers.now_ms(), Ordering::Relaxed);
        Poll::Ready(Some(Ok(Frame::data(slice))))
    }

    fn finished(&mut self) {
        self.stamp.store(NOT_WAITING, Ordering::Relaxed);
        self.answers
            .queued
            .remove(std::mem::take(&mut self.counted));
    }
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if !this.rest.is_empty() {
            let slice = this.rest.split_to(this.rest.len().min(ANSWER_SLICE));
            return this.hand_over(slice);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(mut data) => {
                    let slice = data.split_to(data.remaining().min(ANSWER_SLICE));
                    this.rest = data;
                    this.hand_over(slice)
                }
                Err(frame) => {
                    this.finished();
                    Poll::Ready(Some(Ok(frame)))
                }
            },
            Poll::Ready(None) => {
                this.finished();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(error))) => {
                this.finished();
                Poll::Ready(Some(Err(error)))
            }
            // Hyper came back for more and the answer has none yet: it
            // is not waiting for the peer.
            Poll::Pending => {
                this.stamp.store(NOT_WAITING, Ordering::Relaxed);
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.finished();
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_body_is_counted_until_taken_and_its_progress_stamped() {
        let queued = QueuedAnswers::default();
        let answers = AnswerTracker::new(queued.clone());
        let payload = Bytes::from(vec![5u8; 3 * ANSWER_SLICE + 10]);
        let mut body = answers.track(Body::from(payload.clone()));
        assert_eq!(queued.bytes(), payload.len());
        assert_eq!(body.size_hint().exact(), Some(payload.len() as u64));
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first.len(), ANSWER_SLICE);
        assert_eq!(first.as_ptr(), payload.as_ptr(), "a slice, not a copy");
        assert_eq!(queued.bytes(), payload.len() - ANSWER_SLICE);
        // Nothing taken for a while: the connection sees the stall.
        tokio::time::advance(Duration::from_secs(7)).await;
        assert_eq!(answers.stalled_for(), Duration::from_secs(7));
        let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(second.len(), ANSWER_SLICE);
        assert_eq!(answers.stalled_for(), Duration::ZERO);
        let mut rest = Vec::new();
        while let Some(frame) = body.frame().await {
            rest.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        assert_eq!(rest.len(), ANSWER_SLICE + 10);
        assert_eq!(queued.bytes(), 0);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            answers.stalled_for(),
            Duration::ZERO,
            "a finished body is never stalled"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_streaming_answer_waiting_for_its_own_bytes_is_not_stalled() {
        let answers = AnswerTracker::new(QueuedAnswers::default());
        let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(1);
        let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
            let bytes = receiver.recv().await?;
            Some((Ok::<_, std::convert::Infallible>(bytes), receiver))
        });
        let mut body = answers.track(Body::from_stream(stream));
        sender.send(Bytes::from_static(b"first")).await.unwrap();
        body.frame().await.unwrap().unwrap();
        // Hyper comes back at once; the stream has nothing for a minute.
        let next = tokio::spawn(async move { body.frame().await.map(|frame| frame.is_ok()) });
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(answers.stalled_for(), Duration::ZERO);
        sender.send(Bytes::from_static(b"second")).await.unwrap();
        assert_eq!(next.await.unwrap(), Some(true));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_dropped_unread_is_uncounted() {
        let queued = QueuedAnswers::default();
        let answers = AnswerTracker::new(queued.clone());
        let body = answers.track(Body::from(vec![1u8; 1000]));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(answers.stalled_for(), Duration::from_secs(3));
        drop(body);
        assert_eq!(queued.bytes(), 0);
        assert_eq!(answers.stalled_for(), Duration::ZERO);
        assert!(answers.bodies.lock().unwrap().is_empty(), "pruned");
    }
}
