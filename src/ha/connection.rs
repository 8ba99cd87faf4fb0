//! One connection to one etcd endpoint as the election and the saved state
//! use it: `http://`, or `https://` with etcd's CA (and a client
//! certificate when etcd runs `--client-cert-auth`), and with etcd's user
//! authentication when `--ha_etcd_user` is set.
//!
//! etcd's authentication: `Auth/Authenticate` trades the user's password
//! for a token, sent as the `token` metadata of every later call. etcd's
//! simple tokens lapse after `--auth-token-ttl` (300 s by default) without
//! use, and every token is refused once the auth store changed; a call
//! refused for its token authenticates again, once, and is sent again
//! ([`EtcdConnection::call`]). The files are read on every connection, so a
//! rotated client certificate is used from the next term on.

use std::{
    future::Future,
    sync::{Arc, RwLock},
    time::Duration,
};

use tokio::time::timeout;
use tonic::{
    Code, Request, Status,
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};

use super::{
    EtcdAccess, EtcdCredentials,
    etcd::etcdserverpb::{AuthenticateRequest, auth_client::AuthClient},
};
use crate::security::pem;

/// Target of the hot standby's log lines (the election's and its
/// connections').
pub const LOG: &str = "yadcc_scheduler::ha";

/// Connecting to an etcd endpoint, the TLS handshake included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// `Authenticate` (etcd hashes the password with bcrypt: tens of ms).
const AUTHENTICATE_TIMEOUT: Duration = Duration::from_secs(3);
/// HTTP/2 pings on the etcd connection, so a dead etcd is noticed.
const PING_INTERVAL: Duration = Duration::from_secs(1);
/// The metadata key etcd reads a call's token from.
const TOKEN_KEY: &str = "token";

/// What every etcd stub is built on: the channel, with the current token
/// put on each call.
pub(super) type EtcdService = InterceptedService<Channel, TokenSlot>;

/// The token of the last `Authenticate`; empty without authentication.
#[derive(Debug, Clone, Default)]
pub(super) struct TokenSlot(Arc<RwLock<Option<MetadataValue<Ascii>>>>);

impl TokenSlot {
    fn set(&self, token: Option<MetadataValue<Ascii>>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = token;
    }
}

impl Interceptor for TokenSlot {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let token = self.0.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(token) = token {
            request.metadata_mut().insert(TOKEN_KEY, token);
        }
        Ok(request)
    }
}

/// Why a connection could not be made ready.
#[derive(Debug)]
pub(super) enum ConnectError {
    /// etcd cannot be reached, or failed: another endpoint, or later, may do.
    Unreachable(String),
    /// etcd refused this instance's user or password: no retry helps until
    /// the operator fixes the flags (or etcd's users).
    Refused(String),
}

/// A ready connection (authenticated when configured); cheap to clone.
#[derive(Debug, Clone)]
pub(super) struct EtcdConnection {
    channel: Channel,
    token: TokenSlot,
    credentials: Option<Arc<EtcdCredentials>>,
    url: Arc<str>,
}

impl EtcdConnection {
    /// Connects to `url` as `access` says and authenticates.
    pub(super) async fn open(url: &str, access: &EtcdAccess) -> Result<Self, ConnectError> {
        let channel = connect(url, access).await?;
        let connection = EtcdConnection {
            channel,
            token: TokenSlot::default(),
            credentials: access.credentials.clone().map(Arc::new),
            url: url.into(),
        };
        connection.authenticate().await?;
        Ok(connection)
    }

    /// The stubs' service: the channel and the token.
    pub(super) fn service(&self) -> EtcdService {
        InterceptedService::new(self.channel.clone(), self.token.clone())
    }

    /// Runs `call` on a fresh service; if etcd refuses its token (expired,
    /// or the auth store changed), authenticates once and runs it again.
    pub(super) async fn call<T, F, Fut>(&self, mut call: F) -> Result<T, Status>
    where
        F: FnMut(EtcdService) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        match call(self.service()).await {
            Err(status) if self.renews_token_for(&status).await => call(self.service()).await,
            answer => answer,
        }
    }

    /// For calls [`Self::call`] cannot repeat (a stream already consumed):
    /// if `status` refused the token, a new one is fetched; whether it was.
    pub(super) async fn renews_token_for(&self, status: &Status) -> bool {
        if self.credentials.is_none() || !refuses_token(status) {
            return false;
        }
        match self.authenticate().await {
            Ok(()) => {
                tracing::info!(target: LOG, "etcd refused the token ({}); authenticated again", status.message());
                true
            }
            Err(error) => {
                tracing::warn!(target: LOG, "etcd refused the token and a new one: {error:?}");
                false
            }
        }
    }

    /// A token for the configured user; nothing without one.
    async fn authenticate(&self) -> Result<(), ConnectError> {
        let Some(credentials) = &self.credentials else {
            return Ok(());
        };
        let url = &self.url;
        let request = AuthenticateRequest {
            name: credentials.user.clone(),
            password: credentials.password.0.clone(),
        };
        let mut auth = AuthClient::new(self.channel.clone());
        let answer = match timeout(AUTHENTICATE_TIMEOUT, auth.authenticate(request)).await {
            Ok(Ok(answer)) => answer.into_inner(),
            Ok(Err(status)) if status.message().contains("authentication is not enabled") => {
                // Clients are configured before etcd's `auth enable`, so
                // this is a step of a migration, not a fault.
                tracing::warn!(
                    target: LOG,
                    "--ha_etcd_user is set but etcd at {url} has no authentication enabled; calling without a token"
                );
                self.token.set(None);
                return Ok(());
            }
            Ok(Err(status)) if status.code() == Code::InvalidArgument => {
                return Err(ConnectError::Refused(format!(
                    "etcd at {url} refused user {:?} (--ha_etcd_user, --ha_etcd_password_file): {}",
                    credentials.user,
                    status.message()
                )));
            }
            Ok(Err(status)) => {
                return Err(ConnectError::Unreachable(format!(
                    "etcd at {url} failed to authenticate user {:?}: {status}",
                    credentials.user
                )));
            }
            Err(_) => {
                return Err(ConnectError::Unreachable(format!(
                    "etcd at {url} did not answer the authentication in time"
                )));
            }
        };
        let token = MetadataValue::try_from(answer.token.as_str()).map_err(|_| {
            ConnectError::Unreachable(format!("etcd at {url} answered a token that is no header"))
        })?;
        self.token.set(Some(token));
        Ok(())
    }
}

/// Whether etcd refused a call for its token rather than for what it asked:
/// `etcdserver: invalid auth token` (lapsed or unknown) and `etcdserver:
/// revision of auth store is old` (users or roles changed since it was
/// issued), etcd's own clients' cue to authenticate again.
fn refuses_token(status: &Status) -> bool {
    let message = status.message();
    status.code() == Code::Unauthenticated
        || message.contains("invalid auth token")
        || message.contains("auth store is old")
}

async fn connect(url: &str, access: &EtcdAccess) -> Result<Channel, ConnectError> {
    let unreachable = ConnectError::Unreachable;
    let mut endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|error| unreachable(format!("bad etcd endpoint {url:?}: {error}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(PING_INTERVAL)
        .keep_alive_timeout(PING_INTERVAL)
        .keep_alive_while_idle(true);
    if url.starts_with("https://") {
        // Read on each connection: a rotated file is used from the next on.
        let tls = tls_config(access).map_err(unreachable)?;
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|error| unreachable(format!("etcd endpoint {url}: {}", chain(&error))))?;
    }
    match timeout(CONNECT_TIMEOUT, endpoint.connect()).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(error)) => Err(unreachable(format!(
            "cannot reach etcd at {url}: {}",
            chain(&error)
        ))),
        Err(_) => Err(unreachable(format!(
            "cannot reach etcd at {url}: timed out"
        ))),
    }
}

/// The TLS side of an `https://` endpoint: etcd's CA, and the client
/// certificate if one is configured; the endpoint's host is the name checked.
fn tls_config(access: &EtcdAccess) -> Result<ClientTlsConfig, String> {
    let Some(ca) = &access.ca_file else {
        return Err("https:// etcd endpoints need --ha_etcd_ca_file".to_owned());
    };
    let mut config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pem::certificates(ca)?.0))
        // etcd 3.4 serves gRPC and its HTTP gateway on one port and may
        // leave ALPN out.
        .assume_http2(true);
    if let Some((cert, key)) = &access.client_identity {
        let (chain, _) = pem::certificates(cert)?;
        let (key, _) = pem::private_key(key)?;
        config = config.identity(Identity::from_pem(chain, key));
    }
    Ok(config)
}

/// An error with its causes: tonic's own says only "transport error".
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
