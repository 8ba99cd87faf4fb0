//! The Tenants view (`/api/v1/tenants`): each tenant's share of the farm
//! now against its weight, its waiting calls, grants per second over the
//! last [`RATE_WINDOW`] and its wait percentiles, from the engine's figures
//! and the sampler's grant counts.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

use axum::extract::State;

use super::JsonAnswer;
use serde::Serialize;
use tokio::time::Instant;
use utoipa::ToSchema;

use super::{Dashboard, access::Refusals, history::RATE_WINDOW};
use crate::engine::{TenantView, WAIT_BUCKETS};

/// The tenants, configured ones first, and the farm's slots.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantsView {
    /// Task slots of the farm now, held and free.
    pub slots: u64,
    /// Seconds the grant rates are measured over.
    pub rate_window_seconds: f64,
    pub tenants: Vec<TenantRow>,
}

/// One tenant as the Tenants tab shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantRow {
    pub name: String,
    /// False for a tenant the last reload removed that still waits or holds.
    pub configured: bool,
    pub weight: f64,
    /// Its weight over the configured tenants' sum: its share when all wait.
    pub weight_share: f64,
    /// At most this share of the slots while another tenant waits.
    pub max_share: Option<f64>,
    /// Its share of the slots now (held over slots).
    pub share: f64,
    pub held: u64,
    pub waiting: u64,
    pub grants_total: u64,
    pub grants_per_second: f64,
    /// Median wait of its granted calls since start (bucket-interpolated).
    pub wait_p50_seconds: Option<f64>,
    pub wait_p95_seconds: Option<f64>,
}

/// The sampler's grant counts per tenant over the rate window.
#[derive(Debug, Default)]
pub(super) struct TenantRates {
    samples: VecDeque<(Instant, HashMap<String, u64>)>,
}

impl TenantRates {
    /// Records the grant counts now, keeping the window's worth.
    pub(super) fn record(&mut self, now: Instant, tenants: &[TenantView]) {
        let counts = tenants
            .iter()
            .map(|t| (t.name.clone(), t.grants_total))
            .collect();
        self.samples.push_back((now, counts));
        while self
            .samples
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > RATE_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Grants per second of `name` between the oldest and newest sample.
    fn rate(&self, name: &str) -> f64 {
        let (Some((first, old)), Some((last, new))) = (self.samples.front(), self.samples.back())
        else {
            return 0.0;
        };
        let seconds = last.saturating_duration_since(*first).as_secs_f64();
        if seconds <= 0.0 {
            return 0.0;
        }
        let grants = new
            .get(name)
            .copied()
            .unwrap_or(0)
            .saturating_sub(old.get(name).copied().unwrap_or(0));
        grants as f64 / seconds
    }
}

/// The `q` quantile of a wait histogram, interpolated inside its bucket;
/// None before any wait.
pub(super) fn quantile(buckets: &[u64], q: f64) -> Option<f64> {
    let count: u64 = buckets.iter().sum();
    if count == 0 {
        return None;
    }
    let rank = q * count as f64;
    let mut below = 0u64;
    for (i, &n) in buckets.iter().enumerate() {
        if n > 0 && (below + n) as f64 >= rank {
            let low = if i == 0 { 0.0 } else { WAIT_BUCKETS[i - 1] };
            let high = WAIT_BUCKETS.get(i).copied().unwrap_or(low);
            let within = ((rank - below as f64) / n as f64).clamp(0.0, 1.0);
            return Some(low + (high - low) * within);
        }
        below += n;
    }
    WAIT_BUCKETS.last().copied()
}

impl Dashboard {
    /// The Tenants view now.
    pub fn tenants_view(&self) -> TenantsView {
        let tenants = self.engine.tenants();
        let slots = tenants.first().map_or(0, |t| t.slots);
        let rates = self.tenant_rates.lock().unwrap_or_else(|p| p.into_inner());
        TenantsView {
            slots,
            rate_window_seconds: RATE_WINDOW.as_secs_f64(),
            tenants: tenants
                .iter()
                .map(|t| TenantRow {
                    name: t.name.clone(),
                    configured: t.configured,
                    weight: t.weight,
                    weight_share: t.weight_share,
                    max_share: t.max_share,
                    share: if slots == 0 {
                        0.0
                    } else {
                        t.held as f64 / slots as f64
                    },
                    held: t.held,
                    waiting: t.waiting,
                    grants_total: t.grants_total,
                    grants_per_second: rates.rate(&t.name),
                    wait_p50_seconds: quantile(&t.wait_buckets, 0.5),
                    wait_p95_seconds: quantile(&t.wait_buckets, 0.95),
                })
                .collect(),
        }
    }
}

/// The tenants sharing the farm.
///
/// Each tenant of `--tenants_file` (or the one tenant `default` the token
/// flags form): weight and cap, its share of the slots now, waiting calls,
/// grants per second and wait percentiles.
#[utoipa::path(get, path = "/api/v1/tenants", tag = "dashboard",
    responses((status = 200, description = "The tenants, configured ones first", body = TenantsView),
              Refusals))]
pub(super) async fn tenants(State(dashboard): State<Arc<Dashboard>>) -> JsonAnswer<TenantsView> {
    JsonAnswer(dashboard.tenants_view())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        let mut buckets = vec![0u64; WAIT_BUCKETS.len() + 1];
        assert_eq!(quantile(&buckets, 0.5), None);
        buckets[0] = 10; // <= 5 ms
        assert_eq!(quantile(&buckets, 0.5), Some(0.0025));
        buckets[7] = 10; // (0.5 s, 1 s]
        assert_eq!(quantile(&buckets, 0.5), Some(0.005));
        let p95 = quantile(&buckets, 0.95).unwrap();
        assert!((p95 - 0.95).abs() < 1e-9, "{p95}");
        buckets[WAIT_BUCKETS.len()] = 100; // above 10 s
        assert_eq!(quantile(&buckets, 0.99), Some(10.0));
    }
}
