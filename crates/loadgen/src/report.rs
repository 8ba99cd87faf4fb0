//! What every mode reports: figures rounded for people, CPU from `/proc`.

use std::time::Duration;

use serde_json::{Value, json};
use yadcc_sim::stats::Row;

use crate::process::ProcessSample;

use crate::Cli;

/// Prints one run's JSON line on stdout, labelled if `--label` was given.
pub(crate) fn emit(cli: &Cli, mut line: Value) {
    if let (Some(label), Value::Object(fields)) = (&cli.label, &mut line) {
        fields.insert("label".into(), json!(label));
    }
    println!("{line}");
}

/// CPU-seconds per second between two samples, and the later sample's memory.
pub(crate) fn cpu_json(
    before: Option<ProcessSample>,
    after: Option<ProcessSample>,
    wall: Duration,
) -> Value {
    let (Some(before), Some(after)) = (before, after) else {
        return Value::Null;
    };
    let used = after.cpu.saturating_sub(before.cpu);
    json!({
        "cpu_seconds_per_second": round3(used.as_secs_f64() / wall.as_secs_f64().max(1e-9)),
        "rss_mib": round3(after.rss_kib as f64 / 1024.0),
        "peak_rss_mib": round3(after.peak_rss_kib as f64 / 1024.0),
    })
}

pub(crate) fn round3(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

pub(crate) fn ms(duration: Duration) -> f64 {
    round3(duration.as_secs_f64() * 1e3)
}

pub(crate) fn row_json(row: &Row) -> Value {
    json!({
        "ok": row.ok,
        "per_second": round3(row.per_second),
        "p50_ms": ms(row.p50),
        "p99_ms": ms(row.p99),
        "p999_ms": ms(row.p999),
        "max_ms": ms(row.max),
        "no_quota": row.no_quota,
        "errors": row.error_count(),
        "error_kinds": row.errors,
        "received_bytes_per_second": row.answer_bytes_per_second.round(),
        "inflated_bytes_per_second": row.message_bytes_per_second.round(),
        "compressed_answers": row.compressed,
    })
}
