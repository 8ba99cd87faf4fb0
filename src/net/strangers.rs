//! The connections that have not proved a token yet, oldest first: near the
//! connection cap a new connection evicts the oldest of them instead of
//! being refused, so that strangers (a flood from a few addresses) can never
//! hold every place while daemons that proved a token are locked out. A
//! connection that proved itself is never evicted: it is skipped, and left
//! out of the table, when it comes up.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use tokio::sync::Notify;

use crate::edge::Proof;

/// The table. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Strangers {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    /// By admission order: the first is the oldest.
    seats: BTreeMap<u64, Seated>,
}

#[derive(Debug)]
struct Seated {
    proof: Proof,
    evict: Arc<Notify>,
}

/// One connection's place in the table, left when dropped.
#[derive(Debug)]
pub struct Seat {
    strangers: Arc<Strangers>,
    id: u64,
    evict: Arc<Notify>,
}

impl Strangers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Seats a new connection of standing `proof`.
    pub fn seat(self: &Arc<Self>, proof: Proof) -> Seat {
        let evict = Arc::new(Notify::new());
        let mut table = self.lock();
        let id = table.next;
        table.next += 1;
        table.seats.insert(
            id,
            Seated {
                proof,
                evict: Arc::clone(&evict),
            },
        );
        Seat {
            strangers: Arc::clone(self),
            id,
            evict,
        }
    }

    /// Tells the oldest connection that has proved nothing to close; false
    /// when there is none.
    pub fn evict_oldest(&self) -> bool {
        let mut table = self.lock();
        while let Some((_, seated)) = table.seats.pop_first() {
            if !seated.proof.is_proved() {
                // A stored permit: the connection sees it even if it is not
                // waiting yet.
                seated.evict.notify_one();
                return true;
            }
        }
        false
    }

    /// Connections seated and not yet evicted nor known to have proved
    /// themselves.
    pub fn len(&self) -> usize {
        self.lock().seats.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Seat {
    /// Resolves once the connection is evicted.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.strangers.lock().seats.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_oldest_stranger_is_evicted_and_a_proved_connection_never() {
        let strangers = Arc::new(Strangers::default());
        let daemon = Proof::stranger();
        let oldest = strangers.seat(daemon.clone());
        let second = strangers.seat(Proof::stranger());
        let third = strangers.seat(Proof::stranger());
        daemon.mark();
        assert!(strangers.evict_oldest());
        let quick = Duration::from_millis(50);
        assert!(
            tokio::time::timeout(quick, oldest.evicted()).await.is_err(),
            "the daemon proved its token"
        );
        tokio::time::timeout(quick, second.evicted())
            .await
            .expect("the oldest stranger");
        assert!(tokio::time::timeout(quick, third.evicted()).await.is_err());
        assert_eq!(strangers.len(), 1, "only the third is left to evict");
        drop(third);
        assert!(!strangers.evict_oldest(), "no stranger left");
        drop((oldest, second));
        assert!(strangers.is_empty());
    }
}
