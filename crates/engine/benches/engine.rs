//! Engine benchmarks: cost per call must stay flat as the cluster grows, and
//! waiting must be fair.
//!
//! - `heartbeat/N`: a servant with 5 environments and 16 running tasks (its
//!   live grants) heartbeats; its load alternates so every heartbeat moves it
//!   in the placement indexes.
//! - `grant_free/N`: one immediate grant, then the free of the oldest of 64
//!   grants in flight (so grant and free move different servants).
//!
//! at N = 10, 1,000 and 10,000 servants (10 live grants per servant, so
//! 100,000 at the largest size, plus the 64 in flight). After criterion, a plain timed loop measures
//! the mean ns/op per size and prints `RATIO` lines against the 2.0 limit.
//!
//! - `fairness`: 100 requesting machines, with 1 to 50 waiting calls each,
//!   compete for 10 slots on a paused-time runtime; prints `RATIO fairness
//!   max/min grants per machine` against 1.2 (fair shares are per machine,
//!   not per call).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{BatchSize, BenchmarkId, Criterion};
use tokio::runtime::Runtime;
use yadcc_engine::{
    Config, Grant, GrantRequest, Heartbeat, Limits, ReportedTask, Scheduler, ServantPriority,
    TokenSet,
};

const USER: &str = "bench-user-token";
const SERVANT: &str = "bench-servant-token";
const SIZES: [usize; 3] = [10, 1_000, 10_000];
const GRANTS_PER_SERVANT: usize = 10;
const DAY: Duration = Duration::from_secs(86_400);

fn config() -> Config {
    Config {
        user_tokens: TokenSet::new([USER]),
        servant_tokens: TokenSet::new([SERVANT]),
        adoption_window: Duration::ZERO,
        // Real time passes during the bench: keep everything alive.
        limits: Limits {
            max_next_heartbeat: DAY,
            max_keep_alive: DAY,
            ..Limits::default()
        },
        ..Config::default()
    }
}

fn environments() -> Vec<String> {
    (0..5)
        .map(|i| format!("{i:02}{}", "c0ffee".repeat(10) + "ab"))
        .collect()
}

fn servant_addr(i: usize) -> SocketAddr {
    let ip = Ipv4Addr::new(127, 1 + (i >> 16) as u8, (i >> 8) as u8, i as u8);
    SocketAddr::new(IpAddr::V4(ip), 8335)
}

fn heartbeat(i: usize, load: u32, tasks: Vec<ReportedTask>) -> Heartbeat {
    let location = servant_addr(i);
    Heartbeat {
        token: SERVANT.into(),
        observed_ip: location.ip(),
        location: location.to_string(),
        next_heartbeat_in: DAY,
        version: 10,
        num_processors: 40,
        current_load: load,
        priority: ServantPriority::User,
        not_accepting_reason: None,
        capacity: 32,
        total_memory: 128 << 30,
        memory_available: 64 << 30,
        environments: environments(),
        running_tasks: tasks,
    }
}

/// The machine the benchmarked grants go to (and are freed by).
const REQUESTER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 255, 255, 254));

fn grant_request(immediate: u32) -> GrantRequest {
    GrantRequest {
        token: USER.into(),
        requester_ip: REQUESTER,
        connection: None,
        wait: Duration::ZERO,
        answer_within: None,
        environment: environments()[2].clone(),
        immediate,
        prefetch: 0,
        lease: DAY,
        min_version: 0,
    }
}

/// Polls a future that must complete without waiting (the immediate path).
fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the benchmarked call had to wait"),
    }
}

fn grant(s: &Scheduler, immediate: u32) -> Vec<Grant> {
    now_or_never(s.wait_for_starting_task(grant_request(immediate))).expect("capacity")
}

/// Grants in flight between their grant and their free in `grant_free`.
const IN_FLIGHT: usize = 64;

/// One grant, then the free of the oldest grant in flight (so the free hits
/// another servant than the grant and both move servants in the indexes);
/// the request is built by the caller.
fn grant_free(c: &Cluster, req: GrantRequest) {
    let g = now_or_never(c.sched.wait_for_starting_task(req)).expect("capacity");
    let mut ring = c.in_flight.borrow_mut();
    ring.push_back(g[0].id);
    let oldest = ring.pop_front().expect("never empty");
    c.sched.free(USER, REQUESTER, &[oldest]).unwrap();
}

/// A cluster of `n` servants with `GRANTS_PER_SERVANT * n` live grants.
/// Servant 0 is the benchmarked one and holds 16 of them.
struct Cluster {
    n: usize,
    sched: Scheduler,
    beats: [Heartbeat; 2],
    req: GrantRequest,
    in_flight: RefCell<VecDeque<u64>>,
}

fn build(rt: &Runtime, n: usize) -> Cluster {
    let _enter = rt.enter();
    let sched = Scheduler::new(config());
    sched.heartbeat(heartbeat(0, 0, Vec::new())).unwrap();
    let own = grant(&sched, 16);
    let tasks: Vec<ReportedTask> = own
        .iter()
        .enumerate()
        .map(|(k, g)| ReportedTask {
            servant_task_id: k as u64 + 1,
            grant_id: g.id,
            task_digest: format!("{:064x}", g.id),
        })
        .collect();
    for i in 1..n {
        sched.heartbeat(heartbeat(i, 0, Vec::new())).unwrap();
    }
    let mut left = GRANTS_PER_SERVANT * n - own.len();
    while left > 0 {
        let chunk = left.min(1000);
        assert_eq!(grant(&sched, chunk as u32).len(), chunk);
        left -= chunk;
    }
    // Load 16: all 32 slots available; load 30: 14 foreign, 26 available.
    let beats = [heartbeat(0, 16, tasks.clone()), heartbeat(0, 30, tasks)];
    for b in &beats {
        let reply = sched.heartbeat(b.clone()).unwrap();
        assert!(reply.expired_grant_ids.is_empty());
    }
    let in_flight = grant(&sched, IN_FLIGHT as u32)
        .iter()
        .map(|g| g.id)
        .collect();
    let snap = sched.snapshot();
    assert_eq!(snap.totals.grants, GRANTS_PER_SERVANT * n + IN_FLIGHT);
    assert_eq!(snap.servants[0].running, 16);
    Cluster {
        n,
        sched,
        beats,
        req: grant_request(1),
        in_flight: RefCell::new(in_flight),
    }
}

/// Requests are built in small batches outside the timed region, so they
/// stay in cache and only the engine calls are timed.
const BATCH: usize = 1_000;

/// Mean ns per heartbeat over `iters` calls (request building excluded).
fn time_heartbeats(c: &Cluster, iters: usize) -> f64 {
    let mut total = Duration::ZERO;
    for round in 0..iters.div_ceil(BATCH) {
        let batch: Vec<Heartbeat> = (0..BATCH)
            .map(|k| c.beats[(round * BATCH + k) % 2].clone())
            .collect();
        let start = Instant::now();
        for b in batch {
            black_box(c.sched.heartbeat(b).unwrap());
        }
        total += start.elapsed();
    }
    total.as_nanos() as f64 / (iters.div_ceil(BATCH) * BATCH) as f64
}

/// Mean ns per grant+free cycle over `iters` cycles (request building excluded).
fn time_grant_free(c: &Cluster, iters: usize) -> f64 {
    let mut total = Duration::ZERO;
    for _ in 0..iters.div_ceil(BATCH) {
        let batch: Vec<GrantRequest> = (0..BATCH).map(|_| c.req.clone()).collect();
        let start = Instant::now();
        for req in batch {
            grant_free(c, req);
        }
        total += start.elapsed();
    }
    total.as_nanos() as f64 / (iters.div_ceil(BATCH) * BATCH) as f64
}

fn bench_scaling(c: &mut Criterion, clusters: &[Cluster]) {
    let mut group = c.benchmark_group("heartbeat");
    for cl in clusters {
        let flip = AtomicU64::new(0);
        group.bench_with_input(BenchmarkId::from_parameter(cl.n), cl, |b, cl| {
            b.iter_batched(
                || cl.beats[(flip.fetch_add(1, Ordering::Relaxed) % 2) as usize].clone(),
                |hb| cl.sched.heartbeat(hb).unwrap(),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();

    let mut group = c.benchmark_group("grant_free");
    for cl in clusters {
        group.bench_with_input(BenchmarkId::from_parameter(cl.n), cl, |b, cl| {
            b.iter_batched(
                || cl.req.clone(),
                |req| grant_free(cl, req),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

/// The plain timed loop behind the RATIO lines. The machine is shared, so
/// sizes are measured interleaved, round after round, and each size's figure
/// is the lowest of its per-round means (the median is printed too).
fn print_ratios(clusters: &[Cluster]) -> bool {
    const LIMIT: f64 = 2.0;
    const ROUNDS: usize = 9;
    const ITERS: usize = 20_000;
    for cl in clusters {
        time_heartbeats(cl, ITERS);
        time_grant_free(cl, ITERS);
    }
    let mut hb = vec![Vec::new(); clusters.len()];
    let mut gf = vec![Vec::new(); clusters.len()];
    for _ in 0..ROUNDS {
        for (i, cl) in clusters.iter().enumerate() {
            hb[i].push(time_heartbeats(cl, ITERS));
            gf[i].push(time_grant_free(cl, ITERS));
        }
    }
    let summary = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[0], v[v.len() / 2])
    };
    println!(
        "TIMED LOOP: {ROUNDS} interleaved rounds x {ITERS} calls per size; figure = lowest round mean"
    );
    let hb: Vec<(f64, f64)> = hb.iter_mut().map(summary).collect();
    let gf: Vec<(f64, f64)> = gf.iter_mut().map(summary).collect();
    for (i, cl) in clusters.iter().enumerate() {
        println!(
            "MEAN servants={:>6} grants={:>6} heartbeat={:>6.0} ns/op (median {:>6.0}) grant_free={:>6.0} ns/op (median {:>6.0})",
            cl.n,
            cl.n * GRANTS_PER_SERVANT,
            hb[i].0,
            hb[i].1,
            gf[i].0,
            gf[i].1
        );
    }
    let mut ok = true;
    let last = clusters.len() - 1;
    for (name, v) in [("heartbeat", &hb), ("grant_free", &gf)] {
        let ratio = v[last].0 / v[0].0;
        let pass = ratio <= LIMIT;
        ok &= pass;
        println!(
            "RATIO {name} {}/{} = {ratio:.2} (limit {LIMIT:.1}) {}",
            clusters[last].n,
            clusters[0].n,
            if pass { "PASS" } else { "FAIL" }
        );
        println!(
            "RATIO {name} {}/{} = {:.2} (info; medians {:.2})",
            clusters[1].n,
            clusters[0].n,
            v[1].0 / v[0].0,
            v[last].1 / v[0].1,
        );
    }
    ok
}

/// Requesting machines in the fairness run, and the calls machine `m` keeps
/// waiting: 1 to 50, so a build with 50 long polls meets a colleague's one.
const MACHINES: usize = 100;
fn waiters_of(machine: usize) -> usize {
    1 + machine % 50
}

/// 100 machines (1 to 50 waiting calls each), 10 slots, paused time: each
/// call loops wait -> hold -> free. Returns grants per machine.
fn fairness_run(total_grants: u64) -> Vec<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let sched = Scheduler::new(config());
        let mut beat = heartbeat(0, 0, Vec::new());
        beat.capacity = 10;
        beat.num_processors = 10;
        sched.heartbeat(beat).unwrap();
        let issued = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for m in 0..MACHINES {
            let machine = IpAddr::V4(Ipv4Addr::new(10, 1, 0, m as u8));
            for w in 0..waiters_of(m) {
                let sched = sched.clone();
                let issued = issued.clone();
                tasks.push((
                    m,
                    tokio::spawn(async move {
                        let mut mine = 0u64;
                        // Every call draws its hold times (1..=20 ms) from the
                        // same distribution, with its own seed: differences in
                        // the grants machines get are the scheduler's doing.
                        let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ ((m * 64 + w) as u64 + 1);
                        let req = GrantRequest {
                            wait: Duration::from_secs(10),
                            answer_within: None,
                            requester_ip: machine,
                            ..grant_request(1)
                        };
                        while issued.load(Ordering::Relaxed) < total_grants {
                            match sched.wait_for_starting_task(req.clone()).await {
                                Ok(grants) => {
                                    // Only grants made while the contest runs
                                    // count: once `total_grants` is reached every
                                    // call still queued is served once more, which
                                    // says nothing about fairness.
                                    let n = grants.len() as u64;
                                    if issued.fetch_add(n, Ordering::Relaxed) < total_grants {
                                        mine += n;
                                    }
                                    seed ^= seed << 13;
                                    seed ^= seed >> 7;
                                    seed ^= seed << 17;
                                    let hold = Duration::from_millis(1 + seed % 20);
                                    tokio::time::sleep(hold).await;
                                    let ids: Vec<u64> = grants.iter().map(|g| g.id).collect();
                                    sched.free(USER, machine, &ids).unwrap();
                                }
                                Err(_) => tokio::task::yield_now().await,
                            }
                        }
                        mine
                    }),
                ));
            }
        }
        let mut counts = vec![0u64; MACHINES];
        for (m, t) in tasks {
            counts[m] += t.await.unwrap();
        }
        counts
    })
}

fn bench_fairness(c: &mut Criterion, ratios_only: bool) -> bool {
    const LIMIT: f64 = 1.2;
    if !ratios_only {
        let mut group = c.benchmark_group("fairness");
        group.sample_size(10);
        group.bench_function("100_machines_1_to_50_calls_10_slots_2000_grants", |b| {
            b.iter(|| black_box(fairness_run(2_000)))
        });
        group.finish();
    }

    let counts = fairness_run(20_000);
    let max = *counts.iter().max().unwrap();
    let min = *counts.iter().min().unwrap();
    let ratio = max as f64 / min.max(1) as f64;
    let pass = ratio <= LIMIT;
    println!(
        "FAIRNESS machines={} calls={} grants={} min={min} max={max}",
        counts.len(),
        (0..MACHINES).map(waiters_of).sum::<usize>(),
        counts.iter().sum::<u64>()
    );
    println!(
        "RATIO fairness max/min grants per machine = {ratio:.2} (limit {LIMIT:.1}) {}",
        if pass { "PASS" } else { "FAIL" }
    );
    pass
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let clusters: Vec<Cluster> = SIZES.iter().map(|&n| build(&rt, n)).collect();
    let _enter = rt.enter();

    // ENGINE_BENCH_PROFILE=heartbeat|grant_free[,small]: spin on one size (for perf).
    if let Ok(what) = std::env::var("ENGINE_BENCH_PROFILE") {
        let cl = if what.ends_with(",small") {
            &clusters[0]
        } else {
            clusters.last().unwrap()
        };
        for _ in 0..10 {
            let ns = if what.starts_with("heartbeat") {
                time_heartbeats(cl, 100_000)
            } else {
                time_grant_free(cl, 100_000)
            };
            println!("{what} {} servants: {ns:.0} ns/op", cl.n);
        }
        return;
    }
    // ENGINE_BENCH_RATIOS_ONLY=1 skips the criterion measurements (quick check).
    let ratios_only = std::env::var_os("ENGINE_BENCH_RATIOS_ONLY").is_some();
    if !ratios_only {
        bench_scaling(&mut c, &clusters);
    }
    let fair = bench_fairness(&mut c, ratios_only);
    c.final_summary();

    let flat = print_ratios(&clusters);
    println!("RESULT {}", if flat && fair { "PASS" } else { "FAIL" });
}
