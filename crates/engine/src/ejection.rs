//! Rule "broken servants": a servant whose daemon gives every grant back at
//! once (its serving port refused, a full disk, a broken compiler) turns
//! grants around fastest, so without this rule the lowest-utilisation and
//! observed-speed rules send it most of the farm. Modelled on Envoy's
//! outlier detection: consecutive failures eject a host for a base time
//! that grows with each ejection, never more than a set share of hosts at
//! once, and it comes back on its own.
//!
//! The evidence is what the scheduler sees of a grant: an immediate grant
//! given back live, that no heartbeat of its servant ever listed, after a
//! hold far shorter than the farm's typical one. Either half alone says
//! little: a compile shorter than the heartbeat interval is never listed,
//! and a small file on a fast machine is quick; a grant a heartbeat listed
//! ran, whatever its length. The farm's typical hold is learnt only from
//! grants that ran, so a broken servant that takes the first grants of a
//! fresh farm cannot make its own turnaround look typical.
//!
//! Fixed memory per servant, no timer of its own: an ejection ends at the
//! servant's first heartbeat after its time (daemons beat every second).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::speed::ObservedSpeed;

/// Grants in a row that must come back broken before an ejection
/// (Envoy's `consecutive_5xx` default).
pub(crate) const CONSECUTIVE_BROKEN: u32 = 5;
/// The first ejection's length; the n-th lasts n times as long (Envoy's
/// `base_ejection_time`).
pub(crate) const BASE_EJECTION: Duration = Duration::from_secs(30);
/// No ejection lasts longer (Envoy's `max_ejection_time`).
pub(crate) const MAX_EJECTION: Duration = Duration::from_secs(300);
/// At most this share of the live servants is ejected at once, and at
/// least one may be (Envoy's `max_ejection_percent`, which also always
/// allows one), but never the last: a detector that is wrong about a whole
/// farm (compiles all shorter than it thinks possible) cannot empty it.
pub(crate) const MAX_EJECTED_SHARE: f64 = 0.1;
/// A grant back this many times sooner than the farm's typical hold is far
/// sooner: a compile's length varies by about ten from file to file (the
/// farm model's spread), so 1/16 of the geometric mean is rare for a
/// grant that ran.
const FAR_SOONER: f64 = 16.0;
/// The bound before the farm's typical hold is known: a compile that ran
/// at all takes longer than this.
const UNKNOWN_FARM_BOUND: Duration = Duration::from_millis(100);

/// Why a grant's quick return counts against its servant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokenGrant {
    /// How long it was held.
    pub held: Duration,
    /// The bound it came back under (the farm's typical hold / 16).
    pub bound: Duration,
}

impl fmt::Display for BrokenGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{CONSECUTIVE_BROKEN} grants in a row given back before any heartbeat listed them, \
             the last after {} ms (farm's bound {} ms)",
            self.held.as_millis(),
            self.bound.as_millis()
        )
    }
}

/// What a returned grant says of its servant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ran,
    Broken(BrokenGrant),
}

/// The farm's typical hold of grants that ran.
pub(crate) struct FarmHold {
    held: ObservedSpeed,
}

impl FarmHold {
    pub(crate) fn new(now: Instant) -> FarmHold {
        FarmHold {
            held: ObservedSpeed::new(now),
        }
    }

    /// Judges an immediate grant given back live after `held`; `listed` if
    /// a heartbeat of its servant listed it. One that ran teaches the
    /// farm's typical hold.
    pub(crate) fn judge(&mut self, held: Duration, listed: bool, now: Instant) -> Verdict {
        let bound = self
            .held
            .typical(now)
            .map_or(UNKNOWN_FARM_BOUND, |typical| typical.div_f64(FAR_SOONER));
        if !listed && held < bound {
            return Verdict::Broken(BrokenGrant { held, bound });
        }
        self.held.record(held, now);
        Verdict::Ran
    }
}

/// Where a servant stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutlierState {
    /// In rotation.
    Healthy,
    /// Out of rotation until `until` (no free slot).
    Ejected { until: Instant },
    /// Back after an ejection with one slot at most, until a grant comes
    /// back that ran (or another broken one ejects it again).
    OnTrial,
}

/// One servant's record of broken grants and ejections.
#[derive(Debug, Clone)]
pub(crate) struct Outlier {
    broken_in_a_row: u32,
    /// Ejections that still count towards the next one's length; one less
    /// for each [`BASE_EJECTION`] the servant stays healthy.
    ejections: u32,
    healthy_since: Instant,
    state: OutlierState,
    /// The evidence of the latest ejection.
    last: Option<BrokenGrant>,
}

impl Outlier {
    pub(crate) fn new(now: Instant) -> Outlier {
        Outlier {
            broken_in_a_row: 0,
            ejections: 0,
            healthy_since: now,
            state: OutlierState::Healthy,
            last: None,
        }
    }

    pub(crate) fn state(&self) -> OutlierState {
        self.state
    }

    pub(crate) fn is_ejected(&self) -> bool {
        matches!(self.state, OutlierState::Ejected { .. })
    }

    pub(crate) fn on_trial(&self) -> bool {
        self.state == OutlierState::OnTrial
    }

    /// Why it was last ejected.
    pub(crate) fn last_evidence(&self) -> Option<BrokenGrant> {
        self.last
    }

    /// Ejections counted towards the next one's length.
    pub(crate) fn ejections(&self) -> u32 {
        self.ejections
    }

    /// A grant that ran came back: a servant on trial is healthy again,
    /// and a healthy one earns back an ejection per [`BASE_EJECTION`].
    pub(crate) fn ran(&mut self, now: Instant) {
        self.broken_in_a_row = 0;
        match self.state {
            OutlierState::OnTrial => {
                self.state = OutlierState::Healthy;
                self.healthy_since = now;
            }
            OutlierState::Healthy => {
                let healthy = now.saturating_duration_since(self.healthy_since);
                let earned = (healthy.as_secs_f64() / BASE_EJECTION.as_secs_f64()) as u32;
                if earned > 0 {
                    self.ejections = self.ejections.saturating_sub(earned);
                    self.healthy_since = now;
                }
            }
            OutlierState::Ejected { .. } => {}
        }
    }

    /// A broken grant came back; true if the servant should now be ejected
    /// (the caller checks the share and calls [`Outlier::eject`]).
    pub(crate) fn broken(&mut self) -> bool {
        self.broken_in_a_row = self.broken_in_a_row.saturating_add(1);
        match self.state {
            OutlierState::OnTrial => true,
            OutlierState::Healthy => self.broken_in_a_row >= CONSECUTIVE_BROKEN,
            OutlierState::Ejected { .. } => false,
        }
    }

    /// Out of rotation from `now`, for longer with each ejection.
    pub(crate) fn eject(&mut self, evidence: BrokenGrant, now: Instant) {
        self.ejections = self.ejections.saturating_add(1);
        let length = BASE_EJECTION
            .saturating_mul(self.ejections)
            .min(MAX_EJECTION);
        self.state = OutlierState::Ejected {
            until: now + length,
        };
        self.broken_in_a_row = 0;
        self.last = Some(evidence);
    }

    /// At a heartbeat: an ejection whose time is up ends, on trial. True if
    /// it ended.
    pub(crate) fn end_ejection(&mut self, now: Instant) -> bool {
        match self.state {
            OutlierState::Ejected { until } if until <= now => {
                self.state = OutlierState::OnTrial;
                true
            }
            _ => false,
        }
    }
}

/// How many of `servants` may be ejected at once.
pub(crate) fn ejection_cap(servants: usize) -> usize {
    let share = (servants as f64 * MAX_EJECTED_SHARE).floor() as usize;
    share.max(1).min(servants.saturating_sub(1))
}
