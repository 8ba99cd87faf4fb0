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
    Heartbeat, HeartbeatReply, NotAcceptingReason, Rejection, ReportedTask, RunningTask,
    ServantPriority,
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
    /// The adopted subset of `grants`: each ends when the servant stops listing it.
    pub adopted: HashSet<u64>,
    pub ever_assigned: u64,
    /// What `GetRunningTasks` shows of its last report (see
    /// [`State::heartbeat`]).
    pub reported_tasks: Arc<[RunningTask]>,
    /// Length of its last report as sent (counted against `max_reported_tasks`).
    pub reported_count: usize,
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
            adopted: HashSet::new(),
            ever_assigned: 0,
            reported_tasks: Arc::from(Vec::new()),
            reported_count: 0,
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

/// Rule "location": `location` must be `a.b.c.d:port` or `[v6]:port`, as
/// [`crate::contract::parse_location`] reads it (the grammar the OpenAPI
/// document states).
pub(crate) fn parse_location(location: &str) -> Result<SocketAddr, Rejection> {
    crate::contract::parse_location(location).ok_or_else(|| {
        Rejection::InvalidArgument(format!(
            "location {location:?} is not IP:port (a.b.c.d:port or [v6]:port)"
        ))
    })
}

/// Rule "location": the observed location is the peer IP plus the reported
/// port; both sides are normalised (IPv4-mapped IPv6 becomes IPv4).
pub(crate) fn locations(hb: &Heartbeat, reported: SocketAddr) -> (SocketAddr, SocketAddr) {
    let port = reported.port();
    let observed = SocketAddr::new(hb.observed_ip.to_canonical(), port);
    let reported = SocketAddr::new(reported.ip().to_canonical(), port);
    (observed, reported)
}

impl State {
    /// Applies a validated heartbeat: upsert by observed location, replace the
    /// whole record, check the running tasks, move the servant in the indexes
    /// and serve queued requests if it gained capacity. O(environments +
    /// reported tasks) x log n. Fails only if the report would take the
    /// cluster's reported tasks past `max_reported_tasks` (nothing changes then).
    pub(crate) fn heartbeat(
        &mut self,
        hb: Heartbeat,
        reported: SocketAddr,
        verified: bool,
        now: Instant,
    ) -> Result<HeartbeatReply, Rejection> {
        let (observed, reported) = locations(&hb, reported);
        let previous = self
            .by_addr
            .get(&observed)
            .map_or(0, |key| self.servants[key].reported_count);
        let total = self.reported_total - previous + hb.running_tasks.len();
        if total > self.max_reported_tasks {
            return Err(Rejection::InvalidArgument(format!(
                "running_tasks: the cluster would report {total} running tasks, more than the {} limit",
                self.max_reported_tasks
            )));
        }
        self.reported_total = total;
        let behind_nat = observed != reported;
        let leaving = hb.next_heartbeat_in.is_zero();
        let (max_tasks, reason) = admission(
            verified,
            behind_nat,
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
        s.reported_count = hb.running_tasks.len();
        self.servant_deadlines.remove(&(s.expires_at, key));
        self.servant_deadlines.insert((expires_at, key));
        s.expires_at = expires_at;
        self.note_deadline(expires_at);

        let trusted = verified && !behind_nat;
        let expired = self.examine_running_tasks(key, &hb.running_tasks, trusted, now);
        let shown = self.shown_running_tasks(key, observed, hb.running_tasks, trusted);

        let s = self.servants.get_mut(&key).expect("registered above");
        if *s.reported_tasks != *shown {
            s.reported_tasks = shown.into();
            self.running_version += 1;
        }

        let (old, new) = s.repose();
        sync(&mut self.envs, &mut s.envs, old, new, &mut fx);
        self.apply(fx, now);

        Ok(HeartbeatReply {
            acceptable_tokens: self.tokens.current(now).to_vec(),
            expired_grant_ids: expired,
        })
    }

    /// Rule "what is kept for GetRunningTasks": only reported tasks whose
    /// grant is live on this servant (ids returned as expired and zombies are
    /// left out), and nothing from a servant behind NAT or not verified:
    /// delegates attach to what this list names, so each entry must be a
    /// task that will finish, on a machine they can reach.
    fn shown_running_tasks(
        &self,
        key: ServantKey,
        observed: SocketAddr,
        tasks: Vec<ReportedTask>,
        trusted: bool,
    ) -> Vec<RunningTask> {
        if !trusted {
            return Vec::new();
        }
        tasks
            .into_iter()
            .filter(|t| {
                self.grants
                    .get(&t.grant_id)
                    .is_some_and(|g| g.servant == key && !g.zombie)
            })
            .map(|t| RunningTask {
                servant: observed,
                servant_task_id: t.servant_task_id,
                grant_id: t.grant_id,
                task_digest: t.task_digest,
            })
            .collect()
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
    /// adoption window an id this instance never issued, reported by a
    /// `trusted` servant (verified, not behind NAT), is adopted as a grant on
    /// it (rule "adoption", see `adoption`). Zombies and adopted grants of
    /// this servant that it no longer reports are forgotten. Does not touch
    /// the indexes (the caller reindexes once).
    fn examine_running_tasks(
        &mut self,
        key: ServantKey,
        tasks: &[ReportedTask],
        trusted: bool,
        now: Instant,
    ) -> Vec<u64> {
        let mut expired = Vec::new();
        for task in tasks {
            let id = task.grant_id;
            match self.grants.get(&id) {
                Some(g) if g.servant == key && !g.zombie => {}
                Some(_) => expired.push(id),
                None if trusted && self.adoption.may_adopt(id, now) => self.adopt(key, id, now),
                None => expired.push(id),
            }
        }

        let s = self.servants.get_mut(&key).expect("caller registered it");
        if !s.zombies.is_empty() || !s.adopted.is_empty() {
            let mut listed: Vec<u64> = tasks.iter().map(|t| t.grant_id).collect();
            listed.sort_unstable();
            let gone: Vec<(u64, bool)> = s
                .zombies
                .iter()
                .chain(s.adopted.iter())
                .copied()
                .filter(|id| listed.binary_search(id).is_err())
                .map(|id| (id, s.zombies.contains(&id)))
                .collect();
            for (id, zombie) in gone {
                let s = self.servants.get_mut(&key).expect("caller registered it");
                if !s.grants.remove(&id) {
                    continue; // both a zombie and adopted: done already
                }
                s.zombies.remove(&id);
                s.adopted.remove(&id);
                self.forget(id);
                if zombie {
                    self.counters.zombies_reaped += 1;
                } else {
                    self.counters.adoptions_ended += 1;
                }
            }
        }
        expired
    }

    /// Rule "adoption": a task a trusted servant runs under a grant this
    /// (restarted) engine never issued becomes a grant with `adopted_lease`,
    /// or longer if its owner renewed it before the servant reported it; its
    /// first renewer (that one, or a later one) owns it.
    fn adopt(&mut self, key: ServantKey, id: u64, now: Instant) {
        let early = self.adoption.take_pending(id);
        let mut lease_until = later(now, self.adopted_lease);
        if let Some(p) = early {
            lease_until = lease_until.max(p.lease_until);
            self.requesters.adopted_by(p.owner.ip);
        }
        let s = self.servants.get_mut(&key).expect("caller registered it");
        s.grants.insert(id);
        s.adopted.insert(id);
        s.ever_assigned += 1;
        self.grants.insert_adopted(
            id,
            GrantRec {
                servant: key,
                servant_addr: s.observed,
                owner: early.map(|p| p.owner),
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
        self.reported_total -= s.reported_count;
        for id in &s.grants {
            self.forget(*id);
        }
        detach(&mut self.envs, &s.envs, fx);
        if !s.reported_tasks.is_empty() {
            self.running_version += 1;
        }
        self.counters.servants_expired += 1;
    }
}
