//! The per-tenant series, read from the engine at scrape time. The
//! `tenant` label's values are the tenants file's names (and those of
//! tenants a reload removed while they still wait or hold), never anything
//! a client sends, so the series are bounded by the file.

use std::fmt;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

use crate::engine::{Scheduler, TenantView, WAIT_BUCKETS};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

/// Reads every tenant's figures at scrape time.
#[derive(Debug)]
pub(super) struct TenantCollector {
    pub(super) engine: Scheduler,
}

/// A gauge family: its name, help and value per tenant.
type Gauge = (&'static str, &'static str, fn(&TenantView) -> f64);

fn labels(t: &TenantView) -> TenantLabels {
    TenantLabels {
        tenant: t.name.clone(),
    }
}

impl Collector for TenantCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let tenants = self.engine.tenants();
        let mut family = encoder.encode_descriptor(
            "tenant_grants",
            "Grants made to each tenant since start",
            None,
            MetricType::Counter,
        )?;
        for t in &tenants {
            ConstCounter::new(t.grants_total).encode(family.encode_family(&labels(t))?)?;
        }
        let gauges: [Gauge; 4] = [
            (
                "tenant_waiting",
                "WaitForStartingTask calls of each tenant queued now",
                |t| t.waiting as f64,
            ),
            (
                "tenant_slots_held",
                "Grants each tenant holds now (zombies included)",
                |t| t.held as f64,
            ),
            (
                "tenant_weight",
                "Each tenant's weight in the tenants file",
                |t| t.weight,
            ),
            (
                "tenant_max_share",
                "Each tenant's max_share (1 when it has none)",
                |t| t.max_share.unwrap_or(1.0),
            ),
        ];
        for (name, help, value) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for t in &tenants {
                ConstGauge::new(value(t)).encode(family.encode_family(&labels(t))?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "tenant_wait_seconds",
            "How long each tenant's granted WaitForStartingTask calls waited for their first grant",
            None,
            MetricType::Histogram,
        )?;
        for t in &tenants {
            let buckets: Vec<(f64, u64)> = WAIT_BUCKETS
                .iter()
                .copied()
                // The encoder writes `+Inf` for f64::MAX, never for infinity.
                .chain([f64::MAX])
                .zip(t.wait_buckets.iter().copied())
                .collect();
            let count = t.wait_buckets.iter().sum();
            family
                .encode_family(&labels(t))?
                .encode_histogram::<TenantLabels>(
                    t.wait_sum.as_secs_f64(),
                    count,
                    &buckets,
                    None,
                )?;
        }
        Ok(())
    }
}
