//! `--tenants_file`: the tenants, their weights, caps and user tokens, and
//! optionally the servants' tokens, in TOML (docs/tenants.md). Read at
//! start (a bad file stops it) and again on SIGHUP or a change of the file
//! (a bad file keeps the running configuration; [`Watched`], one of the
//! sources of [`crate::reload`]).
//!
//! Strict: an unknown key, a token in two tenants, a weight outside
//! [`engine::MIN_TENANT_WEIGHT`]..=[`engine::MAX_TENANT_WEIGHT`], a share outside (0, 1], a name that is
//! not a label or a digest that is not 64 hex characters is an error naming
//! the file and the line. So is an empty token (what a template's unset
//! variable leaves), which would let calls without a token in. A reload
//! runs every check the start runs, including [`check_admin_tokens`].

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use toml::Spanned;

use crate::engine::{self, Redacted, Scheduler, Tenancy, TenantSpec, TokenSet};
use crate::reload::{self, Reloadable, Why};

/// Largest tenants file read (a file of tokens and a few names).
pub const MAX_TENANTS_FILE_BYTES: u64 = 1 << 20;
/// Most tenants in one file: the `tenant` label's values are bounded by it.
pub const MAX_TENANTS: usize = 1000;
/// Longest tenant name (it is a metrics label value).
pub const MAX_TENANT_NAME_CHARS: usize = 64;

/// Why an empty token is refused, wherever it is listed.
const EMPTY_TOKEN: &str = "an empty token would let calls without a token in \
    (a template's unset variable?): remove it";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    servants: Option<RawServants>,
    #[serde(default)]
    tenant: Vec<Spanned<RawTenant>>,
}

/// What a tenants file is checked against besides itself, at start and on
/// every reload: the operators' tokens, which no daemon may hold.
#[derive(Clone, Debug, Default)]
pub struct Checks {
    /// `--admin_tokens` (empty: the admin API is closed).
    pub admin_tokens: TokenSet,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServants {
    tokens: Spanned<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: Spanned<String>,
    weight: Spanned<f64>,
    max_share: Option<Spanned<f64>>,
    #[serde(default)]
    user_tokens: Vec<Spanned<String>>,
    #[serde(default)]
    user_token_sha256: Vec<Spanned<String>>,
}

/// Reads the tenants file at `path` and runs every check on it: the file's
/// own and those against the rest of the configuration (`checks`).
pub fn read_checked(path: &Path, checks: &Checks) -> Result<Tenancy, String> {
    let tenancy = read(path)?;
    check_admin_tokens(&tenancy, &checks.admin_tokens)
        .map_err(|error| format!("--tenants_file {}: {error}", path.display()))?;
    Ok(tenancy)
}

/// Admin tokens are the operators' own (as at start): no tenant's user token and
/// no `[servants]` token is one of `admin_tokens` (a daemon could act on
/// the farm otherwise).
pub fn check_admin_tokens(tenancy: &Tenancy, admin_tokens: &TokenSet) -> Result<(), String> {
    if admin_tokens.is_empty() {
        return Ok(());
    }
    for tenant in &tenancy.tenants {
        if admin_tokens.lists_any_of(&tenant.token_digests) {
            return Err(format!(
                "tenant {:?}: a user token is also an --admin_tokens token: operators need \
                 tokens of their own",
                tenant.name
            ));
        }
    }
    if let Some(servants) = &tenancy.servant_tokens
        && admin_tokens.shares_a_token_with(servants)
    {
        return Err(
            "[servants]: a token is also an --admin_tokens token: operators need \
             tokens of their own"
                .to_owned(),
        );
    }
    Ok(())
}

/// Reads and checks the tenants file at `path` (its own checks only).
pub fn read(path: &Path) -> Result<Tenancy, String> {
    let shown = path.display();
    let size = std::fs::metadata(path)
        .map_err(|error| format!("--tenants_file {shown}: {error}"))?
        .len();
    if size > MAX_TENANTS_FILE_BYTES {
        return Err(format!(
            "--tenants_file {shown}: {size} bytes, more than the {MAX_TENANTS_FILE_BYTES} byte limit"
        ));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("--tenants_file {shown}: {error}"))?;
    parse(&text).map_err(|error| format!("--tenants_file {shown}:{error}"))
}

/// Checks a tenants file's text. An error starts with the line it names.
pub fn parse(text: &str) -> Result<Tenancy, String> {
    let line_of = |span: Range<usize>| {
        let start = span.start.min(text.len());
        text.as_bytes()[..start]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    };
    let at = |span: Range<usize>, message: String| format!("{}: {message}", line_of(span));
    let raw: RawFile = toml::from_str(text).map_err(|error| {
        let line = error.span().map_or(1, &line_of);
        format!("{line}: {}", error.message())
    })?;
    if raw.tenant.is_empty() {
        return Err("1: no [[tenant]]: list at least one".to_owned());
    }
    if raw.tenant.len() > MAX_TENANTS {
        return Err(at(
            raw.tenant[MAX_TENANTS].span(),
            format!("more than {MAX_TENANTS} tenants"),
        ));
    }
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut owners: HashMap<engine::TokenDigest, String> = HashMap::new();
    let mut tenants = Vec::with_capacity(raw.tenant.len());
    for spanned in raw.tenant {
        let t = spanned.into_inner();
        let name = t.name.get_ref().clone();
        let name_ok = !name.is_empty()
            && name.chars().count() <= MAX_TENANT_NAME_CHARS
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !name_ok {
            return Err(at(
                t.name.span(),
                format!(
                    "tenant name {name:?}: 1 to {MAX_TENANT_NAME_CHARS} letters, digits, '_', '-' or '.'"
                ),
            ));
        }
        if let Some(line) = names.insert(name.clone(), line_of(t.name.span())) {
            return Err(at(
                t.name.span(),
                format!("tenant {name:?} is also named on line {line}"),
            ));
        }
        let weight = *t.weight.get_ref();
        // The same check at start and on reload: both read through here.
        if !(engine::MIN_TENANT_WEIGHT..=engine::MAX_TENANT_WEIGHT).contains(&weight) {
            return Err(at(
                t.weight.span(),
                format!(
                    "tenant {name:?}: weight {weight} must be from {} to {} \
                     (a ratio of at most 10^6 between two tenants)",
                    engine::MIN_TENANT_WEIGHT,
                    engine::MAX_TENANT_WEIGHT
                ),
            ));
        }
        let max_share = match &t.max_share {
            Some(share) => {
                let value = *share.get_ref();
                if !(value > 0.0 && value <= 1.0) {
                    return Err(at(
                        share.span(),
                        format!("tenant {name:?}: max_share {value} must be in (0, 1]"),
                    ));
                }
                Some(value)
            }
            None => None,
        };
        if let Some(empty) = t
            .user_tokens
            .iter()
            .find(|token| token.get_ref().is_empty())
        {
            return Err(at(empty.span(), format!("tenant {name:?}: {EMPTY_TOKEN}")));
        }
        let mut digests = Vec::new();
        let plain = t
            .user_tokens
            .iter()
            .map(|token| (engine::token_digest(token.get_ref()), token.span()));
        let hashed = t
            .user_token_sha256
            .iter()
            .map(|hex_digest| {
                let mut digest = [0u8; 32];
                match hex::decode_to_slice(hex_digest.get_ref(), &mut digest) {
                    Ok(()) => Ok((digest, hex_digest.span())),
                    Err(_) => Err(at(
                        hex_digest.span(),
                        format!("tenant {name:?}: user_token_sha256 entries are 64 hex characters"),
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        for (digest, span) in plain.chain(hashed) {
            if let Some(other) = owners.insert(digest, name.clone()) {
                let whose = if other == name {
                    "twice in this tenant".to_owned()
                } else {
                    format!("also in tenant {other:?}")
                };
                return Err(at(span, format!("tenant {name:?}: a token is {whose}")));
            }
            digests.push(digest);
        }
        tenants.push(TenantSpec {
            name,
            weight,
            max_share,
            token_digests: Redacted(digests),
        });
    }
    let servant_tokens = match raw.servants {
        None => None,
        Some(servants) => {
            let tokens = servants.tokens.into_inner();
            let mut seen: HashMap<&str, usize> = HashMap::new();
            for token in &tokens {
                if token.get_ref().is_empty() {
                    return Err(at(
                        token.span(),
                        format!("[servants] tokens: {EMPTY_TOKEN}"),
                    ));
                }
                let line = line_of(token.span());
                if let Some(first) = seen.insert(token.get_ref(), line) {
                    return Err(at(
                        token.span(),
                        format!("[servants] tokens: a token is also on line {first}"),
                    ));
                }
            }
            Some(TokenSet::new(tokens.into_iter().map(Spanned::into_inner)))
        }
    };
    Ok(Tenancy {
        tenants,
        servant_tokens,
    })
}

/// The file as a [`Reloadable`]: rule "reload": on SIGHUP, and when the
/// file's modification time or size changes, it is read again with every
/// check of the start ([`read_checked`]); a good one replaces the engine's
/// tenants and tokens at once, a bad one is logged and counted by `failed`,
/// and the running configuration stays.
pub struct Watched {
    path: PathBuf,
    engine: Scheduler,
    checks: Checks,
    failed: Arc<dyn Fn() + Send + Sync>,
    /// The file as last read (or tried): one error per change, not per look.
    seen: Mutex<reload::Stamp>,
}

impl Watched {
    /// The source for `path`, whose current version the engine runs.
    pub fn source(
        path: PathBuf,
        engine: Scheduler,
        checks: Checks,
        failed: Arc<dyn Fn() + Send + Sync>,
    ) -> Arc<dyn Reloadable> {
        Arc::new(Watched {
            seen: Mutex::new(reload::stamp(&path)),
            path,
            engine,
            checks,
            failed,
        })
    }
}

impl Reloadable for Watched {
    fn name(&self) -> String {
        format!("the tenants file {}", self.path.display())
    }

    fn reload(&self, why: Why) {
        let now = reload::stamp(&self.path);
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if why == Why::Poll && *seen == now {
                return;
            }
            *seen = now;
        }
        let why = why.as_str();
        match read_checked(&self.path, &self.checks) {
            Ok(tenancy) => {
                self.engine.set_tenancy(&tenancy);
                tracing::info!(
                    "tenants reloaded after {why}: {} tenant(s) ({})",
                    tenancy.tenants.len(),
                    tenancy
                        .tenants
                        .iter()
                        .map(|t| t.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            Err(error) => {
                (self.failed)();
                tracing::warn!(
                    "tenants not reloaded after {why}, the running configuration stays: {error}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
[servants]
tokens = ["servant-secret"]

[[tenant]]
name = "ci"
weight = 1
max_share = 0.5
user_tokens = ["ci-token"]
user_token_sha256 = ["5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"]

[[tenant]]
name = "developers"
weight = 3
user_tokens = ["dev-token"]
"#;

    fn error_of(text: &str) -> String {
        parse(text).expect_err("a bad file")
    }

    #[test]
    fn the_documented_example_is_read_whole() {
        let t = parse(EXAMPLE).unwrap();
        assert_eq!(t.tenants.len(), 2);
        let (ci, dev) = (&t.tenants[0], &t.tenants[1]);
        assert_eq!(
            (ci.name.as_str(), ci.weight, ci.max_share),
            ("ci", 1.0, Some(0.5))
        );
        assert_eq!(
            (dev.name.as_str(), dev.weight, dev.max_share),
            ("developers", 3.0, None)
        );
        assert_eq!(
            *ci.token_digests,
            vec![
                engine::token_digest("ci-token"),
                engine::token_digest("password")
            ]
        );
        let servants = t.servant_tokens.expect("servant tokens");
        assert!(servants.accepts_token("servant-secret"));
        assert!(!servants.accepts_token("ci-token"));
    }

    #[test]
    fn without_servants_the_flag_s_tokens_stay() {
        let t = parse("[[tenant]]\nname = \"a\"\nweight = 0.5\nuser_tokens = [\"x\"]\n").unwrap();
        assert_eq!(t.servant_tokens, None);
        assert_eq!(t.tenants[0].weight, 0.5);
    }

    #[test]
    fn each_mistake_stops_the_read_naming_its_line() {
        let cases = [
            (
                "[[tenant]]\nname = \"a\"\nweight = 1\ncolour = \"red\"\n",
                "4: ",
                "colour",
            ),
            ("[[tenant]]\nname = \"a\"\nweight = 0\n", "3: ", "weight 0"),
            (
                "[[tenant]]\nname = \"a\"\nweight = 0.000001\n",
                "3: ",
                "from 0.001 to 1000",
            ),
            (
                "[[tenant]]\nname = \"a\"\nweight = 1000.5\n",
                "3: ",
                "from 0.001 to 1000",
            ),
            (
                "[[tenant]]\nname = \"a\"\nweight = nan\n",
                "3: ",
                "weight NaN",
            ),
            (
                "[[tenant]]\nname = \"a\"\nweight = -2\n",
                "3: ",
                "weight -2",
            ),
            (
                "[[tenant]]\nname = \"a\"\nweight = 1\nmax_share = 0\n",
                "4: ",
                "max_share 0",
            ),
            (
                "[[tenant]]\nname = \"a\"\nweight = 1\nmax_share = 1.5\n",
                "4: ",
                "(0, 1]",
            ),
            (
                "[[tenant]]\nname = \"a\"\nweight = 1\nuser_tokens = [\"t\"]\n\n[[tenant]]\nname = \"b\"\nweight = 1\nuser_tokens = [\"u\", \"t\"]\n",
                "9: ",
                "also in tenant \"a\"",
            ),
            (
                "[[tenant]]\nname = \"a\"\nweight = 1\nuser_tokens = [\"t\"]\n[[tenant]]\nname = \"b\"\nweight = 1\nuser_token_sha256 = [\"e3b98a4da31a127d4bde6e43033f66ba274cab0eb7eb1c70ec41402bf6273dd8\"]\n",
                "8: ",
                "also in tenant",
            ),
            (
                "[[tenant]]\nname = \"a\"\nweight = 1\nuser_token_sha256 = [\"abc\"]\n",
                "4: ",
                "64 hex",
            ),
            (
                "[[tenant]]\nname = \"a b\"\nweight = 1\n",
                "2: ",
                "tenant name",
            ),
            (
                "[[tenant]]\nname = \"a\"\nweight = 1\n[[tenant]]\nname = \"a\"\nweight = 2\n",
                "5: ",
                "line 2",
            ),
            ("[[tenant]]\nname = \"a\"\n", "1: ", "weight"),
            ("[servants]\ntokens = [\"s\"]\n", "1: ", "no [[tenant]]"),
            (
                "[[tenant]]\nname = \"a\"\nweight = 1\n[extra]\n",
                "4: ",
                "extra",
            ),
        ];
        for (text, line, says) in cases {
            let error = error_of(text);
            assert!(
                error.starts_with(line),
                "{text:?}: {error:?} does not name line {line}"
            );
            assert!(
                error.contains(says),
                "{text:?}: {error:?} does not say {says:?}"
            );
        }
    }

    #[test]
    fn no_tenant_or_servant_token_may_be_an_admin_token() {
        let t = parse(EXAMPLE).unwrap();
        let admin = |token: &str| TokenSet::new([token]);
        assert_eq!(check_admin_tokens(&t, &admin("ops-only")), Ok(()));
        assert_eq!(check_admin_tokens(&t, &TokenSet::default()), Ok(()));
        let error = check_admin_tokens(&t, &admin("dev-token")).unwrap_err();
        assert!(error.contains("tenant \"developers\"") && error.contains("--admin_tokens"));
        // A digest in the file is the same token.
        let error = check_admin_tokens(&t, &admin("password")).unwrap_err();
        assert!(error.contains("tenant \"ci\""), "{error}");
        let error = check_admin_tokens(&t, &admin("servant-secret")).unwrap_err();
        assert!(error.starts_with("[servants]"), "{error}");
    }

    #[test]
    fn a_file_names_itself_in_its_errors_and_a_missing_one_is_an_error() {
        let dir = std::env::temp_dir().join(format!("tenants-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tenants.toml");
        std::fs::write(&path, "[[tenant]]\nname = \"a\"\nweight = 0\n").unwrap();
        let error = read(&path).unwrap_err();
        assert!(
            error.contains(&format!("{}:3: ", path.display())),
            "{error}"
        );
        std::fs::remove_file(&path).unwrap();
        assert!(read(&path).unwrap_err().contains("--tenants_file"));
    }
}
