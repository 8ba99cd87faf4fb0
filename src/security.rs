//! Transport security as plain data and rules, below everything that uses
//! them: the TLS files (`--tls_*`; the listener in [`crate::net`]'s `tls`
//! serves them), the mark a TLS connection puts on each of its requests
//! ([`OverTls`]), the rule for the inspection credential over plain HTTP
//! ([`SecuritySettings::refuses_plaintext_credential`]), the limit on guessing a
//! credential ([`Guessing`]) and the counters `/metrics` shows
//! ([`SecurityCounters`]). A leaf: the dashboard, the call core and the
//! listener read it.

use std::{
    collections::HashMap,
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};
use tokio::time::Instant;

/// The certificate, key and optional client CA (`--tls_cert_file`,
/// `--tls_key_file`, `--tls_client_ca_file`), all PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, the server's own first.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Client certificates it signed are authenticated inspectors (mTLS).
    pub client_ca: Option<PathBuf>,
}

/// What the transport is asked to secure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecuritySettings {
    /// TLS on the listening port beside the plaintext protocols; None: none.
    pub tls: Option<TlsFiles>,
    /// `--allow_plaintext_inspection`: with TLS configured, accept the
    /// inspection credential over plain HTTP from any address anyway (a
    /// proxy in front terminates TLS).
    pub allow_plaintext_inspection: bool,
}

impl SecuritySettings {
    /// Rule "credentials over TLS": with TLS configured, the inspection
    /// credential is refused on a plaintext connection except from loopback
    /// (where nobody can listen in) or when the operator allowed it; a
    /// refused credential is never checked, so plain HTTP is no oracle.
    pub fn refuses_plaintext_credential(&self, over_tls: bool, peer: IpAddr) -> bool {
        self.tls.is_some()
            && !over_tls
            && !self.allow_plaintext_inspection
            && !peer.to_canonical().is_loopback()
    }
}

/// Put by the listener into the extensions of every request that came over
/// TLS; absent on a plaintext connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverTls;

/// Where a credential was presented, as `/metrics` labels its failures.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Surface {
    /// The inspection credential (basic auth on the dashboard, `/api/v1/*`,
    /// `/inspect/*`).
    Inspect,
    /// A daemon's token on an RPC (STATUS_ACCESS_DENIED).
    RpcToken,
}

impl Surface {
    pub const ALL: [Surface; 2] = [Surface::Inspect, Surface::RpcToken];

    pub fn label(self) -> &'static str {
        match self {
            Surface::Inspect => "inspect",
            Surface::RpcToken => "rpc_token",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SurfaceLabels {
    surface: &'static str,
}

/// The counters of transport security, registered on `/metrics` by
/// [`crate::metrics::Metrics::register_security`]; cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct SecurityCounters {
    failed_credentials: Family<SurfaceLabels, Counter>,
    guesses_refused: Family<SurfaceLabels, Counter>,
    tls_reload_failures: Counter,
    tls_handshake_failures: Counter,
}

impl SecurityCounters {
    pub fn new() -> Self {
        let counters = Self::default();
        for surface in Surface::ALL {
            let labels = SurfaceLabels {
                surface: surface.label(),
            };
            drop(counters.failed_credentials.get_or_create(&labels));
            drop(counters.guesses_refused.get_or_create(&labels));
        }
        counters
    }

    /// Registers every family on `registry` (the scheduler's prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "failed_credentials",
            "Credentials presented and refused, by surface (inspect: basic auth; rpc_token: a daemon's token)",
            self.failed_credentials.clone(),
        );
        registry.register(
            "guesses_refused",
            "Requests answered 429 because their address failed too many credentials (--inspect_credential's limit)",
            self.guesses_refused.clone(),
        );
        registry.register(
            "tls_reload_failures",
            "Replaced TLS certificate or key files that did not load (the previous pair is still served)",
            self.tls_reload_failures.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS connections closed during the handshake (bad client certificate, no common protocol)",
            self.tls_handshake_failures.clone(),
        );
    }

    pub fn failed_credential(&self, surface: Surface) {
        self.failed_credentials
            .get_or_create(&SurfaceLabels {
                surface: surface.label(),
            })
            .inc();
    }

    pub fn guess_refused(&self, surface: Surface) {
        self.guesses_refused
            .get_or_create(&SurfaceLabels {
                surface: surface.label(),
            })
            .inc();
    }

    pub fn tls_reload_failed(&self) {
        self.tls_reload_failures.inc();
    }

    pub fn tls_handshake_failed(&self) {
        self.tls_handshake_failures.inc();
    }

    /// For tests: failed credentials counted on `surface`.
    pub fn failed_credentials(&self, surface: Surface) -> u64 {
        self.failed_credentials
            .get_or_create(&SurfaceLabels {
                surface: surface.label(),
            })
            .get()
    }
}

/// Failed credentials an address may present in one [`GUESS_WINDOW`] before
/// it is refused for a while.
pub const GUESSES_PER_WINDOW: u32 = 10;
/// The window over which [`GUESSES_PER_WINDOW`] counts.
pub const GUESS_WINDOW: Duration = Duration::from_secs(60);
/// The first refusal lasts this long; each further one twice the last.
pub const FIRST_LOCKOUT: Duration = Duration::from_secs(60);
/// The longest refusal.
pub const MAX_LOCKOUT: Duration = Duration::from_secs(3600);
/// An address without a failure for this long starts again from
/// [`FIRST_LOCKOUT`].
pub const LOCKOUT_MEMORY: Duration = Duration::from_secs(6 * 3600);
/// Addresses tracked at most; past it, the quietest are forgotten first.
pub const MAX_TRACKED_ADDRESSES: usize = 16_384;

/// One address's recent failures.
#[derive(Debug, Clone, Copy)]
struct Attempts {
    window_started: Instant,
    failures: u32,
    /// Refusals so far (each twice as long as the one before).
    lockouts: u32,
    refused_until: Option<Instant>,
    last_failure: Instant,
}

/// Rule "guessing costs time": per address block ([`crate::edge::address_block`]),
/// [`GUESSES_PER_WINDOW`] failed credentials a [`GUESS_WINDOW`], then every
/// request presenting one is refused (429, `Retry-After`) for
/// [`FIRST_LOCKOUT`], doubling up to [`MAX_LOCKOUT`]. Only the inspection
/// credential is limited: a daemon's token is counted, never limited (one
/// misconfigured daemon must not lock its office's NAT address out).
#[derive(Debug, Default)]
pub struct Guessing {
    addresses: Mutex<HashMap<IpAddr, Attempts>>,
}

impl Guessing {
    /// Err(how long until it may try again) while `peer` is refused.
    pub fn check(&self, peer: IpAddr) -> Result<(), Duration> {
        let now = Instant::now();
        let addresses = self.addresses.lock().unwrap_or_else(|p| p.into_inner());
        match addresses
            .get(&crate::edge::address_block(peer))
            .and_then(|attempts| attempts.refused_until)
        {
            Some(until) if until > now => Err(until - now),
            _ => Ok(()),
        }
    }

    /// Counts a failed credential from `peer`; Some(the refusal's length)
    /// when this one starts a refusal.
    pub fn failed(&self, peer: IpAddr) -> Option<Duration> {
        let now = Instant::now();
        let block = crate::edge::address_block(peer);
        let mut addresses = self.addresses.lock().unwrap_or_else(|p| p.into_inner());
        if addresses.len() >= MAX_TRACKED_ADDRESSES && !addresses.contains_key(&block) {
            forget_quietest(&mut addresses, now);
        }
        let attempts = addresses.entry(block).or_insert(Attempts {
            window_started: now,
            failures: 0,
            lockouts: 0,
            refused_until: None,
            last_failure: now,
        });
        if now.duration_since(attempts.last_failure) >= LOCKOUT_MEMORY {
            attempts.lockouts = 0;
        }
        if now.duration_since(attempts.window_started) >= GUESS_WINDOW {
            attempts.window_started = now;
            attempts.failures = 0;
        }
        attempts.last_failure = now;
        attempts.failures += 1;
        if attempts.failures < GUESSES_PER_WINDOW {
            return None;
        }
        let lockout = FIRST_LOCKOUT
            .saturating_mul(1u32 << attempts.lockouts.min(16))
            .min(MAX_LOCKOUT);
        attempts.lockouts += 1;
        attempts.failures = 0;
        attempts.window_started = now + lockout;
        attempts.refused_until = Some(now + lockout);
        Some(lockout)
    }
}

/// Makes room: first every address whose failures are all old, then, if an
/// attacker's many addresses still fill the table, the longest quiet half.
fn forget_quietest(addresses: &mut HashMap<IpAddr, Attempts>, now: Instant) {
    addresses.retain(|_, attempts| {
        now.duration_since(attempts.last_failure) < GUESS_WINDOW
            || attempts.refused_until.is_some_and(|until| until > now)
    });
    if addresses.len() >= MAX_TRACKED_ADDRESSES {
        let mut quiet: Vec<_> = addresses
            .iter()
            .map(|(ip, attempts)| (attempts.last_failure, *ip))
            .collect();
        quiet.sort_unstable();
        for (_, ip) in quiet.iter().take(quiet.len() / 2) {
            addresses.remove(ip);
        }
    }
}

/// What the dashboard, the call core and the listener share of it.
#[derive(Debug, Clone, Default)]
pub struct Security {
    pub settings: SecuritySettings,
    pub counters: SecurityCounters,
    pub guessing: Arc<Guessing>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn ten_failures_a_minute_then_a_refusal_that_doubles() {
        let guessing = Guessing::default();
        let guesser = ip("192.0.2.7");
        for _ in 1..GUESSES_PER_WINDOW {
            assert_eq!(guessing.failed(guesser), None);
            assert_eq!(guessing.check(guesser), Ok(()));
        }
        assert_eq!(guessing.failed(guesser), Some(FIRST_LOCKOUT));
        assert_eq!(guessing.check(guesser), Err(FIRST_LOCKOUT));
        assert_eq!(guessing.check(ip("192.0.2.8")), Ok(()), "another address");

        tokio::time::advance(FIRST_LOCKOUT).await;
        assert_eq!(guessing.check(guesser), Ok(()));
        for _ in 1..GUESSES_PER_WINDOW {
            assert_eq!(guessing.failed(guesser), None);
        }
        assert_eq!(guessing.failed(guesser), Some(2 * FIRST_LOCKOUT));
        tokio::time::advance(FIRST_LOCKOUT).await;
        assert_eq!(guessing.check(guesser), Err(FIRST_LOCKOUT));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_spread_over_minutes_are_never_refused() {
        let guessing = Guessing::default();
        let guesser = ip("2001:db8::1");
        for _ in 0..5 * GUESSES_PER_WINDOW {
            assert_eq!(guessing.failed(guesser), None);
            tokio::time::advance(GUESS_WINDOW / (GUESSES_PER_WINDOW - 2)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_slash_64_guesses_as_one_address() {
        let guessing = Guessing::default();
        for host in 0..GUESSES_PER_WINDOW {
            guessing.failed(ip(&format!("2001:db8:0:1::{host:x}")));
        }
        assert!(guessing.check(ip("2001:db8:0:1::ffff")).is_err());
        assert!(guessing.check(ip("2001:db8:0:2::1")).is_ok());
    }

    #[test]
    fn the_plaintext_rule_needs_tls_configured_and_spares_loopback() {
        let peer = ip("192.0.2.1");
        assert!(!SecuritySettings::default().refuses_plaintext_credential(false, peer));
        let with_tls = SecuritySettings {
            tls: Some(TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: None,
            }),
            allow_plaintext_inspection: false,
        };
        assert!(with_tls.refuses_plaintext_credential(false, peer));
        assert!(!with_tls.refuses_plaintext_credential(true, peer));
        assert!(!with_tls.refuses_plaintext_credential(false, ip("127.0.0.1")));
        assert!(!with_tls.refuses_plaintext_credential(false, ip("::ffff:127.0.0.1")));
        let allowed = SecuritySettings {
            allow_plaintext_inspection: true,
            ..with_tls
        };
        assert!(!allowed.refuses_plaintext_credential(false, peer));
    }
}

/// PEM files read once for everyone who needs them (the listener's TLS and
/// the etcd client), with errors that name the file.
pub mod pem {
    use std::path::Path;

    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

    fn named(path: &Path, error: &dyn std::fmt::Display) -> String {
        format!("{}: {error}", path.display())
    }

    /// A PEM file's bytes and the certificates in it, at least one, each
    /// parsed (tonic would drop a bad one silently and fail every handshake
    /// later).
    pub fn certificates(path: &Path) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), String> {
        let pem = std::fs::read(path).map_err(|error| named(path, &error))?;
        let certificates = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| named(path, &error))?;
        if certificates.is_empty() {
            return Err(named(path, &"no PEM certificate in it"));
        }
        Ok((pem, certificates))
    }

    /// A PEM file's bytes and the private key in it.
    pub fn private_key(path: &Path) -> Result<(Vec<u8>, PrivateKeyDer<'static>), String> {
        let pem = std::fs::read(path).map_err(|error| named(path, &error))?;
        let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|error| named(path, &error))?;
        Ok((pem, key))
    }
}
