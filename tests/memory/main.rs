//! Memory bounded whatever a client does (issue 22): each test is one attack
//! from the table against the real binary holding 40,960 running
//! tasks (a 3.5 MB `GetRunningTasks` answer), over loopback. During the
//! attack the scheduler's peak resident set (`VmHWM`) must stay at most
//! [`PEAK_RSS_LIMIT_MIB`], and a legitimate daemon on another address must
//! be answered within [`LEGITIMATE_LATENCY_LIMIT`] every time.
//!
//! A test binary of its own: each attack takes seconds of both cores, so the
//! tests run one at a time (each takes [`support::heavy`]) and apart from
//! the `it` suite. `YADCC_SCHEDULER_BINARY` runs them against another build (an
//! older one, to see them fail); `YADCC_MEMORY_ATTACK_SECONDS` and
//! `YADCC_MEMORY_STOP_MIB` lengthen an attack and let it run past the limit,
//! for the figures in BENCHMARKS.md (`scripts/bench_memory.sh`).

use yadcc_testkit as support;

mod attacks;
mod budgets;
mod cluster;
mod legitimate;
mod strangers;

use std::time::{Duration, Instant};

use self::{
    attacks::Attack,
    cluster::{scheduler_with_running_tasks, usage},
    legitimate::Legitimate,
    support::{STEP, heavy},
};

/// The most the scheduler may ever hold resident during an attack.
const PEAK_RSS_LIMIT_MIB: u64 = 256;
/// The longest a legitimate daemon may wait for an answer during an attack.
const LEGITIMATE_LATENCY_LIMIT: Duration = Duration::from_secs(1);
/// How long each attack lasts by default; the answers the attackers leave
/// unread pile up (or not) within the first seconds.
const ATTACK_SECONDS: u64 = 10;
/// The legitimate daemon's pace: a heartbeat every so often.
const LEGITIMATE_PERIOD: Duration = Duration::from_millis(100);
/// Half the legitimate daemon's pace: a call answered at least every
/// 200 ms on average.
const LEGITIMATE_CALLS_PER_SECOND: f64 = 5.0;
/// How often the peak RSS is read.
const SAMPLE_PERIOD: Duration = Duration::from_millis(50);

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// Runs `attack` against a fresh scheduler while `legitimate` calls it from
/// another address; asserts the peak RSS and the legitimate latencies.
async fn withstand(attack: Attack, legitimate: Legitimate) {
    withstand_within(
        attack,
        legitimate,
        PEAK_RSS_LIMIT_MIB,
        LEGITIMATE_LATENCY_LIMIT,
        LEGITIMATE_CALLS_PER_SECOND,
    )
    .await;
}

/// [`withstand`] with a peak RSS limit of `peak_rss_limit_mib`, a longest
/// legitimate call of `latency_limit` and at least `min_calls_per_second`
/// legitimate calls answered on average.
async fn withstand_within(
    attack: Attack,
    legitimate: Legitimate,
    peak_rss_limit_mib: u64,
    latency_limit: Duration,
    min_calls_per_second: f64,
) {
    // One attack at a time: each needs the machine's cores and memory to
    // itself for its figures to mean anything.
    let _alone = heavy().await;
    let (tls_dir, flags) = attack.server_flags();
    let binary = scheduler_with_running_tasks(flags).await;
    let length = Duration::from_secs(env_number("YADCC_MEMORY_ATTACK_SECONDS", ATTACK_SECONDS));
    let stop_kib =
        env_number("YADCC_MEMORY_STOP_MIB", peak_rss_limit_mib).max(peak_rss_limit_mib) * 1024;
    let mut client = legitimate.connect(binary.addr).await;
    let attacking = attack.start(binary.addr);
    let started = Instant::now();
    let pid = binary.child.id();
    let cpu_before = usage(pid).0;
    // Sampled on its own, so a legitimate call that hangs does not hide the
    // peak: the attack ends at `length`, or once the peak passes `stop_kib`.
    let mut sampling = tokio::spawn(async move {
        let mut peak_kib = 0;
        while started.elapsed() < length && peak_kib <= stop_kib {
            peak_kib = usage(pid).1;
            tokio::time::sleep(SAMPLE_PERIOD).await;
        }
        peak_kib
    });
    let mut latencies = Vec::new();
    let mut failure = None;
    let peak_kib = loop {
        if failure.is_some() {
            break (&mut sampling).await.expect("sampling");
        }
        let sent = Instant::now();
        tokio::select! {
            // The attack is over (or past the limit) while a call waits.
            peak = &mut sampling => {
                let waited = sent.elapsed();
                if waited > latency_limit {
                    latencies.push(waited);
                    failure = Some(format!(
                        "a call unanswered for {} ms when the attack ended",
                        waited.as_millis()
                    ));
                }
                break peak.expect("sampling");
            }
            answered = tokio::time::timeout(STEP, client.call()) => match answered {
                Ok(Ok(())) => latencies.push(sent.elapsed()),
                Ok(Err(error)) => failure = Some(error),
                Err(_) => {
                    latencies.push(STEP);
                    failure = Some(format!("no answer within {STEP:?}"));
                }
            },
        }
        tokio::time::sleep(LEGITIMATE_PERIOD.saturating_sub(sent.elapsed())).await;
    };
    let (cpu_after, peak_after) = usage(pid);
    let peak_kib = peak_kib.max(peak_after);
    let cpu = cpu_after.saturating_sub(cpu_before);
    attacking.stop();
    if let Some(dir) = tls_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    let worst = latencies.iter().max().copied().unwrap_or_default();
    println!(
        "memory: {}: peak RSS {} MiB in {:.1} s ({:.1} CPU-s); {} {}, worst {} ms{}",
        attack.label(),
        peak_kib / 1024,
        started.elapsed().as_secs_f64(),
        cpu.as_secs_f64(),
        latencies.len(),
        legitimate.label(),
        worst.as_millis(),
        failure
            .as_ref()
            .map(|error| format!(", then failed: {error}"))
            .unwrap_or_default()
    );
    assert!(
        peak_kib <= peak_rss_limit_mib * 1024,
        "{}: peak RSS {} MiB, over the {peak_rss_limit_mib} MiB limit",
        attack.label(),
        peak_kib / 1024
    );
    assert_eq!(failure, None, "{}: the legitimate client", attack.label());
    assert!(
        worst <= latency_limit,
        "{}: a legitimate call took {} ms",
        attack.label(),
        worst.as_millis()
    );
    assert!(
        latencies.len() as f64 >= length.as_secs_f64() * min_calls_per_second,
        "{}: only {} legitimate calls in {length:?}",
        attack.label(),
        latencies.len()
    );
}

#[tokio::test]
async fn flare_connections_that_never_read_their_answers() {
    withstand(Attack::FlareUnread, Legitimate::Flare).await;
}

#[tokio::test]
async fn http_pb_connections_that_pipeline_and_never_read() {
    withstand(Attack::HttpPbUnread, Legitimate::HttpPb).await;
}

#[tokio::test]
async fn http2_streams_with_a_zero_window() {
    withstand(Attack::Http2ZeroWindow, Legitimate::Grpc).await;
}

#[tokio::test]
async fn http2_streams_with_small_stalled_bodies() {
    withstand(Attack::Http2StalledBodies, Legitimate::Grpc).await;
}

#[tokio::test]
async fn strangers_stalled_bodies_leave_the_budget_to_servants_that_proved_a_token() {
    withstand(Attack::Http2StalledBodies, Legitimate::LargeFlare).await;
}

#[tokio::test]
async fn huge_keep_alives_from_twenty_connections_hold_the_engine_a_slice_at_a_time() {
    withstand(Attack::HugeKeepAlives, Legitimate::Flare).await;
}

/// Issue 45's goal for connections that never make a request.
const CONNECTIONS_RSS_LIMIT_MIB: u64 = 512;
/// 19,000 connections churn through the accept loop on two shared cores:
/// the legitimate calls must all be answered, within this.
const CONNECTIONS_LATENCY_LIMIT: Duration = Duration::from_secs(5);
/// And at least one a second on average: each reopened partial head or
/// handshake brings 64 KB more to read over loopback on the same two cores,
/// so the daemon's calls slow down (measured with heads: 38 in 10.9 s, the
/// worst 4.7 s), but never stop or fail.
const CONNECTIONS_CALLS_PER_SECOND: f64 = 1.0;

#[tokio::test]
async fn connections_holding_h2c_prefaces_stay_within_the_connection_buffers() {
    withstand_within(
        Attack::H2Prefaces,
        Legitimate::Grpc,
        CONNECTIONS_RSS_LIMIT_MIB,
        CONNECTIONS_LATENCY_LIMIT,
        CONNECTIONS_CALLS_PER_SECOND,
    )
    .await;
}

/// A benchmark rather than a check: each reopened head brings 64 KB more
/// over loopback, so on two shared cores the daemon's worst call is 2.8 to
/// 4.7 s, too near the limit for every CI run (BENCHMARKS.md runs it).
#[tokio::test]
#[ignore = "a benchmark: run with --ignored (BENCHMARKS.md, the edge's budgets)"]
async fn connections_holding_partial_heads_stay_within_the_connection_buffers() {
    withstand_within(
        Attack::PartialHeads,
        Legitimate::Grpc,
        CONNECTIONS_RSS_LIMIT_MIB,
        CONNECTIONS_LATENCY_LIMIT,
        CONNECTIONS_CALLS_PER_SECOND,
    )
    .await;
}

#[tokio::test]
async fn connections_holding_partial_tls_handshakes_stay_within_the_connection_buffers() {
    withstand_within(
        Attack::PartialTlsHellos,
        Legitimate::Grpc,
        CONNECTIONS_RSS_LIMIT_MIB,
        CONNECTIONS_LATENCY_LIMIT,
        CONNECTIONS_CALLS_PER_SECOND,
    )
    .await;
}
