//! What the flags mean once parsed: their value parsers, the checks across
//! flags, and the [`Settings`] the server starts with. Errors say what to pass.

use std::{net::SocketAddr, time::Duration};

use super::Cli;
use crate::{
    admin::AdminTokens,
    dashboard::InspectAccess,
    edge::{self, EdgeSettings},
    engine::{self, Redacted},
    ha::{self, EtcdAccess, EtcdCredentials, HaSettings},
    rpc::state::TransportSettings,
    security::{self, AllowedHosts, SecuritySettings, TlsFiles},
};

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
    pub transport: TransportSettings,
    /// Run the simulated demo cluster against this scheduler.
    pub demo: bool,
    /// A hot standby elected on etcd (`--ha_*`); None: the only scheduler.
    /// `instance` is left empty: `main` names the instance once it listens.
    pub ha: Option<HaSettings>,
    /// What the demo's simulated daemons speak.
    pub demo_protocol: crate::sim::Wire,
    /// Who may act on the farm (`--admin_tokens`; closed when empty).
    pub admin_tokens: AdminTokens,
    /// Where the operators' state lasts without a hot standby (`--state_file`).
    pub state_file: Option<std::path::PathBuf>,
    /// The tenants file to watch for changes (`--tenants_file`), already
    /// read into `engine.tenancy`.
    pub tenants_file: Option<std::path::PathBuf>,
    /// What a reload of the tenants file is checked against, as at start.
    pub tenants_checks: super::tenants_file::Checks,
    /// Mount the benchmark's bare route.
    #[cfg(feature = "bench-route")]
    pub bench_bare_route: bool,
}

impl Cli {
    /// Who may read the inspection pages: the original's rules, plus the
    /// demo, whose data is simulated and which listens on loopback only.
    fn inspect_access(&self, listen: SocketAddr) -> InspectAccess {
        if self.server.debugging_no_inspect_auth {
            return InspectAccess::Open;
        }
        // Empty is the original's default: closed.
        if let Some(credential) = self
            .server
            .inspect_credential
            .as_ref()
            .filter(|credential| !credential.is_empty())
        {
            return InspectAccess::Credential(credential.as_str().into());
        }
        if self.sim.demo && listen.ip().is_loopback() {
            return InspectAccess::Open;
        }
        InspectAccess::Closed
    }

    /// The user and servant token sets: both lists, the demo's public tokens
    /// for a list not given to the demo, or anyone with
    /// `--insecure_accept_any_token`. A list that is missing or empty stops
    /// the start (the original refuses an empty one too).
    fn token_sets(
        &self,
        tenancy: Option<&engine::Tenancy>,
    ) -> Result<(engine::TokenSet, engine::TokenSet), String> {
        if let Some(tenancy) = tenancy {
            return self.tenant_token_sets(tenancy);
        }
        if self.server.insecure_accept_any_token {
            return Ok((engine::TokenSet::anyone(), engine::TokenSet::anyone()));
        }
        let list = |given: &Option<Redacted<String>>, flag: &str, demo: &str| match given {
            Some(tokens) if tokens.is_empty() => Err(format!(
                "{flag} is empty: list at least one token (the original scheduler refuses \
                 to start too), or, to let anyone in, drop both token flags and pass \
                 --insecure_accept_any_token"
            )),
            // The original accepts an empty entry as the empty token (with a
            // warning); a template's unset variable makes one, and then calls
            // without a token pass. Refused, like an empty token in the file.
            Some(tokens) if tokens.split(',').any(str::is_empty) => Err(format!(
                "{flag} has an empty entry (`a,`, `,a` or `a,,b`): the empty token would let \
                 daemons without --token in (a template's unset variable?): remove it, or, \
                 to let anyone in, drop both token flags and pass --insecure_accept_any_token"
            )),
            Some(tokens) => Ok(Some(engine::TokenSet::from_flag(tokens))),
            None => Ok(self.sim.demo.then(|| engine::TokenSet::new([demo]))),
        };
        let user = list(
            &self.server.acceptable_user_tokens,
            "--acceptable_user_tokens",
            crate::sim::DEMO_USER_TOKEN,
        )?;
        let servant = list(
            &self.server.acceptable_servant_tokens,
            "--acceptable_servant_tokens",
            crate::sim::DEMO_SERVANT_TOKEN,
        )?;
        user.zip(servant).ok_or_else(|| {
            "no tokens configured: pass --acceptable_user_tokens=TOKEN[,TOKEN...] \
             (what delegates present) and --acceptable_servant_tokens=TOKEN[,TOKEN...] \
             (what compile servants present), or set YADCC_ACCEPTABLE_USER_TOKENS and \
             YADCC_ACCEPTABLE_SERVANT_TOKENS"
                .to_owned()
        })
    }

    /// The demo's tenants ([`super::demo::DEMO_TENANTS`]) unless user
    /// tokens are given (then they form the one tenant, as without the demo)
    /// or anyone is let in. The servants keep the demo's token unless one is
    /// given.
    fn demo_tenancy(&self) -> Result<Option<engine::Tenancy>, String> {
        if !self.sim.demo
            || self.server.acceptable_user_tokens.is_some()
            || self.server.insecure_accept_any_token
        {
            return Ok(None);
        }
        let mut tenancy = super::tenants_file::parse(super::demo::DEMO_TENANTS)
            .map_err(|error| format!("the demo's tenants:{error}"))?;
        if self.server.acceptable_servant_tokens.is_none() {
            tenancy.servant_tokens = Some(engine::TokenSet::new([crate::sim::DEMO_SERVANT_TOKEN]));
        }
        Ok(Some(tenancy))
    }

    /// With `--tenants_file`: the user tokens are the file's (the engine
    /// reads them from [`engine::Config::tenancy`]), the servants' the
    /// file's or the flag's.
    fn tenant_token_sets(
        &self,
        tenancy: &engine::Tenancy,
    ) -> Result<(engine::TokenSet, engine::TokenSet), String> {
        if self.sim.demo && self.server.tenants_file.is_some() {
            return Err(
                "--demo cannot run with --tenants_file: the simulated daemons \
                 present the demo's own tokens"
                    .to_owned(),
            );
        }
        let servant = match (
            &tenancy.servant_tokens,
            &self.server.acceptable_servant_tokens,
        ) {
            (Some(tokens), _) => tokens.clone(),
            (None, Some(tokens)) if !tokens.is_empty() => engine::TokenSet::from_flag(tokens),
            (None, _) => {
                return Err(
                    "--tenants_file: no servant tokens: add [servants] tokens = [...] \
                     to the file or pass --acceptable_servant_tokens"
                        .to_owned(),
                );
            }
        };
        Ok((engine::TokenSet::new(Vec::<String>::new()), servant))
    }

    /// `--admin_tokens`, checked: not empty when given, and none of them a
    /// daemon's token (a daemon could act on the farm otherwise).
    /// The demo on loopback opens the API to its public token, so the
    /// operators' examples run against it; off loopback a public token
    /// would let anyone act on the farm, so it stays closed there.
    fn admin_tokens(
        &self,
        user: &engine::TokenSet,
        servant: &engine::TokenSet,
        tenancy: Option<&engine::Tenancy>,
        listen: SocketAddr,
    ) -> Result<(AdminTokens, engine::TokenSet), String> {
        let entries: Vec<&str> = match &self.server.admin_tokens {
            Some(flag) => flag.split(',').filter(|token| !token.is_empty()).collect(),
            None if self.sim.demo && listen.ip().is_loopback() => {
                vec![super::demo::DEMO_ADMIN_TOKEN]
            }
            None => return Ok(Default::default()),
        };
        let tokens: Vec<&str> = entries
            .iter()
            .map(|entry| crate::admin::credentials::split_label(entry).1)
            .collect();
        if tokens.is_empty() {
            return Err(
                "--admin_tokens is empty: list at least one token, or leave the flag \
                 out (the admin API is then closed)"
                    .to_owned(),
            );
        }
        let listed =
            |set: &engine::TokenSet, token: &str| !set.accepts_anyone() && set.accepts_token(token);
        // The file's tokens: the same check as on every reload.
        if let (Some(tenancy), Some(path)) = (tenancy, &self.server.tenants_file) {
            super::tenants_file::check_admin_tokens(
                tenancy,
                &engine::TokenSet::new(tokens.iter().copied()),
            )
            .map_err(|error| {
                format!(
                    "--admin_tokens and --tenants_file {}: {error}",
                    path.display()
                )
            })?;
        }
        if tokens
            .iter()
            .any(|token| listed(user, token) || listed(servant, token))
        {
            return Err("--admin_tokens: a token is also a daemon's token \
                 (--acceptable_user_tokens or --acceptable_servant_tokens): operators need \
                 tokens of their own"
                .to_owned());
        }
        Ok((AdminTokens::new(entries), engine::TokenSet::new(tokens)))
    }

    /// The `--ha_*` flags, checked; None without `--ha_etcd_endpoints`.
    fn ha_settings(&self) -> Result<Option<HaSettings>, String> {
        let flags = &self.server;
        let endpoints: Vec<String> = flags
            .ha_etcd_endpoints
            .iter()
            .map(|url| url.trim())
            .filter(|url| !url.is_empty())
            .map(|url| {
                if url.starts_with("http://") || url.starts_with("https://") {
                    Ok(url.to_owned())
                } else if url.contains("://") {
                    Err(format!(
                        "--ha_etcd_endpoints: {url} is not an http:// or https:// URL"
                    ))
                } else {
                    Ok(format!("http://{url}"))
                }
            })
            .collect::<Result<_, _>>()?;
        if endpoints.is_empty() {
            return Ok(None);
        }
        let access = self.etcd_access(&endpoints)?;
        if self.sim.demo {
            return Err("--demo cannot run with --ha_etcd_endpoints".to_owned());
        }
        if flags
            .serving_daemon_token_secret
            .as_ref()
            .is_none_or(|secret| secret.is_empty())
        {
            return Err(
                "--ha_etcd_endpoints needs --serving_daemon_token_secret, the same on \
                 every instance, so the tokens daemons hold stay valid when another instance \
                 takes over (prefer YADCC_SERVING_DAEMON_TOKEN_SECRET)"
                    .to_owned(),
            );
        }
        let ttl = flags.ha_lease_ttl;
        if ttl.subsec_nanos() != 0 || ttl < ha::MIN_LEASE_TTL {
            return Err(format!(
                "--ha_lease_ttl must be whole seconds, at least {}s (etcd's leases are)",
                ha::MIN_LEASE_TTL.as_secs()
            ));
        }
        if flags.ha_election_name.is_empty() {
            return Err("--ha_election_name must not be empty".to_owned());
        }
        Ok(Some(HaSettings {
            endpoints,
            election_name: flags.ha_election_name.clone(),
            lease_ttl: ttl,
            resign_unchecked_after: Some(flags.ha_resign_unchecked_after)
                .filter(|after| !after.is_zero()),
            instance: String::new(),
            access,
            failsafe_secret: self.failsafe_secret()?,
        }))
    }

    /// `--ha_failsafe_secret_file`, read once at start (a trailing newline
    /// is not the secret's).
    fn failsafe_secret(&self) -> Result<Option<crate::engine::Redacted<Vec<u8>>>, String> {
        let Some(path) = &self.server.ha_failsafe_secret_file else {
            return Ok(None);
        };
        let mut secret = std::fs::read(path)
            .map_err(|error| format!("--ha_failsafe_secret_file: {}: {error}", path.display()))?;
        while secret
            .last()
            .is_some_and(|byte| *byte == b'\n' || *byte == b'\r')
        {
            secret.pop();
        }
        if secret.len() < ha::failsafe::MIN_SECRET_BYTES {
            return Err(format!(
                "--ha_failsafe_secret_file: {} holds {} bytes; at least {} (the same \
                 random secret on every instance, e.g. `head -c 32 /dev/urandom | base64`)",
                path.display(),
                secret.len(),
                ha::failsafe::MIN_SECRET_BYTES
            ));
        }
        Ok(Some(crate::engine::Redacted(secret)))
    }

    /// TLS and authentication to etcd, checked against the endpoints'
    /// scheme; the files are read here once, so a wrong one stops the start.
    fn etcd_access(&self, endpoints: &[String]) -> Result<EtcdAccess, String> {
        let flags = &self.server;
        let secure = endpoints
            .iter()
            .filter(|url| url.starts_with("https://"))
            .count();
        if secure != 0 && secure != endpoints.len() {
            return Err(
                "--ha_etcd_endpoints: either every endpoint is https:// or none is".to_owned(),
            );
        }
        let named = |flag: &str, error: String| format!("--{flag}: {error}");
        if secure == 0 {
            if flags.ha_etcd_ca_file.is_some() || flags.ha_etcd_cert_file.is_some() {
                return Err(
                    "--ha_etcd_ca_file and --ha_etcd_cert_file are for https:// etcd endpoints"
                        .to_owned(),
                );
            }
        } else {
            let Some(ca) = &flags.ha_etcd_ca_file else {
                return Err(
                    "https:// etcd endpoints need --ha_etcd_ca_file (the CA etcd's certificates chain to)"
                        .to_owned(),
                );
            };
            security::pem::certificates(ca).map_err(|error| named("ha_etcd_ca_file", error))?;
        }
        let client_identity = flags
            .ha_etcd_cert_file
            .clone()
            .zip(flags.ha_etcd_key_file.clone());
        if let Some((cert, key)) = &client_identity {
            security::pem::certificates(cert).map_err(|error| named("ha_etcd_cert_file", error))?;
            security::pem::private_key(key).map_err(|error| named("ha_etcd_key_file", error))?;
        }
        let credentials = match (&flags.ha_etcd_user, &flags.ha_etcd_password_file) {
            (Some(user), Some(path)) => {
                if user.is_empty() {
                    return Err("--ha_etcd_user must not be empty".to_owned());
                }
                let text = std::fs::read_to_string(path).map_err(|error| {
                    named(
                        "ha_etcd_password_file",
                        format!("{}: {error}", path.display()),
                    )
                })?;
                let password = text.strip_suffix('\n').unwrap_or(&text);
                let password = password.strip_suffix('\r').unwrap_or(password);
                if password.is_empty() || password.contains('\n') {
                    return Err(format!(
                        "--ha_etcd_password_file: {} must hold the password on one line",
                        path.display()
                    ));
                }
                Some(EtcdCredentials {
                    user: user.clone(),
                    password: password.into(),
                })
            }
            _ => None,
        };
        Ok(EtcdAccess {
            ca_file: flags.ha_etcd_ca_file.clone(),
            client_identity,
            credentials,
        })
    }

    /// The connection limits, checked: every timeout above zero, the idle
    /// one at least what stock daemons expect.
    fn edge_settings(&self) -> Result<EdgeSettings, String> {
        if self.server.idle_timeout < edge::MIN_IDLE_TIMEOUT {
            return Err(format!(
                "--idle_timeout must be at least {}s: stock daemons expect idle connections to stay open 60s",
                edge::MIN_IDLE_TIMEOUT.as_secs()
            ));
        }
        for (flag, value) in [
            ("--header_read_timeout", self.server.header_read_timeout),
            ("--body_read_timeout", self.server.body_read_timeout),
        ] {
            if value.is_zero() {
                return Err(format!("{flag} must be more than zero"));
            }
        }
        Ok(EdgeSettings {
            header_read_timeout: self.server.header_read_timeout,
            body_read_timeout: self.server.body_read_timeout,
            idle_timeout: self.server.idle_timeout,
            max_connections: (self.server.max_connections > 0)
                .then_some(self.server.max_connections),
            max_connections_per_ip: (self.server.max_connections_per_ip > 0)
                .then_some(self.server.max_connections_per_ip as usize),
            max_calls_in_flight_per_connection: self.server.max_calls_in_flight_per_connection
                as usize,
            max_buffered_body_bytes: usize::try_from(self.server.max_buffered_body_bytes)
                .map_err(|_| "--max_buffered_body_bytes is too large".to_owned())?,
            shutdown_grace: self.server.shutdown_grace,
            http2_max_concurrent_streams: self.server.http2_max_concurrent_streams,
        })
    }

    /// `--cors_allowed_origins`, each a valid header value.
    fn cors_allowed_origins(&self) -> Result<Vec<axum::http::HeaderValue>, String> {
        self.server
            .cors_allowed_origins
            .iter()
            .map(|origin| origin.trim())
            .filter(|origin| !origin.is_empty())
            .map(|origin| {
                axum::http::HeaderValue::from_str(origin).map_err(|_| {
                    format!("--cors_allowed_origins: {origin:?} is not a valid origin")
                })
            })
            .collect()
    }

    /// The engine's configuration from the checked token sets and tenants.
    fn engine_config(
        &self,
        user_tokens: engine::TokenSet,
        servant_tokens: engine::TokenSet,
        tenancy: Option<engine::Tenancy>,
    ) -> engine::Config {
        engine::Config {
            user_tokens,
            servant_tokens,
            min_daemon_version: self.server.min_daemon_version,
            servant_min_memory_for_accepting_new_task: self
                .server
                .servant_min_memory_for_accepting_new_task,
            serving_daemon_token_rollout_interval: Duration::from_secs(
                self.server.serving_daemon_token_rollout_interval,
            ),
            serving_daemon_token_secret: self
                .server
                .serving_daemon_token_secret
                .as_ref()
                .map(|secret| secret.as_bytes().to_vec().into()),
            adoption_window: Duration::from_secs(self.server.adoption_window),
            foreign_load_from_own_average: self.server.foreign_load_from_own_average,
            place_by_observed_speed: self.server.place_by_observed_speed,
            eject_broken_servants: self.server.eject_broken_servants,
            limits: engine::Limits {
                max_waiters: self.server.max_waiters as usize,
                max_waiters_per_requester: self.server.max_waiters_per_requester as usize,
                ..engine::Limits::default()
            },
            tenancy,
            ..engine::Config::default()
        }
    }

    /// TLS and the inspection credential's transport rule.
    fn security_settings(&self) -> SecuritySettings {
        SecuritySettings {
            tls: self
                .server
                .tls_cert_file
                .clone()
                .zip(self.server.tls_key_file.clone())
                .map(|(cert, key)| TlsFiles {
                    cert,
                    key,
                    client_ca: self.server.tls_client_ca_file.clone(),
                }),
            allow_plaintext_inspection: self.server.allow_plaintext_inspection,
            guessing_ipv6_prefix: self.server.guessing_ipv6_prefix,
            allowed_hosts: AllowedHosts::new(
                machine_name()
                    .into_iter()
                    .chain(self.server.allowed_hosts.iter().cloned()),
            ),
        }
    }

    /// Checks the flags and turns them into settings. Errors say what to pass.
    pub fn settings(&self) -> Result<Settings, String> {
        let listen = self.server.listen.unwrap_or_else(|| {
            // The demo's tokens are public: keep it off the network.
            let ip = if self.sim.demo {
                [127, 0, 0, 1]
            } else {
                [0, 0, 0, 0]
            };
            SocketAddr::from((ip, self.server.port))
        });
        let tenancy = match &self.server.tenants_file {
            Some(path) => Some(super::tenants_file::read(path)?),
            None => self.demo_tenancy()?,
        };
        let (user_tokens, servant_tokens) = self.token_sets(tenancy.as_ref())?;
        let (admin_tokens, admin_token_set) =
            self.admin_tokens(&user_tokens, &servant_tokens, tenancy.as_ref(), listen)?;
        let ha = self.ha_settings()?;
        if ha.is_some() && self.server.state_file.is_some() {
            return Err(
                "--state_file is for a single scheduler: with --ha_etcd_endpoints the \
                 operators' state lasts in etcd, where every instance reads it"
                    .to_owned(),
            );
        }
        if let Some(credential) = &self.server.inspect_credential
            && !credential.is_empty()
            && !credential.contains(':')
        {
            return Err("--inspect_credential must be user:password".to_owned());
        }
        let max_body_bytes = usize::try_from(self.server.max_body_bytes)
            .map_err(|_| "--max_body_bytes is too large".to_owned())?;
        let max_running_tasks_bytes = usize::try_from(self.server.max_running_tasks_bytes)
            .map_err(|_| "--max_running_tasks_bytes is too large".to_owned())?;
        let edge = self.edge_settings()?;
        let cors_allowed_origins = self.cors_allowed_origins()?;
        let engine = self.engine_config(user_tokens, servant_tokens, tenancy);
        Ok(Settings {
            listen,
            engine,
            transport: TransportSettings {
                max_body_bytes,
                max_running_tasks_bytes,
                trusted_proxies: self.server.trusted_proxies.clone(),
                inspect: self.inspect_access(listen),
                edge,
                cors_allowed_origins,
                access_log: self.server.access_log,
                security: self.security_settings(),
            },
            ha,
            demo: self.sim.demo,
            demo_protocol: self.sim.protocol,
            admin_tokens,
            state_file: self.server.state_file.clone(),
            tenants_file: self.server.tenants_file.clone(),
            tenants_checks: super::tenants_file::Checks {
                admin_tokens: admin_token_set,
            },
            #[cfg(feature = "bench-route")]
            bench_bare_route: self.sim.bench_bare_route,
        })
    }
}

/// This machine's name (what a browser on the office network reaches it
/// by), if the kernel says.
fn machine_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}
