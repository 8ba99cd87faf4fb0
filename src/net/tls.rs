//! TLS on the daemons' port: a connection whose first byte is a handshake
//! record (0x16) is decrypted here and then served by hyper, HTTP/2 or
//! HTTP/1.1 as ALPN chose; the stock daemons' plaintext protocols keep the
//! same port. The certificate and key are read again on SIGHUP and when
//! their files change ([`crate::reload`]'s one watcher; new connections get
//! the new pair, open ones keep theirs); a pair that does not load keeps the
//! previous one, with an error in the log and
//! `yadcc_scheduler_tls_reload_failures`. With a client CA (reloaded the
//! same way), a client certificate it signed makes the connection's
//! requests an authenticated inspector's ([`ClientCertificate`]); a
//! connection without one is still served, as the dashboard's other
//! credential may come.

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex, RwLock},
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
    edge::{BufferCharge, Proof},
    reload::{Reloadable, Reloads, Stamp, Why, stamp},
    security::{SecurityCounters, TlsFiles, pem},
};

const LOG: &str = "yadcc_scheduler::tls";

/// The first byte of a TLS record carrying a handshake (a ClientHello).
pub const HANDSHAKE_RECORD: u8 = 0x16;

/// ALPN: HTTP/2 first (gRPC needs it), then HTTP/1.1.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Certificates are renewed this long before they expire (ACME clients such
/// as certbot renew with 30 days left): less left at start or on a reload
/// means renewal failed somewhere, worth a warning while there is time.
const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 86_400);

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
    files: TlsFiles,
    counters: SecurityCounters,
    /// The files as last loaded (or tried): one error per change, not one
    /// per look.
    loaded: Mutex<Stamps>,
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
    /// has `reloads` read them again (SIGHUP, a change) while it lives.
    pub fn start(
        files: &TlsFiles,
        counters: SecurityCounters,
        reloads: &Reloads,
    ) -> Result<Tls, String> {
        let provider = Arc::new(ring::default_provider());
        // Taken before the files are read, not when the watcher first runs
        // (late on a busy machine): a change in between is then seen.
        let loaded = Stamps::of(files);
        let first = load_pair(files, &provider)?;
        note_expiry(&first, files, &counters, SystemTime::now());
        let pair = Arc::new(Reloading {
            current: RwLock::new(Arc::new(first)),
        });
        let config = server_config(&provider, &pair, files.client_ca.as_deref())?;
        let served = Arc::new(Served {
            provider,
            pair,
            acceptor: RwLock::new(TlsAcceptor::from(Arc::new(config))),
            files: files.clone(),
            counters,
            loaded: Mutex::new(loaded),
        });
        reloads.add(Arc::clone(&served) as Arc<dyn Reloadable>);
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

/// On SIGHUP both the pair and the client CA are read again; otherwise
/// what changed. A pair that loads replaces the served one, a client CA
/// that loads the verifier of new connections; what does not load keeps
/// the running one.
impl Reloadable for Served {
    fn name(&self) -> String {
        format!("the TLS certificate {}", self.files.cert.display())
    }

    fn reload(&self, why: Why) {
        let now = Stamps::of(&self.files);
        let before = {
            let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut *loaded, now)
        };
        let hangup = why == Why::Hangup;
        if hangup || now.pair != before.pair {
            self.reload_pair(why);
        }
        if let Some(client_ca) = &self.files.client_ca
            && (hangup || now.client_ca != before.client_ca)
        {
            self.reload_client_ca(client_ca, why);
        }
    }
}

impl Served {
    fn reload_pair(&self, why: Why) {
        match load_pair(&self.files, &self.provider) {
            Ok(pair) => {
                note_expiry(&pair, &self.files, &self.counters, SystemTime::now());
                *self.pair.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(pair);
                tracing::info!(
                    target: LOG,
                    "TLS certificate reloaded from {} after {}",
                    self.files.cert.display(),
                    why.as_str()
                );
            }
            Err(error) => {
                self.counters.tls_reload_failed();
                tracing::error!(
                    target: LOG,
                    "TLS files do not load after {}; still serving the previous certificate: {error}",
                    why.as_str()
                );
            }
        }
    }

    fn reload_client_ca(&self, client_ca: &Path, why: Why) {
        match server_config(&self.provider, &self.pair, Some(client_ca)) {
            Ok(config) => {
                *self.acceptor.write().unwrap_or_else(|p| p.into_inner()) =
                    TlsAcceptor::from(Arc::new(config));
                tracing::info!(
                    target: LOG,
                    "TLS client CA reloaded from {} after {}",
                    client_ca.display(),
                    why.as_str()
                );
            }
            Err(error) => {
                self.counters.tls_reload_failed();
                tracing::error!(
                    target: LOG,
                    "the client CA does not load after {}; still verifying with the previous one: {error}",
                    why.as_str()
                );
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

/// Publishes when the pair's leaf certificate expires, and warns when that
/// is past or within [`EXPIRY_WARNING`] of `now`: clients refuse an expired
/// certificate, and the scheduler serves it anyway (refusing to start would
/// take the daemons' plaintext protocols down with it).
fn note_expiry(
    pair: &CertifiedKey,
    files: &TlsFiles,
    counters: &SecurityCounters,
    now: SystemTime,
) {
    let cert = files.cert.display();
    let Some(not_after) = pair
        .cert
        .first()
        .and_then(|leaf| der::not_after(leaf.as_ref()))
    else {
        tracing::warn!(target: LOG, "cannot read when the TLS certificate {cert} expires");
        return;
    };
    counters.tls_certificate_expires(not_after);
    let expiry = u64::try_from(not_after).map_or(SystemTime::UNIX_EPOCH, |seconds| {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    });
    let date = httpdate::fmt_http_date(expiry);
    match expiry.duration_since(now) {
        Err(past) => tracing::warn!(
            target: LOG,
            "the TLS certificate {cert} expired {} days ago ({date}): clients refuse it; \
             replace the file (it is read again when it changes, and on SIGHUP)",
            past.duration().as_secs() / 86_400
        ),
        Ok(left) if left < EXPIRY_WARNING => tracing::warn!(
            target: LOG,
            "the TLS certificate {cert} expires in {} days ({date}): renew it (the file is \
             read again when it changes, and on SIGHUP)",
            left.as_secs() / 86_400
        ),
        Ok(_) => tracing::info!(target: LOG, "the TLS certificate {cert} expires {date}"),
    }
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

mod der;

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
    charge: BufferCharge,
) {
    let Some(tls) = &shared.tls else {
        return;
    };
    let activity = Activity::new();
    // The handshake's bytes (a ClientHello may be 64 KB) are charged to
    // the connection until its first request.
    let raw = Rewind::new(first.freeze(), stream, activity.clone()).charged(charge.clone());
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
    if stream.get_ref().1.alpn_protocol() == Some(b"h2")
        && !charge.grow_by(crate::edge::buffers::PENDING_HTTP2_BYTES)
    {
        return;
    }
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
        (proof, charge),
    )
    .await;
}
