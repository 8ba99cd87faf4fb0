//! The servant registry: one record per live servant, found by key or by
//! observed address, with its expiry, its environments, the grants counted
//! against it and its last running-task report. [`Servants`] is the only
//! writer of these records; the rules that also touch grants (heartbeats,
//! removal) are in `heartbeat`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::ejection::{FarmHold, Outlier, Verdict, ejection_cap};
use super::envs::{
    Effects, EnvLink, EnvList, Envs, PlaceKey, Presence, detach, relink, sync, tier,
};
use super::hosts::ServantHosts;
use super::own_load::OwnLoad;
use super::speed::ObservedSpeed;
use super::types::{NotAcceptingReason, Rejection, RunningTask, ServantKey, ServantPriority};

mod listing;

/// One compile servant as of its last heartbeat, plus what the engine granted there.
pub(crate) struct Servant {
    key: ServantKey,
    observed: SocketAddr,
    reported: SocketAddr,
    version: u32,
    priority: ServantPriority,
    envs: EnvList,
    /// Capacity after the admission rules (0 when not accepting).
    max_tasks: u32,
    /// Reason after the admission rules (not-verified, NAT, or reported).
    reason: Option<NotAcceptingReason>,
    num_processors: u32,
    current_load: u32,
    total_memory: u64,
    memory_available: u64,
    /// False when the memory floor applies.
    memory_ok: bool,
    /// Live and zombie grants counted against this servant.
    grants: HashSet<u64>,
    /// The zombie subset of `grants`.
    zombies: HashSet<u64>,
    /// The adopted subset of `grants`: each ends when the servant stops listing it.
    adopted: HashSet<u64>,
    ever_assigned: u64,
    /// What `GetRunningTasks` shows of its last report (see `heartbeat`).
    reported_tasks: Arc<[RunningTask]>,
    /// Length of its last report as sent (counted against `max_reported_tasks`).
    reported_count: usize,
    discovered_at: Instant,
    expires_at: Instant,
    leaving: bool,
    /// Rule "cordon": an operator took it out of rotation (no free slot).
    cordoned: bool,
    /// Its presence as of the last change (the true one).
    indexed: Presence,
    /// Rule "own load": its grants here, averaged as the daemon averages its load.
    own_load: OwnLoad,
    /// That average as of its last report.
    own_load_at_report: f64,
    /// Whether the foreign load is `current_load - own_load_at_report` (see
    /// `capacity_available`).
    foreign_from_own_load: bool,
    /// Rule "observed speed": its freed grants' times, and the class they
    /// put it in as of its last report or free (0 without the rule).
    speed: ObservedSpeed,
    speed_class: u8,
    /// Rule "broken servants": its grants given back broken, its ejections.
    outlier: Outlier,
}

impl Servant {
    fn placeholder(
        key: ServantKey,
        observed: SocketAddr,
        foreign_from_own_load: bool,
        now: Instant,
    ) -> Self {
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
            cordoned: false,
            indexed: Presence::ABSENT,
            own_load: OwnLoad::new(now),
            own_load_at_report: 0.0,
            foreign_from_own_load,
            speed: ObservedSpeed::new(now),
            speed_class: 0,
            outlier: Outlier::new(now),
        }
    }

    /// Grants counted against the servant (live and zombie).
    pub(crate) fn granted(&self) -> u32 {
        u32::try_from(self.grants.len()).unwrap_or(u32::MAX)
    }

    /// Rule "capacity of a servant": under the memory floor, what it runs
    /// already (so no new task; the original's figure, which its dump shows);
    /// otherwise `min(max_tasks, max(num_processors - foreign_load, 0))` with
    /// `foreign_load = max(current_load - granted_here, 0)`, or with
    /// `--foreign_load_from_own_average` `max(current_load - own_load, 0)`
    /// rounded, `own_load` being the average of its grants here over the
    /// 15 s before its report (rule "own load"): the daemon's figure is a
    /// 15 s average too, so after a burst of compiles ends it still counts
    /// them, and the grants held now would call them foreign.
    pub(crate) fn capacity_available(&self) -> u32 {
        if !self.memory_ok {
            return self.granted();
        }
        let foreign_load = if self.foreign_from_own_load {
            (f64::from(self.current_load) - self.own_load_at_report)
                .round()
                .max(0.0) as u32
        } else {
            self.current_load.saturating_sub(self.granted())
        };
        self.max_tasks
            .min(self.num_processors.saturating_sub(foreign_load))
    }

    /// The servant's entries in the environment indexes, from its current
    /// fields. A cordoned or ejected servant has no free slot (rules
    /// "cordon", "broken servants"), and keeps its environments available;
    /// one on trial after an ejection takes one grant at a time.
    fn presence(&self) -> Presence {
        let granted = self.granted();
        let capacity = self.capacity_available();
        let available = if self.cordoned || self.outlier.is_ejected() {
            granted.min(capacity)
        } else if self.outlier.on_trial() {
            capacity.min(granted.max(1))
        } else {
            capacity
        };
        let place = (available > granted).then(|| {
            PlaceKey::new(
                tier(self.priority, granted, self.num_processors),
                self.speed_class,
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
    /// after a grant, which may leave them lagging (see `envs`).
    /// Grant `id` no longer counts against this servant; false if it did not.
    fn forget_grant(&mut self, id: u64) -> bool {
        self.zombies.remove(&id);
        self.adopted.remove(&id);
        let forgotten = self.grants.remove(&id);
        self.note_own_load();
        forgotten
    }

    /// The grants held changed: the average goes on from now (tokio's
    /// clock, as the grants' own times; paused in tests).
    fn note_own_load(&mut self) {
        let count = self.granted();
        self.own_load.set(count, Instant::now());
    }

    fn repose(&mut self) -> (Presence, Presence) {
        let new = self.presence();
        (std::mem::replace(&mut self.indexed, new), new)
    }

    /// The reason shown to people: the admission reason, else the memory floor.
    fn effective_reason(&self) -> Option<NotAcceptingReason> {
        match self.reason {
            Some(r) => Some(r),
            None if self.max_tasks > 0 && !self.memory_ok => Some(NotAcceptingReason::PoorMachine),
            None => None,
        }
    }

    /// Where the scheduler sees it: peer IP + reported port; its identity.
    pub(crate) fn observed(&self) -> SocketAddr {
        self.observed
    }

    /// The location it reports (differs from [`Servant::observed`] behind NAT).
    pub(crate) fn reported(&self) -> SocketAddr {
        self.reported
    }

    /// Whether an operator took it out of rotation (rule "cordon").
    pub(crate) fn is_cordoned(&self) -> bool {
        self.cordoned
    }

    /// Whether rule "broken servants" took it out of rotation.
    pub(crate) fn is_ejected(&self) -> bool {
        self.outlier.is_ejected()
    }

    /// Daemon version.
    pub(crate) fn version(&self) -> u32 {
        self.version
    }

    /// Capacity after the admission rules (0 when not accepting).
    pub(crate) fn max_tasks(&self) -> u32 {
        self.max_tasks
    }

    /// Zombie grants among those counted against it.
    pub(crate) fn zombie_count(&self) -> usize {
        self.zombies.len()
    }

    /// Its key in the free sets of its environments, if it has a free slot
    /// (the true key: the sets may hold a lower one, see `envs`).
    pub(crate) fn place(&self) -> Option<PlaceKey> {
        self.indexed.place
    }

    /// The environments it offers, sorted by name.
    pub(crate) fn environments(&self) -> &[EnvLink] {
        &self.envs
    }
}

/// What a heartbeat sets on a servant's record, after the admission rules.
pub(crate) struct ServantReport {
    pub reported: SocketAddr,
    pub version: u32,
    pub priority: ServantPriority,
    pub max_tasks: u32,
    pub reason: Option<NotAcceptingReason>,
    pub num_processors: u32,
    pub current_load: u32,
    pub total_memory: u64,
    pub memory_available: u64,
    pub leaving: bool,
    /// Rule "cordon": whether its location is cordoned.
    pub cordoned: bool,
    pub expires_at: Instant,
}

/// Every live servant, by key and by observed address, with the expiry
/// deadlines, the cluster's total of reported tasks and the cached
/// running-task list built from the reports.
pub(crate) struct Servants {
    by_key: HashMap<ServantKey, Servant>,
    by_addr: HashMap<SocketAddr, ServantKey>,
    /// The IPs of `by_addr`, for the edge (see [`ServantHosts`]).
    pub(super) hosts: ServantHosts,
    next_key: ServantKey,
    /// Expiry of every servant, earliest first.
    deadlines: BTreeSet<(Instant, ServantKey)>,
    /// Sum of the lengths of the servants' last reports (as sent).
    reported_total: usize,
    /// Bound on `reported_total`.
    max_reported_tasks: usize,
    /// No new task goes to a servant reporting less available memory.
    min_memory: u64,
    /// `--foreign_load_from_own_average` (see `Servant::capacity_available`).
    foreign_from_own_load: bool,
    /// `--place_by_observed_speed` (rule "observed speed").
    place_by_speed: bool,
    /// Bumped whenever any servant's shown running tasks change.
    running_version: u64,
    /// The version of the list last handed out, and when: callers are
    /// shown it until it is `running_tasks_refresh` old.
    running_shown: Option<(u64, Instant)>,
    running_tasks_refresh: Duration,
    /// Servants removed after expiry or leaving (counter).
    expired: u64,
    /// Free slots over every servant's indexed presence (rule "max share").
    free_total: u64,
    /// `--eject_broken_servants` (rule "broken servants").
    eject_broken: bool,
    /// The farm's typical hold of grants that ran (rule "broken servants").
    farm_hold: FarmHold,
    /// Servants ejected now.
    ejected_now: usize,
    /// Grants given back broken, ejections, and ejections the share cap
    /// held back, since start.
    pub(crate) broken_grants: u64,
    pub(crate) ejections: u64,
    pub(crate) ejections_capped: u64,
    /// The latest ejections, for the audit.
    recent_ejections: std::collections::VecDeque<(Instant, super::views::EjectionEvent)>,
}

/// A grant given back live by its owner, for the rules that learn from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Returned {
    pub held: Duration,
    /// A heartbeat of its servant listed it.
    pub listed: bool,
    pub at: Instant,
}

impl Servants {
    pub(crate) fn new(
        max_reported_tasks: usize,
        min_memory: u64,
        running_tasks_refresh: Duration,
        foreign_from_own_load: bool,
        place_by_speed: bool,
        eject_broken: bool,
        now: Instant,
    ) -> Self {
        Servants {
            by_key: HashMap::new(),
            by_addr: HashMap::new(),
            hosts: ServantHosts::default(),
            next_key: 1,
            deadlines: BTreeSet::new(),
            reported_total: 0,
            max_reported_tasks,
            min_memory,
            foreign_from_own_load,
            place_by_speed,
            running_version: 0,
            running_shown: None,
            running_tasks_refresh,
            expired: 0,
            free_total: 0,
            eject_broken,
            farm_hold: FarmHold::new(now),
            ejected_now: 0,
            broken_grants: 0,
            ejections: 0,
            ejections_capped: 0,
            recent_ejections: std::collections::VecDeque::new(),
        }
    }

    pub(crate) fn get(&self, key: ServantKey) -> Option<&Servant> {
        self.by_key.get(&key)
    }

    /// Free slots over every servant, as the indexes see them.
    pub(crate) fn free_slots(&self) -> u64 {
        self.free_total
    }

    fn live(&mut self, key: ServantKey) -> &mut Servant {
        self.by_key
            .get_mut(&key)
            .expect("the caller holds the key of a live servant")
    }

    /// Every live servant, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Servant> {
        self.by_key.values()
    }

    /// Servants removed since start.
    pub(crate) fn expired(&self) -> u64 {
        self.expired
    }

    /// The earliest servant expiry.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|d| d.0)
    }

    /// A servant whose expiry is at or before `now`, if any.
    pub(crate) fn first_expired(&self, now: Instant) -> Option<ServantKey> {
        self.deadlines
            .first()
            .filter(|(at, _)| *at <= now)
            .map(|(_, key)| *key)
    }

    /// The cluster's bound on reported tasks (rule "limits"): takes a report of `count` running
    /// tasks from the servant at `observed`, registering the servant if it
    /// is new. Refused, with nothing changed, if the cluster's reports would
    /// hold more than `max_reported_tasks`.
    pub(crate) fn take_report(
        &mut self,
        observed: SocketAddr,
        count: usize,
        now: Instant,
    ) -> Result<ServantKey, Rejection> {
        let previous = self
            .by_addr
            .get(&observed)
            .map_or(0, |key| self.by_key[key].reported_count);
        let total = self.reported_total - previous + count;
        if total > self.max_reported_tasks {
            return Err(Rejection::InvalidArgument(format!(
                "running_tasks: the cluster would report {total} running tasks, more than the {} limit",
                self.max_reported_tasks
            )));
        }
        self.reported_total = total;
        let key = match self.by_addr.get(&observed) {
            Some(&key) => key,
            None => self.register(observed, now),
        };
        self.live(key).reported_count = count;
        Ok(key)
    }

    fn register(&mut self, observed: SocketAddr, now: Instant) -> ServantKey {
        let key = self.next_key;
        self.next_key += 1;
        self.by_key.insert(
            key,
            Servant::placeholder(key, observed, self.foreign_from_own_load, now),
        );
        self.by_addr.insert(observed, key);
        self.hosts.add(observed.ip());
        self.deadlines.insert((now, key));
        key
    }

    /// The environments the servant offers become `names` (empty names
    /// ignored): links of environments still offered are kept, new ones
    /// added, and the servant leaves the others' indexes.
    pub(crate) fn offer(
        &mut self,
        key: ServantKey,
        mut names: Vec<String>,
        envs: &mut Envs,
        fx: &mut Effects,
    ) {
        names.retain(|n| !n.is_empty());
        names.sort_unstable();
        names.dedup();
        let s = self.live(key);
        let same = s.envs.len() == names.len()
            && s.envs.iter().zip(&names).all(|(a, b)| **a.name() == **b);
        if same {
            return;
        }
        // Merge by name (both lists are sorted).
        let old = std::mem::take(&mut s.envs);
        let mut kept = Vec::with_capacity(names.len());
        let mut gone = Vec::new();
        let mut old = old.into_iter().peekable();
        for name in &names {
            while old.peek().is_some_and(|l| **l.name() < **name) {
                gone.extend(old.next());
            }
            match old.peek() {
                Some(l) if **l.name() == **name => kept.extend(old.next()),
                _ => {
                    let (name, id) = envs.intern(name);
                    kept.push(EnvLink::fresh(name, id));
                }
            }
        }
        gone.extend(old);
        detach(envs, &gone, fx);
        s.envs = kept;
    }

    /// Replaces the servant's reported figures and moves its expiry; returns
    /// the new expiry. Does not touch the indexes (see [`Servants::reindex`]).
    pub(crate) fn update(
        &mut self,
        key: ServantKey,
        report: ServantReport,
        now: Instant,
    ) -> Instant {
        let min_memory = self.min_memory;
        let place_by_speed = self.place_by_speed;
        let s = self.live(key);
        s.own_load_at_report = s.own_load.average(now);
        if place_by_speed {
            s.speed_class = s.speed.class(now);
        }
        let back_on_trial = s.outlier.end_ejection(now);
        let previous_expiry = s.expires_at;
        s.reported = report.reported;
        s.version = report.version;
        s.priority = report.priority;
        s.max_tasks = report.max_tasks;
        s.reason = report.reason;
        s.num_processors = report.num_processors;
        s.current_load = report.current_load;
        s.total_memory = report.total_memory;
        s.memory_available = report.memory_available;
        s.memory_ok = report.total_memory == 0 || report.memory_available >= min_memory;
        s.leaving = report.leaving;
        s.cordoned = report.cordoned;
        s.expires_at = report.expires_at;
        self.deadlines.remove(&(previous_expiry, key));
        self.deadlines.insert((report.expires_at, key));
        if back_on_trial {
            self.ejected_now -= 1;
        }
        report.expires_at
    }

    /// Replaces what `GetRunningTasks` shows of the servant's report.
    pub(crate) fn show_running_tasks(&mut self, key: ServantKey, shown: Vec<RunningTask>) {
        let s = self.live(key);
        if *s.reported_tasks != *shown {
            s.reported_tasks = shown.into();
            self.running_version += 1;
        }
    }

    /// Brings the indexes of all the servant's environments up to date with
    /// its current figures.
    pub(crate) fn reindex(&mut self, key: ServantKey, envs: &mut Envs, fx: &mut Effects) {
        if let Some(s) = self.by_key.get_mut(&key) {
            let (old, new) = s.repose();
            track_free(&mut self.free_total, old, new);
            sync(envs, &mut s.envs, old, new, fx);
        }
    }

    /// Sets every servant's cordon flag to what `covered(reported,
    /// observed)` says, moving those that change in the indexes. O(servants):
    /// operators' actions only, never a daemon's call.
    pub(crate) fn recordon(
        &mut self,
        covered: impl Fn(SocketAddr, SocketAddr) -> bool,
        envs: &mut Envs,
        fx: &mut Effects,
    ) {
        for s in self.by_key.values_mut() {
            let cordoned = covered(s.reported, s.observed);
            if s.cordoned != cordoned {
                s.cordoned = cordoned;
                let (old, new) = s.repose();
                track_free(&mut self.free_total, old, new);
                sync(envs, &mut s.envs, old, new, fx);
            }
        }
    }

    /// Records the key an environment's free set now holds for the servant
    /// (placement moved a stale entry to its true place).
    pub(crate) fn relink(&mut self, key: ServantKey, env: &str, place: Option<PlaceKey>) {
        if let Some(s) = self.by_key.get_mut(&key) {
            relink(&mut s.envs, env, place);
        }
    }

    /// Counts grant `id` against the servant; returns the servant's observed
    /// location. An issued grant only raises the servant's place key, so the
    /// environment indexes are left to lag (see `envs`); an adopted one
    /// is counted inside a heartbeat, which reindexes the servant once at
    /// the end, so its presence is left alone here.
    pub(crate) fn count_grant(&mut self, key: ServantKey, id: u64, adopted: bool) -> SocketAddr {
        let s = self
            .by_key
            .get_mut(&key)
            .expect("the caller holds the key of a live servant");
        s.grants.insert(id);
        s.note_own_load();
        s.ever_assigned += 1;
        if adopted {
            s.adopted.insert(id);
        } else {
            let (old, new) = s.repose();
            track_free(&mut self.free_total, old, new);
        }
        s.observed
    }

    /// Stops counting grant `id` against the servant; false if it was not.
    /// The caller reindexes the servant.
    pub(crate) fn uncount_grant(&mut self, key: ServantKey, id: u64) -> bool {
        self.by_key
            .get_mut(&key)
            .is_some_and(|s| s.forget_grant(id))
    }

    /// A freed grant: uncounted, and the servant moved to its new place in
    /// the environment indexes at once (the capacity may serve queued
    /// requests). One lookup for both, as every `FreeTask` pays it.
    /// `returned`: how it came back, if it tells the servant's speed and
    /// health (rules "observed speed", "broken servants").
    pub(crate) fn release_grant(
        &mut self,
        key: ServantKey,
        id: u64,
        returned: Option<Returned>,
        envs: &mut Envs,
        fx: &mut Effects,
    ) {
        if let Some(returned) = returned {
            self.learn(key, returned);
        }
        if let Some(s) = self.by_key.get_mut(&key) {
            s.forget_grant(id);
            let (old, new) = s.repose();
            track_free(&mut self.free_total, old, new);
            sync(envs, &mut s.envs, old, new, fx);
        }
    }

    /// Grant `id` on the servant became a zombie (it still counts).
    pub(crate) fn mark_zombie(&mut self, key: ServantKey, id: u64) {
        if let Some(s) = self.by_key.get_mut(&key) {
            s.zombies.insert(id);
        }
    }

    /// Zombies and adopted grants of the servant that `listed` (its report,
    /// sorted) no longer names, each once, with `true` for a zombie.
    pub(crate) fn unlisted(&self, key: ServantKey, listed: &[u64]) -> Vec<(u64, bool)> {
        let Some(s) = self.by_key.get(&key) else {
            return Vec::new();
        };
        let gone = |id: &&u64| listed.binary_search(id).is_err();
        s.zombies
            .iter()
            .filter(gone)
            .map(|&id| (id, true))
            .chain(
                s.adopted
                    .iter()
                    .filter(|id| !s.zombies.contains(id))
                    .filter(gone)
                    .map(|&id| (id, false)),
            )
            .collect()
    }

    /// True if the servant has zombie or adopted grants (which its reports
    /// can end).
    pub(crate) fn has_reportable_grants(&self, key: ServantKey) -> bool {
        self.by_key
            .get(&key)
            .is_some_and(|s| !s.zombies.is_empty() || !s.adopted.is_empty())
    }

    /// Forgets the servant: its address, expiry, report and place in every
    /// environment. Returns the grants that were counted against it, which
    /// the caller removes.
    pub(crate) fn remove(
        &mut self,
        key: ServantKey,
        envs: &mut Envs,
        fx: &mut Effects,
    ) -> Option<HashSet<u64>> {
        let s = self.by_key.remove(&key)?;
        if s.outlier.is_ejected() {
            self.ejected_now -= 1;
        }
        track_free(&mut self.free_total, s.indexed, Presence::ABSENT);
        self.by_addr.remove(&s.observed);
        self.hosts.remove(s.observed.ip());
        self.deadlines.remove(&(s.expires_at, key));
        self.reported_total -= s.reported_count;
        detach(envs, &s.envs, fx);
        if !s.reported_tasks.is_empty() {
            self.running_version += 1;
        }
        self.expired += 1;
        Some(s.grants)
    }
}

/// Keeps the sum of free slots in step with one servant's new presence.
fn track_free(total: &mut u64, old: Presence, new: Presence) {
    *total = (*total + u64::from(new.free)).saturating_sub(u64::from(old.free));
}
