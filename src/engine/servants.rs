//! Servant registry: heartbeats, capacity rules, running-task reports, removal.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::time::Instant;

use super::grants::GrantRec;
use super::placement::{
    Effects, EnvLink, EnvList, MAX_SLOTS, PlaceKey, Presence, detach, sync, tier,
};
use super::state::{State, later};
use super::types::{
    Heartbeat, HeartbeatReply, NotAcceptingReason, ReportedTask, RunningTask, ServantPriority,
};

/// Registration sequence number: identifies a servant and orders ties
/// (earliest registered first). A servant that expires and comes back gets a
/// new one.
pub(crate) type ServantKey = u64;

/// One compile servant as of its last heartbeat, plus what the engine granted there.
pub(crate) struct Servant {
    pub key: ServantKey,
    pub observed: SocketAddr,
    pub reported: SocketAddr,
    pub version: u32,
    pub priority: ServantPriority,
    pub envs: EnvList,
    /// Capacity after the admission rules (0 when not accepting).
    pub max_tasks: u32,
    /// Reason after the admission rules (not-verified, NAT, or reported).
    pub reason: Option<NotAcceptingReason>,
    pub num_processors: u32,
    pub current_load: u32,
    pub total_memory: u64,
    pub memory_available: u64,
    /// False when the memory floor applies.
    pub memory_ok: bool,
    /// Live and zombie grants counted against this servant.
    pub grants: HashSet<u64>,
    /// The zombie subset of `grants`.
    pub zombies: HashSet<u64>,
    pub ever_assigned: u64,
    pub reported_tasks: Arc<[RunningTask]>,
    pub discovered_at: Instant,
    pub expires_at: Instant,
    pub leaving: bool,
    /// Its presence as of the last change (the true one).
    pub indexed: Presence,
}

impl Servant {
    fn placeholder(key: ServantKey, observed: SocketAddr, now: Instant) -> Self {
        Servant {
            key,
            observed,
            reported: observed,
            version: 0,
            priority: ServantPriority::User,
            envs: Vec::new(),
            max_tasks: 0,
            reason: None,
            num_processors: 0,
            current_load: 0,
            total_memory: 0,
            memory_available: 0,
            memory_ok: true,
            grants: HashSet::new(),
            zombies: HashSet::new(),
            ever_assigned: 0,
            reported_tasks: Arc::from(Vec::new()),
            discovered_at: now,
            expires_at: now,
            leaving: false,
            indexed: Presence::ABSENT,
        }
    }

    /// Grants counted against the servant (live and zombie).
    pub(crate) fn granted(&self) -> u32 {
        u32::try_from(self.grants.len()).unwrap_or(u32::MAX)
    }

    /// Rule "capacity of a servant": no new task under the memory floor;
    /// otherwise `min(max_tasks, max(num_processors - foreign_load, 0))` with
    /// `foreign_load = max(current_load - granted_here, 0)`.
    pub(crate) fn capacity_available(&self) -> u32 {
        if self.max_tasks == 0 || !self.memory_ok {
            return 0;
        }
        let foreign_load = self.current_load.saturating_sub(self.granted());
        self.max_tasks
            .min(self.num_processors.saturating_sub(foreign_load))
    }

    /// The servant's entries in the environment indexes, from its current fields.
    pub(crate) fn presence(&self) -> Presence {
        let granted = self.granted();
        let available = self.capacity_available();
        let place = (available > granted).then(|| {
            PlaceKey::new(
                tier(self.priority, granted, self.num_processors),
                granted,
                available,
                self.key,
            )
        });
        Presence {
            accepting: (self.max_tasks > 0).then_some(self.version),
            place,
            free: available.saturating_sub(granted),
        }
    }

    /// Recomputes the presence; returns (the previous one, the new one) and
    /// records the new one. The caller then `sync`s the environments, except
    /// after a grant, which may leave them lagging (see `placement`).
    pub(crate) fn repose(&mut self) -> (Presence, Presence) {
        let new = self.presence();
        (std::mem::replace(&mut self.indexed, new), new)
    }

    /// The reason shown to people: the admission reason, else the memory floor.
    pub(crate) fn effective_reason(&self) -> Option<NotAcceptingReason> {
        match self.reason {
            Some(r) => Some(r),
            None if self.max_tasks > 0 && !self.memory_ok => Some(NotAcceptingReason::PoorMachine),
            None => None,
        }
    }
}

/// Rule "admission": a servant with only a user token is kept with capacity 0
/// (not verified); one whose observed and reported locations differ is kept
/// with capacity 0 (behind NAT); a leaving servant gets capacity 0 at once.
/// Otherwise the reported capacity and reason stand.
pub(crate) fn admission(
    verified: bool,
    behind_nat: bool,
    leaving: bool,
    capacity: u32,
    reported: Option<NotAcceptingReason>,
) -> (u32, Option<NotAcceptingReason>) {
    if !verified {
        (0, Some(NotAcceptingReason::NotVerified))
    } else if behind_nat {
        (0, Some(NotAcceptingReason::BehindNat))
    } else if leaving {
        (0, reported)
    } else {
        (capacity.min(MAX_SLOTS), reported)
    }
}

/// Rule "old daemons": `num_processors = 0` means the daemon predates the
/// field; use its capacity instead.
pub(crate) fn effective_processors(num_processors: u32, capacity: u32) -> u32 {
    if num_processors == 0 {
        capacity
    } else {
        num_processors
    }
}

/// Rule "location": the observed location is the peer IP plus the reported
/// port; both sides are normalised (IPv4-mapped IPv6 becomes IPv4).
pub(crate) fn locations(hb: &Heartbeat) -> (SocketAddr, SocketAddr) {
    let port = hb.reported_location.port();
    let observed = SocketAddr::new(hb.observed_ip.to_canonical(), port);
    let reported = SocketAddr::new(hb.reported_location.ip().to_canonical(), port);
    (observed, reported)
}

fn same_report(old: &[RunningTask], new: &[ReportedTask]) -> bool {
    old.len() == new.len()
        && old.iter().zip(new).all(|(a, b)| {
            a.grant_id == b.grant_id
                && a.servant_task_id == b.servant_task_id
                && a.task_digest == b.task_digest
        })
}

impl State {
    /// Applies a validated heartbeat: upsert by observed location, replace the
    /// whole record, check the running tasks, move the servant in the indexes
    /// and serve queued requests if it gained capacity. O(environments +
    /// reported tasks) x log n.
    pub(crate) fn heartbeat(
        &mut self,
        hb: Heartbeat,
        verified: bool,
        now: Instant,
    ) -> HeartbeatReply {
        let (observed, reported) = locations(&hb);
        let leaving = hb.next_heartbeat_in.is_zero();
        let (max_tasks, reason) = admission(
            verified,
            observed != reported,
            leaving,
            hb.capacity,
            hb.not_accepting_reason,
        );

        let key = match self.by_addr.get(&observed) {
            Some(&key) => key,
            None => self.register(observed, now),
        };

        let mut names = hb.environments;
        names.retain(|n| !n.is_empty());
        names.sort_unstable();
        names.dedup();
        let same_envs = {
            let s = &self.servants[&key];
            s.envs.len() == names.len() && s.envs.iter().zip(&names).all(|(a, b)| *a.name == **b)
        };

        let mut fx = Effects::default();
        let expires_at = later(now, hb.next_heartbeat_in);
        let s = self.servants.get_mut(&key).expect("registered above");
        if !same_envs {
            // Merge by name: keep the links of environments still offered,
            // add fresh ones, take the servant out of the others.
            let old = std::mem::take(&mut s.envs);
            let mut kept = Vec::with_capacity(names.len());
            let mut gone = Vec::new();
            let mut old = old.into_iter().peekable();
            for name in &names {
                while old.peek().is_some_and(|l| *l.name < **name) {
                    gone.extend(old.next());
                }
                match old.peek() {
                    Some(l) if *l.name == **name => kept.extend(old.next()),
                    _ => {
                        let (name, id) = self.envs.intern(name);
                        kept.push(EnvLink::fresh(name, id));
                    }
                }
            }
            gone.extend(old);
            detach(&mut self.envs, &gone, &mut fx);
            s.envs = kept;
        }
        s.reported = reported;
        s.version = hb.version;
        s.priority = hb.priority;
        s.max_tasks = max_tasks;
        s.reason = reason;
        s.num_processors = effective_processors(hb.num_processors, hb.capacity);
        s.current_load = hb.current_load;
        s.total_memory = hb.total_memory;
        s.memory_available = hb.memory_available;
        s.memory_ok = hb.total_memory == 0 || hb.memory_available >= self.min_memory;
        s.leaving = leaving;
        self.servant_deadlines.remove(&(s.expires_at, key));
        self.servant_deadlines.insert((expires_at, key));
        s.expires_at = expires_at;
        self.note_deadline(expires_at);

        let expired = self.examine_running_tasks(key, &hb.running_tasks, now);

        let s = self.servants.get_mut(&key).expect("registered above");
        if !same_report(&s.reported_tasks, &hb.running_tasks) {
            s.reported_tasks = hb
                .running_tasks
                .into_iter()
                .map(|t| RunningTask {
                    servant: observed,
                    servant_task_id: t.servant_task_id,
                    grant_id: t.grant_id,
                    task_digest: t.task_digest,
                })
                .collect();
            self.running_version += 1;
        }

        let (old, new) = s.repose();
        sync(&mut self.envs, &mut s.envs, old, new, &mut fx);
        self.apply(fx, now);

        HeartbeatReply {
            acceptable_tokens: self.tokens.current(now).to_vec(),
            expired_grant_ids: expired,
        }
    }

    fn register(&mut self, observed: SocketAddr, now: Instant) -> ServantKey {
        let key = self.next_servant_key;
        self.next_servant_key += 1;
        self.servants
            .insert(key, Servant::placeholder(key, observed, now));
        self.by_addr.insert(observed, key);
        self.servant_deadlines.insert((now, key));
        key
    }

    /// Rule "running-task report": a reported grant id that is not a live
    /// grant of this servant is returned as expired, except that during the
    /// adoption window after start an id unknown everywhere is adopted as a
    /// grant on this servant. Zombies of this servant that are no longer
    /// reported are forgotten. Does not touch the indexes (the caller reindexes
    /// once).
    fn examine_running_tasks(
        &mut self,
        key: ServantKey,
        tasks: &[ReportedTask],
        now: Instant,
    ) -> Vec<u64> {
        let adopting = now < self.adoption_until;
        let mut expired = Vec::new();
        for task in tasks {
            let id = task.grant_id;
            match self.grants.get(&id) {
                Some(g) if g.servant == key && !g.zombie => {}
                Some(_) => expired.push(id),
                None if adopting && id != 0 => self.adopt(key, id, now),
                None => expired.push(id),
            }
        }

        let s = self.servants.get_mut(&key).expect("caller registered it");
        if !s.zombies.is_empty() {
            let mut listed: Vec<u64> = tasks.iter().map(|t| t.grant_id).collect();
            listed.sort_unstable();
            let gone: Vec<u64> = s
                .zombies
                .iter()
                .copied()
                .filter(|z| listed.binary_search(z).is_err())
                .collect();
            for id in gone {
                s.zombies.remove(&id);
                s.grants.remove(&id);
                self.grants.remove(&id);
                self.counters.zombies_reaped += 1;
            }
        }
        expired
    }

    /// Rule "adoption": a task the servant runs under a grant this (restarted)
    /// engine does not know becomes a grant with `adopted_lease`.
    fn adopt(&mut self, key: ServantKey, id: u64, now: Instant) {
        let lease_until = later(now, self.adopted_lease);
        let s = self.servants.get_mut(&key).expect("caller registered it");
        s.grants.insert(id);
        s.ever_assigned += 1;
        self.grants.insert_adopted(
            id,
            GrantRec {
                servant: key,
                servant_addr: s.observed,
                requester: None,
                environment: None,
                granted_at: now,
                lease_until,
                prefetch: false,
                zombie: false,
                adopted: true,
            },
        );
        self.grant_deadlines.insert((lease_until, id));
        self.note_deadline(lease_until);
        self.counters.adoptions += 1;
    }

    /// Rule "servant expiry": the servant, its reported tasks and all its
    /// grants (live and zombie) are forgotten at once. Frees nothing usable.
    pub(crate) fn remove_servant(&mut self, key: ServantKey, fx: &mut Effects) {
        let Some(s) = self.servants.remove(&key) else {
            return;
        };
        self.by_addr.remove(&s.observed);
        self.servant_deadlines.remove(&(s.expires_at, key));
        for id in &s.grants {
            if let Some(g) = self.grants.remove(id) {
                if !g.zombie {
                    self.grant_deadlines.remove(&(g.lease_until, *id));
                }
            }
        }
        detach(&mut self.envs, &s.envs, fx);
        if !s.reported_tasks.is_empty() {
            self.running_version += 1;
        }
        self.counters.servants_expired += 1;
    }
}
