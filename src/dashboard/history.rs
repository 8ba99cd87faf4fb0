//! The history ring: one sample of the cluster totals per second, an hour of
//! them, kept by the server so a page opened now shows the last hour; and
//! the grant rates (in all and per requesting machine) over the last
//! [`RATE_WINDOW`], measured by the same sampler, so a page shows them on
//! its first load and every figure of one rate agrees.

use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum::extract::State;

use super::JsonAnswer;
use serde::Serialize;
use utoipa::ToSchema;

use super::{Dashboard, access::Refusals, overview::unix_millis};
use crate::engine::{ClusterTotals, RequesterView};

/// One history sample per this interval.
pub const HISTORY_INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept: one hour at one per second.
pub const HISTORY_CAPACITY: usize = 3600;
/// Grant rates are grants made over (at most) this long before the latest
/// sample, divided by its length: long enough that one burst does not swing
/// the figure, short enough to follow a build starting.
pub const RATE_WINDOW: Duration = Duration::from_secs(10);
/// Sampler steps in [`RATE_WINDOW`].
const RATE_STEPS: usize = (RATE_WINDOW.as_secs() / HISTORY_INTERVAL.as_secs()) as usize;

#[derive(Debug, Default)]
pub(super) struct History {
    samples: VecDeque<HistorySample>,
    rates: GrantRates,
}

/// Grants made between two samples, in all and by each machine that got any.
#[derive(Debug)]
struct RateStep {
    seconds: f64,
    issued: u64,
    by_machine: Vec<(IpAddr, u64)>,
}

/// The sampler's grant counts: the latest per machine, and the last
/// [`RATE_STEPS`] steps. Memory: one entry per known machine, plus one per
/// machine that got a grant in a step of the window.
#[derive(Debug, Default)]
struct GrantRates {
    at: Option<tokio::time::Instant>,
    issued: u64,
    by_machine: HashMap<IpAddr, u64>,
    steps: VecDeque<RateStep>,
    latest: Rates,
}

/// Grants per second over the window before the latest sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Rates {
    /// How long the window actually is: [`RATE_WINDOW`] once the sampler has
    /// run that long, less before; 0 before its second sample.
    pub(super) window_seconds: f64,
    pub(super) total: f64,
    /// Machines that got a grant in the window.
    pub(super) by_machine: HashMap<IpAddr, f64>,
}

impl GrantRates {
    fn record(&mut self, now: tokio::time::Instant, issued: u64, requesters: &[RequesterView]) {
        let by_machine: HashMap<IpAddr, u64> = requesters
            .iter()
            .map(|requester| (requester.ip, requester.grants_total))
            .collect();
        if let Some(before) = self.at.filter(|before| now > *before) {
            let step = RateStep {
                seconds: (now - before).as_secs_f64(),
                issued: issued.saturating_sub(self.issued),
                by_machine: by_machine
                    .iter()
                    .filter_map(|(ip, total)| {
                        let made = total.saturating_sub(*self.by_machine.get(ip).unwrap_or(&0));
                        (made > 0).then_some((*ip, made))
                    })
                    .collect(),
            };
            if self.steps.len() == RATE_STEPS {
                self.steps.pop_front();
            }
            self.steps.push_back(step);
        }
        self.at = Some(now);
        self.issued = issued;
        self.by_machine = by_machine;
        self.latest = self.rates();
    }

    fn rates(&self) -> Rates {
        let window_seconds: f64 = self.steps.iter().map(|step| step.seconds).sum();
        if window_seconds <= 0.0 {
            return Rates::default();
        }
        let mut made: HashMap<IpAddr, u64> = HashMap::new();
        for (ip, grants) in self.steps.iter().flat_map(|step| &step.by_machine) {
            *made.entry(*ip).or_default() += grants;
        }
        Rates {
            window_seconds,
            total: self.steps.iter().map(|step| step.issued).sum::<u64>() as f64 / window_seconds,
            by_machine: made
                .into_iter()
                .map(|(ip, grants)| (ip, grants as f64 / window_seconds))
                .collect(),
        }
    }
}

impl History {
    /// Appends a sample of `totals` now, dropping the oldest when full;
    /// `grants_issued` is the engine's running count of grants made,
    /// `requesters` each machine's (for the rates).
    pub(super) fn record(
        &mut self,
        totals: &ClusterTotals,
        grants_issued: u64,
        requesters: &[RequesterView],
    ) {
        let now = tokio::time::Instant::now();
        self.rates.record(now, grants_issued, requesters);
        let grants_per_second = self.rates.latest.total;
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
            rate_window_seconds: RATE_WINDOW.as_secs(),
            samples: self.samples.iter().cloned().collect(),
        }
    }

    /// The grant rates of the latest sample.
    pub(super) fn rates(&self) -> &Rates {
        &self.rates.latest
    }
}

/// The history ring, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryView {
    pub interval_seconds: u64,
    /// Each sample's `grantsPerSecond` is measured over this many seconds.
    pub rate_window_seconds: u64,
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
    /// Grants made per second over the `rateWindowSeconds` before `atMs`.
    pub grants_per_second: f64,
}

/// One sample per second for the last hour.
///
/// The dashboard's history chart: cluster totals and the grant rate, one
/// sample per second, oldest first.
#[utoipa::path(get, path = "/api/v1/history", tag = "dashboard",
    responses((status = 200, description = "History, oldest first", body = HistoryView),
              Refusals))]
pub(super) async fn history(State(dashboard): State<Arc<Dashboard>>) -> JsonAnswer<HistoryView> {
    JsonAnswer(
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

    fn machine(ip: &str, grants_total: u64) -> RequesterView {
        RequesterView {
            ip: ip.parse().unwrap(),
            grants_held: 0,
            waiting: 0,
            waiting_requesters: 0,
            grants_total,
            refused_total: 0,
            wait_cap_refusals: 0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_ring_keeps_the_last_hour() {
        let mut history = History::default();
        let totals = ClusterTotals {
            capacity: 8,
            running: 3,
            ..ClusterTotals::default()
        };
        for issued in 0..HISTORY_CAPACITY as u64 + 5 {
            history.record(&totals, issued, &[]);
            tokio::time::advance(HISTORY_INTERVAL).await;
        }
        let view = history.view();
        assert_eq!(view.samples.len(), HISTORY_CAPACITY, "the oldest dropped");
        assert_eq!(view.interval_seconds, 1);
        assert_eq!(view.rate_window_seconds, 10);
        let newest = view.samples.last().unwrap();
        assert_eq!((newest.capacity, newest.running), (8, 3));
        assert_eq!(newest.grants_per_second, 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn rates_are_grants_over_the_window_in_all_and_per_machine() {
        let mut history = History::default();
        let totals = ClusterTotals::default();
        history.record(&totals, 100, &[machine("10.0.0.1", 40)]);
        assert_eq!(
            history.rates(),
            &Rates::default(),
            "no rate from one sample"
        );

        // 2 s later: 10 grants, 6 of them to 10.0.0.1, 4 to a new machine.
        tokio::time::advance(Duration::from_secs(2)).await;
        history.record(
            &totals,
            110,
            &[machine("10.0.0.1", 46), machine("10.0.0.2", 4)],
        );
        let rates = history.rates().clone();
        assert_eq!(rates.window_seconds, 2.0, "the window it has");
        assert_eq!(rates.total, 5.0);
        assert_eq!(
            rates.by_machine[&"10.0.0.1".parse::<IpAddr>().unwrap()],
            3.0
        );
        assert_eq!(
            rates.by_machine[&"10.0.0.2".parse::<IpAddr>().unwrap()],
            2.0
        );
        assert_eq!(history.view().samples[1].grants_per_second, 5.0);

        // Then quiet for the whole window: the burst leaves it.
        for _ in 0..RATE_STEPS {
            tokio::time::advance(HISTORY_INTERVAL).await;
            history.record(
                &totals,
                110,
                &[machine("10.0.0.1", 46), machine("10.0.0.2", 4)],
            );
        }
        let rates = history.rates();
        assert_eq!(rates.window_seconds, RATE_WINDOW.as_secs_f64());
        assert_eq!(rates.total, 0.0);
        assert!(rates.by_machine.is_empty(), "{:?}", rates.by_machine);

        // One machine gets 20 grants in a second: 2 per second over 10 s.
        tokio::time::advance(HISTORY_INTERVAL).await;
        history.record(
            &totals,
            130,
            &[machine("10.0.0.1", 66), machine("10.0.0.2", 4)],
        );
        let rates = history.rates();
        assert_eq!(rates.total, 2.0);
        assert_eq!(rates.by_machine.len(), 1);
        assert_eq!(
            rates.by_machine[&"10.0.0.1".parse::<IpAddr>().unwrap()],
            2.0
        );
    }
}
