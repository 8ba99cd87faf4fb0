//! Which tasks run on which simulated servant: delegates start and finish
//! tasks here, servants report them in their heartbeats and kill the expired
//! ones. Servants are numbered as the cluster's machines; each has its own
//! lock, so lookups need no global one.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Mutex, MutexGuard, PoisonError,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
};

/// A task a delegate started on a servant.
#[derive(Debug, Clone, Copy)]
pub struct Task {
    pub servant_task_id: u64,
    /// Hex digits of the task digest (what `RunningTask.task_digest` carries).
    pub digest: [u8; 32],
    /// The machine whose delegate runs it.
    pub owner: usize,
    pub started: tokio::time::Instant,
}

#[derive(Debug, Default)]
struct Slot {
    next_task_id: u64,
    /// By grant id.
    tasks: HashMap<u64, Task>,
}

/// Which tasks run where, by servant (machine index).
#[derive(Debug, Default)]
pub struct Registry {
    slots: Vec<Mutex<Slot>>,
    by_location: HashMap<SocketAddr, usize>,
    running: AtomicUsize,
}

impl Registry {
    /// Servants `0..` at these locations, in order.
    pub fn new(locations: impl IntoIterator<Item = SocketAddr>) -> Registry {
        let by_location: HashMap<SocketAddr, usize> = locations
            .into_iter()
            .enumerate()
            .map(|(index, location)| (location, index))
            .collect();
        Registry {
            slots: (0..by_location.len()).map(|_| Mutex::default()).collect(),
            by_location,
            running: AtomicUsize::new(0),
        }
    }

    fn slot(&self, servant: usize) -> Option<MutexGuard<'_, Slot>> {
        self.slots
            .get(servant)
            .map(|slot| slot.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The servant a grant's `servant_location` names, if simulated here.
    pub fn servant_at(&self, location: &str) -> Option<usize> {
        let location = location.parse::<SocketAddr>().ok()?;
        self.by_location.get(&location).copied()
    }

    /// Starts a task under `grant_id` on `servant`, for `owner`'s delegate.
    pub fn start(&self, servant: usize, grant_id: u64, digest: [u8; 32], owner: usize) {
        if let Some(mut slot) = self.slot(servant) {
            slot.next_task_id += 1;
            let servant_task_id = slot.next_task_id;
            let task = Task {
                servant_task_id,
                digest,
                owner,
                started: tokio::time::Instant::now(),
            };
            if slot.tasks.insert(grant_id, task).is_none() {
                self.running.fetch_add(1, Relaxed);
            }
        }
    }

    /// The task finished: the servant stops reporting it.
    pub fn finish(&self, servant: usize, grant_id: u64) {
        if let Some(mut slot) = self.slot(servant)
            && slot.tasks.remove(&grant_id).is_some()
        {
            self.running.fetch_sub(1, Relaxed);
        }
    }

    /// Runs `report` over the servant's tasks by grant id, as its heartbeat
    /// lists them, under its lock.
    pub fn with_tasks<R>(
        &self,
        servant: usize,
        report: impl FnOnce(&HashMap<u64, Task>) -> R,
    ) -> R {
        match self.slot(servant) {
            Some(slot) => report(&slot.tasks),
            None => report(&HashMap::new()),
        }
    }

    /// Kills the listed tasks; returns the grant and task of each that ran.
    pub fn kill(&self, servant: usize, grant_ids: &[u64]) -> Vec<(u64, Task)> {
        let Some(mut slot) = self.slot(servant) else {
            return Vec::new();
        };
        let killed: Vec<(u64, Task)> = grant_ids
            .iter()
            .filter_map(|id| slot.tasks.remove(id).map(|task| (*id, task)))
            .collect();
        self.running.fetch_sub(killed.len(), Relaxed);
        killed
    }

    /// Tasks running on every servant.
    pub fn running(&self) -> usize {
        self.running.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_reported_finished_and_killed() {
        let registry = Registry::new(["127.1.0.1:8335".parse().unwrap()]);
        assert_eq!(registry.servant_at("127.1.0.1:8335"), Some(0));
        assert_eq!(registry.servant_at("127.9.9.9:8335"), None);
        assert_eq!(registry.servant_at("not an address"), None);
        registry.start(0, 7, [b'a'; 32], 3);
        registry.start(0, 8, [b'b'; 32], 4);
        registry.start(5, 9, [b'c'; 32], 4);
        assert_eq!(registry.running(), 2);
        let ids = registry.with_tasks(0, |tasks| {
            let mut ids: Vec<u64> = tasks.keys().copied().collect();
            ids.sort_unstable();
            ids
        });
        assert_eq!(ids, [7, 8]);
        let killed = registry.kill(0, &[7, 99]);
        assert_eq!(
            killed
                .iter()
                .map(|(id, task)| (*id, task.owner))
                .collect::<Vec<_>>(),
            [(7, 3)]
        );
        registry.finish(0, 8);
        registry.finish(0, 8);
        assert_eq!(registry.running(), 0);
    }
}
