//! Heartbeats and servant removal: the servant rules that also touch grants
//! (running-task reports, adoption, zombies reaped, a servant's grants
//! forgotten with it). The records themselves belong to `servants`.

use std::net::SocketAddr;

use tokio::time::Instant;

use super::envs::{Effects, MAX_SLOTS};
use super::grants::{GrantEnd, NewGrant, Origin};
use super::servants::ServantReport;
use super::state::State;
use super::types::{
    Heartbeat, HeartbeatReply, NotAcceptingReason, Rejection, ReportedTask, RunningTask,
    ServantKey, later,
};

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
/// [`yadcc_text::grammar::parse_location`] reads it (the grammar the OpenAPI
/// document states).
pub(crate) fn parse_location(location: &str) -> Result<SocketAddr, Rejection> {
    yadcc_text::grammar::parse_location(location).ok_or_else(|| {
        Rejection::InvalidArgument(format!(
            "location {:?} is not IP:port (a.b.c.d:port or [v6]:port)",
            yadcc_text::echo::echo(location)
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
        let key = self
            .servants
            .take_report(observed, hb.running_tasks.len(), now)?;
        let behind_nat = observed != reported;
        let leaving = hb.next_heartbeat_in.is_zero();
        let (max_tasks, reason) = admission(
            verified,
            behind_nat,
            leaving,
            hb.capacity,
            hb.not_accepting_reason,
        );

        let mut fx = Effects::default();
        self.servants
            .offer(key, hb.environments, &mut self.envs, &mut fx);
        let expires_at = self.servants.update(
            key,
            ServantReport {
                reported,
                version: hb.version,
                priority: hb.priority,
                max_tasks,
                reason,
                num_processors: effective_processors(hb.num_processors, hb.capacity),
                current_load: hb.current_load,
                total_memory: hb.total_memory,
                memory_available: hb.memory_available,
                leaving,
                cordoned: self.cordons.covering(reported, observed).is_some(),
                expires_at: later(now, hb.next_heartbeat_in),
            },
            now,
        );
        self.note_deadline(expires_at);

        let trusted = verified && !behind_nat;
        let expired = self.examine_running_tasks(key, &hb.running_tasks, trusted, now, &mut fx);
        let shown = self.shown_running_tasks(key, observed, hb.running_tasks, trusted);
        self.servants.show_running_tasks(key, shown);

        self.servants.reindex(key, &mut self.envs, &mut fx);
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
            .filter(|t| self.grants.is_live_on(t.grant_id, key))
            .map(|t| RunningTask {
                servant: observed,
                servant_task_id: t.servant_task_id,
                grant_id: t.grant_id,
                task_digest: t.task_digest,
            })
            .collect()
    }

    /// Rule "running-task report": a reported grant id that is not a live
    /// grant of this servant is returned as expired, except that during the
    /// adoption window an id this instance never issued, reported by a
    /// `trusted` servant (verified, not behind NAT), is adopted as a grant on
    /// it (rule "adoption", see `adoption`). Zombies and adopted grants of
    /// this servant that it no longer reports end. Does not touch the
    /// indexes (the caller reindexes once).
    fn examine_running_tasks(
        &mut self,
        key: ServantKey,
        tasks: &[ReportedTask],
        trusted: bool,
        now: Instant,
        fx: &mut Effects,
    ) -> Vec<u64> {
        let mut expired = Vec::new();
        for task in tasks {
            let id = task.grant_id;
            if self.grants.listed_live_on(id, key) {
                continue;
            }
            if !self.grants.contains(id) && trusted && self.grants.may_adopt(id, now) {
                self.create_grant(
                    NewGrant {
                        servant: key,
                        origin: Origin::Adopted { id },
                    },
                    now,
                );
            } else {
                expired.push(id);
            }
        }

        if self.servants.has_reportable_grants(key) {
            let mut listed: Vec<u64> = tasks.iter().map(|t| t.grant_id).collect();
            listed.sort_unstable();
            for (id, zombie) in self.servants.unlisted(key, &listed) {
                let end = if zombie {
                    GrantEnd::Reaped
                } else {
                    GrantEnd::AdoptionEnded
                };
                self.remove_grant(id, end, fx);
            }
        }
        expired
    }

    /// Rule "servant expiry": the servant, its reported tasks and all its
    /// grants (live and zombie) are forgotten at once. Frees nothing usable.
    pub(crate) fn remove_servant(&mut self, key: ServantKey, fx: &mut Effects) {
        let Some(grants) = self.servants.remove(key, &mut self.envs, fx) else {
            return;
        };
        for id in grants {
            self.remove_grant(id, GrantEnd::ServantGone, fx);
        }
    }
}
