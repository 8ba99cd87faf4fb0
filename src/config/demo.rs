//! Flags that run the simulator inside the scheduler (`--demo`), the demo's
//! public credentials and tenants, and, in a build with the `bench-route`
//! feature only, the benchmark's bare route.

use clap::Args;

use crate::sim::Wire;

/// Admin token of `yadcc-scheduler --demo` on loopback: public, so the
/// operators' examples of the docs (cordon, drain, uncordon) run against
/// the demo as written.
pub const DEMO_ADMIN_TOKEN: &str = "demo-admin-token";

/// User token of the demo's second tenant, `ci`: public, for the tenants
/// examples. The simulated daemons present [`crate::sim::DEMO_USER_TOKEN`]
/// (tenant `developers`), so `ci` is what a reader's own calls show.
pub const DEMO_CI_TOKEN: &str = "demo-ci-token";

/// The demo's tenants, in the `--tenants_file` format (docs/tenants.md), so
/// the Tenants tab and the per-tenant series have something to show. Read
/// by the same parser as a real file: the example cannot drift from it.
pub const DEMO_TENANTS: &str = r#"
[[tenant]]
name = "developers"
weight = 3
user_tokens = ["demo-user-token"]

[[tenant]]
name = "ci"
weight = 1
max_share = 0.5
user_tokens = ["demo-ci-token"]
"#;

#[derive(Debug, Clone, Args)]
#[command(rename_all = "snake_case")]
pub struct DemoFlags {
    /// Demo: listen on 127.0.0.1 (unless --listen is given), use demo tokens
    /// (unless tokens are given) and run a simulated cluster of 30 servants and
    /// 12 delegates against this scheduler, so the dashboard shows a live cluster.
    /// On loopback it also opens the admin API to the token demo-admin-token
    /// (unless --admin_tokens is given) and, without --acceptable_user_tokens,
    /// shares the farm between two tenants: developers (demo-user-token,
    /// weight 3) and ci (demo-ci-token, weight 1, at most half the slots).
    #[arg(long)]
    pub demo: bool,

    /// Demo: the wire protocol of the simulated daemons: flare (what stock
    /// daemons use), http+pb or json.
    #[arg(long, default_value = "flare")]
    pub protocol: Wire,

    /// Benchmarks only: also serve `POST /bench/bare` (fixed bytes, no RPC
    /// work) on the same server stack, as the baseline of `yadcc-loadgen heartbeat-rate`.
    #[cfg(feature = "bench-route")]
    #[arg(long, hide = true)]
    pub bench_bare_route: bool,
}
