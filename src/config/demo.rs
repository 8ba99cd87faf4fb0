//! Flags that run the simulator inside the scheduler (`--demo`), and, in a
//! build with the `bench-route` feature only, the benchmark's bare route.

use clap::Args;

use crate::sim::Wire;

#[derive(Debug, Clone, Args)]
#[command(rename_all = "snake_case")]
pub struct DemoFlags {
    /// Demo: listen on 127.0.0.1 (unless --listen is given), use demo tokens
    /// (unless tokens are given) and run a simulated cluster of 30 servants and
    /// 12 delegates against this scheduler, so the dashboard shows a live cluster.
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
