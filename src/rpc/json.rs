//! Proto3 JSON requests, read in one pass: serde_json's tokens, driven by
//! the request's message descriptor, are written straight out as binary
//! protobuf, which prost then decodes as it decodes any binary request. No
//! JSON tree is built, and the field names are matched once, against a table
//! compiled from the descriptor pool at first use ([`Plans`]).
//!
//! Every form canonical proto3 JSON allows is read, and the rest refused
//! with a message naming the field (as a path from the message's root,
//! `envDescs[1].compilerDigest`):
//!
//! - integers as JSON numbers (also `1e3`, `1000.0`) or strings (also
//!   `"1e3"`), when integral and in the field's range;
//! - `null` for any field means its default;
//! - enums by name or by a number the enum defines;
//! - both spellings of a field name; the same field twice (one key in each
//!   spelling, or a repeated key) is an error, as in Google's parsers;
//! - unknown fields of any shape are skipped (a key twice in one object is
//!   refused there too, as Google's parser refuses it anywhere).
//!
//! Malformed JSON comes first: when a request is refused, the body is read
//! once more as plain JSON, and a syntax error anywhere in it (or a key given
//! twice in one object) is what the caller hears, before any error about a
//! field. The refusal path pays for that, never a valid request.
//!
//! The files, in the order a request meets them: [`plan`] (the tables
//! compiled from the descriptors), [`reader`] (the walk over serde_json's
//! tokens), [`writer`] (the binary output), [`scalars`] (integers, floats,
//! bytes and how a refused value is shown), [`syntax`] (plain JSON: keys,
//! skipping, the syntax check) and [`path`] (where a refused value is).

mod path;
mod plan;
mod reader;
mod scalars;
mod syntax;
#[cfg(test)]
mod tests;
mod writer;

use std::sync::LazyLock;

use prost_reflect::Kind;
use serde_json::Value;

use crate::pb;

use self::{
    path::Path,
    plan::Plans,
    reader::{Present, not_an_object, read_document},
    syntax::syntax_error,
    writer::Writer,
};

/// Why a JSON request was refused.
#[derive(Debug)]
pub enum JsonError {
    /// Not JSON, or a key twice in one object: serde_json's message, with
    /// the line and column.
    Syntax(serde_json::Error),
    /// JSON, but not a valid message of the type: names the field.
    Invalid(String),
    /// The message has a field this reader does not implement (a
    /// well-known type such as `google.protobuf.Timestamp`): a server bug,
    /// which a test over the descriptor pool keeps from shipping.
    Unsupported(String),
}

/// The JSON request `body`, a message `package.name`, as binary protobuf.
/// `None` if the descriptor pool has no such message.
pub fn to_binary(package: &str, name: &str, body: &[u8]) -> Option<Result<Vec<u8>, JsonError>> {
    let plans = &*PLANS;
    let message = plans.find(package, name)?;
    Some(plans.to_binary(message, body))
}

/// Every message of the descriptor pool, compiled once.
static PLANS: LazyLock<Plans> = LazyLock::new(|| Plans::compile(&pb::DESCRIPTOR_POOL));

impl Plans {
    /// The JSON `body`, a message of type `message`, as binary protobuf.
    fn to_binary(&self, message: usize, body: &[u8]) -> Result<Vec<u8>, JsonError> {
        let mut writer = Writer {
            plans: self,
            // Binary is shorter than its JSON: one allocation in practice.
            out: Vec::with_capacity(body.len()),
            refusal: None,
        };
        // UTF-8 checked once for the whole body is much cheaper than
        // serde_json's check of each string from a byte slice; a body that is
        // not UTF-8 is read from the slice, for serde_json's own error.
        let read = match std::str::from_utf8(body) {
            Ok(text) => read_document(
                &mut writer,
                message,
                serde_json::Deserializer::from_str(text),
            ),
            Err(_) => read_document(
                &mut writer,
                message,
                serde_json::Deserializer::from_slice(body),
            ),
        };
        let refusal = match read {
            Ok(Present::Written) => return Ok(writer.out),
            Ok(Present::Null) => JsonError::Invalid(not_an_object(
                &self.messages[message],
                &Path::Root,
                &Value::Null,
            )),
            Err(error) => writer.refusal.take().unwrap_or(JsonError::Syntax(error)),
        };
        Err(syntax_error(body).map_or(refusal, JsonError::Syntax))
    }
}

/// The integer field types of protobuf, by range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntegerKind {
    Int32,
    Uint32,
    Int64,
    Uint64,
}

impl IntegerKind {
    pub fn of(kind: &Kind) -> Option<IntegerKind> {
        Some(match kind {
            Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => IntegerKind::Int32,
            Kind::Uint32 | Kind::Fixed32 => IntegerKind::Uint32,
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => IntegerKind::Int64,
            Kind::Uint64 | Kind::Fixed64 => IntegerKind::Uint64,
            _ => return None,
        })
    }

    /// The smallest and largest value.
    pub fn range(self) -> (i128, i128) {
        match self {
            IntegerKind::Int32 => (i32::MIN.into(), i32::MAX.into()),
            IntegerKind::Uint32 => (0, u32::MAX.into()),
            IntegerKind::Int64 => (i64::MIN.into(), i64::MAX.into()),
            IntegerKind::Uint64 => (0, u64::MAX.into()),
        }
    }

    fn name(self) -> &'static str {
        match self {
            IntegerKind::Int32 => "int32",
            IntegerKind::Uint32 => "uint32",
            IntegerKind::Int64 => "int64",
            IntegerKind::Uint64 => "uint64",
        }
    }
}
