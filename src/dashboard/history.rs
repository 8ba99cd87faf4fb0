//! The history ring: one sample of the cluster totals per second, an hour of
//! them, kept by the server so a page opened now shows the last hour.

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum::{Json, extract::State};
use serde::Serialize;
use utoipa::ToSchema;

use super::{Dashboard, access::Refusals, overview::unix_millis};
use crate::engine::ClusterTotals;

/// One history sample per this interval.
pub const HISTORY_INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept: one hour at one per second.
pub const HISTORY_CAPACITY: usize = 3600;

#[derive(Debug, Default)]
pub(super) struct History {
    samples: VecDeque<HistorySample>,
    /// The grants counter at the previous sample, for the rate.
    last_grants_issued: Option<(u64, tokio::time::Instant)>,
}

impl History {
    /// Appends a sample of `totals` now, dropping the oldest when full;
    /// `grants_issued` is the engine's running count of grants made.
    pub(super) fn record(&mut self, totals: &ClusterTotals, grants_issued: u64) {
        let now = tokio::time::Instant::now();
        let grants_per_second = match self.last_grants_issued {
            Some((before, at)) if now > at => {
                grants_issued.saturating_sub(before) as f64 / (now - at).as_secs_f64()
            }
            _ => 0.0,
        };
        self.last_grants_issued = Some((grants_issued, now));
        if self.samples.len() == HISTORY_CAPACITY {
            self.samples.pop_front();
        }
        self.samples.push_back(HistorySample {
            at_ms: unix_millis(SystemTime::now()),
            capacity: totals.capacity,
            capacity_available: totals.capacity_available,
            running: totals.running,
            waiters: totals.waiters as u64,
            grants_per_second,
        });
    }

    pub(super) fn view(&self) -> HistoryView {
        HistoryView {
            interval_seconds: HISTORY_INTERVAL.as_secs(),
            samples: self.samples.iter().cloned().collect(),
        }
    }

    pub(super) fn latest_grants_per_second(&self) -> f64 {
        self.samples
            .back()
            .map_or(0.0, |sample| sample.grants_per_second)
    }
}

/// The history ring, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryView {
    pub interval_seconds: u64,
    pub samples: Vec<HistorySample>,
}

/// One history sample.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistorySample {
    pub at_ms: u64,
    pub capacity: u64,
    pub capacity_available: u64,
    pub running: u64,
    pub waiters: u64,
    pub grants_per_second: f64,
}

/// One sample per second for the last hour.
///
/// The dashboard's history chart: cluster totals and the grant rate, one
/// sample per second, oldest first.
#[utoipa::path(get, path = "/api/v1/history", tag = "dashboard",
    responses((status = 200, description = "History, oldest first", body = HistoryView),
              Refusals))]
pub(super) async fn history(State(dashboard): State<Arc<Dashboard>>) -> Json<HistoryView> {
    Json(
        dashboard
            .history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .view(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_ring_keeps_the_last_hour_and_measures_the_grant_rate() {
        let mut history = History::default();
        let totals = ClusterTotals {
            capacity: 8,
            running: 3,
            ..ClusterTotals::default()
        };
        history.record(&totals, 100);
        assert_eq!(
            history.latest_grants_per_second(),
            0.0,
            "no rate before a second sample"
        );
        tokio::time::advance(Duration::from_secs(2)).await;
        history.record(&totals, 110);
        assert_eq!(history.latest_grants_per_second(), 5.0, "10 grants in 2 s");

        for issued in 0..HISTORY_CAPACITY as u64 {
            tokio::time::advance(HISTORY_INTERVAL).await;
            history.record(&totals, 110 + issued);
        }
        let view = history.view();
        assert_eq!(view.samples.len(), HISTORY_CAPACITY, "the oldest dropped");
        assert_eq!(view.interval_seconds, 1);
        let newest = view.samples.last().unwrap();
        assert_eq!((newest.capacity, newest.running), (8, 3));
        assert_eq!(newest.grants_per_second, 1.0);
        assert!(view.samples.iter().all(|s| s.grants_per_second != 5.0));
    }
}
