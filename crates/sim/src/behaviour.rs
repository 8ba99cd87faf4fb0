//! How the simulated daemons behave: the stock daemons' periods, leases and
//! timeouts, and where compilations come from. Defaults are the reference
//! daemon's. `Debug` leaves the tokens out.

use std::{ops::RangeInclusive, time::Duration};

use yadcc_stock as stock;

/// How servants behave.
#[derive(Clone)]
pub struct ServantBehaviour {
    pub token: String,
    /// Between heartbeats (1 s, as the daemon).
    pub heartbeat_interval: Duration,
    /// `next_heartbeat_in_ms` (10000, as the daemon).
    pub next_heartbeat_in_ms: u32,
    /// Send `next_heartbeat_in_ms = 0` when stopping.
    pub leave_on_stop: bool,
}

impl ServantBehaviour {
    /// A stock servant's habits (`yadcc_stock`), with `token`.
    pub fn stock(token: impl Into<String>) -> ServantBehaviour {
        ServantBehaviour {
            token: token.into(),
            heartbeat_interval: stock::HEARTBEAT_PERIOD,
            next_heartbeat_in_ms: stock::NEXT_HEARTBEAT_IN_MS,
            leave_on_stop: true,
        }
    }
}

impl std::fmt::Debug for ServantBehaviour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServantBehaviour")
            .field("token", &format_args!("<redacted>"))
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("next_heartbeat_in_ms", &self.next_heartbeat_in_ms)
            .field("leave_on_stop", &self.leave_on_stop)
            .finish()
    }
}

/// Where jobs come from.
#[derive(Debug, Clone)]
pub enum Workload {
    /// A steady stream: jobs arrive at random (Poisson) at this rate, per delegate.
    Rate { jobs_per_second: f64 },
    /// A developer building now and then: idle, then a build of `files`
    /// compilations with `parallelism` at once (`make -jN`).
    Builds {
        idle: RangeInclusive<Duration>,
        files: RangeInclusive<u32>,
        parallelism: RangeInclusive<u32>,
    },
    /// A delegate that always has `running` compilations under way: each
    /// one done is replaced at once (the first ones are part-way through, so
    /// completions are spread out from the start).
    Steady { running: u32 },
}

/// How delegates behave.
#[derive(Clone)]
pub struct DelegateBehaviour {
    pub token: String,
    pub workload: Workload,
    /// How long one compilation runs on its servant.
    pub task_duration: RangeInclusive<Duration>,
    /// `milliseconds_to_wait` (5000).
    pub wait_ms: u32,
    /// `next_keep_alive_in_ms` of `WaitForStartingTask` (15000).
    pub grant_lease_ms: u32,
    /// `prefetch_reqs` (1).
    pub prefetch: u32,
    /// Between `KeepTaskAlive` calls (1 s).
    pub renew_interval: Duration,
    /// `next_keep_alive_in_ms` of `KeepTaskAlive` (10000).
    pub renew_lease_ms: u32,
    /// Between `GetConfig` calls (10 s).
    pub config_interval: Duration,
    /// Between `GetRunningTasks` calls (1 s); `None`: never.
    pub running_tasks_interval: Option<Duration>,
    /// Jobs queued or running per delegate beyond which new ones are shed
    /// (so an overloaded scheduler does not grow the simulator's memory).
    pub max_jobs: usize,
}

impl std::fmt::Debug for DelegateBehaviour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegateBehaviour")
            .field("token", &format_args!("<redacted>"))
            .field("workload", &self.workload)
            .field("task_duration", &self.task_duration)
            .field("wait_ms", &self.wait_ms)
            .field("grant_lease_ms", &self.grant_lease_ms)
            .field("prefetch", &self.prefetch)
            .field("renew_interval", &self.renew_interval)
            .field("renew_lease_ms", &self.renew_lease_ms)
            .field("config_interval", &self.config_interval)
            .field("running_tasks_interval", &self.running_tasks_interval)
            .field("max_jobs", &self.max_jobs)
            .finish()
    }
}

impl DelegateBehaviour {
    pub fn new(token: impl Into<String>, workload: Workload) -> DelegateBehaviour {
        DelegateBehaviour {
            token: token.into(),
            workload,
            task_duration: Duration::from_secs(2)..=Duration::from_secs(10),
            wait_ms: stock::WAIT_MS,
            grant_lease_ms: stock::GRANT_LEASE_MS,
            prefetch: stock::PREFETCH,
            renew_interval: stock::RENEW_PERIOD,
            renew_lease_ms: stock::RENEW_LEASE_MS,
            config_interval: stock::CONFIG_PERIOD,
            running_tasks_interval: Some(Duration::from_secs(1)),
            max_jobs: 2000,
        }
    }

    /// Prefetched grants count as expired this much before their lease ends.
    const EARLY_EXPIRY_MS: u32 = 5000;

    /// How long a prefetched grant is kept for a job.
    pub(crate) fn spare_life(&self) -> Duration {
        let life = self.grant_lease_ms.saturating_sub(Self::EARLY_EXPIRY_MS);
        Duration::from_millis(u64::from(life))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_tokens() {
        let delegate = DelegateBehaviour::new(
            "user-secret",
            Workload::Rate {
                jobs_per_second: 1.0,
            },
        );
        let servant = ServantBehaviour::stock("servant-secret");
        for printed in [format!("{delegate:?}"), format!("{servant:?}")] {
            assert!(!printed.contains("-secret"), "{printed}");
            assert!(printed.contains("token: <redacted>"), "{printed}");
        }
    }

    #[test]
    fn prefetched_grants_are_kept_until_5_s_before_their_lease_ends() {
        let delegate = DelegateBehaviour::new(
            "t",
            Workload::Rate {
                jobs_per_second: 1.0,
            },
        );
        assert_eq!(delegate.spare_life(), Duration::from_secs(10));
    }
}
