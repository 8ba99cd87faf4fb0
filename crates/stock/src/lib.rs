//! The stock yadcc daemons' timings (yadcc's `daemon/local` and
//! `daemon/cloud`, unmodified), written once: the engine assumes them where
//! a daemon says nothing (an adopted grant's lease), the simulator copies
//! them, and tests and benchmarks size their waits by them. A number here
//! is a fact about a client, not a choice of this scheduler.

use std::time::Duration;

/// A servant heartbeats this often.
pub const HEARTBEAT_PERIOD: Duration = Duration::from_secs(1);

/// The `next_heartbeat_in_ms` a servant sends: how long the scheduler keeps
/// it without another heartbeat.
pub const NEXT_HEARTBEAT_IN_MS: u32 = 10_000;

/// The `next_keep_alive_in_ms` a delegate sends with `WaitForStartingTask`:
/// a new grant's lease.
pub const GRANT_LEASE_MS: u32 = 15_000;

/// A delegate renews its grants (`KeepTaskAlive`) this often.
pub const RENEW_PERIOD: Duration = Duration::from_secs(1);

/// The `next_keep_alive_in_ms` a delegate sends with `KeepTaskAlive`.
pub const RENEW_LEASE_MS: u32 = 10_000;

/// The `milliseconds_to_wait` a delegate sends with `WaitForStartingTask`.
pub const WAIT_MS: u32 = 5_000;

/// `prefetch_reqs`: grants a delegate keeps ready beyond its running jobs.
pub const PREFETCH: u32 = 1;

/// A delegate and a servant read the serving token (`GetConfig`) this often.
pub const CONFIG_PERIOD: Duration = Duration::from_secs(10);

/// A new grant's lease as a duration.
pub const fn grant_lease() -> Duration {
    Duration::from_millis(GRANT_LEASE_MS as u64)
}
