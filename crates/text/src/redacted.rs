//! Secrets kept out of logs.

use std::{fmt, ops::Deref};

/// A value that must never reach a log: its `Debug` prints `<redacted>`.
/// Every type that holds a secret (tokens, the serving-daemon secret, the
/// inspection credential) holds it in one of these, so a derived `Debug`,
/// a `{:?}` in a log line or a panic message cannot leak it.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Redacted<T>(pub T);

impl<T> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl<T> Deref for Redacted<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> From<T> for Redacted<T> {
    fn from(value: T) -> Self {
        Redacted(value)
    }
}

impl From<&str> for Redacted<String> {
    fn from(value: &str) -> Self {
        Redacted(value.to_owned())
    }
}
