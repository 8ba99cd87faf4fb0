//! The scheduler's own flags: listening, tokens, inspection access and the
//! edge's limits. Names, kebab-case aliases and `YADCC_*` variables are added
//! to every flag in one place ([`super::Cli::command_line`]).

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use clap::{Args, ValueEnum};

use super::settings::{parse_duration, parse_size};
use crate::{engine::Redacted, logging::AccessLog};

#[derive(Debug, Clone, Args)]
#[command(rename_all = "snake_case")]
pub struct ServerFlags {
    /// Port to listen on (all interfaces). Ignored when --listen is given.
    #[arg(long, default_value_t = 8336)]
    pub port: u16,

    /// Address to listen on, e.g. `127.0.0.1:8336` or `[::]:8336`.
    #[arg(long)]
    pub listen: Option<SocketAddr>,

    /// Comma-separated tokens that delegates (and unverified servants) present.
    /// Entries are literal (no trimming). An empty entry (`a,` or `,a`: the
    /// empty token, which lets daemons without `--token` in) stops the start,
    /// as a wholly empty flag does.
    #[arg(long, hide_env_values = true)]
    pub acceptable_user_tokens: Option<Redacted<String>>,

    /// Comma-separated tokens that compile servants present. Servants with only a
    /// user token are listed but get no task. Entries are literal (no trimming).
    /// An empty entry (`a,` or `,a`) stops the start, as a wholly empty flag
    /// does.
    #[arg(long, hide_env_values = true)]
    pub acceptable_servant_tokens: Option<Redacted<String>>,

    /// Accept any token, or none, on every RPC instead of the two token lists:
    /// anyone who reaches the port may register servants and take grants.
    /// For tests and closed networks only; the log warns.
    #[arg(long, conflicts_with_all = ["acceptable_user_tokens", "acceptable_servant_tokens"])]
    pub insecure_accept_any_token: bool,

    /// Daemons older than this version are refused (STATUS_VERSION_TOO_OLD).
    #[arg(long, default_value_t = 0)]
    pub min_daemon_version: u32,

    /// Seconds between rollouts of the token daemons use to reach each other.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub serving_daemon_token_rollout_interval: u64,

    /// Secret the serving-daemon tokens are derived from. Set it (preferably
    /// through the environment) so tokens survive a restart; without it a random
    /// one is drawn at start.
    #[arg(long, hide_env_values = true)]
    pub serving_daemon_token_secret: Option<Redacted<String>>,

    /// Servants reporting less available memory than this get no new task
    /// (sizes like 512M, 10G).
    #[arg(long, default_value = "10G", value_parser = parse_size)]
    pub servant_min_memory_for_accepting_new_task: u64,

    /// Take a servant's foreign load as its reported load minus the 15 s
    /// average of this scheduler's grants there (the daemon's load is a 15 s
    /// average), not minus the grants held now. On by default (benchmark P7:
    /// shorter builds on a busy farm); =false for the original's rule.
    /// docs/farm.md.
    #[arg(long, default_value_t = true)]
    pub foreign_load_from_own_average: bool,

    /// Within each tier of the pick order, place first on the servants whose
    /// freed grants came back sooner (the log-mean time of their recent
    /// immediate grants: faster or less loaded machines), then by
    /// utilisation; a servant with too few recent grants is tried first.
    /// On by default (benchmark P7: shorter builds on a farm of mixed
    /// machines, the same on a uniform one); =false for the original's
    /// order. docs/farm.md.
    #[arg(long, default_value_t = true)]
    pub place_by_observed_speed: bool,

    /// Take a servant out of rotation when 5 immediate grants in a row come
    /// back before any heartbeat listed them, far sooner than the farm's
    /// typical hold (a refused serving port, a full disk, a broken
    /// compiler): for 30 s, 30 s more with each ejection up to 300 s, then
    /// one grant at a time until one runs; never more than a tenth of the
    /// servants (at least one) at once. Shown on the dashboard, in
    /// /metrics, the audit and ListServantStates. =false keeps every
    /// servant in rotation, as the original does. docs/farm.md.
    #[arg(long, default_value_t = true)]
    pub eject_broken_servants: bool,

    /// `user:password` for HTTP basic auth on the dashboard, `/api/v1/*` and
    /// `/inspect/*`. Without it, or empty (the original's default), and
    /// without --debugging_no_inspect_auth they are closed, as in the original.
    #[arg(long, hide_env_values = true)]
    pub inspect_credential: Option<Redacted<String>>,

    /// Comma-separated tokens of the operators who may cordon, drain and
    /// uncordon servants (`yadcc.scheduler.AdminService`, sent as
    /// `Authorization: Bearer TOKEN`). Apart from the daemons' tokens (none
    /// may be one of them) and from --inspect_credential. Without it the
    /// admin API is closed. `LABEL:TOKEN` (e.g. `alice:$TOKEN`; a label is
    /// letters, digits, `.`, `_`, `-`, `@`) names who acted in the audit and
    /// on cordons; a plain TOKEN is named `admin-token-N` by its place in
    /// the list (`:TOKEN` keeps a token that contains `:` whole).
    #[arg(long, hide_env_values = true)]
    pub admin_tokens: Option<Redacted<String>>,

    /// Where the operators' cordons and audit list last across restarts
    /// (JSON, replaced atomically at each action, read at start). Without
    /// it, and without a hot standby (which keeps them in etcd), a restart
    /// forgets them.
    #[arg(long)]
    pub state_file: Option<std::path::PathBuf>,

    /// Named tenants sharing the farm by weight, with their user tokens (and
    /// optionally the servants' tokens), in TOML (docs/tenants.md). Read
    /// again on SIGHUP and when it changes; a bad file stops the start, and
    /// at a reload keeps the running configuration. Replaces
    /// --acceptable_user_tokens.
    #[arg(long, conflicts_with_all = ["acceptable_user_tokens", "insecure_accept_any_token"])]
    pub tenants_file: Option<std::path::PathBuf>,

    /// Open the dashboard, `/api/v1/*` and `/inspect/*` to anyone who can
    /// reach the port, without a credential (the original's flag; for
    /// debugging or a trusted network).
    #[arg(long)]
    pub debugging_no_inspect_auth: bool,

    /// Largest accepted request body (sizes like 4M).
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    pub max_body_bytes: u64,

    /// Largest GetRunningTasks answer (its encoding, before compression;
    /// 64M lists about 700,000 tasks). A longer list is cut to fit, with a
    /// warning in the log.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub max_running_tasks_bytes: u64,

    /// Comma-separated proxy addresses whose X-Forwarded-For is believed.
    #[arg(long, value_delimiter = ',')]
    pub trusted_proxies: Vec<IpAddr>,

    /// Seconds after start during which running tasks that servants report but
    /// this scheduler never granted are adopted instead of killed.
    #[arg(long, default_value_t = 15)]
    pub adoption_window: u64,

    /// Longest time from a connection's or request's first byte to its
    /// complete head (HTTP headers; a binary frame's header and meta). Slower
    /// clients are closed. Durations like 10s, 500ms, 2m; a bare number is seconds.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// Longest time from a complete head to the last byte of its body.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub body_read_timeout: Duration,

    /// A daemon connection (flare, http+pb) with no call in flight and no byte
    /// for this long is closed. At least 60s: stock daemons keep idle
    /// connections 45s and expect the server to keep them 60s.
    #[arg(long, default_value = "90s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Open connections at most; 0: the file-descriptor limit (the soft limit
    /// is raised to the hard one at start) less 64.
    #[arg(long, default_value_t = 0)]
    pub max_connections: usize,

    /// Open connections from one IP address (an IPv6 client: its /64) at
    /// most; more are closed at once. 0: 4096 (an office of 1,000 daemons
    /// behind one NAT address holds 2,000), but at most half the connection
    /// cap, so one address never holds every descriptor. A --trusted_proxies
    /// address is exempt (everyone behind it shares it).
    #[arg(long, default_value_t = 0)]
    pub max_connections_per_ip: u32,

    /// Calls one daemon connection (flare, http+pb) may have in flight at
    /// most; more are answered "overloaded" (code 11) at once.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_calls_in_flight_per_connection: u32,

    /// WaitForStartingTask calls queued at most, in all; more get
    /// STATUS_NO_QUOTA_AVAILABLE at once.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_waiters: u32,

    /// WaitForStartingTask calls one requester may have queued at most; more
    /// get STATUS_NO_QUOTA_AVAILABLE at once. A requester is a daemon's
    /// connection (flare, http+pb), so every daemon behind a NAT address has
    /// its own; for JSON, Connect and gRPC callers, an address.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_waiters_per_requester: u32,

    /// Request bytes buffered at most over all connections beyond each
    /// connection's own 64K (every byte of every body counts); a request
    /// that does not fit is answered "overloaded" (or, on the binary
    /// protocol, its connection is closed).
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    pub max_buffered_body_bytes: u64,

    /// HTTP/2 streams one connection may have open at once.
    #[arg(long, default_value_t = crate::edge::DEFAULT_HTTP2_MAX_CONCURRENT_STREAMS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub http2_max_concurrent_streams: u32,

    /// Which calls the access log writes: every one (`all`), failed and slow
    /// ones at most once a second per kind (`errors`), or none (`off`).
    #[arg(long, value_enum, default_value_t = AccessLog::Errors)]
    pub access_log: AccessLog,

    /// On SIGINT/SIGTERM, how long open connections may finish their calls
    /// (waiting long polls are answered at once) before they are closed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,

    /// Log lines on stderr: `text` for people, `json` for log shippers (one
    /// object per line: timestamp, level, target, fields).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Comma-separated etcd client URLs (`http://etcd1:2379,...`, or all
    /// `https://` with --ha_etcd_ca_file): run as one of several schedulers of which the one elected on etcd serves and the
    /// others stand by, ready to take over. Needs
    /// --serving_daemon_token_secret (the same on every instance).
    #[arg(long, value_delimiter = ',')]
    pub ha_etcd_endpoints: Vec<String>,

    /// The etcd election the instances campaign in (a key prefix).
    #[arg(long, default_value = crate::ha::DEFAULT_ELECTION_NAME)]
    pub ha_election_name: String,

    /// The leader's etcd lease, whole seconds: a leader that dies holds the
    /// election this long at most, and one that cannot renew stops serving
    /// before it runs out.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub ha_lease_ttl: Duration,

    /// With --ha_etcd_endpoints: a leader that no balancer has asked
    /// `/readyz` for this long resigns, so that the instance the daemons can
    /// reach leads (a leader cut off from the balancer and the daemons but
    /// not from etcd; a standby's own probes do not count). Well above the
    /// balancer's check interval (HAProxy's in scripts/deploy: 300 ms, down
    /// after 2 missed); 0 never resigns for that (a deployment without a
    /// balancer checking `/readyz`). A single instance is never affected.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub ha_resign_unchecked_after: Duration,

    /// A file holding a secret (16 bytes at least, the same on every
    /// instance, readable by this one only) that turns failsafe on: while
    /// etcd does not answer, the leader goes on granting as long as every
    /// other instance the election named confirms, over a call signed with
    /// this secret, that it does not lead (docs/failover.md, "Failsafe").
    /// Without it a leader that etcd does not answer steps down within its
    /// lease. The instances' clocks must agree within 5 s.
    #[arg(long)]
    pub ha_failsafe_secret_file: Option<std::path::PathBuf>,

    /// CA certificates (PEM) etcd's server certificates chain to: needed by
    /// `https://` endpoints in --ha_etcd_endpoints (no system root store:
    /// etcd's certificates come from a private CA). Read on every connection.
    #[arg(long)]
    pub ha_etcd_ca_file: Option<std::path::PathBuf>,

    /// A client certificate chain (PEM) for etcd, when etcd runs
    /// `--client-cert-auth`; with --ha_etcd_key_file.
    #[arg(long, requires = "ha_etcd_key_file")]
    pub ha_etcd_cert_file: Option<std::path::PathBuf>,

    /// The private key of --ha_etcd_cert_file (PEM).
    #[arg(long, requires = "ha_etcd_cert_file")]
    pub ha_etcd_key_file: Option<std::path::PathBuf>,

    /// The etcd user the instances authenticate as (etcd's `auth enable`);
    /// its password comes from --ha_etcd_password_file.
    #[arg(long, requires = "ha_etcd_password_file")]
    pub ha_etcd_user: Option<String>,

    /// A file holding --ha_etcd_user's password (one line; a trailing
    /// newline is ignored), so it never shows in the process list.
    #[arg(long, requires = "ha_etcd_user")]
    pub ha_etcd_password_file: Option<std::path::PathBuf>,

    /// TLS certificate chain (PEM, the server's certificate first) served on
    /// the same port as the plaintext protocols: a connection that opens
    /// with a TLS handshake gets HTTPS (HTTP/2 or HTTP/1.1 by ALPN), the
    /// stock daemons keep plaintext flare:// and http+pb. Read again when
    /// the file changes; a file that does not load keeps the previous one.
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<std::path::PathBuf>,

    /// The private key of --tls_cert_file (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<std::path::PathBuf>,

    /// CA certificates (PEM) whose client certificates are authenticated
    /// inspectors (mutual TLS): the dashboard, `/api/v1/*` and `/inspect/*`
    /// without a password. Clients without a certificate are still served.
    /// Read again when the file changes, as the certificate is.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_client_ca_file: Option<std::path::PathBuf>,

    /// With TLS configured, accept --inspect_credential and admin tokens
    /// over plain HTTP from any address (by default only from loopback): for
    /// a proxy in front that terminates TLS itself.
    #[arg(long)]
    pub allow_plaintext_inspection: bool,

    /// Comma-separated names browsers may reach this server by, besides IP
    /// addresses, `localhost`, `*.localhost` and this machine's name: a
    /// request with an `Origin` for any other `Host` is refused (403), so a
    /// page cannot rebind its own name to this server (DNS rebinding). A
    /// name starting with `.` stands for every name under it
    /// (`.farm.example.com`). Requests without an `Origin` are not checked.
    #[arg(long, value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,

    /// IPv6 clients share one guessing limit (failed credentials: the
    /// inspection password, admin and daemon tokens) per this prefix length:
    /// 56 (a customer's usual allocation), 64 for one per subnet, 128 for
    /// one per address. IPv4 clients count per address.
    #[arg(long, default_value_t = crate::security::DEFAULT_IPV6_PREFIX,
          value_parser = clap::value_parser!(u8).range(16..=128))]
    pub guessing_ipv6_prefix: u8,

    /// Comma-separated origins (`https://ci.example.com`) whose pages may call
    /// the RPCs from a browser (Connect, gRPC-Web); `*` for any. Default: none.
    #[arg(long, value_delimiter = ',')]
    pub cors_allowed_origins: Vec<String>,
}

/// How log lines are written (`--log_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
