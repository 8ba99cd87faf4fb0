//! The standard `process_*` series (CPU, memory, file descriptors, threads,
//! start time), read at scrape time by the `metrics-process` crate's
//! collector, which follows the Prometheus Go client's definitions; written
//! here under their standard names, without the scheduler's prefix, so stock
//! dashboards and alerts find them.

use std::fmt;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
};

/// Registered on the root registry (no prefix).
#[derive(Debug, Default)]
pub(super) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let process = metrics_process::collector::collect();
        if let Some(seconds) = process.cpu_seconds_total {
            ConstCounter::new(seconds).encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                MetricType::Counter,
            )?)?;
        }
        let gauges = [
            (
                "process_open_fds",
                "Number of open file descriptors.",
                process.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                process.max_fds,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                process.virtual_memory_bytes,
            ),
            (
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
                process.virtual_memory_max_bytes,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                process.resident_memory_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                process.start_time_seconds,
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                process.threads,
            ),
        ];
        for (name, help, value) in gauges {
            let Some(value) = value else { continue };
            let gauge: ConstGauge<i64> = ConstGauge::new(value.try_into().unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        Ok(())
    }
}
