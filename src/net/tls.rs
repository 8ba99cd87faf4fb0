//! TLS on the daemons' port: a connection whose first byte is a handshake
//! record (0x16) is decrypted here and then served by hyper, HTTP/2 or
//! HTTP/1.1 as ALPN chose; the stock daemons' plaintext protocols keep the
//! same port. The certificate and key are read again when their files
//! change (new connections get the new pair, open ones keep theirs); a pair
//! that does not load keeps the previous one, with an error in the log and
//! `yadcc_scheduler_tls_reload_failures`. With a client CA (reloaded the
//! same way), a client certificate it signed makes the connection's
//! requests an authenticated inspector's ([`ClientCertificate`]); a
//! connection without one is still served, as the dashboard's other
//! credential may come.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, RwLock},
    time::{Duration, SystemTime},
};

use sha2::{Digest, Sha256};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        self, RootCertStore, ServerConfig,
        crypto::{CryptoProvider, ring},
        pki_types::CertificateDer,
        server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier},
        sign::CertifiedKey,
    },
};

use bytes::BytesMut;
use tokio::{net::TcpStream, sync::watch};

use super::{
    Listener,
    io::{Activity, Rewind},
    serve_hyper,
};
use crate::{
    admin::ClientCertificate,
    edge::Proof,
    security::{SecurityCounters, TlsFiles, pem},
};

const LOG: &str = "yadcc_scheduler::tls";

/// The first byte of a TLS record carrying a handshake (a ClientHello).
pub const HANDSHAKE_RECORD: u8 = 0x16;

/// How often the certificate and key files are looked at for a change
/// (their modification time and length).
pub const RELOAD_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// ALPN: HTTP/2 first (gRPC needs it), then HTTP/1.1.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// What a change of the files is detected by.
type Stamp = Option<(SystemTime, u64)>;

/// The certificate's and the key's stamps, and the client CA's.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamps {
    pair: (Stamp, Stamp),
    client_ca: Stamp,
}

impl Stamps {
    fn of(files: &TlsFiles) -> Stamps {
        Stamps {
            pair: (stamp(&files.cert), stamp(&files.key)),
            client_ca: files.client_ca.as_deref().and_then(stamp),
        }
    }
}

fn stamp(path: &Path) -> Stamp {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// The pair served to new connections, replaced when the files change.
#[derive(Debug)]
struct Reloading {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.current.read().unwrap_or_else(|p| p.into_inner()),
        ))
    }
}

/// What the watcher replaces: the pair (inside the configuration, through
/// its resolver) and, when the client CA changes, the whole configuration
/// (rustls fixes a configuration's client verifier).
struct Served {
    provider: Arc<CryptoProvider>,
    pair: Arc<Reloading>,
    acceptor: RwLock<TlsAcceptor>,
}

/// A configuration serving the reloading `pair` and asking for client
/// certificates `client_ca` signed, if given.
fn server_config(
    provider: &Arc<CryptoProvider>,
    pair: &Arc<Reloading>,
    client_ca: Option<&Path>,
) -> Result<ServerConfig, String> {
    let builder = ServerConfig::builder_with_provider(Arc::clone(provider))
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS: {error}"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for certificate in pem::certificates(path)?.1 {
                roots
                    .add(certificate)
                    .map_err(|error| format!("--tls_client_ca_file {}: {error}", path.display()))?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
                    .allow_unauthenticated()
                    .build()
                    .map_err(|error| format!("--tls_client_ca_file {}: {error}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(Arc::clone(pair) as _);
    config.alpn_protocols = ALPN.iter().map(|protocol| protocol.to_vec()).collect();
    Ok(config)
}

/// The listener's TLS side: the acceptor and the reloading files behind it.
#[derive(Clone)]
pub struct Tls {
    served: Arc<Served>,
    /// Whether client certificates are asked for.
    verifies_clients: bool,
}

impl Tls {
    /// Loads the files (an error names the file and what is wrong) and
    /// starts watching them for changes. Must run inside a tokio runtime.
    pub fn start(files: &TlsFiles, counters: SecurityCounters) -> Result<Tls, String> {
        let provider = Arc::new(ring::default_provider());
        // Taken before the files are read, not when the watcher first runs
        // (late on a busy machine): a change in between is then seen.
        let loaded = Stamps::of(files);
        let pair = Arc::new(Reloading {
            current: RwLock::new(Arc::new(load_pair(files, &provider)?)),
        });
        let config = server_config(&provider, &pair, files.client_ca.as_deref())?;
        let served = Served {
            provider,
            pair,
            acceptor: RwLock::new(TlsAcceptor::from(Arc::new(config))),
        };
        let served = Arc::new(served);
        tokio::spawn(watch(
            Arc::downgrade(&served),
            files.clone(),
            loaded,
            counters,
        ));
        Ok(Tls {
            served,
            verifies_clients: files.client_ca.is_some(),
        })
    }

    /// The acceptor of a new connection: the files' latest that loaded.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.served
            .acceptor
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The verified client certificate of a finished handshake, if any.
    pub fn client_certificate(
        &self,
        connection: &rustls::ServerConnection,
    ) -> Option<ClientCertificate> {
        if !self.verifies_clients {
            return None;
        }
        let leaf = connection.peer_certificates()?.first()?;
        Some(ClientCertificate {
            subject: subject_name(leaf).into(),
        })
    }
}

/// Looks at the files every [`RELOAD_CHECK_PERIOD`] until the listener is
/// gone; a changed pair that loads replaces the served one, a changed
/// client CA that loads the verifier of new connections.
async fn watch(
    served: std::sync::Weak<Served>,
    files: TlsFiles,
    mut loaded: Stamps,
    counters: SecurityCounters,
) {
    let mut ticks = tokio::time::interval(RELOAD_CHECK_PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(served) = served.upgrade() else {
            return;
        };
        let now = Stamps::of(&files);
        if now == loaded {
            continue;
        }
        // Remembered also when it fails: one error per change, not one per tick.
        let before = std::mem::replace(&mut loaded, now);
        if now.pair != before.pair {
            match load_pair(&files, &served.provider) {
                Ok(pair) => {
                    *served
                        .pair
                        .current
                        .write()
                        .unwrap_or_else(|p| p.into_inner()) = Arc::new(pair);
                    tracing::info!(
                        target: LOG,
                        "TLS certificate reloaded from {}",
                        files.cert.display()
                    );
                }
                Err(error) => {
                    counters.tls_reload_failed();
                    tracing::error!(
                        target: LOG,
                        "TLS files changed but do not load; still serving the previous certificate: {error}"
                    );
                }
            }
        }
        if let Some(client_ca) = &files.client_ca
            && now.client_ca != before.client_ca
        {
            match server_config(&served.provider, &served.pair, Some(client_ca)) {
                Ok(config) => {
                    *served.acceptor.write().unwrap_or_else(|p| p.into_inner()) =
                        TlsAcceptor::from(Arc::new(config));
                    tracing::info!(
                        target: LOG,
                        "TLS client CA reloaded from {}",
                        client_ca.display()
                    );
                }
                Err(error) => {
                    counters.tls_reload_failed();
                    tracing::error!(
                        target: LOG,
                        "the client CA changed but does not load; still verifying with the previous one: {error}"
                    );
                }
            }
        }
    }
}

/// The chain and key, checked to belong together.
fn load_pair(files: &TlsFiles, provider: &CryptoProvider) -> Result<CertifiedKey, String> {
    let (_, chain) = pem::certificates(&files.cert)?;
    let (_, key) = pem::private_key(&files.key)?;
    CertifiedKey::from_der(chain, key, provider).map_err(|error| {
        format!(
            "{} and {}: {error}",
            files.cert.display(),
            files.key.display()
        )
    })
}

/// The name the audit and the logs give a client certificate: `CN=<common
/// name>` of its subject when it has one, and always its SHA-256 prefix
/// (a common name alone can be shared by certificates).
fn subject_name(certificate: &CertificateDer<'_>) -> String {
    let digest = hex::encode(Sha256::digest(certificate.as_ref()));
    match der::common_name(certificate.as_ref()) {
        Some(name) => format!("CN={name} sha256:{}", &digest[..16]),
        None => format!("sha256:{}", &digest[..16]),
    }
}

/// Just enough DER to find a certificate's subject common name.
mod der {
    /// 2.5.4.3, id-at-commonName.
    const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

    /// One element: (tag, contents, rest).
    fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 || rest.len() < count {
                return None;
            }
            let len = rest[..count]
                .iter()
                .fold(0usize, |len, &byte| (len << 8) | usize::from(byte));
            (len, &rest[count..])
        };
        (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
    }

    pub(super) fn common_name(certificate: &[u8]) -> Option<String> {
        let (_, certificate, _) = element(certificate)?;
        let (_, mut tbs, _) = element(certificate)?;
        // [0] version (optional), serial, signature, issuer, validity, subject.
        if tbs.first() == Some(&0xa0) {
            tbs = element(tbs)?.2;
        }
        for _ in 0..4 {
            tbs = element(tbs)?.2;
        }
        let (_, mut subject, _) = element(tbs)?;
        while !subject.is_empty() {
            let (_, set, rest) = element(subject)?;
            subject = rest;
            let (_, attribute, _) = element(set)?;
            let (_, oid, value) = element(attribute)?;
            if oid == COMMON_NAME {
                let (_, name, _) = element(value)?;
                return String::from_utf8(name.to_vec()).ok();
            }
        }
        None
    }
}

/// How a hyper connection was secured: its requests are marked
/// [`OverTls`], and carry the verified client certificate if one came.
pub(super) struct Secured {
    pub(super) certificate: Option<ClientCertificate>,
}

/// The handshake within the head-read timeout, then hyper over the
/// decrypted stream.
pub(super) async fn serve(
    shared: &Listener,
    stream: TcpStream,
    peer: SocketAddr,
    first: BytesMut,
    stopping: watch::Receiver<bool>,
    proof: Proof,
) {
    let Some(tls) = &shared.tls else {
        return;
    };
    let activity = Activity::new();
    let raw = Rewind::new(first.freeze(), stream, activity.clone());
    let handshake =
        tokio::time::timeout(shared.edge.header_read_timeout, tls.acceptor().accept(raw)).await;
    let stream = match handshake {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) => {
            shared.state.security.counters.tls_handshake_failed();
            tracing::debug!(target: super::LOG, %peer, "TLS handshake failed: {error}");
            return;
        }
        Err(_) => {
            shared.state.security.counters.tls_handshake_failed();
            return;
        }
    };
    let secured = Secured {
        certificate: tls.client_certificate(stream.get_ref().1),
    };
    serve_hyper(
        shared,
        stream,
        activity,
        Some(secured),
        peer,
        stopping,
        proof,
    )
    .await;
}
