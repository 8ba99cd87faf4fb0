//! Who may act ([`AdminTokens`], `--admin_tokens`), what a call presents
//! ([`Credentials`]: `Authorization: Bearer`, and the seam for a client
//! certificate) and who it is once accepted ([`Identity`], what the audit
//! says).

use std::fmt;
use std::sync::Arc;

use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

use crate::engine::TokenSet;

/// Hex digits of a SHA-256 that name a grant id on the dashboard
/// ([`fingerprint`]).
pub const FINGERPRINT_HEX_DIGITS: usize = 12;

/// Longest operator's label (`--admin_tokens=LABEL:TOKEN`).
pub const MAX_LABEL_CHARS: usize = 64;

/// The operators' tokens (`--admin_tokens`): apart from the daemons' tokens
/// and from the inspection credential, so that neither a daemon nor a
/// dashboard reader can act. None configured: every call is refused.
/// Each token has a label, the operator's name the audit and the cordons
/// show: never anything derived from the token, which would let a viewer
/// test guesses offline.
#[derive(Debug, Clone, Default)]
pub struct AdminTokens {
    tokens: TokenSet,
    /// Each token's label and the token alone, in the flag's order.
    labeled: Vec<(String, TokenSet)>,
}

impl AdminTokens {
    /// Rule "token flag": split on every `,`, entries kept literally. An
    /// empty entry (the empty token) is dropped: an operator's token is
    /// never empty.
    pub fn from_flag(flag: &str) -> AdminTokens {
        AdminTokens::new(flag.split(',').filter(|token| !token.is_empty()))
    }

    /// Entries `LABEL:TOKEN` or a plain `TOKEN` ([`split_label`]).
    pub fn new<I, S>(entries: I) -> AdminTokens
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut tokens = Vec::new();
        let mut labeled = Vec::new();
        for (index, entry) in entries.into_iter().enumerate() {
            let entry: String = entry.into();
            let (label, token) = split_label(&entry);
            let label = label.map_or_else(|| format!("admin-token-{}", index + 1), str::to_owned);
            labeled.push((label, TokenSet::new([token.to_owned()])));
            tokens.push(token.to_owned());
        }
        AdminTokens {
            tokens: TokenSet::new(tokens),
            labeled,
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

    /// The label of an accepted `token` (None for the empty one). Every
    /// configured token is compared (rule "token check", constant time),
    /// without stopping at a match, so timing tells neither whether nor which.
    pub fn label_of(&self, token: &str) -> Option<&str> {
        if token.is_empty() {
            return None;
        }
        let mut found = None;
        for (label, known) in &self.labeled {
            if known.accepts_token(token) && found.is_none() {
                found = Some(label.as_str());
            }
        }
        found
    }

    /// The labels, for the start-up log (so an operator can tell whose
    /// token the audit names).
    pub fn labels(&self) -> Vec<&str> {
        self.labeled
            .iter()
            .map(|(label, _)| label.as_str())
            .collect()
    }
}

/// `LABEL:TOKEN` when the part before the first `:` is a name (letters,
/// digits, `.`, `_`, `-`, `@`, at most [`MAX_LABEL_CHARS`]); otherwise the
/// whole entry is the token, so plain tokens keep working (a token with a
/// `:` after a name-like start is written `:TOKEN`, an empty label).
pub fn split_label(entry: &str) -> (Option<&str>, &str) {
    match entry.split_once(':') {
        Some(("", token)) => (None, token),
        Some((label, token))
            if !token.is_empty()
                && label.chars().count() <= MAX_LABEL_CHARS
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@')) =>
        {
            (Some(label), token)
        }
        _ => (None, entry),
    }
}

/// A grant id's name on the dashboard: the first [`FINGERPRINT_HEX_DIGITS`]
/// hex digits of its SHA-256.
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
    /// Whether the request came over TLS ([`crate::security::OverTls`]):
    /// with TLS configured, a token in clear from afar is refused unread.
    over_tls: bool,
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
            .field("over_tls", &self.over_tls)
            .finish()
    }
}

impl Credentials {
    /// None: the daemons' binary protocol.
    pub const NONE: Credentials = Credentials {
        bearer: None,
        other: false,
        certificate_subject: None,
        over_tls: false,
    };

    /// The client certificate among a request's extensions, if any, and
    /// whether it came over TLS, added.
    pub fn with_certificate_from(mut self, extensions: &axum::http::Extensions) -> Credentials {
        self.certificate_subject = extensions
            .get::<ClientCertificate>()
            .map(|certificate| Arc::clone(&certificate.subject));
        self.over_tls = extensions.get::<crate::security::OverTls>().is_some();
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
            ..Credentials::NONE
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

    /// Whether a bearer token came: what the guessing limit and the
    /// plaintext rule look at.
    pub fn presents_token(&self) -> bool {
        self.bearer.is_some()
    }

    pub fn over_tls(&self) -> bool {
        self.over_tls
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
    /// An admin token, by its label (`--admin_tokens=LABEL:TOKEN`).
    Token { label: String },
    /// A client certificate, by its subject (mutual TLS; the operators'
    /// service accepts none yet: see [`Credentials`]).
    Certificate { subject: String },
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Token { label } => write!(f, "token:{label}"),
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
        assert_eq!(tokens.labels(), ["admin-token-1", "admin-token-2"]);
    }

    #[test]
    fn a_label_names_its_token_and_plain_tokens_keep_working() {
        let tokens = AdminTokens::from_flag("alice:s3cret,plain,bob@ops:t:with:colons,:x:y,a b:z");
        assert!(tokens.accepts("s3cret") && !tokens.accepts("alice:s3cret"));
        assert_eq!(tokens.label_of("s3cret"), Some("alice"));
        assert_eq!(tokens.label_of("plain"), Some("admin-token-2"));
        assert_eq!(tokens.label_of("t:with:colons"), Some("bob@ops"));
        assert_eq!(tokens.label_of("x:y"), Some("admin-token-4"), "`:` escapes");
        assert_eq!(
            tokens.label_of("a b:z"),
            Some("admin-token-5"),
            "not a name: the whole entry is the token"
        );
        assert_eq!(tokens.label_of("wrong"), None);
        assert_eq!(split_label("alice:"), (None, "alice:"), "no empty token");
        assert_eq!(
            Identity::Token {
                label: "alice".into()
            }
            .to_string(),
            "token:alice"
        );
    }

    #[test]
    fn a_fingerprint_is_the_start_of_the_sha256() {
        // printf %s s3cret | sha256sum
        assert_eq!(fingerprint("s3cret"), "1ec1c26b50d5");
    }
}
