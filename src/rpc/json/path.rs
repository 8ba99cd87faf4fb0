//! Where in a request a value is, for the messages that refuse it.

use std::fmt;

/// Where in the request a value is, for error messages; built on the stack
/// as the reader descends, and spelt out only when something is refused.
#[derive(Debug, Clone, Copy)]
pub(super) enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
    MapKey(&'a Path<'a>, &'a str),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, index) => write!(f, "{parent}[{index}]"),
            Path::MapKey(parent, key) => write!(f, "{parent}[{key:?}]"),
        }
    }
}

impl Path<'_> {
    /// `"path: "`, or nothing at the root.
    pub(super) fn prefix(&self) -> String {
        match self {
            Path::Root => String::new(),
            _ => format!("{self}: "),
        }
    }
}
