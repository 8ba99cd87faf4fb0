//! Transport security as plain data and rules, below everything that uses
//! them: the TLS files (`--tls_*`; the listener in [`crate::net`]'s `tls`
//! serves them), the mark a TLS connection puts on each of its requests
//! ([`OverTls`]), the rule for the inspection credential over plain HTTP
//! ([`SecuritySettings::refuses_plaintext_credential`]), the limit on guessing a
//! credential ([`Guessing`]) and the counters `/metrics` shows
//! ([`SecurityCounters`]). A leaf: the dashboard, the call core and the
//! listener read it.

mod guessing;
mod hosts;

use std::{net::IpAddr, path::PathBuf, sync::Arc, time::Duration};

pub use guessing::{
    DEFAULT_IPV6_PREFIX, FIRST_LOCKOUT, Failure, GUESS_WINDOW, GUESSES_PER_WINDOW, Guessing,
    LOCKOUT_MEMORY, MAX_LOCKOUT, MAX_TRACKED_BLOCKS, SLOWED_ANSWER,
};
pub use hosts::AllowedHosts;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecuritySettings {
    /// TLS on the listening port beside the plaintext protocols; None: none.
    pub tls: Option<TlsFiles>,
    /// `--allow_plaintext_inspection`: with TLS configured, accept the
    /// inspection credential over plain HTTP from any address anyway (a
    /// proxy in front terminates TLS).
    pub allow_plaintext_inspection: bool,
    /// `--guessing_ipv6_prefix`: IPv6 clients share a guessing limit per
    /// this prefix.
    pub guessing_ipv6_prefix: u8,
    /// Rule "no rebinding": the machine's name and `--allowed_hosts`.
    pub allowed_hosts: AllowedHosts,
}

impl Default for SecuritySettings {
    fn default() -> Self {
        SecuritySettings {
            tls: None,
            allow_plaintext_inspection: false,
            guessing_ipv6_prefix: DEFAULT_IPV6_PREFIX,
            allowed_hosts: AllowedHosts::default(),
        }
    }
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
    /// An operator's bearer token on the admin API.
    AdminToken,
}

impl Surface {
    pub const ALL: [Surface; 3] = [Surface::Inspect, Surface::RpcToken, Surface::AdminToken];

    pub fn label(self) -> &'static str {
        match self {
            Surface::Inspect => "inspect",
            Surface::RpcToken => "rpc_token",
            Surface::AdminToken => "admin_token",
        }
    }

    /// The credential's name in the log.
    fn described(self) -> &'static str {
        match self {
            Surface::Inspect => "inspection credential",
            Surface::RpcToken => "daemon token",
            Surface::AdminToken => "admin token",
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
    tls_certificate_expiry: Gauge,
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
            "Credentials presented and refused, by surface (inspect: basic auth; rpc_token: a daemon's token; admin_token: an operator's bearer token)",
            self.failed_credentials.clone(),
        );
        registry.register(
            "guesses_refused",
            "Wrong credentials answered slowly (after 1 s) because their address block failed too many credentials, by surface",
            self.guesses_refused.clone(),
        );
        registry.register(
            "tls_reload_failures",
            "Replaced TLS certificate or key files that did not load (the previous pair is still served)",
            self.tls_reload_failures.clone(),
        );
        registry.register(
            "tls_certificate_expiry_timestamp_seconds",
            "When the served TLS certificate expires (its notAfter), in seconds since the Unix epoch; 0 without TLS. The log warns at start and on reload with less than 30 days left",
            self.tls_certificate_expiry.clone(),
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

    fn guess_refused(&self, surface: Surface) {
        self.guesses_refused
            .get_or_create(&SurfaceLabels {
                surface: surface.label(),
            })
            .inc();
    }

    pub fn tls_reload_failed(&self) {
        self.tls_reload_failures.inc();
    }

    /// The served certificate's `notAfter` (seconds since the epoch).
    pub fn tls_certificate_expires(&self, not_after: i64) {
        self.tls_certificate_expiry.set(not_after);
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

/// What the dashboard, the call core and the listener share of it.
#[derive(Debug, Clone, Default)]
pub struct Security {
    pub settings: SecuritySettings,
    pub counters: SecurityCounters,
    pub guessing: Arc<Guessing>,
}

/// Target of the guessing limit's lines.
pub const GUESSING_LOG: &str = "yadcc_scheduler::guessing";

impl Security {
    pub fn new(settings: SecuritySettings) -> Self {
        Security {
            guessing: Arc::new(Guessing::new(settings.guessing_ipv6_prefix)),
            settings,
            counters: SecurityCounters::new(),
        }
    }

    /// Rule "guessing costs time", the one place every surface reports a
    /// wrong credential from `peer`: counted, logged (warnings are limited
    /// to a line a second per call site, `logging`), and, if `peer`'s block
    /// is slowed, answered only after [`SLOWED_ANSWER`]. Some(what is left
    /// of the slowed period, for `Retry-After`) when it was slowed.
    ///
    /// A right credential is never slowed, so a guesser behind an office's
    /// NAT address cannot lock its operators out; the cost of that is that
    /// a slowed block still learns which guess was right, at a second of a
    /// connection per wrong guess (see docs/security.md).
    pub async fn wrong_credential(&self, surface: Surface, peer: IpAddr) -> Option<Duration> {
        self.counters.failed_credential(surface);
        let failure = self.guessing.failed(peer);
        let block = self.guessing.block(peer);
        if let Some(lockout) = failure.started {
            tracing::warn!(
                target: GUESSING_LOG,
                %peer,
                %block,
                surface = surface.label(),
                "{GUESSES_PER_WINDOW} failed credentials within {} s: wrong credentials from \
                 this block are answered after {} s for the next {} s (right ones pass)",
                GUESS_WINDOW.as_secs(),
                SLOWED_ANSWER.as_secs(),
                lockout.as_secs()
            );
        } else if failure.slowed.is_none() {
            tracing::warn!(
                target: GUESSING_LOG,
                %peer,
                surface = surface.label(),
                "{} refused",
                surface.described()
            );
        }
        let left = failure.slowed?;
        self.counters.guess_refused(surface);
        tokio::time::sleep(SLOWED_ANSWER).await;
        Some(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
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
            ..SecuritySettings::default()
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
        if is_encrypted(&pem) {
            return Err(named(path, &ENCRYPTED_KEY));
        }
        let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|error| named(path, &error))?;
        Ok((pem, key))
    }

    /// Why an encrypted key is refused, and what to do: the scheduler
    /// starts unattended (a unit, a pod), where nobody types a passphrase.
    const ENCRYPTED_KEY: &str = "the private key is encrypted with a passphrase, and the \
         scheduler reads unencrypted keys only (it starts unattended): decrypt it once with \
         `openssl pkey -in KEY -out KEY.plain` and protect that file instead (mode 0600, \
         owned by the scheduler's user)";

    /// PKCS#8 `ENCRYPTED PRIVATE KEY`, or OpenSSL's traditional format with
    /// `Proc-Type: 4,ENCRYPTED` (rustls-pki-types sees neither as a key and
    /// would only say that there is none).
    fn is_encrypted(pem: &[u8]) -> bool {
        let text = String::from_utf8_lossy(pem);
        text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")
            || text.contains("Proc-Type: 4,ENCRYPTED")
    }
}
