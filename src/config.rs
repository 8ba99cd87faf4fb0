//! The command line. Flag names are the reference scheduler's (snake_case, so
//! existing deployment scripts keep working); each is also accepted in
//! kebab-case and as a `YADCC_*` environment variable. The original's gflags
//! habits (`--flagfile`, `-name=value`, `--noflag`, its logging flags) are
//! rewritten by [`gflags`] before clap sees them.

pub mod gflags;

use std::{ffi::OsString, net::IpAddr, net::SocketAddr, time::Duration};

use clap::{CommandFactory, Parser};

use crate::{
    dashboard::InspectAccess,
    engine::{self, Redacted},
    http::state::HttpSettings,
    limits::{self, EdgeSettings},
};

/// yadcc scheduler: hands out compile slots on the servants of a yadcc cluster.
///
/// Daemons reach it with `--scheduler_uri=flare://HOST:8336` (or http+pb://); scripts post
/// JSON to `/rpc/yadcc.scheduler.SchedulerService.<Method>`; people open the
/// dashboard at `/` and the API docs at `/docs`.
#[derive(Debug, Clone, Parser)]
// Repeating a flag is not an error: the last one wins, as with gflags (a
// flag file, then an override on the command line).
#[command(version, about, long_about, args_override_self = true)]
pub struct Cli {
    /// Port to listen on (all interfaces). Ignored when --listen is given.
    #[arg(long, env = "YADCC_PORT", default_value_t = 8336)]
    pub port: u16,

    /// Address to listen on, e.g. `127.0.0.1:8336` or `[::]:8336`.
    #[arg(long, env = "YADCC_LISTEN")]
    pub listen: Option<SocketAddr>,

    /// Comma-separated tokens that delegates (and unverified servants) present.
    /// Entries are literal (no trimming). An empty entry (`a,` or `,a`) accepts
    /// only the empty token (daemons without `--token`), with a warning; only a
    /// wholly empty flag (`--acceptable_user_tokens=`) lets anyone in.
    #[arg(
        long = "acceptable_user_tokens",
        visible_alias = "acceptable-user-tokens",
        env = "YADCC_ACCEPTABLE_USER_TOKENS",
        hide_env_values = true
    )]
    pub acceptable_user_tokens: Option<Redacted<String>>,

    /// Comma-separated tokens that compile servants present. Servants with only a
    /// user token are listed but get no task. Entries are literal (no trimming).
    /// An empty entry (`a,` or `,a`) accepts only the empty token, with a
    /// warning; only a wholly empty flag (`--acceptable_servant_tokens=`) lets
    /// anyone in.
    #[arg(
        long = "acceptable_servant_tokens",
        visible_alias = "acceptable-servant-tokens",
        env = "YADCC_ACCEPTABLE_SERVANT_TOKENS",
        hide_env_values = true
    )]
    pub acceptable_servant_tokens: Option<Redacted<String>>,

    /// Daemons older than this version are refused (STATUS_VERSION_TOO_OLD).
    #[arg(
        long = "min_daemon_version",
        visible_alias = "min-daemon-version",
        env = "YADCC_MIN_DAEMON_VERSION",
        default_value_t = 0
    )]
    pub min_daemon_version: u32,

    /// Seconds between rollouts of the token daemons use to reach each other.
    #[arg(
        long = "serving_daemon_token_rollout_interval",
        visible_alias = "serving-daemon-token-rollout-interval",
        env = "YADCC_SERVING_DAEMON_TOKEN_ROLLOUT_INTERVAL",
        default_value_t = 3600,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub serving_daemon_token_rollout_interval: u64,

    /// Secret the serving-daemon tokens are derived from. Set it (preferably
    /// through the environment) so tokens survive a restart; without it a random
    /// one is drawn at start.
    #[arg(
        long = "serving_daemon_token_secret",
        visible_alias = "serving-daemon-token-secret",
        env = "YADCC_SERVING_DAEMON_TOKEN_SECRET",
        hide_env_values = true
    )]
    pub serving_daemon_token_secret: Option<Redacted<String>>,

    /// Servants reporting less available memory than this get no new task
    /// (sizes like 512M, 10G).
    #[arg(
        long = "servant_min_memory_for_accepting_new_task",
        visible_alias = "servant-min-memory-for-accepting-new-task",
        env = "YADCC_SERVANT_MIN_MEMORY_FOR_ACCEPTING_NEW_TASK",
        default_value = "10G",
        value_parser = parse_size
    )]
    pub servant_min_memory_for_accepting_new_task: u64,

    /// `user:password` for HTTP basic auth on the dashboard, `/api/v1/*` and
    /// `/inspect/*`. Without it (and without --debugging_no_inspect_auth) they
    /// are closed, as in the original.
    #[arg(
        long = "inspect_credential",
        visible_alias = "inspect-credential",
        env = "YADCC_INSPECT_CREDENTIAL",
        hide_env_values = true
    )]
    pub inspect_credential: Option<Redacted<String>>,

    /// Open the dashboard, `/api/v1/*` and `/inspect/*` to anyone who can
    /// reach the port, without a credential (the original's flag; for
    /// debugging or a trusted network).
    #[arg(
        long = "debugging_no_inspect_auth",
        visible_alias = "debugging-no-inspect-auth",
        env = "YADCC_DEBUGGING_NO_INSPECT_AUTH"
    )]
    pub debugging_no_inspect_auth: bool,

    /// Largest accepted request body (sizes like 4M).
    #[arg(
        long = "max_body_bytes",
        visible_alias = "max-body-bytes",
        env = "YADCC_MAX_BODY_BYTES",
        default_value = "4M",
        value_parser = parse_size
    )]
    pub max_body_bytes: u64,

    /// Comma-separated proxy addresses whose X-Forwarded-For is believed.
    #[arg(
        long = "trusted_proxies",
        visible_alias = "trusted-proxies",
        env = "YADCC_TRUSTED_PROXIES",
        value_delimiter = ','
    )]
    pub trusted_proxies: Vec<IpAddr>,

    /// Seconds after start during which running tasks that servants report but
    /// this scheduler never granted are adopted instead of killed.
    #[arg(
        long = "adoption_window",
        visible_alias = "adoption-window",
        env = "YADCC_ADOPTION_WINDOW",
        default_value_t = 15
    )]
    pub adoption_window: u64,

    /// Longest time from a connection's or request's first byte to its
    /// complete head (HTTP headers; a binary frame's header and meta). Slower
    /// clients are closed. Durations like 10s, 500ms, 2m; a bare number is seconds.
    #[arg(
        long = "header_read_timeout",
        visible_alias = "header-read-timeout",
        env = "YADCC_HEADER_READ_TIMEOUT",
        default_value = "10s",
        value_parser = parse_duration
    )]
    pub header_read_timeout: Duration,

    /// Longest time from a complete head to the last byte of its body.
    #[arg(
        long = "body_read_timeout",
        visible_alias = "body-read-timeout",
        env = "YADCC_BODY_READ_TIMEOUT",
        default_value = "30s",
        value_parser = parse_duration
    )]
    pub body_read_timeout: Duration,

    /// A daemon connection (flare, http+pb) with no call in flight and no byte
    /// for this long is closed. At least 60s: stock daemons keep idle
    /// connections 45s and expect the server to keep them 60s.
    #[arg(
        long = "idle_timeout",
        visible_alias = "idle-timeout",
        env = "YADCC_IDLE_TIMEOUT",
        default_value = "90s",
        value_parser = parse_duration
    )]
    pub idle_timeout: Duration,

    /// Open connections at most; 0: the file-descriptor limit (the soft limit
    /// is raised to the hard one at start) less 64.
    #[arg(
        long = "max_connections",
        visible_alias = "max-connections",
        env = "YADCC_MAX_CONNECTIONS",
        default_value_t = 0
    )]
    pub max_connections: usize,

    /// Open connections from one IP address at most; more are closed at once.
    /// A --trusted_proxies address is exempt (everyone behind it shares it).
    #[arg(
        long = "max_connections_per_ip",
        visible_alias = "max-connections-per-ip",
        env = "YADCC_MAX_CONNECTIONS_PER_IP",
        default_value_t = 256,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_connections_per_ip: u32,

    /// Bytes buffered at most, over all connections, for request bodies above
    /// 64K that are still arriving; a request that does not fit is answered
    /// "overloaded" (or, on the binary protocol, its connection is closed).
    #[arg(
        long = "max_buffered_body_bytes",
        visible_alias = "max-buffered-body-bytes",
        env = "YADCC_MAX_BUFFERED_BODY_BYTES",
        default_value = "32M",
        value_parser = parse_size
    )]
    pub max_buffered_body_bytes: u64,

    /// On SIGINT/SIGTERM, how long open connections may finish their calls
    /// (waiting long polls are answered at once) before they are closed.
    #[arg(
        long = "shutdown_grace",
        visible_alias = "shutdown-grace",
        env = "YADCC_SHUTDOWN_GRACE",
        default_value = "10s",
        value_parser = parse_duration
    )]
    pub shutdown_grace: Duration,
    /// Comma-separated origins (`https://ci.example.com`) whose pages may call
    /// the RPCs from a browser (Connect, gRPC-Web); `*` for any. Default: none.
    #[arg(
        long = "cors_allowed_origins",
        visible_alias = "cors-allowed-origins",
        env = "YADCC_CORS_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_allowed_origins: Vec<String>,

    /// Demo: listen on 127.0.0.1 (unless --listen is given), use demo tokens
    /// (unless tokens are given) and run a simulated cluster of 30 servants and
    /// 12 delegates against this scheduler, so the dashboard shows a live cluster.
    #[arg(long)]
    pub demo: bool,

    /// Demo: the wire protocol of the simulated daemons: flare (what stock
    /// daemons use), http+pb or json.
    #[arg(long, default_value = "flare")]
    pub protocol: crate::sim::Protocol,

    /// Benchmarks only: also serve `POST /bench/bare` (fixed bytes, no RPC
    /// work) on the same server stack, as the baseline of `yadcc-loadgen hammer`.
    #[arg(
        long = "bench_bare_route",
        visible_alias = "bench-bare-route",
        hide = true
    )]
    pub bench_bare_route: bool,
}

/// Parses `4096`, `512K`, `512M`, `10G`, `1T` (binary multiples; a trailing `B`
/// or `iB` is allowed).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let upper = trimmed.to_ascii_uppercase();
    let unitless = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (digits, shift) = match unitless.chars().last() {
        Some('K') => (&unitless[..unitless.len() - 1], 10),
        Some('M') => (&unitless[..unitless.len() - 1], 20),
        Some('G') => (&unitless[..unitless.len() - 1], 30),
        Some('T') => (&unitless[..unitless.len() - 1], 40),
        _ => (unitless, 0),
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|value| value.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("{trimmed:?} is not a size like 4096, 512M or 10G"))
}

/// The longest duration a flag accepts: deadlines are computed as
/// `Instant::now() + timeout`, which panics past the clock's range, and no
/// timeout here is sensibly longer.
pub const MAX_FLAG_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Parses `10s`, `500ms`, `2m`, `1h`; a bare number is seconds; at most
/// [`MAX_FLAG_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let lower = trimmed.to_ascii_lowercase();
    let (digits, unit_ms) = if let Some(digits) = lower.strip_suffix("ms") {
        (digits, 1)
    } else if let Some(digits) = lower.strip_suffix('s') {
        (digits, 1000)
    } else if let Some(digits) = lower.strip_suffix('m') {
        (digits, 60_000)
    } else if let Some(digits) = lower.strip_suffix('h') {
        (digits, 3_600_000)
    } else {
        (lower.as_str(), 1000)
    };
    let duration = digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|value| value.checked_mul(unit_ms))
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{trimmed:?} is not a duration like 10s, 500ms or 2m"))?;
    if duration > MAX_FLAG_DURATION {
        return Err(format!(
            "{trimmed:?} is longer than the {}h maximum",
            MAX_FLAG_DURATION.as_secs() / 3600
        ));
    }
    Ok(duration)
}

/// Settings derived from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub engine: engine::Config,
    pub http: HttpSettings,
    /// Run the simulated demo cluster against this scheduler.
    pub demo: bool,
    /// What the demo's simulated daemons speak.
    pub demo_protocol: crate::sim::Protocol,
    /// Mount the benchmark's bare route.
    pub bench_bare_route: bool,
}

impl Cli {
    /// Parses a command line as the original scheduler's operators write it
    /// (see [`gflags`]); also returns the warnings to log once logging is up.
    pub fn parse_gflags(
        args: impl IntoIterator<Item = OsString>,
    ) -> Result<(Cli, Vec<String>), clap::Error> {
        let mut command = Cli::command();
        command.build();
        let normalised = gflags::normalise(&command, args)
            .map_err(|message| command.error(clap::error::ErrorKind::InvalidValue, message))?;
        let cli = Cli::try_parse_from(normalised.args)?;
        Ok((cli, normalised.warnings))
    }

    /// Who may read the inspection pages: the original's rules, plus the
    /// demo, whose data is simulated and which listens on loopback only.
    fn inspect_access(&self, listen: SocketAddr) -> InspectAccess {
        if self.debugging_no_inspect_auth {
            return InspectAccess::Open;
        }
        if let Some(credential) = &self.inspect_credential {
            return InspectAccess::Credential(credential.as_str().into());
        }
        if self.demo && listen.ip().is_loopback() {
            return InspectAccess::Open;
        }
        InspectAccess::Closed
    }

    /// Checks the flags and turns them into settings. Errors say what to pass.
    pub fn settings(&self) -> Result<Settings, String> {
        let demo_tokens = |given: &Option<Redacted<String>>, demo: &str| {
            given
                .as_ref()
                .map(|tokens| tokens.0.clone())
                .or_else(|| self.demo.then(|| demo.to_owned()))
        };
        let (Some(user_tokens), Some(servant_tokens)) = (
            &demo_tokens(&self.acceptable_user_tokens, crate::sim::DEMO_USER_TOKEN),
            &demo_tokens(
                &self.acceptable_servant_tokens,
                crate::sim::DEMO_SERVANT_TOKEN,
            ),
        ) else {
            return Err(
                "no tokens configured: pass --acceptable_user_tokens=TOKEN[,TOKEN...] \
                 (what delegates present) and --acceptable_servant_tokens=TOKEN[,TOKEN...] \
                 (what compile servants present), or set YADCC_ACCEPTABLE_USER_TOKENS and \
                 YADCC_ACCEPTABLE_SERVANT_TOKENS; an empty value lets anyone in"
                    .to_owned(),
            );
        };
        if let Some(credential) = &self.inspect_credential
            && !credential.contains(':')
        {
            return Err("--inspect_credential must be user:password".to_owned());
        }
        let max_body_bytes = usize::try_from(self.max_body_bytes)
            .map_err(|_| "--max_body_bytes is too large".to_owned())?;
        if self.idle_timeout < limits::MIN_IDLE_TIMEOUT {
            return Err(format!(
                "--idle_timeout must be at least {}s: stock daemons expect idle connections to stay open 60s",
                limits::MIN_IDLE_TIMEOUT.as_secs()
            ));
        }
        for (flag, value) in [
            ("--header_read_timeout", self.header_read_timeout),
            ("--body_read_timeout", self.body_read_timeout),
        ] {
            if value.is_zero() {
                return Err(format!("{flag} must be more than zero"));
            }
        }
        let edge = EdgeSettings {
            header_read_timeout: self.header_read_timeout,
            body_read_timeout: self.body_read_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: (self.max_connections > 0).then_some(self.max_connections),
            max_connections_per_ip: self.max_connections_per_ip as usize,
            max_buffered_body_bytes: usize::try_from(self.max_buffered_body_bytes)
                .map_err(|_| "--max_buffered_body_bytes is too large".to_owned())?,
            shutdown_grace: self.shutdown_grace,
        };
        let cors_allowed_origins = self
            .cors_allowed_origins
            .iter()
            .map(|origin| origin.trim())
            .filter(|origin| !origin.is_empty())
            .map(|origin| {
                axum::http::HeaderValue::from_str(origin).map_err(|_| {
                    format!("--cors_allowed_origins: {origin:?} is not a valid origin")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let engine = engine::Config {
            user_tokens: engine::TokenSet::from_flag(user_tokens),
            servant_tokens: engine::TokenSet::from_flag(servant_tokens),
            min_daemon_version: self.min_daemon_version,
            servant_min_memory_for_accepting_new_task: self
                .servant_min_memory_for_accepting_new_task,
            serving_daemon_token_rollout_interval: Duration::from_secs(
                self.serving_daemon_token_rollout_interval,
            ),
            serving_daemon_token_secret: self
                .serving_daemon_token_secret
                .as_ref()
                .map(|secret| secret.as_bytes().to_vec().into()),
            adoption_window: Duration::from_secs(self.adoption_window),
            ..engine::Config::default()
        };
        let listen = self.listen.unwrap_or_else(|| {
            // The demo's tokens are public: keep it off the network.
            let ip = if self.demo {
                [127, 0, 0, 1]
            } else {
                [0, 0, 0, 0]
            };
            SocketAddr::from((ip, self.port))
        });
        Ok(Settings {
            listen,
            engine,
            http: HttpSettings {
                max_body_bytes,
                trusted_proxies: self.trusted_proxies.clone(),
                inspect: self.inspect_access(listen),
                edge,
                cors_allowed_origins,
            },
            demo: self.demo,
            demo_protocol: self.protocol,
            bench_bare_route: self.bench_bare_route,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("yadcc-scheduler").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("4MiB"), Ok(4 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn reference_and_kebab_spellings_are_both_accepted() {
        let snake = cli(&[
            "--acceptable_user_tokens=u1,u2",
            "--acceptable_servant_tokens=s",
            "--min_daemon_version=3",
        ]);
        let kebab = cli(&[
            "--acceptable-user-tokens=u1,u2",
            "--acceptable-servant-tokens=s",
            "--min-daemon-version=3",
        ]);
        let (snake, kebab) = (snake.settings().unwrap(), kebab.settings().unwrap());
        assert_eq!(
            snake.engine.user_tokens,
            engine::TokenSet::new(["u1", "u2"])
        );
        assert_eq!(snake.engine.user_tokens, kebab.engine.user_tokens);
        assert_eq!(kebab.engine.min_daemon_version, 3);
        assert_eq!(snake.listen.port(), 8336);
        assert_eq!(snake.http.max_body_bytes, 4 << 20);
        assert_eq!(
            snake.engine.servant_min_memory_for_accepting_new_task,
            10 << 30
        );
    }

    #[test]
    fn edge_flags_have_documented_defaults_and_bounds() {
        let settings = cli(&[
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
        ])
        .settings()
        .unwrap();
        assert_eq!(settings.http.edge, EdgeSettings::default());
        let tuned = cli(&[
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
            "--header_read_timeout=500ms",
            "--idle_timeout=2m",
            "--max_connections=100",
            "--max_connections_per_ip=3",
            "--max_buffered_body_bytes=8M",
        ])
        .settings()
        .unwrap()
        .http
        .edge;
        assert_eq!(tuned.header_read_timeout, Duration::from_millis(500));
        assert_eq!(tuned.idle_timeout, Duration::from_secs(120));
        assert_eq!(tuned.max_connections, Some(100));
        assert_eq!(tuned.max_connections_per_ip, 3);
        assert_eq!(tuned.max_buffered_body_bytes, 8 << 20);
        let error = cli(&[
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
            "--idle_timeout=30s",
        ])
        .settings()
        .unwrap_err();
        assert!(error.contains("--idle_timeout"), "{error}");
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn durations_are_capped_at_a_day() {
        assert_eq!(parse_duration("24h"), Ok(MAX_FLAG_DURATION));
        assert_eq!(parse_duration("86400"), Ok(MAX_FLAG_DURATION));
        for too_long in ["25h", "86401s", "18446744073709551615ms", "1441m"] {
            let error = parse_duration(too_long).unwrap_err();
            assert!(error.contains("24h maximum"), "{too_long}: {error}");
        }
        let error = Cli::try_parse_from([
            "yadcc-scheduler",
            "--header_read_timeout=18446744073709551615ms",
        ])
        .unwrap_err()
        .to_string();
        assert!(error.contains("24h maximum"), "{error}");
    }

    #[test]
    fn starting_without_tokens_says_what_to_pass() {
        let error = cli(&["--acceptable_user_tokens=u"]).settings().unwrap_err();
        assert!(error.contains("--acceptable_servant_tokens"), "{error}");
        assert!(error.contains("--acceptable_user_tokens"), "{error}");
    }

    #[test]
    fn the_demo_needs_no_other_flag_and_stays_on_loopback() {
        let settings = cli(&["--demo"]).settings().unwrap();
        assert!(settings.demo);
        assert_eq!(settings.listen.to_string(), "127.0.0.1:8336");
        assert_eq!(
            settings.engine.user_tokens,
            engine::TokenSet::new([crate::sim::DEMO_USER_TOKEN])
        );
        assert_eq!(
            settings.engine.servant_tokens,
            engine::TokenSet::new([crate::sim::DEMO_SERVANT_TOKEN])
        );
        let given = cli(&["--demo", "--port=9", "--acceptable_user_tokens=u"])
            .settings()
            .unwrap();
        assert_eq!(given.engine.user_tokens, engine::TokenSet::new(["u"]));
        assert_eq!(given.listen.port(), 9);
        assert!(!cli(&["--demo"]).settings().unwrap().bench_bare_route);
        // Stock daemons speak flare: so does the demo unless told otherwise.
        assert_eq!(settings.demo_protocol, crate::sim::Protocol::Flare);
        let over_http = cli(&["--demo", "--protocol=http+pb"]).settings().unwrap();
        assert_eq!(over_http.demo_protocol, crate::sim::Protocol::HttpPb);
        assert!(cli(&["--demo"]).settings().is_ok());
        assert!(Cli::try_parse_from(["yadcc-scheduler", "--demo", "--protocol=grpc"]).is_err());
    }

    fn gflags(args: &[&str]) -> (Cli, Vec<String>) {
        Cli::parse_gflags(
            std::iter::once("yadcc-scheduler")
                .chain(args.iter().copied())
                .map(OsString::from),
        )
        .unwrap()
    }

    #[test]
    fn the_originals_command_line_works_unchanged() {
        let (cli, warnings) = gflags(&[
            "-port=8337",
            "--acceptable_user_tokens=user-secret-1,user-secret-2",
            "-acceptable_servant_tokens",
            "servant-secret",
            "--serving_daemon_token_secret=daemon-secret",
            "--min_daemon_version=2",
            "--serving_daemon_token_rollout_interval=600",
            "--servant_min_memory_for_accepting_new_task=4G",
            "--inspect_credential=ops:pw",
            "--logtostderr",
            "--v=1",
            "--log_dir=/var/log/yadcc",
            "--flare_concurrency_hint=8",
            "--port=8338",
        ]);
        let settings = cli.settings().unwrap();
        assert_eq!(settings.listen.port(), 8338, "the last --port wins");
        assert_eq!(
            settings.engine.user_tokens,
            engine::TokenSet::new(["user-secret-1", "user-secret-2"])
        );
        assert_eq!(
            settings.engine.servant_tokens,
            engine::TokenSet::new(["servant-secret"])
        );
        assert_eq!(settings.engine.min_daemon_version, 2);
        assert_eq!(
            settings.engine.serving_daemon_token_rollout_interval,
            Duration::from_secs(600)
        );
        assert_eq!(
            settings.engine.servant_min_memory_for_accepting_new_task,
            4 << 30
        );
        assert!(
            matches!(settings.http.inspect, InspectAccess::Credential(ref c) if c.as_str() == "ops:pw")
        );
        assert!(
            !format!("{:?}", settings.http).contains("ops:pw"),
            "the credential never reaches a log"
        );
        let printed = format!("{cli:?}");
        for secret in ["user-secret", "servant-secret", "daemon-secret", "ops:pw"] {
            assert!(!printed.contains(secret), "{secret} leaks: {printed}");
        }
        assert!(printed.contains("<redacted>"), "{printed}");
        assert_eq!(warnings.len(), 4, "{warnings:?}");
    }

    #[test]
    fn a_flagfile_and_the_originals_booleans_work() {
        let path = std::env::temp_dir().join(format!("yadcc-cli-{}.flags", std::process::id()));
        std::fs::write(
            &path,
            "# production\n--acceptable_user_tokens=u\n--acceptable_servant_tokens=s\n--debugging_no_inspect_auth\n",
        )
        .unwrap();
        let (cli, _) = gflags(&[&format!("--flagfile={}", path.display())]);
        assert!(matches!(
            cli.settings().unwrap().http.inspect,
            InspectAccess::Open
        ));
        let (cli, _) = gflags(&[
            &format!("-flagfile={}", path.display()),
            "--nodebugging_no_inspect_auth",
        ]);
        assert!(matches!(
            cli.settings().unwrap().http.inspect,
            InspectAccess::Closed
        ));
        std::fs::remove_file(&path).unwrap();
        let error =
            Cli::parse_gflags(["yadcc-scheduler", "--flagfile=/nonexistent"].map(OsString::from))
                .unwrap_err()
                .to_string();
        assert!(error.contains("/nonexistent"), "{error}");
    }

    #[test]
    fn inspection_is_closed_unless_a_flag_opens_it() {
        let tokens = [
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
        ];
        let access = |extra: &[&str]| {
            let args: Vec<&str> = tokens.iter().chain(extra).copied().collect();
            cli(&args).settings().unwrap().http.inspect
        };
        assert!(matches!(access(&[]), InspectAccess::Closed));
        assert!(matches!(
            access(&["--debugging_no_inspect_auth"]),
            InspectAccess::Open
        ));
        assert!(matches!(
            access(&["--inspect_credential=a:b"]),
            InspectAccess::Credential(_)
        ));
        // The original: the debugging flag wins over a credential.
        assert!(matches!(
            access(&["--inspect_credential=a:b", "--debugging_no_inspect_auth"]),
            InspectAccess::Open
        ));
        // The demo on loopback is open; the demo on the network is not.
        assert!(matches!(access(&["--demo"]), InspectAccess::Open));
        assert!(matches!(
            access(&["--demo", "--listen=0.0.0.0:8336"]),
            InspectAccess::Closed
        ));
    }

    fn user_tokens(flag: &str) -> engine::TokenSet {
        cli(&[
            &format!("--acceptable_user_tokens={flag}"),
            "--acceptable_servant_tokens=s",
        ])
        .settings()
        .unwrap()
        .engine
        .user_tokens
    }

    #[test]
    fn token_lists_are_read_as_the_original_reads_them() {
        // Literal entries: "a, " is `a` and a single space, nothing else.
        let spaced = user_tokens("a, ");
        assert!(spaced.accepts_token("a") && spaced.accepts_token(" "));
        assert!(!spaced.accepts_token("b") && !spaced.accepts_token(""));
        assert!(!spaced.accepts_anyone() && !spaced.accepts_empty_token());
        // An empty entry accepts the empty token (daemons without --token), never anyone.
        let trailing = user_tokens("a,");
        assert!(trailing.accepts_token("") && trailing.accepts_token("a"));
        assert!(!trailing.accepts_token("b") && !trailing.accepts_anyone());
        assert!(trailing.accepts_empty_token(), "warned about at start");
        assert!(user_tokens(",a").accepts_token(""));
        // Only a flag that is empty as a whole keeps the open mode.
        assert!(user_tokens("").accepts_anyone());
    }

    #[test]
    fn a_flagfile_keeps_token_lists_literal() {
        let path = std::env::temp_dir().join(format!("yadcc-tokens-{}.flags", std::process::id()));
        std::fs::write(
            &path,
            "--acceptable_user_tokens=a, \n--acceptable_servant_tokens=s\n",
        )
        .unwrap();
        let (cli, _) = gflags(&[&format!("--flagfile={}", path.display())]);
        std::fs::remove_file(&path).unwrap();
        let tokens = cli.settings().unwrap().engine.user_tokens;
        assert!(tokens.accepts_token(" ") && !tokens.accepts_token("b"));
    }

    #[test]
    fn an_empty_token_list_means_anyone() {
        let settings = cli(&["--acceptable_user_tokens=", "--acceptable_servant_tokens="])
            .settings()
            .unwrap();
        assert_eq!(settings.engine.user_tokens, engine::TokenSet::anyone());
    }
}
