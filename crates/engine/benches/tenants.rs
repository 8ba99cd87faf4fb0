//! Tenants benchmark (issue 31): the cost of a contended grant must not grow
//! with the number of tenants.
//!
//! A farm of one servant with 10 slots, kept saturated by 200 calls that
//! each loop wait -> free at once, on a paused-time current-thread runtime:
//! every free hands the slot to a queued call (the serving pass, the
//! tenants' and requesters' keys) and the served call frees again. The same
//! 200 calls from 100 machines belong to 1 tenant, or to 100 tenants of
//! equal weight (2 calls each). Prints the mean ns per grant+free of each,
//! `RATIO grant_free 100/1 tenants` against the 1.2 limit, and the spread of
//! grants between the 100 tenants (max/min, info).
//!
//! `cargo bench --bench tenants` (criterion is not used: one timed loop,
//! interleaved rounds, the lowest round mean).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use yadcc_engine::{
    Config, GrantRequest, Heartbeat, Redacted, Scheduler, ServantPriority, Tenancy, TenantSpec,
    TokenSet, token_digest,
};

const SERVANT: &str = "bench-servant-token";
const ENV: &str = "bench-environment";
const CALLS: usize = 200;
const MACHINES: usize = 100;
const SLOTS: u32 = 10;

fn token(tenant: usize) -> String {
    format!("tenant-{tenant}")
}

fn config(tenants: usize) -> Config {
    let tenants = (0..tenants)
        .map(|t| TenantSpec {
            name: format!("t{t}"),
            weight: 1.0,
            max_share: None,
            token_digests: Redacted(vec![token_digest(&token(t))]),
        })
        .collect();
    Config {
        servant_tokens: TokenSet::new([SERVANT]),
        adoption_window: Duration::ZERO,
        tenancy: Some(Tenancy {
            tenants,
            servant_tokens: None,
        }),
        ..Config::default()
    }
}

fn heartbeat() -> Heartbeat {
    Heartbeat {
        token: SERVANT.into(),
        observed_ip: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        location: "127.0.0.2:8335".into(),
        next_heartbeat_in: Duration::from_secs(30),
        version: 10,
        num_processors: SLOTS,
        current_load: 0,
        priority: ServantPriority::User,
        not_accepting_reason: None,
        capacity: SLOTS,
        total_memory: 0,
        memory_available: 0,
        environments: vec![ENV.into()],
        running_tasks: Vec::new(),
    }
}

/// `grants` contended grants among `tenants` tenants: the wall time and the
/// grants each tenant got.
fn run(tenants: usize, grants: u64) -> (Duration, Vec<u64>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let sched = Scheduler::new(config(tenants));
        sched.heartbeat(heartbeat()).unwrap();
        let issued = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for call in 0..CALLS {
            let tenant = call % tenants;
            let machine = IpAddr::V4(Ipv4Addr::new(10, 1, 0, (call % MACHINES) as u8));
            let req = GrantRequest {
                token: token(tenant).into(),
                requester_ip: machine,
                connection: None,
                wait: Duration::from_secs(10),
                answer_within: None,
                environment: ENV.into(),
                immediate: 1,
                prefetch: 0,
                lease: Duration::from_secs(30),
                min_version: 0,
            };
            let sched = sched.clone();
            let issued = issued.clone();
            let token = token(tenant);
            tasks.push((
                tenant,
                tokio::spawn(async move {
                    let mut mine = 0;
                    while issued.load(Ordering::Relaxed) < grants {
                        let got = sched.wait_for_starting_task(req.clone()).await;
                        let ids: Vec<u64> = got.iter().flatten().map(|g| g.id).collect();
                        if issued.fetch_add(ids.len() as u64, Ordering::Relaxed) < grants {
                            mine += ids.len() as u64;
                        }
                        // Let every other call queue before freeing: the
                        // farm stays saturated.
                        tokio::task::yield_now().await;
                        sched.free(&token, machine, &ids).unwrap();
                    }
                    mine
                }),
            ));
        }
        let start = Instant::now();
        let mut per_tenant = vec![0u64; tenants];
        for (tenant, task) in tasks {
            per_tenant[tenant] += task.await.unwrap();
        }
        (start.elapsed(), per_tenant)
    })
}

fn main() {
    const LIMIT: f64 = 1.2;
    const ROUNDS: usize = 7;
    const GRANTS: u64 = 50_000;
    let sizes = [1usize, 100];
    run(1, GRANTS / 10);
    run(100, GRANTS / 10);
    let mut means = vec![Vec::new(); sizes.len()];
    let mut spread = Vec::new();
    for _ in 0..ROUNDS {
        for (i, &tenants) in sizes.iter().enumerate() {
            let (took, per_tenant) = run(tenants, GRANTS);
            means[i].push(took.as_nanos() as f64 / GRANTS as f64);
            if tenants > 1 {
                let max = *per_tenant.iter().max().unwrap() as f64;
                let min = *per_tenant.iter().min().unwrap() as f64;
                spread.push(max / min.max(1.0));
            }
        }
    }
    println!(
        "TIMED LOOP: {ROUNDS} interleaved rounds x {GRANTS} contended grants; {CALLS} calls, {SLOTS} slots; figure = lowest round mean"
    );
    let best: Vec<f64> = means
        .iter_mut()
        .map(|v| {
            v.sort_by(f64::total_cmp);
            println!("  (rounds: {v:.0?})");
            v[0]
        })
        .collect();
    for (i, &tenants) in sizes.iter().enumerate() {
        println!(
            "MEAN tenants={tenants:>3} grant_free={:>6.0} ns/grant",
            best[i]
        );
    }
    let ratio = best[1] / best[0];
    let pass = ratio <= LIMIT;
    println!(
        "RATIO grant_free 100/1 tenants = {ratio:.2} (limit {LIMIT:.1}) {}",
        if pass { "PASS" } else { "FAIL" }
    );
    spread.sort_by(f64::total_cmp);
    println!(
        "SPREAD grants per tenant, 100 tenants of equal weight: max/min = {:.3} (worst round)",
        spread.last().copied().unwrap_or(0.0)
    );
    if !pass {
        std::process::exit(1);
    }
}
