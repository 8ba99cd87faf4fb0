//! What the simulator measured: per-RPC counts, latency histograms and errors
//! by kind, plus the cluster's own events (grants used, tasks killed, ...).
//!
//! Everything is lock-free on the success path (relaxed atomics), so thousands
//! of simulated machines can record into one [`Stats`] without contending on a
//! lock; errors, which should be rare, go through a small mutex-protected map.

use std::{
    collections::BTreeMap,
    fmt,
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use yadcc_pb::{Method, Service};

/// The RPCs daemons call: the scheduler's service.
const DAEMON_METHODS: &[Method] = Service::Scheduler.methods();

/// What the simulator calls: the six RPCs, plus the benchmark's bare route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    Rpc(Method),
    /// `POST /bench/bare` (a scheduler built with the `bench-route` feature,
    /// started with `--bench_bare_route`).
    Bare,
}

impl Call {
    /// Every call, in report order.
    pub const ALL: [Call; 7] = [
        Call::Rpc(Method::Heartbeat),
        Call::Rpc(Method::GetConfig),
        Call::Rpc(Method::WaitForStartingTask),
        Call::Rpc(Method::KeepTaskAlive),
        Call::Rpc(Method::FreeTask),
        Call::Rpc(Method::GetRunningTasks),
        Call::Bare,
    ];

    fn index(self) -> usize {
        match self {
            Call::Rpc(rpc) => DAEMON_METHODS
                .iter()
                .position(|candidate| *candidate == rpc)
                .unwrap_or(0),
            Call::Bare => DAEMON_METHODS.len(),
        }
    }

    /// Name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Call::Rpc(rpc) => rpc.name(),
            Call::Bare => "bare",
        }
    }
}

/// Sub-buckets per power of two: values are kept with at most 1/64 (1.6 %)
/// relative error.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// Values (microseconds) up to 2^36 us (19 hours) are kept exactly enough;
/// anything larger lands in the last bucket.
const MAX_EXP: u32 = 36;
const BUCKETS: usize = (2 * SUB + (MAX_EXP as u64 - SUB_BITS as u64 - 1) * SUB) as usize;

/// A log-linear latency histogram in microseconds (HDR-style), safe to record
/// into from many tasks at once.
pub struct Histogram {
    buckets: Box<[AtomicU64]>,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
        }
    }
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .finish_non_exhaustive()
    }
}

fn bucket_of(micros: u64) -> usize {
    if micros < 2 * SUB {
        return micros as usize;
    }
    let exp = 63 - u64::from(micros.leading_zeros()); // >= SUB_BITS + 1
    if exp >= u64::from(MAX_EXP) {
        return BUCKETS - 1;
    }
    let sub = (micros >> (exp - u64::from(SUB_BITS))) & (SUB - 1);
    (2 * SUB + (exp - u64::from(SUB_BITS) - 1) * SUB + sub) as usize
}

/// Highest value that lands in `bucket` (what percentiles report, so they
/// never understate).
fn bucket_high(bucket: usize) -> u64 {
    let bucket = bucket as u64;
    if bucket < 2 * SUB {
        return bucket;
    }
    let exp = (bucket - 2 * SUB) / SUB + u64::from(SUB_BITS) + 1;
    let sub = (bucket - 2 * SUB) % SUB;
    let shift = exp - u64::from(SUB_BITS);
    ((SUB + sub + 1) << shift) - 1
}

impl Histogram {
    pub fn record(&self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(micros)].fetch_add(1, Relaxed);
        self.max.fetch_max(micros, Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|bucket| bucket.load(Relaxed)).sum()
    }

    /// Adds every value of `other` into `self`.
    pub fn merge(&self, other: &Histogram) {
        for (mine, theirs) in self.buckets.iter().zip(other.buckets.iter()) {
            let count = theirs.load(Relaxed);
            if count > 0 {
                mine.fetch_add(count, Relaxed);
            }
        }
        self.max.fetch_max(other.max.load(Relaxed), Relaxed);
    }

    pub fn reset(&self) {
        for bucket in &self.buckets {
            bucket.store(0, Relaxed);
        }
        self.max.store(0, Relaxed);
    }

    /// The value at quantile `q` (0..=1), nearest rank, rounded up to its
    /// bucket's upper edge; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        quantile_of(&self.counts(), q).map(|value| value.min(self.max()))
    }

    /// The bucket counts, for [`quantile_of`] over a difference of two readings.
    pub fn counts(&self) -> Vec<u64> {
        self.buckets.iter().map(|b| b.load(Relaxed)).collect()
    }

    pub fn max(&self) -> Duration {
        Duration::from_micros(self.max.load(Relaxed))
    }
}

/// The value at quantile `q` of bucket counts from [`Histogram::counts`]
/// (possibly the difference of two readings: a time slice).
pub fn quantile_of(counts: &[u64], q: f64) -> Option<Duration> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (bucket, count) in counts.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return Some(Duration::from_micros(bucket_high(bucket)));
        }
    }
    None
}

/// Counters of one call kind.
#[derive(Debug, Default)]
pub struct CallStats {
    /// Successful calls (HTTP 200, decoded); their latency is in `latency`.
    pub ok: AtomicU64,
    /// `STATUS_NO_QUOTA_AVAILABLE` answers: an expected outcome of a long
    /// poll on a busy cluster, counted apart and not as an error.
    pub no_quota: AtomicU64,
    pub latency: Histogram,
    /// Bytes of the successful answers as they came off the wire (frame or
    /// HTTP head, and message, compressed or not).
    pub answer_bytes: AtomicU64,
    /// Bytes of their messages once inflated.
    pub message_bytes: AtomicU64,
    /// Successful answers whose message came compressed.
    pub compressed: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl CallStats {
    pub fn error_count(&self) -> u64 {
        self.errors().values().sum()
    }

    /// Errors by kind (`io`, `timeout`, `rpc_1003_access_denied`, ...).
    pub fn errors(&self) -> BTreeMap<String, u64> {
        self.errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn reset(&self) {
        self.ok.store(0, Relaxed);
        self.no_quota.store(0, Relaxed);
        self.latency.reset();
        self.answer_bytes.store(0, Relaxed);
        self.message_bytes.store(0, Relaxed);
        self.compressed.store(0, Relaxed);
        self.errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// What the simulated machines did, beyond single calls.
#[derive(Debug, Default)]
pub struct Events {
    /// Servants whose first heartbeat succeeded.
    pub servants_registered: AtomicU64,
    /// Grants received from `WaitForStartingTask`.
    pub grants_received: AtomicU64,
    /// Jobs that started on a grant (the grant reached a servant).
    pub tasks_started: AtomicU64,
    /// Jobs that ran to completion and were freed.
    pub tasks_completed: AtomicU64,
    /// Tasks a servant killed because the scheduler listed them in `expired_tasks`.
    pub tasks_killed: AtomicU64,
    /// `KeepTaskAlive` answered `false` for a task still running.
    pub renewals_refused: AtomicU64,
    /// Prefetched grants never used before their (early) expiry, then freed.
    pub spares_expired: AtomicU64,
    /// Jobs not submitted because the delegate already had too many queued.
    pub jobs_shed: AtomicU64,
    /// A grant named a servant this simulator does not run.
    pub unknown_servants: AtomicU64,
    /// Connections opened (at most two per machine on flare and http+pb,
    /// unless some broke).
    pub connections_opened: AtomicU64,
    /// Connections found broken (closed by the server, failed, or given up
    /// after a protocol error) and replaced.
    pub connections_lost: AtomicU64,
    /// The most tasks one `GetRunningTasks` answer listed.
    pub largest_task_list: AtomicU64,
    /// The first [`MAX_KILLS_KEPT`] kills, so a run that should have none
    /// says which grant died, where, and when it had started.
    kills: Mutex<Vec<TaskKill>>,
}

/// A task a servant killed because the scheduler listed its grant as expired.
#[derive(Debug, Clone, Copy)]
pub struct TaskKill {
    pub grant: u64,
    /// The servant (machine index).
    pub servant: usize,
    pub started: tokio::time::Instant,
    pub killed: tokio::time::Instant,
}

/// Kills recorded at most.
const MAX_KILLS_KEPT: usize = 1000;

impl Events {
    fn reset(&self) {
        for counter in self.all() {
            counter.1.store(0, Relaxed);
        }
        self.kills
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Counts kills and keeps the first ones.
    pub(crate) fn record_kills(&self, kills: impl ExactSizeIterator<Item = TaskKill>) {
        self.tasks_killed.fetch_add(kills.len() as u64, Relaxed);
        let mut kept = self.kills.lock().unwrap_or_else(PoisonError::into_inner);
        let room = MAX_KILLS_KEPT.saturating_sub(kept.len());
        kept.extend(kills.take(room));
    }

    /// The kills recorded (the first [`MAX_KILLS_KEPT`]).
    pub fn kills(&self) -> Vec<TaskKill> {
        self.kills
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn all(&self) -> [(&'static str, &AtomicU64); 12] {
        [
            ("servants_registered", &self.servants_registered),
            ("grants_received", &self.grants_received),
            ("tasks_started", &self.tasks_started),
            ("tasks_completed", &self.tasks_completed),
            ("tasks_killed", &self.tasks_killed),
            ("renewals_refused", &self.renewals_refused),
            ("spares_expired", &self.spares_expired),
            ("jobs_shed", &self.jobs_shed),
            ("unknown_servants", &self.unknown_servants),
            ("connections_opened", &self.connections_opened),
            ("connections_lost", &self.connections_lost),
            ("largest_task_list", &self.largest_task_list),
        ]
    }

    /// Events that never happen in a healthy run (a task killed or refused a
    /// renewal while its delegate still ran it, a grant to an unknown servant).
    pub fn anomalies(&self) -> u64 {
        self.tasks_killed.load(Relaxed)
            + self.renewals_refused.load(Relaxed)
            + self.unknown_servants.load(Relaxed)
    }
}

/// A connection that broke with calls still waiting on it.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLoss {
    pub opened: Instant,
    pub lost: Instant,
    /// The calls it failed.
    pub calls: usize,
}

/// Connection losses kept at most: a run that loses more keeps the first.
const MAX_CONNECTION_LOSSES: usize = 100_000;

/// Everything one simulator run measured.
#[derive(Debug)]
pub struct Stats {
    calls: [CallStats; 7],
    pub events: Events,
    since: Mutex<Instant>,
    connection_losses: Mutex<Vec<ConnectionLoss>>,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            calls: Default::default(),
            events: Events::default(),
            since: Mutex::new(Instant::now()),
            connection_losses: Mutex::default(),
        }
    }
}

impl Stats {
    pub fn call(&self, call: Call) -> &CallStats {
        &self.calls[call.index()]
    }

    pub fn record_ok(&self, call: Call, latency: Duration) {
        let stats = self.call(call);
        stats.ok.fetch_add(1, Relaxed);
        stats.latency.record(latency);
    }

    /// Bytes of one successful answer: as it came, and its message inflated.
    pub fn record_bytes(&self, call: Call, answer: usize, message: usize, compressed: bool) {
        let stats = self.call(call);
        stats.answer_bytes.fetch_add(answer as u64, Relaxed);
        stats.message_bytes.fetch_add(message as u64, Relaxed);
        if compressed {
            stats.compressed.fetch_add(1, Relaxed);
        }
    }

    pub fn record_no_quota(&self, call: Call) {
        self.call(call).no_quota.fetch_add(1, Relaxed);
    }

    pub fn record_error(&self, call: Call, kind: &str) {
        let mut errors = self
            .call(call)
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *errors.entry(kind.to_owned()).or_default() += 1;
    }

    /// A connection broke with calls waiting on it: which calls a server
    /// that died took with it, told apart from later failures by time.
    pub fn record_connection_loss(&self, loss: ConnectionLoss) {
        let mut losses = self
            .connection_losses
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if losses.len() < MAX_CONNECTION_LOSSES {
            losses.push(loss);
        }
    }

    pub fn connection_losses(&self) -> Vec<ConnectionLoss> {
        self.connection_losses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Errors over every call kind.
    pub fn total_errors(&self) -> u64 {
        self.calls.iter().map(CallStats::error_count).sum()
    }

    /// Starts the measurement window again (after a warm-up).
    pub fn reset(&self) {
        for call in &self.calls {
            call.reset();
        }
        self.events.reset();
        *self.since.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// Time since creation or the last [`Stats::reset`].
    pub fn elapsed(&self) -> Duration {
        self.since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }

    /// A printable summary of the window so far.
    pub fn report(&self) -> Report {
        let elapsed = self.elapsed();
        let all = Histogram::default();
        let mut rows = Vec::new();
        for call in Call::ALL {
            let stats = self.call(call);
            let ok = stats.ok.load(Relaxed);
            let no_quota = stats.no_quota.load(Relaxed);
            let errors = stats.errors();
            if ok == 0 && no_quota == 0 && errors.is_empty() {
                continue;
            }
            all.merge(&stats.latency);
            let mut row =
                Row::from_histogram(call.name(), ok, no_quota, errors, &stats.latency, elapsed);
            row.set_bytes(
                stats.answer_bytes.load(Relaxed),
                stats.message_bytes.load(Relaxed),
                stats.compressed.load(Relaxed),
                elapsed,
            );
            rows.push(row);
        }
        let mut total = Row::from_histogram(
            "all",
            rows.iter().map(|row| row.ok).sum(),
            rows.iter().map(|row| row.no_quota).sum(),
            rows.iter().flat_map(|row| row.errors.iter()).fold(
                BTreeMap::new(),
                |mut acc, (kind, count)| {
                    *acc.entry(kind.clone()).or_default() += count;
                    acc
                },
            ),
            &all,
            elapsed,
        );
        total.answer_bytes_per_second = rows.iter().map(|row| row.answer_bytes_per_second).sum();
        total.message_bytes_per_second = rows.iter().map(|row| row.message_bytes_per_second).sum();
        total.compressed = rows.iter().map(|row| row.compressed).sum();
        Report {
            elapsed,
            rows,
            total,
            events: self
                .events
                .all()
                .iter()
                .map(|(name, counter)| (*name, counter.load(Relaxed)))
                .collect(),
        }
    }
}

/// One line of a report.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: &'static str,
    pub ok: u64,
    pub no_quota: u64,
    pub errors: BTreeMap<String, u64>,
    pub per_second: f64,
    pub p50: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
    /// Answer bytes received per second, as they came off the wire.
    pub answer_bytes_per_second: f64,
    /// The same answers' messages per second, inflated.
    pub message_bytes_per_second: f64,
    /// Answers that came compressed.
    pub compressed: u64,
}

impl Row {
    pub fn from_histogram(
        name: &'static str,
        ok: u64,
        no_quota: u64,
        errors: BTreeMap<String, u64>,
        latency: &Histogram,
        elapsed: Duration,
    ) -> Row {
        Row {
            name,
            ok,
            no_quota,
            errors,
            per_second: ok as f64 / elapsed.as_secs_f64().max(1e-9),
            p50: latency.quantile(0.50).unwrap_or_default(),
            p99: latency.quantile(0.99).unwrap_or_default(),
            p999: latency.quantile(0.999).unwrap_or_default(),
            max: latency.max(),
            answer_bytes_per_second: 0.0,
            message_bytes_per_second: 0.0,
            compressed: 0,
        }
    }

    /// Sets the byte figures from totals over `elapsed`.
    pub fn set_bytes(&mut self, answer: u64, message: u64, compressed: u64, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64().max(1e-9);
        self.answer_bytes_per_second = answer as f64 / seconds;
        self.message_bytes_per_second = message as f64 / seconds;
        self.compressed = compressed;
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// Formats a latency in milliseconds with three decimals.
pub fn millis(duration: Duration) -> String {
    format!("{:.3}", duration.as_secs_f64() * 1e3)
}

/// A measurement window, ready to print.
#[derive(Debug, Clone)]
pub struct Report {
    pub elapsed: Duration,
    pub rows: Vec<Row>,
    pub total: Row,
    pub events: Vec<(&'static str, u64)>,
}

impl Report {
    pub fn total_errors(&self) -> u64 {
        self.total.error_count()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "window: {:.1} s", self.elapsed.as_secs_f64())?;
        writeln!(
            f,
            "{:<20} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>9}  errors by kind",
            "rpc",
            "ok",
            "ok/s",
            "p50 ms",
            "p99 ms",
            "p999 ms",
            "max ms",
            "no_quota",
            "errors",
            "in MB/s",
            "msg MB/s"
        )?;
        for row in self.rows.iter().chain(std::iter::once(&self.total)) {
            let kinds: Vec<String> = row
                .errors
                .iter()
                .map(|(kind, count)| format!("{kind}={count}"))
                .collect();
            writeln!(
                f,
                "{:<20} {:>10} {:>10.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9.3} {:>9.3}  {}",
                row.name,
                row.ok,
                row.per_second,
                millis(row.p50),
                millis(row.p99),
                millis(row.p999),
                millis(row.max),
                row.no_quota,
                row.error_count(),
                row.answer_bytes_per_second / 1e6,
                row.message_bytes_per_second / 1e6,
                kinds.join(" ")
            )?;
        }
        let events: Vec<String> = self
            .events
            .iter()
            .map(|(name, count)| format!("{name}={count}"))
            .collect();
        writeln!(f, "events: {}", events.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for micros in (0..200_000u64).chain([1 << 30, 1 << 35]) {
            let bucket = bucket_of(micros);
            assert!(bucket >= last, "{micros}");
            last = bucket;
            let high = bucket_high(bucket);
            assert!(high >= micros, "{micros} -> {high}");
            assert!(
                (high - micros) as f64 <= micros as f64 / SUB as f64 + 1.0,
                "{micros} -> {high}"
            );
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_use_nearest_rank() {
        let histogram = Histogram::default();
        for micros in 1..=1000 {
            histogram.record(Duration::from_micros(micros));
        }
        let p50 = histogram.quantile(0.5).unwrap().as_micros() as u64;
        assert!((500..=508).contains(&p50), "{p50}");
        let p999 = histogram.quantile(0.999).unwrap().as_micros() as u64;
        assert!((999..=1000).contains(&p999), "{p999}");
        assert_eq!(histogram.max(), Duration::from_micros(1000));
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    #[test]
    fn errors_are_counted_by_kind_and_reset() {
        let stats = Stats::default();
        stats.record_error(Call::Bare, "io");
        stats.record_error(Call::Bare, "io");
        stats.record_no_quota(Call::Rpc(Method::WaitForStartingTask));
        stats.record_ok(Call::Rpc(Method::Heartbeat), Duration::from_millis(1));
        assert_eq!(stats.total_errors(), 2);
        let report = stats.report();
        assert_eq!(report.total.ok, 1);
        assert_eq!(report.total.no_quota, 1);
        assert_eq!(report.total.errors["io"], 2);
        stats.reset();
        assert_eq!(stats.total_errors(), 0);
    }
}
