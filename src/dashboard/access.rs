//! Who may read the dashboard, `/api/v1/*` and `/inspect/*`: closed unless a
//! flag opens them, as in the original; the refusals name the flag to pass.
//! A client certificate the `--tls_client_ca_file` signed opens them too;
//! with TLS configured the credential is refused over plain HTTP (rule
//! "credentials over TLS"), and guessing it costs time
//! ([`crate::security::Guessing`]: rule "guessing costs time").

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
};

use axum::{
    extract::{ConnectInfo, Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use base64::Engine as _;

use super::Dashboard;
use crate::{
    admin::ClientCertificate,
    engine::{Redacted, TokenSet},
    security::{OverTls, Surface},
};

/// Who may read the dashboard, `/api/v1/*` and `/inspect/*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum InspectAccess {
    /// Nobody (the original's default): 401 with the challenge, and a message
    /// that says which flag opens them.
    #[default]
    Closed,
    /// HTTP basic auth with this `user:password` (`--inspect_credential`).
    Credential(Redacted<String>),
    /// Anyone who reaches the port (`--debugging_no_inspect_auth`, or the
    /// demo on loopback).
    Open,
}

/// [`InspectAccess`] ready for checking.
#[derive(Debug)]
pub(super) enum Access {
    Closed,
    /// `user:password`, compared like tokens: in constant time.
    Credential(TokenSet),
    Open,
}

impl From<InspectAccess> for Access {
    fn from(access: InspectAccess) -> Self {
        match access {
            InspectAccess::Closed => Access::Closed,
            InspectAccess::Credential(credential) => {
                Access::Credential(TokenSet::new([credential.0]))
            }
            InspectAccess::Open => Access::Open,
        }
    }
}

/// The answer [`require_access`] gives instead of a page, for the OpenAPI
/// document of every route behind it.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // Documentation only: the answers are built below.
pub(super) enum Refusals {
    #[response(
        status = 401,
        description = "Basic auth required (--inspect_credential); without a credential \
            configured nothing is accepted (start with --inspect_credential or \
            --debugging_no_inspect_auth). A wrong credential from an address that failed \
            too many (10 a minute) is answered after a second, with Retry-After: the \
            seconds this lasts (doubling each time, up to an hour); the right one still \
            passes"
    )]
    NoCredential,
    #[response(
        status = 403,
        description = "With TLS configured (--tls_cert_file), the credential is accepted \
            over HTTPS only, except from loopback or with --allow_plaintext_inspection"
    )]
    Plaintext,
}

/// Why a request was refused, in words that name the flag to pass.
const CLOSED_MESSAGE: &str = "inspection pages are closed: start the scheduler with \
     --inspect_credential=USER:PASSWORD (HTTP basic auth) or, on a trusted network, \
     --debugging_no_inspect_auth\n";
const CREDENTIAL_MESSAGE: &str =
    "credentials required: HTTP basic auth with the USER:PASSWORD given to --inspect_credential\n";
const PLAINTEXT_MESSAGE: &str = "the inspection credential is accepted over HTTPS only \
     (this scheduler has --tls_cert_file); plain HTTP is refused except from loopback or \
     with --allow_plaintext_inspection\n";
const GUESSING_MESSAGE: &str = "wrong credential, and too many failed credentials from this \
     address: wrong ones are answered slowly for Retry-After seconds (the right one passes)\n";

/// The challenge of every refusal.
const CHALLENGE: &str = "Basic realm=\"yadcc scheduler\", charset=\"UTF-8\"";

/// Rule "inspection access", as the original's basic-auth filter: a request
/// without an accepted credential gets 401 and the challenge, also when no
/// credential is configured (none is accepted then; the message says which
/// flag opens the pages).
pub(super) async fn require_access(
    State(dashboard): State<Arc<Dashboard>>,
    request: Request,
    next: Next,
) -> Response {
    if request.extensions().get::<ClientCertificate>().is_some() {
        return next.run(request).await;
    }
    let refusal = match &dashboard.access {
        Access::Open => return next.run(request).await,
        Access::Closed => CLOSED_MESSAGE,
        Access::Credential(expected) => {
            let presented = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .and_then(basic_credentials);
            match presented {
                None => CREDENTIAL_MESSAGE,
                Some(presented) => {
                    // Read before the await: a request is not Sync.
                    let peer = request
                        .extensions()
                        .get::<ConnectInfo<SocketAddr>>()
                        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |info| info.0.ip());
                    let over_tls = request.extensions().get::<OverTls>().is_some();
                    let refusal =
                        refuse_credential(&dashboard, peer, over_tls, expected, &presented).await;
                    return match refusal {
                        None => next.run(request).await,
                        Some(refusal) => refusal,
                    };
                }
            }
        }
    };
    challenge(refusal)
}

/// The refusal of a presented credential, or None to let it in: refused
/// unread over plain HTTP when TLS is configured, else compared; a wrong one
/// is counted, and answered after a pause while its address block is slowed
/// (a right one always passes: rule "guessing costs time"). The status stays
/// 401: the credential is what is wrong, and clients that prompt for a new
/// one on 401 keep doing so; Retry-After says how long the pause lasts.
async fn refuse_credential(
    dashboard: &Dashboard,
    peer: IpAddr,
    over_tls: bool,
    expected: &TokenSet,
    presented: &str,
) -> Option<Response> {
    let security = &dashboard.security;
    if security
        .settings
        .refuses_plaintext_credential(over_tls, peer)
    {
        return Some(plain(StatusCode::FORBIDDEN, PLAINTEXT_MESSAGE));
    }
    if expected.accepts_token(presented) {
        return None;
    }
    let Some(left) = security.wrong_credential(Surface::Inspect, peer).await else {
        return Some(challenge(CREDENTIAL_MESSAGE));
    };
    let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
    let mut refusal = challenge(GUESSING_MESSAGE);
    refusal
        .headers_mut()
        .insert(header::RETRY_AFTER, seconds.into());
    Some(refusal)
}

fn plain(status: StatusCode, message: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

fn challenge(refusal: &'static str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [
            (header::WWW_AUTHENTICATE, CHALLENGE),
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
        ],
        refusal,
    )
        .into_response()
}

/// `user:password` from an `Authorization` value. The scheme name is
/// case-insensitive (RFC 9110), so `basic` and `BASIC` work too.
fn basic_credentials(value: &str) -> Option<String> {
    let (scheme, encoded) = value.trim_start().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    String::from_utf8(decoded).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_basic_scheme_is_matched_without_regard_to_case() {
        let encoded = base64::engine::general_purpose::STANDARD.encode("ops:pw");
        for scheme in ["Basic", "basic", "BASIC", "bAsIc"] {
            assert_eq!(
                basic_credentials(&format!("{scheme} {encoded}")).as_deref(),
                Some("ops:pw"),
                "{scheme}"
            );
        }
        assert_eq!(basic_credentials(&format!("Bearer {encoded}")), None);
        assert_eq!(basic_credentials("Basic !!!"), None);
    }
}
