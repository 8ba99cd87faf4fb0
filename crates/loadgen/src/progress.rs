//! What a cluster run says while it runs: the calls so far when it cannot
//! begin (no report is printed then), and one line per time slice of the
//! measured window.

use std::{
    sync::atomic::Ordering::Relaxed,
    time::{Duration, Instant},
};

use yadcc_sim::{
    Stats,
    stats::{Call, millis, quantile_of},
};

/// The calls so far, one line: answered and failed by kind per call.
pub(crate) fn calls_so_far(stats: &Stats) -> String {
    let mut parts = Vec::new();
    for call in Call::ALL {
        let counters = stats.call(call);
        let ok = counters.ok.load(Relaxed) + counters.no_quota.load(Relaxed);
        let errors = counters.errors();
        if ok == 0 && errors.is_empty() {
            continue;
        }
        let failed: Vec<String> = errors
            .iter()
            .map(|(kind, count)| format!("{kind} {count}"))
            .collect();
        parts.push(format!(
            "{}: {ok} answered, failed: [{}]",
            call.name(),
            failed.join(", ")
        ));
    }
    if parts.is_empty() {
        "no call answered or failed".to_owned()
    } else {
        parts.join("; ")
    }
}

/// Every call's latency bucket counts added up and the successful calls, at
/// one instant: two readings give one time slice.
struct Reading {
    counts: Vec<u64>,
    ok: u64,
    at: Instant,
}

impl Reading {
    fn now(stats: &Stats) -> Reading {
        let mut counts: Vec<u64> = Vec::new();
        let mut ok = 0;
        for call in Call::ALL {
            let counters = stats.call(call);
            ok += counters.ok.load(Relaxed);
            let latency = counters.latency.counts();
            counts.resize(latency.len().max(counts.len()), 0);
            for (total, count) in counts.iter_mut().zip(latency) {
                *total += count;
            }
        }
        Reading {
            counts,
            ok,
            at: Instant::now(),
        }
    }
}

/// Sleeps until `window` after `started`, printing a line for each slice of
/// `every` (none if zero): that slice's rate and latency, not the whole
/// window's so far.
pub(crate) async fn watch_window(
    stats: &Stats,
    started: Instant,
    window: Duration,
    every: Duration,
    running_tasks: impl Fn() -> usize,
) {
    let mut last = Reading::now(stats);
    while started.elapsed() < window {
        let left = window.saturating_sub(started.elapsed());
        let nap = if every.is_zero() {
            left
        } else {
            left.min(every)
        };
        tokio::time::sleep(nap).await;
        if !every.is_zero() && started.elapsed() < window {
            let now = Reading::now(stats);
            let slice: Vec<u64> = now
                .counts
                .iter()
                .zip(&last.counts)
                .map(|(a, b)| a - b)
                .collect();
            let calls = now.ok - last.ok;
            let seconds = (now.at - last.at).as_secs_f64();
            eprintln!(
                "  {:>5.1} s: {:>8.0} calls/s, p50 {} ms, p99 {} ms, max <= {} ms; errors so far {}, tasks running {}",
                started.elapsed().as_secs_f64(),
                calls as f64 / seconds.max(1e-9),
                millis(quantile_of(&slice, 0.5).unwrap_or_default()),
                millis(quantile_of(&slice, 0.99).unwrap_or_default()),
                millis(quantile_of(&slice, 1.0).unwrap_or_default()),
                stats.total_errors(),
                running_tasks()
            );
            last = now;
        }
    }
}
