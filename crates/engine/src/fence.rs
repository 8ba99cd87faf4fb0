//! Rule "fencing": until when this instance may grant. With one scheduler
//! it always may. With a hot standby (`crate::ha`) only the elected leader
//! may, and only while its etcd lease certainly still runs: the election
//! moves the deadline forward on each lease renewal and closes the fence on
//! losing. Every grant checks the deadline against the monotonic clock, so
//! a leader that was paused (SIGSTOP, a stalled VM) past its lease grants
//! nothing when it resumes, before any of its tasks has run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

/// Nanoseconds after the fence's origin, `CLOSED` when no grant is allowed.
const CLOSED: u64 = 0;

/// Cheap to clone; every clone is the same fence.
#[derive(Clone, Debug, Default)]
pub struct GrantFence(Option<Arc<Deadline>>);

#[derive(Debug)]
struct Deadline {
    origin: Instant,
    until_nanos: AtomicU64,
}

impl GrantFence {
    /// Always open: a scheduler that is the only one.
    pub fn open() -> Self {
        GrantFence(None)
    }

    /// Closed until [`GrantFence::open_until`] moves its deadline.
    pub fn closed() -> Self {
        GrantFence(Some(Arc::new(Deadline {
            origin: Instant::now(),
            until_nanos: AtomicU64::new(CLOSED),
        })))
    }

    /// Grants are allowed before `deadline` (an earlier one than held
    /// replaces it: the latest word of the lease is the truth). Ignored by an
    /// always-open fence.
    pub fn open_until(&self, deadline: Instant) {
        if let Some(inner) = &self.0 {
            let nanos = deadline.saturating_duration_since(inner.origin).as_nanos();
            let nanos = u64::try_from(nanos).unwrap_or(u64::MAX).max(CLOSED + 1);
            inner.until_nanos.store(nanos, Ordering::Release);
        }
    }

    /// No grant from now on, until opened again.
    pub fn close(&self) {
        if let Some(inner) = &self.0 {
            inner.until_nanos.store(CLOSED, Ordering::Release);
        }
    }

    /// Whether a grant may be made at `now`: one atomic load and a compare.
    pub fn allows(&self, now: Instant) -> bool {
        match &self.0 {
            None => true,
            Some(inner) => {
                let until = inner.until_nanos.load(Ordering::Acquire);
                until != CLOSED
                    && now.saturating_duration_since(inner.origin).as_nanos() < u128::from(until)
            }
        }
    }

    /// The deadline now held, if the fence is open and can close.
    pub fn deadline(&self) -> Option<Instant> {
        let inner = self.0.as_ref()?;
        let until = inner.until_nanos.load(Ordering::Acquire);
        (until != CLOSED).then(|| inner.origin + std::time::Duration::from_nanos(until))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fence_allows_only_before_its_deadline_and_never_once_closed() {
        let fence = GrantFence::closed();
        assert!(!fence.allows(Instant::now()), "closed until opened");
        let deadline = Instant::now() + Duration::from_secs(3);
        fence.open_until(deadline);
        assert!(fence.allows(Instant::now()));
        assert_eq!(fence.deadline(), Some(deadline));
        // A pause past the deadline: the first check after it refuses.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(!fence.allows(Instant::now()), "at the deadline, no more");
        fence.open_until(Instant::now() + Duration::from_secs(1));
        assert!(fence.allows(Instant::now()));
        fence.close();
        assert!(!fence.allows(Instant::now()));
        assert_eq!(fence.deadline(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_default_fence_is_always_open() {
        let fence = GrantFence::open();
        fence.close();
        assert!(fence.allows(Instant::now()));
        assert_eq!(fence.deadline(), None);
    }
}
