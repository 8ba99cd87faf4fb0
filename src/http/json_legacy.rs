#![allow(dead_code, unreachable_pub)]
//! The proto3 JSON forms pbjson does not read, rewritten into ones it does
//! before it sees them, by walking the request with its message descriptor.
//!
//! The decoder stays pbjson's; this only fills the gap between what pbjson
//! reads and what canonical proto3 JSON allows, and refuses the rest with a
//! message naming the field:
//!
//! - integers as JSON numbers (also `1e3`, `1000.0`) or strings (also
//!   `"1e3"`), when integral and in the field's range; rewritten to a plain
//!   JSON integer;
//! - `null` for any field means its default: the key is dropped;
//! - enums by name or by a number the enum defines;
//! - both spellings of a field name; the same field twice (one key in each
//!   spelling, or a repeated key) is an error, as in Google's parsers;
//! - unknown fields of any shape are dropped unread.

use std::collections::HashMap;
use std::fmt;

use prost_reflect::{FieldDescriptor, Kind, MessageDescriptor};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A JSON document as serde_json reads it, except that an object with the
/// same key twice is an error instead of "the last one wins".
#[derive(Debug)]
pub struct StrictJson(pub Value);

impl<'de> Deserialize<'de> for StrictJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(StrictJson)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::from(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(value)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number is not finite"))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        StrictJson::deserialize(deserializer).map(|StrictJson(value)| value)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictJson(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let StrictJson(value) = map.next_value()?;
            if object.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "the key {key:?} appears twice in one object"
                )));
            }
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// Rewrites `value`, a request of type `message`, into the forms pbjson
/// reads. The error names the field, as a path from the message's root
/// (`envDescs[1].compilerDigest`).
pub fn normalise(message: &MessageDescriptor, value: Value) -> Result<Value, String> {
    normalise_message(message, value, "")
}

fn normalise_message(message: &MessageDescriptor, value: Value, at: &str) -> Result<Value, String> {
    let Value::Object(object) = value else {
        return Err(format!(
            "{}expected a JSON object (message {}), found {}",
            prefix(at),
            message.full_name(),
            describe(&value)
        ));
    };
    let mut out = Map::new();
    let mut keys_by_field: HashMap<u32, String> = HashMap::new();
    let mut oneof_members: HashMap<String, String> = HashMap::new();
    for (key, value) in object {
        let Some(field) = message
            .get_field_by_json_name(&key)
            .or_else(|| message.get_field_by_name(&key))
        else {
            continue;
        };
        let here = join(at, &key);
        if let Some(previous) = keys_by_field.insert(field.number(), key.clone()) {
            return Err(format!(
                "{here}: field {} is given twice (as {previous:?} and {key:?})",
                field.name()
            ));
        }
        if value.is_null() {
            continue;
        }
        if let Some(oneof) = field
            .containing_oneof()
            .filter(|oneof| !oneof.is_synthetic())
            && let Some(other) = oneof_members.insert(oneof.name().to_owned(), key.clone())
        {
            return Err(format!(
                "{here}: {other:?} and {key:?} are members of oneof {}; set at most one",
                oneof.name()
            ));
        }
        let value = normalise_field(&field, value, &here)?;
        out.insert(field.json_name().to_owned(), value);
    }
    Ok(Value::Object(out))
}

fn normalise_field(field: &FieldDescriptor, value: Value, at: &str) -> Result<Value, String> {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            unreachable!("a map field's kind is its entry message")
        };
        let value_kind = entry.map_entry_value_field().kind();
        let Value::Object(object) = value else {
            return Err(format!(
                "{at}: expected a JSON object (a map), found {}",
                describe(&value)
            ));
        };
        let mut out = Map::new();
        for (key, item) in object {
            let here = format!("{at}[{key:?}]");
            if item.is_null() {
                return Err(format!("{here}: null is not allowed as a map value"));
            }
            out.insert(key, normalise_value(&value_kind, item, &here)?);
        }
        return Ok(Value::Object(out));
    }
    if field.is_list() {
        let Value::Array(items) = value else {
            return Err(format!(
                "{at}: expected a JSON array (a repeated field), found {}",
                describe(&value)
            ));
        };
        let kind = field.kind();
        return items
            .into_iter()
            .enumerate()
            .map(|(index, item)| {
                let here = format!("{at}[{index}]");
                if item.is_null() {
                    Err(format!("{here}: null is not allowed as a list element"))
                } else {
                    normalise_value(&kind, item, &here)
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array);
    }
    normalise_value(&field.kind(), value, at)
}

/// One value of a field's type (one element, for a list).
fn normalise_value(kind: &Kind, value: Value, at: &str) -> Result<Value, String> {
    let wrong_type = |expected: &str, value: &Value| {
        Err(format!(
            "{at}: expected {expected}, found {}",
            describe(value)
        ))
    };
    match kind {
        Kind::Message(message) if message.full_name().starts_with("google.protobuf.") => Ok(value),
        Kind::Message(message) => normalise_message(message, value, at),
        Kind::Enum(enumeration) => match &value {
            Value::String(name) => {
                if enumeration.get_value_by_name(name).is_some() {
                    Ok(value)
                } else {
                    let names: Vec<String> =
                        enumeration.values().map(|v| v.name().to_owned()).collect();
                    Err(format!(
                        "{at}: {name:?} is not a value of enum {}; use one of {} or its number",
                        enumeration.full_name(),
                        names.join(", ")
                    ))
                }
            }
            Value::Number(_) => {
                let number = integer(&value, IntegerKindOld::Int32, at)?;
                let number = i32::try_from(number).expect("in int32 range, checked above");
                if enumeration.get_value(number).is_some() {
                    Ok(Value::from(number))
                } else {
                    let numbers: Vec<String> = enumeration
                        .values()
                        .map(|v| v.number().to_string())
                        .collect();
                    Err(format!(
                        "{at}: {number} is not a number of enum {}; use one of {} or its name",
                        enumeration.full_name(),
                        numbers.join(", ")
                    ))
                }
            }
            other => wrong_type("an enum value name (a string) or number", other),
        },
        Kind::Bool => match value {
            Value::Bool(_) => Ok(value),
            ref other => wrong_type("true or false", other),
        },
        Kind::String => match value {
            Value::String(_) => Ok(value),
            ref other => wrong_type("a string", other),
        },
        Kind::Bytes => match value {
            Value::String(_) => Ok(value),
            ref other => wrong_type("a base64 string", other),
        },
        // pbjson reads every number form of floating-point fields.
        Kind::Float | Kind::Double => match value {
            Value::Number(_) | Value::String(_) => Ok(value),
            ref other => wrong_type("a number", other),
        },
        _ => {
            let integer_kind = IntegerKindOld::of(kind).expect("every other kind is an integer");
            let number = integer(&value, integer_kind, at)?;
            Ok(if number < 0 {
                Value::from(i64::try_from(number).expect("in range, checked"))
            } else {
                Value::from(u64::try_from(number).expect("in range, checked"))
            })
        }
    }
}

/// The integer field types of protobuf, by range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntegerKindOld {
    Int32,
    Uint32,
    Int64,
    Uint64,
}

impl IntegerKindOld {
    pub fn of(kind: &Kind) -> Option<IntegerKindOld> {
        Some(match kind {
            Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => IntegerKindOld::Int32,
            Kind::Uint32 | Kind::Fixed32 => IntegerKindOld::Uint32,
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => IntegerKindOld::Int64,
            Kind::Uint64 | Kind::Fixed64 => IntegerKindOld::Uint64,
            _ => return None,
        })
    }

    /// The smallest and largest value.
    pub fn range(self) -> (i128, i128) {
        match self {
            IntegerKindOld::Int32 => (i32::MIN.into(), i32::MAX.into()),
            IntegerKindOld::Uint32 => (0, u32::MAX.into()),
            IntegerKindOld::Int64 => (i64::MIN.into(), i64::MAX.into()),
            IntegerKindOld::Uint64 => (0, u64::MAX.into()),
        }
    }

    fn name(self) -> &'static str {
        match self {
            IntegerKindOld::Int32 => "int32",
            IntegerKindOld::Uint32 => "uint32",
            IntegerKindOld::Int64 => "int64",
            IntegerKindOld::Uint64 => "uint64",
        }
    }
}

/// An integer field's value: a JSON number or a string holding a JSON
/// number, integral (`1e3` and `1000.0` are 1000) and within the type's range.
fn integer(value: &Value, kind: IntegerKindOld, at: &str) -> Result<i128, String> {
    let number = match value {
        Value::Number(number) => {
            if let Some(unsigned) = number.as_u64() {
                Some(i128::from(unsigned))
            } else if let Some(signed) = number.as_i64() {
                Some(i128::from(signed))
            } else {
                number.as_f64().and_then(integral)
            }
        }
        Value::String(text) => {
            if !is_json_number(text) {
                return Err(format!(
                    "{at}: {text:?} is not a number; an integer field takes a JSON number \
                     or a string holding one"
                ));
            }
            match text.parse::<i128>() {
                Ok(exact) => Some(exact),
                // Digits only but too long for i128: out of any range.
                Err(_) if !text.contains(['.', 'e', 'E']) => None,
                Err(_) => text.parse::<f64>().ok().and_then(integral),
            }
        }
        other => {
            return Err(format!(
                "{at}: expected an integer ({}), found {}",
                kind.name(),
                describe(other)
            ));
        }
    };
    let (low, high) = kind.range();
    match number {
        Some(number) if (low..=high).contains(&number) => Ok(number),
        Some(_) | None if !is_integral(value) => {
            Err(format!("{at}: {} is not an integer", compact(value)))
        }
        _ => Err(format!(
            "{at}: {} is out of range for {} ({low} to {high})",
            compact(value),
            kind.name()
        )),
    }
}

/// `Some` for a finite float without fraction that fits an i128.
fn integral(float: f64) -> Option<i128> {
    const LIMIT: f64 = 1.7e38; // below 2^127
    (float.is_finite() && float.fract() == 0.0 && float.abs() < LIMIT).then_some(float as i128)
}

/// Whether a number (or a string holding one) has no fractional part.
fn is_integral(value: &Value) -> bool {
    let float = match value {
        Value::Number(number) => number.as_f64(),
        Value::String(text) => text.parse::<f64>().ok(),
        _ => None,
    };
    float.is_some_and(|float| !float.is_finite() || float.fract() == 0.0)
}

/// The JSON number grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
pub fn is_json_number(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut at = 0;
    let digits = |at: &mut usize| {
        let start = *at;
        while *at < bytes.len() && bytes[*at].is_ascii_digit() {
            *at += 1;
        }
        *at - start
    };
    if bytes.get(at) == Some(&b'-') {
        at += 1;
    }
    match bytes.get(at) {
        Some(b'0') => at += 1,
        Some(b'1'..=b'9') => {
            digits(&mut at);
        }
        _ => return false,
    }
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        if digits(&mut at) == 0 {
            return false;
        }
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(bytes.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        if digits(&mut at) == 0 {
            return false;
        }
    }
    at == bytes.len()
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    }
}

fn prefix(at: &str) -> String {
    if at.is_empty() {
        String::new()
    } else {
        format!("{at}: ")
    }
}

/// A value as an error message shows it: short, and never more than a line.
fn compact(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 40 {
        format!("{}...", text.chars().take(40).collect::<String>())
    } else {
        text
    }
}

fn describe(value: &Value) -> String {
    let kind = match value {
        Value::Null => return "null".to_owned(),
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    format!("{kind} ({})", compact(value))
}

use crate::pb;

pub fn legacy_decode<T>(body: &[u8]) -> Result<T, String>
where
    T: prost::Message + prost::Name + Default + serde::de::DeserializeOwned,
{
    if body
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return Ok(T::default());
    }
    let name = T::full_name();
    let descriptor = pb::DESCRIPTOR_POOL.get_message_by_name(&name).unwrap();
    let StrictJson(value) =
        serde_json::from_slice(body).map_err(|error| format!("body is not valid JSON: {error}"))?;
    let value = normalise(&descriptor, value)
        .map_err(|error| format!("body is not a valid proto3 JSON {name}: {error}"))?;
    serde_json::from_value(value)
        .map_err(|error| format!("PBJSON body is not a valid proto3 JSON {name}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng, seq::IndexedRandom};
    use serde_json::json;

    fn field_keys(name: &str) -> Vec<String> {
        let m = pb::DESCRIPTOR_POOL.get_message_by_name(name).unwrap();
        let mut keys = Vec::new();
        for f in m.fields() {
            keys.push(f.json_name().to_owned());
            keys.push(f.name().to_owned());
        }
        keys
    }

    fn number(rng: &mut StdRng) -> Value {
        let forms: Vec<Value> = vec![
            json!(0),
            json!(1),
            json!(-1),
            json!(1000),
            json!(1e3),
            json!(1000.0),
            json!(1.5),
            json!(-0.0),
            json!(4294967295_u64),
            json!(4294967296_u64),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(2147483647),
            json!(-2147483648_i64),
            json!(-2147483649_i64),
            json!(1e20),
            json!(1.7e308),
            json!(2),
            json!(100),
            json!(3),
            json!("1"),
            json!("1e3"),
            json!("1E+3"),
            json!("1.5"),
            json!(" 1"),
            json!("01"),
            json!("0x10"),
            json!("-0"),
            json!("18446744073709551615"),
            json!("18446744073709551616"),
            json!("999999999999999999999999999999999999999999"),
            json!("1e999"),
            json!("-1"),
            json!("NaN"),
            json!(""),
            json!("abc"),
            json!("SERVANT_PRIORITY_USER"),
            json!("SERVANT_PRIORITY_DEDICATED"),
            json!("USER"),
            json!("2"),
            json!(true),
            json!(false),
            Value::Null,
            json!([]),
            json!({}),
            json!([1, 2]),
            json!({"a": 1}),
            json!("0.0"),
            json!("1.0e1"),
            json!(7),
            json!("a very long string that goes on and on and on for more than forty chars"),
            json!([1, null]),
            json!(["x"]),
            json!({"compilerDigest": "d"}),
            json!({"compiler_digest": "d", "x": [1, {"y": null}]}),
            json!([{"compilerDigest": "a"}, {"compiler_digest": 5}]),
            json!([null]),
            json!([{"taskGrantId": "5", "servantTaskId": 1e3, "taskDigest": "t"}]),
            json!([{"task_grant_id": -1}]),
            json!([{}]),
            json!(["1", 2, 3.0, "4e0"]),
            json!([1.5]),
            json!([true]),
            json!([[1]]),
        ];
        let v = forms.choose(rng).unwrap().clone();
        if rng.random_bool(0.3) {
            // nest in array sometimes
            if rng.random_bool(0.5) { json!([v]) } else { v }
        } else {
            v
        }
    }

    fn body(rng: &mut StdRng, keys: &[String]) -> String {
        let n = rng.random_range(0..6);
        let mut parts = Vec::new();
        for _ in 0..n {
            let key = if rng.random_bool(0.8) {
                keys.choose(rng).cloned().unwrap_or_else(|| "zzz".into())
            } else {
                ["future", "x", "Token", "envDesc", "env_desc"]
                    .choose(rng)
                    .unwrap()
                    .to_string()
            };
            let value = number(rng);
            parts.push(format!(
                "{}:{}",
                serde_json::to_string(&key).unwrap(),
                value
            ));
        }
        let mut text = format!("{{{}}}", parts.join(","));
        match rng.random_range(0..20) {
            0 => {
                let cut = rng.random_range(0..=text.len());
                text.truncate(cut);
            }
            1 => text = format!("[{text}]"),
            2 => text = "null".into(),
            3 => text = "5".into(),
            4 => text.push_str(" x"),
            5 => text = format!(" \n{text}\t "),
            6 => {
                let at = rng.random_range(0..=text.len());
                if text.is_char_boundary(at) {
                    text.insert(at, ',');
                }
            }
            7 => text = text.replacen(':', ": {\"a\":1,\"a\":2},\"q\":", 1),
            8 => text = "\"str\"".into(),
            _ => {}
        }
        text
    }

    fn compare<T>(rng: &mut StdRng, rounds: usize) -> usize
    where
        T: prost::Message
            + prost::Name
            + Default
            + serde::de::DeserializeOwned
            + PartialEq
            + std::fmt::Debug,
    {
        let keys = field_keys(&T::full_name());
        let mut errors = 0;
        for _ in 0..rounds {
            let text = body(rng, &keys);
            let old = legacy_decode::<T>(text.as_bytes());
            let new = crate::http::codec::decode::<T>(crate::pb::Encoding::Json, text.as_bytes())
                .map_err(|e| e.message);
            if old.is_err() {
                errors += 1;
                if errors % 997 == 0 {
                    eprintln!("{text} => {:?}", old);
                }
            }
            if text.trim().is_empty() {
                continue;
            }
            assert_eq!(old, new, "{} body {text}", T::full_name());
        }
        errors
    }

    #[test]
    fn agrees_with_legacy() {
        let mut rng = StdRng::seed_from_u64(
            std::env::var("SEED")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1),
        );
        let n = std::env::var("N")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(40_000);
        let mut e = 0;
        e += compare::<pb::HeartbeatRequest>(&mut rng, n);
        e += compare::<pb::KeepTaskAliveRequest>(&mut rng, n);
        e += compare::<pb::WaitForStartingTaskRequest>(&mut rng, n);
        e += compare::<pb::GetConfigRequest>(&mut rng, n);
        e += compare::<pb::FreeTaskRequest>(&mut rng, n);
        e += compare::<pb::GetRunningTasksRequest>(&mut rng, n);
        e += compare::<pb::HeartbeatResponse>(&mut rng, n);
        e += compare::<pb::GetRunningTasksResponse>(&mut rng, n);
        e += compare::<pb::WaitForStartingTaskResponse>(&mut rng, n);
        eprintln!("errors compared: {e} of {}", 9 * n);
    }
}
