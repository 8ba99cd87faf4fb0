//! Who may act ([`AdminTokens`], `--admin_tokens`), what a call presents
//! ([`Credentials`]: `Authorization: Bearer`, and the seam for a client
//! certificate) and who it is once accepted ([`Identity`], what the audit
//! says).

use std::fmt;
use std::sync::Arc;

use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

use crate::engine::TokenSet;

/// Hex digits of a token's SHA-256 that name it in the audit: enough to tell
/// an operator's tokens apart, too few to help guess a token.
pub const FINGERPRINT_HEX_DIGITS: usize = 12;

/// The operators' tokens (`--admin_tokens`): apart from the daemons' tokens
/// and from the inspection credential, so that neither a daemon nor a
/// dashboard reader can act. None configured: every call is refused.
#[derive(Debug, Clone, Default)]
pub struct AdminTokens {
    tokens: TokenSet,
    fingerprints: Vec<String>,
}

impl AdminTokens {
    /// Rule "token flag": split on every `,`, entries kept literally. An
    /// empty entry (the empty token) is dropped: an operator's token is
    /// never empty.
    pub fn from_flag(flag: &str) -> AdminTokens {
        AdminTokens::new(flag.split(',').filter(|token| !token.is_empty()))
    }

    pub fn new<I, S>(tokens: I) -> AdminTokens
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let tokens: Vec<String> = tokens.into_iter().map(Into::into).collect();
        AdminTokens {
            fingerprints: tokens.iter().map(|token| fingerprint(token)).collect(),
            tokens: TokenSet::new(tokens),
        }
    }

    /// Whether no token is configured: the admin API is closed.
    pub fn is_closed(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Rule "token check": constant-time against every configured token.
    pub fn accepts(&self, token: &str) -> bool {
        !token.is_empty() && self.tokens.accepts_token(token)
    }

    /// Fingerprints of the configured tokens, for the start-up log (so an
    /// operator can tell whose token the audit names).
    pub fn fingerprints(&self) -> &[String] {
        &self.fingerprints
    }
}

/// The audit's name for a token: the first [`FINGERPRINT_HEX_DIGITS`] hex
/// digits of its SHA-256 (`printf %s "$TOKEN" | sha256sum | cut -c1-12`).
pub fn fingerprint(token: &str) -> String {
    let digest = hex::encode(Sha256::digest(token.as_bytes()));
    digest[..FINGERPRINT_HEX_DIGITS].to_owned()
}

/// What a call presents to the operators' service. The daemons' calls
/// carry none, and cost nothing: no allocation without a header.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The token of `Authorization: Bearer <token>`.
    bearer: Option<Arc<str>>,
    /// An `Authorization` header of another scheme, or unreadable.
    other: bool,
    /// The subject of the client certificate the connection presented, once
    /// a listener terminates TLS with client certificates (mTLS): the
    /// listener puts it in the request's extensions as a
    /// [`ClientCertificate`] and [`Credentials::with_certificate_from`]
    /// carries it here (`net::tls`, with `--tls_client_ca_file`; the
    /// dashboard accepts it, the operators' service not yet).
    certificate_subject: Option<Arc<str>>,
}

/// The seam for mutual TLS: the verified subject of a connection's client
/// certificate, which a TLS listener inserts into every request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    pub subject: Arc<str>,
}

/// Never prints the token.
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("bearer", &self.bearer.as_ref().map(|_| "<redacted>"))
            .field("other", &self.other)
            .field("certificate_subject", &self.certificate_subject)
            .finish()
    }
}

impl Credentials {
    /// None: the daemons' binary protocol.
    pub const NONE: Credentials = Credentials {
        bearer: None,
        other: false,
        certificate_subject: None,
    };

    /// The client certificate among a request's extensions, if any, added.
    pub fn with_certificate_from(mut self, extensions: &axum::http::Extensions) -> Credentials {
        self.certificate_subject = extensions
            .get::<ClientCertificate>()
            .map(|certificate| Arc::clone(&certificate.subject));
        self
    }

    /// `Authorization: Bearer <token>` (RFC 6750: the scheme in any case,
    /// one or more spaces) of a request's headers.
    pub fn from_headers(headers: &HeaderMap) -> Credentials {
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Credentials::NONE;
        };
        let bearer = value
            .to_str()
            .ok()
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim_start_matches(' '))
            .filter(|token| !token.is_empty());
        Credentials {
            bearer: bearer.map(Arc::from),
            other: bearer.is_none(),
            certificate_subject: None,
        }
    }

    /// A bearer token, as tests and tools present one.
    pub fn bearer(token: &str) -> Credentials {
        Credentials {
            bearer: Some(Arc::from(token)),
            ..Credentials::NONE
        }
    }

    pub(super) fn token(&self) -> Option<&str> {
        self.bearer.as_deref()
    }

    pub(super) fn certificate_subject(&self) -> Option<&str> {
        self.certificate_subject.as_deref()
    }

    /// Whether an `Authorization` header came that is no bearer token.
    pub(super) fn has_other_scheme(&self) -> bool {
        self.other
    }
}

/// Who acted, as the audit and the log name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// An admin token, by its [`fingerprint`].
    Token { fingerprint: String },
    /// A client certificate, by its subject (mutual TLS; the operators'
    /// service accepts none yet: see [`Credentials`]).
    Certificate { subject: String },
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Token { fingerprint } => write!(f, "token:{fingerprint}"),
            Identity::Certificate { subject } => write!(f, "certificate:{subject}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn with_authorization(value: &str) -> Credentials {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        Credentials::from_headers(&headers)
    }

    #[test]
    fn a_bearer_token_is_read_in_any_case_of_the_scheme() {
        for value in ["Bearer s3cret", "bearer s3cret", "BEARER  s3cret"] {
            assert_eq!(with_authorization(value).token(), Some("s3cret"), "{value}");
        }
        for value in ["Basic dXNlcjpwdw==", "Bearer", "Bearer ", "Tokens3cret"] {
            let credentials = with_authorization(value);
            assert_eq!(credentials.token(), None, "{value}");
            assert!(credentials.has_other_scheme(), "{value}");
        }
        assert_eq!(
            Credentials::from_headers(&HeaderMap::new()),
            Credentials::NONE
        );
    }

    #[test]
    fn the_token_never_shows_in_debug() {
        let shown = format!("{:?}", Credentials::bearer("s3cret"));
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn tokens_are_split_on_commas_and_the_empty_one_is_never_accepted() {
        let tokens = AdminTokens::from_flag("a,,b ");
        assert!(tokens.accepts("a"));
        assert!(tokens.accepts("b "));
        assert!(!tokens.accepts("b"));
        assert!(!tokens.accepts(""));
        assert!(!AdminTokens::from_flag("").accepts(""));
        assert!(AdminTokens::from_flag("").is_closed());
        assert_eq!(tokens.fingerprints().len(), 2);
    }

    #[test]
    fn a_fingerprint_is_the_start_of_the_tokens_sha256() {
        // printf %s s3cret | sha256sum
        assert_eq!(fingerprint("s3cret"), "1ec1c26b50d5");
        assert_eq!(
            Identity::Token {
                fingerprint: fingerprint("s3cret")
            }
            .to_string(),
            "token:1ec1c26b50d5"
        );
    }
}
