//! Who may read the dashboard, `/api/v1/*` and `/inspect/*`: closed unless a
//! flag opens them, as in the original; the refusals name the flag to pass.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::{StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use base64::Engine as _;

use super::Dashboard;
use crate::engine::{Redacted, TokenSet};

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
            --debugging_no_inspect_auth)"
    )]
    NoCredential,
}

/// Why a request was refused, in words that name the flag to pass.
const CLOSED_MESSAGE: &str = "inspection pages are closed: start the scheduler with \
     --inspect_credential=USER:PASSWORD (HTTP basic auth) or, on a trusted network, \
     --debugging_no_inspect_auth\n";
const CREDENTIAL_MESSAGE: &str =
    "credentials required: HTTP basic auth with the USER:PASSWORD given to --inspect_credential\n";

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
    let refusal = match &dashboard.access {
        Access::Open => return next.run(request).await,
        Access::Closed => CLOSED_MESSAGE,
        Access::Credential(expected) => {
            let presented = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .and_then(basic_credentials);
            if presented.is_some_and(|presented| expected.accepts_token(&presented)) {
                return next.run(request).await;
            }
            CREDENTIAL_MESSAGE
        }
    };
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
