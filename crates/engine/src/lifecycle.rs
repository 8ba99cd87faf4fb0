//! A grant's life: where it goes (the placement rule), the one place it is
//! made ([`State::create_grant`]), renewals, frees, its lease running out,
//! and the one place it ends ([`State::remove_grant`]). Each step keeps
//! every index the grant appears in (the grant table and deadlines, its
//! servant's count and place, the environment indexes, the requester's
//! figures, the counters) in step, through their owners' methods.

use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::envs::{Effects, PlaceKey};
use super::grants::{GrantEnd, GrantRec, NewGrant, Origin, Renewal};
use super::requesters::Owner;
use super::servants::Returned;
use super::state::State;
use super::types::{EnvId, Grant, ServantKey, later};

impl State {
    /// The one way a grant is made: its record and lease deadline, its
    /// servant's count, the requester's figures and the counters. Only
    /// reduces free capacity, so it never triggers serving.
    pub(crate) fn create_grant(&mut self, new: NewGrant, now: Instant) -> Grant {
        let NewGrant { servant, origin } = new;
        let (owner, tenant, environment, lease_until, prefetch, adopted_id) = match origin {
            Origin::Issued {
                env,
                owner,
                tenant,
                lease,
                prefetch,
                ..
            } => (
                Some(owner),
                Some(tenant),
                self.envs.get(env).map(|e| e.name().clone()),
                later(now, lease),
                prefetch,
                None,
            ),
            Origin::Adopted { id } => {
                let (owner, lease_until) = self.grants.adoption_terms(id, now);
                (owner, None, None, lease_until, false, Some(id))
            }
        };
        let servant_addr = self
            .servants
            .get(servant)
            .expect("placement and heartbeats name live servants")
            .observed();
        let adopted = adopted_id.is_some();
        let id = self.grants.insert(
            GrantRec {
                servant,
                servant_addr,
                owner,
                tenant,
                environment,
                granted_at: now,
                lease_until,
                prefetch,
                zombie: false,
                adopted,
                listed: false,
            },
            adopted_id,
        );
        self.servants.count_grant(servant, id, adopted);
        self.note_deadline(lease_until);
        match (origin, owner) {
            (
                Origin::Issued {
                    owner,
                    requester,
                    tenant,
                    ..
                },
                _,
            ) => {
                self.requesters.granted(owner.ip, requester);
                self.tenants.granted(tenant);
            }
            (Origin::Adopted { .. }, Some(owner)) => self.requesters.adopted_by(owner.ip),
            (Origin::Adopted { .. }, None) => {}
        }
        Grant {
            id,
            servant: servant_addr,
            prefetch,
        }
    }

    /// The one way a grant ends: its record and lease deadline, its owner's
    /// count, its servant's count (unless the servant is gone) and, inside
    /// the adoption window, a note never to adopt the id. A freed grant's
    /// servant is reindexed at once (the capacity may serve queued
    /// requests); a grant a heartbeat ends leaves that to the heartbeat,
    /// which reindexes its servant once when done. False if unknown.
    pub(crate) fn remove_grant(&mut self, id: u64, end: GrantEnd, fx: &mut Effects) -> bool {
        let Some(g) = self.grants.remove(id, end) else {
            return false;
        };
        if let Some(owner) = g.owner {
            self.requesters.released(owner.ip);
        }
        if let Some(tenant) = g.tenant {
            self.tenants.released(tenant);
        }
        match end {
            GrantEnd::Freed { at } => {
                // Rules "observed speed", "broken servants": only an
                // immediate grant given back live times a compile (see
                // `speed`) or tells that its servant failed it.
                let returned = (!g.prefetch && !g.adopted && !g.zombie).then(|| Returned {
                    held: at.saturating_duration_since(g.granted_at),
                    listed: g.listed,
                    at,
                });
                self.servants
                    .release_grant(g.servant, id, returned, &mut self.envs, fx);
            }
            GrantEnd::Undelivered => {
                self.servants
                    .release_grant(g.servant, id, None, &mut self.envs, fx);
            }
            GrantEnd::Reaped | GrantEnd::AdoptionEnded => {
                self.servants.uncount_grant(g.servant, id);
            }
            GrantEnd::ServantGone => {}
        }
        true
    }

    /// Rule "renew": true if the grant is live and `caller` owns it (lease =
    /// now + `lease`); false if unknown, a zombie, or owned by someone else
    /// (rule "grant ownership": counted as refused). An adopted grant belongs
    /// to its first renewer. Inside the adoption window an id no servant
    /// reported yet is remembered and answered true (rule "early renewal").
    pub(crate) fn renew(&mut self, id: u64, caller: Owner, lease: Duration, now: Instant) -> bool {
        match self.grants.renew(id, caller, later(now, lease), now) {
            Renewal::Renewed { claimed, moved } => {
                if claimed {
                    self.requesters.adopted_by(caller.ip);
                }
                if let Some(at) = moved {
                    self.note_deadline(at);
                }
                true
            }
            Renewal::Remembered => true,
            Renewal::NotRenewed => false,
            Renewal::Refused => {
                self.requesters.refused(caller.ip);
                false
            }
        }
    }

    /// Rule "free": releases every known id (zombies too) that `caller` owns
    /// (or that nobody owns: adopted and not renewed), skipping unknown ids
    /// and, counted as refused, ids someone else owns, without stopping;
    /// then serves queued requests that the released capacity can satisfy.
    /// Inside the adoption window an unknown id is remembered as freed, so a
    /// late report cannot bring it back (rule "early free").
    pub(crate) fn free_ids(&mut self, ids: &[u64], caller: Owner, now: Instant) {
        let mut fx = Effects::default();
        for &id in ids {
            if self.grants.may_free(id, caller, now) {
                self.remove_grant(id, GrantEnd::Freed { at: now }, &mut fx);
            } else {
                self.requesters.refused(caller.ip);
            }
        }
        self.apply(fx, now);
    }

    /// Rule "lease expiry": the grant becomes a zombie; it keeps counting
    /// against its servant until a heartbeat no longer lists it.
    pub(crate) fn zombify(&mut self, id: u64) {
        if let Some(servant) = self.grants.zombify(id) {
            self.servants.mark_zombie(servant, id);
        }
    }

    /// Rule "placement": walk the free set in order (dedicated-under-half
    /// first, then rule "observed speed", then lowest utilisation, ties to
    /// the earliest-registered servant), skipping servants older than
    /// `min_version`; the requester's own machine (same IP) is used only if
    /// nothing else is free. Stale entries met on the way are moved to their
    /// true place (see `envs`). Nothing is placed while the fence is closed
    /// (rule "fencing"): an instance that may not be the leader any more.
    pub(crate) fn pick(
        &mut self,
        env: EnvId,
        requester: IpAddr,
        min_version: u32,
        now: Instant,
    ) -> Option<ServantKey> {
        if !self.fence.allows(now) {
            return None;
        }
        let requester = requester.to_canonical();
        let mut own = None;
        let mut after: Option<PlaceKey> = None;
        loop {
            let entry = self.envs.get(env)?;
            let Some(key) = entry.free_after(after) else {
                return own;
            };
            let Some(servant) = self.servants.get(key.servant) else {
                self.envs.correct_free(env, key, None);
                continue;
            };
            let truth = servant.place();
            if truth != Some(key) {
                debug_assert!(truth.is_none_or(|t| t > key), "held key above the true key");
                self.servants.relink(key.servant, entry.name(), truth);
                self.envs.correct_free(env, key, truth);
                continue;
            }
            after = Some(key);
            if servant.version() < min_version {
                continue;
            }
            if servant.observed().ip() == requester {
                own.get_or_insert(key.servant);
                continue;
            }
            return Some(key.servant);
        }
    }
}
