//! The engine's configuration and the bounds it enforces.

use std::time::Duration;

use super::fence::GrantFence;
use super::tenants::Tenancy;
use super::tokens::{Redacted, TokenSet};

/// Engine configuration, fixed for the life of a [`Scheduler`](super::Scheduler).
///
/// Token sets: see [`TokenSet`] (literal entries; an empty entry is the
/// empty token; only [`TokenSet::anyone`] lets anyone in). `Debug` prints no
/// token and no secret (they are [`Redacted`]).
#[derive(Clone, Debug)]
pub struct Config {
    /// Tokens of delegates (`--acceptable_user_tokens`); needed by every call
    /// except `Heartbeat`, which also takes them (servant then not verified).
    pub user_tokens: TokenSet,
    /// Tokens of servants (`--acceptable_servant_tokens`).
    pub servant_tokens: TokenSet,
    /// Heartbeats from older daemons are rejected with `VersionTooOld`.
    pub min_daemon_version: u32,
    /// No new task goes to a servant reporting total memory and less than
    /// this much available (default 10 GiB).
    pub servant_min_memory_for_accepting_new_task: u64,
    /// Lifetime of one serving-daemon token epoch (default 3600 s).
    pub serving_daemon_token_rollout_interval: Duration,
    /// If set, the serving-daemon token ring is derived from this secret and the wall-clock epoch
    /// (epoch = unix_seconds / interval; token_k = hex(first 16 bytes of SHA-256(secret || k as u64 LE)))
    /// so tokens survive a scheduler restart. If None, a random 32-byte secret is drawn at start (same code path).
    pub serving_daemon_token_secret: Option<Redacted<Vec<u8>>>,
    /// After start, running tasks that verified servants not behind NAT
    /// report under grant ids this instance never issued are adopted instead
    /// of killed (default 15 s, a little longer than a 10 s heartbeat
    /// expiry, so every live servant reports once). See `adoption`.
    pub adoption_window: Duration,
    /// Lease given to adopted tasks (default 15 s); their owner renews them as usual.
    pub adopted_lease: Duration,
    /// How far `running_tasks()` may lag the heartbeats (default 1 s). Every
    /// daemon polls it about once a second while some heartbeat changes it
    /// almost every millisecond in a large cluster: rebuilding at most once
    /// per interval bounds its cost whatever the number of callers.
    pub running_tasks_refresh: Duration,
    /// Size limits on requests.
    pub limits: Limits,
    /// Until when this instance may grant (rule "fencing"; default: always).
    pub grant_fence: GrantFence,
    /// The tenants and their tokens (a tenants file); `None`: `user_tokens`
    /// form the one tenant `default` of weight 1.
    pub tenancy: Option<Tenancy>,
    /// Rule "own load": the foreign load on a servant is its reported load
    /// minus the 15 s average of this scheduler's grants there, not minus
    /// the grants held now (`--foreign_load_from_own_average`, on by
    /// default since benchmark P7; false is the original's rule).
    pub foreign_load_from_own_average: bool,
    /// Rule "observed speed": within a tier, servants whose freed grants
    /// came back sooner are placed first (`--place_by_observed_speed`).
    pub place_by_observed_speed: bool,
    /// Rule "broken servants": a servant whose grants keep coming back at
    /// once is taken out of rotation for a while (`--eject_broken_servants`).
    pub eject_broken_servants: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            user_tokens: TokenSet::default(),
            servant_tokens: TokenSet::default(),
            min_daemon_version: 0,
            servant_min_memory_for_accepting_new_task: 10 << 30,
            serving_daemon_token_rollout_interval: Duration::from_secs(3600),
            serving_daemon_token_secret: None,
            adoption_window: Duration::from_secs(15),
            adopted_lease: yadcc_stock::grant_lease(),
            running_tasks_refresh: Duration::from_secs(1),
            limits: Limits::default(),
            grant_fence: GrantFence::open(),
            tenancy: None,
            foreign_load_from_own_average: true,
            place_by_observed_speed: true,
            eject_broken_servants: true,
        }
    }
}

/// Bounds on what one request, one client or the whole state may hold, so
/// no client can make a call cost more than a known amount. Exceeding a
/// request bound is `InvalidArgument`, except where noted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest `next_heartbeat_in` (30 s; the reference rejects > 30000 ms).
    pub max_next_heartbeat: Duration,
    /// Longest `wait` of `WaitForStartingTask` (10 s).
    pub max_wait: Duration,
    /// Longest lease / keep-alive interval (30 s).
    pub max_keep_alive: Duration,
    /// Most grants one request gets, immediate + prefetch (1024). A request
    /// asking for more is capped, never refused (a delegate running
    /// `make -j1100` asks for 1100).
    pub max_grants_per_request: u32,
    /// Most ids in one keep-alive or free request (65536).
    pub max_ids_per_request: usize,
    /// Most environments one heartbeat may list (1024).
    pub max_environments_per_servant: usize,
    /// Most running tasks one heartbeat may list (8192; a servant runs at
    /// most about as many tasks as it has processors).
    pub max_running_tasks_per_servant: usize,
    /// Most running tasks all servants' last reports may hold together
    /// (1 Mi); a heartbeat that would pass it is refused.
    pub max_reported_tasks: usize,
    /// Longest compiler or task digest, in characters (256; yadcc's are 64 hex
    /// characters).
    pub max_digest_chars: usize,
    /// Most queued requests at once; beyond, `NoQuotaAvailable` at once (100000).
    pub max_waiters: usize,
    /// Most queued requests of one requester (a daemon's connection, or an
    /// address for other protocols: [`super::RequesterId`]); beyond,
    /// `NoQuotaAvailable` at once (64; a delegate keeps one long poll per
    /// compiler).
    pub max_waiters_per_requester: usize,
    /// Requesting machines remembered for the Requesters view; beyond, idle
    /// ones are forgotten (65536).
    pub max_requesters: usize,
    /// Ids this instance issued that were freed or expired during the
    /// adoption window, remembered so as never to adopt them (1 Mi); beyond,
    /// the window closes early. Only the engine's own grants count here.
    pub max_adoption_retired_ids: usize,
    /// Ids nobody had reported yet that were freed during the adoption
    /// window, remembered so as never to adopt them (1 Mi); beyond, further
    /// such frees are not remembered (the window stays open: any user-token
    /// holder can free made-up ids).
    pub max_adoption_early_frees: usize,
    /// Renewals during the adoption window of ids no servant reported yet
    /// that it remembers, in total (1 Mi, like `max_reported_tasks`: no more
    /// can be reported); beyond, such renewals answer false.
    pub max_adoption_early_renewals: usize,
    /// The same, per renewing machine (IP) (8192: far more grants than one
    /// delegate holds), so one machine cannot use up the total.
    pub max_adoption_early_renewals_per_machine: usize,
    /// Most locations cordoned at once (1000); a cordon of another one is
    /// `InvalidArgument`. Bounds the state saved at each action.
    pub max_cordons: usize,
    /// Longest reason of a cordon or drain, in characters (200).
    pub max_cordon_reason_chars: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_next_heartbeat: Duration::from_secs(30),
            max_wait: Duration::from_secs(10),
            max_keep_alive: Duration::from_secs(30),
            max_grants_per_request: 1024,
            max_ids_per_request: 65536,
            max_environments_per_servant: 1024,
            max_running_tasks_per_servant: 8192,
            max_reported_tasks: 1 << 20,
            max_digest_chars: 256,
            max_waiters: 100_000,
            max_waiters_per_requester: 64,
            max_requesters: 65536,
            max_adoption_retired_ids: 1 << 20,
            max_adoption_early_frees: 1 << 20,
            max_adoption_early_renewals: 1 << 20,
            max_adoption_early_renewals_per_machine: 8192,
            max_cordons: 1000,
            max_cordon_reason_chars: 200,
        }
    }
}
