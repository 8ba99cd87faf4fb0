//! The timers of a simulated cluster. Every machine's periodic calls, job
//! arrivals and completions, retries and call deadlines are entries in a
//! timing wheel; machines are split over a few shards, each with its wheel
//! and one task that runs whatever fell due. So thousands of machines need a
//! handful of tasks, the entries due at one tick run in one wake, and
//! setting or firing an entry costs the same however many there are (a
//! binary heap's cost grew with the tens of thousands of call deadlines).

use std::{
    sync::{Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

use super::client::Expiry;

/// What falls due, for which machine (its index in the cluster).
#[derive(Debug)]
pub(crate) enum Event {
    /// The servant's next heartbeat.
    Heartbeat(usize),
    /// The delegate's next `GetRunningTasks`.
    RunningTasks(usize),
    /// The delegate's next `GetConfig`.
    Config(usize),
    /// The delegate renews its running grants and frees stale prefetched ones.
    Renew(usize),
    /// A compilation arrives (a steady stream of jobs).
    Arrival(usize),
    /// An idle developer starts a build.
    BuildStart(usize),
    /// The compilation under `grant` finished on its servant.
    JobDone { machine: usize, grant: u64 },
    /// A compiler's `WaitForStartingTask` loop tries again after an error.
    LaneRetry { machine: usize, lane: usize },
    /// A call still unanswered at its client timeout ends.
    Expire(Expiry),
}

/// Slots of the wheel, one per millisecond: a turn is about 4 s. An entry due
/// in a later turn waits in its slot for that turn.
const SLOTS: usize = 4096;
const WORDS: usize = SLOTS / 64;

struct Entry {
    /// Due at this tick (milliseconds since the shard's epoch).
    tick: u64,
    event: Event,
}

struct Wheel {
    epoch: Instant,
    slots: Vec<Vec<Entry>>,
    /// Which slots hold entries, a bit each, to find the next one fast.
    occupied: [u64; WORDS],
    entries: usize,
    /// Every tick up to this one has run.
    done: u64,
    /// The tick at which the shard's task wakes unless notified.
    armed: Option<u64>,
    /// An empty vector kept for the next slot's entries that are not due.
    spare: Vec<Entry>,
}

impl Wheel {
    fn millis(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.epoch)
    }

    fn instant_of(&self, tick: u64) -> Instant {
        self.epoch + Duration::from_millis(tick)
    }

    fn mark(&mut self, slot: usize, occupied: bool) {
        let bit = 1u64 << (slot % 64);
        if occupied {
            self.occupied[slot / 64] |= bit;
        } else {
            self.occupied[slot / 64] &= !bit;
        }
    }

    /// The first tick after `done` whose slot holds an entry (maybe one for
    /// a later turn: the task then wakes once for nothing).
    fn next_occupied(&self) -> Option<u64> {
        if self.entries == 0 {
            return None;
        }
        let from = (self.done + 1) as usize % SLOTS;
        let (first_word, first_bit) = (from / 64, from % 64);
        (0..=WORDS).find_map(|step| {
            let word = (first_word + step) % WORDS;
            let bits = match step {
                0 => self.occupied[word] & (!0u64 << first_bit),
                // Round to the first word again: the slots before `from`.
                WORDS => self.occupied[word] & !(!0u64 << first_bit),
                _ => self.occupied[word],
            };
            (bits != 0).then(|| {
                let slot = word * 64 + bits.trailing_zeros() as usize;
                let ahead = (slot + SLOTS - from) % SLOTS;
                self.done + 1 + ahead as u64
            })
        })
    }
}

/// One shard's timers.
pub(crate) struct Shard {
    wheel: Mutex<Wheel>,
    wake: Notify,
}

impl Default for Shard {
    fn default() -> Shard {
        Shard {
            wheel: Mutex::new(Wheel {
                epoch: Instant::now(),
                slots: (0..SLOTS).map(|_| Vec::new()).collect(),
                occupied: [0; WORDS],
                entries: 0,
                done: 0,
                armed: None,
                spare: Vec::new(),
            }),
            wake: Notify::new(),
        }
    }
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("entries", &self.lock().entries)
            .finish()
    }
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Wheel> {
        self.wheel.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `event` falls due at `at` (at the next tick if that has passed).
    pub(crate) fn at(&self, at: Instant, event: Event) {
        let mut wheel = self.lock();
        // Rounded up, so nothing runs before it is due.
        let millis = wheel.millis(at).as_nanos().div_ceil(1_000_000) as u64;
        let tick = millis.max(wheel.done + 1);
        let slot = tick as usize % SLOTS;
        wheel.slots[slot].push(Entry { tick, event });
        wheel.mark(slot, true);
        wheel.entries += 1;
        let sooner = wheel.armed.is_none_or(|armed| tick < armed);
        if sooner {
            wheel.armed = Some(tick);
        }
        drop(wheel);
        if sooner {
            // A permit is kept if the task is not waiting yet.
            self.wake.notify_one();
        }
    }

    /// Moves every entry due by `now` into `due` (with its tick), in order;
    /// returns when the task should look again.
    fn take_due(&self, now: Instant, due: &mut Vec<(u64, Event)>) -> Option<Instant> {
        let mut wheel = self.lock();
        let wheel = &mut *wheel;
        let now_tick = (wheel.millis(now).as_millis() as u64).max(wheel.done);
        // After a stall longer than a turn, each slot is looked at once, and
        // what was due is put in order below.
        let first = (wheel.done + 1).max((now_tick + 1).saturating_sub(SLOTS as u64));
        let stalled = first > wheel.done + 1;
        for tick in first..=now_tick {
            let slot = tick as usize % SLOTS;
            if wheel.slots[slot].is_empty() {
                continue;
            }
            let mut kept = std::mem::take(&mut wheel.spare);
            let mut entries = std::mem::take(&mut wheel.slots[slot]);
            for entry in entries.drain(..) {
                if entry.tick <= now_tick {
                    due.push((entry.tick, entry.event));
                    wheel.entries -= 1;
                } else {
                    kept.push(entry);
                }
            }
            wheel.mark(slot, !kept.is_empty());
            // The slot keeps a vector with room (it fills again next turn):
            // the drained one if nothing is left, else the one kept.
            if kept.is_empty() {
                wheel.slots[slot] = entries;
                wheel.spare = kept;
            } else {
                wheel.slots[slot] = kept;
                wheel.spare = entries;
            }
        }
        if stalled {
            due.sort_by_key(|(tick, _)| *tick);
        }
        wheel.done = now_tick;
        wheel.armed = wheel.next_occupied();
        wheel.armed.map(|tick| wheel.instant_of(tick))
    }

    /// Runs what falls due, with `fire`, for ever (the caller aborts it).
    pub(crate) async fn run(&self, mut fire: impl FnMut(Event)) {
        let mut due = Vec::new();
        loop {
            let next = self.take_due(Instant::now(), &mut due);
            for (_, event) in due.drain(..) {
                fire(event);
            }
            match next {
                Some(at) => {
                    tokio::select! {
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    fn machine_of(event: &Event) -> usize {
        match event {
            Event::Heartbeat(machine) | Event::Config(machine) => *machine,
            other => panic!("{other:?}"),
        }
    }

    /// Entries run when due and in order (same-instant ones as they were
    /// set), entries turns ahead wait for their turn, and one set sooner than
    /// the task's wake-up wakes it.
    #[tokio::test(start_paused = true)]
    async fn entries_run_when_due_in_order_and_a_sooner_one_wakes_the_task() {
        let shard = Arc::new(Shard::default());
        let fired = Arc::new(Mutex::new(Vec::new()));
        let start = shard.lock().epoch;
        let at = |millis: u64| start + Duration::from_millis(millis);
        shard.at(at(10_000), Event::Heartbeat(3));
        shard.at(at(1000), Event::Heartbeat(1));
        shard.at(at(1000), Event::Config(2));
        // Several turns of the wheel ahead, in the same slot as the first.
        shard.at(at(1000 + 3 * SLOTS as u64), Event::Heartbeat(5));
        let task = {
            let (shard, fired) = (shard.clone(), fired.clone());
            tokio::spawn(async move {
                shard
                    .run(|event| {
                        let elapsed = Instant::now() - start;
                        let millis = elapsed.as_millis() as u64;
                        fired.lock().unwrap().push((machine_of(&event), millis));
                    })
                    .await;
            })
        };
        tokio::time::sleep_until(at(2000)).await;
        assert_eq!(*fired.lock().unwrap(), [(1, 1000), (2, 1000)]);
        // The task now sleeps until a later slot; one due at 3 s wakes it.
        shard.at(at(3000), Event::Heartbeat(4));
        tokio::time::sleep_until(at(3500)).await;
        assert_eq!(fired.lock().unwrap().last(), Some(&(4, 3000)));
        tokio::time::sleep_until(at(11_000)).await;
        assert_eq!(fired.lock().unwrap().last(), Some(&(3, 10_000)));
        tokio::time::sleep_until(at(20_000)).await;
        assert_eq!(fired.lock().unwrap().last(), Some(&(5, 1000 + 3 * 4096)));
        assert_eq!(fired.lock().unwrap().len(), 5);
        assert_eq!(shard.lock().entries, 0);
        task.abort();
    }

    /// Past a stall of more than a turn, everything due runs once, in order
    /// of its tick, and nothing not due yet.
    #[test]
    fn a_stall_longer_than_a_turn_runs_everything_due_once_in_order() {
        let shard = Shard::default();
        let start = shard.lock().epoch;
        let at = |millis: u64| start + Duration::from_millis(millis);
        for (machine, millis) in [(1, 5), (2, 4100), (3, 3000), (4, 12_000)] {
            shard.at(at(millis), Event::Heartbeat(machine));
        }
        let mut due = Vec::new();
        let next = shard.take_due(at(9000), &mut due);
        let fired: Vec<(usize, u64)> = due.iter().map(|(t, e)| (machine_of(e), *t)).collect();
        assert_eq!(fired, [(1, 5), (3, 3000), (2, 4100)]);
        assert_eq!(next, Some(at(12_000)));
        due.clear();
        assert_eq!(shard.take_due(at(11_999), &mut due), Some(at(12_000)));
        assert!(due.is_empty());
        assert_eq!(shard.take_due(at(12_000), &mut due), None);
        assert_eq!(due.len(), 1);
    }
}
