//! Scalar values as proto3 JSON writes them: integers as numbers or strings,
//! checked to be integral and within the field's range; floats with their
//! named non-finite values; bytes as base64; and how a refused value is shown.

use base64::{
    Engine as _, alphabet,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
};
use serde_json::Value;

use super::{IntegerKind, path::Path};

/// One scalar JSON value as serde_json hands it over, or an array or object
/// read whole where a scalar was expected (only ever to describe it).
pub(super) enum Token<'a> {
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    Str(&'a str),
    Compound(Value),
}

impl Token<'_> {
    /// The value as serde_json would have parsed it, for error messages.
    pub(super) fn to_value(&self) -> Value {
        match self {
            Token::Bool(value) => Value::Bool(*value),
            Token::U64(value) => Value::from(*value),
            Token::I64(value) => Value::from(*value),
            Token::F64(value) => {
                serde_json::Number::from_f64(*value).map_or(Value::Null, Value::Number)
            }
            Token::Str(text) => Value::String((*text).to_owned()),
            Token::Compound(value) => value.clone(),
        }
    }
}

/// An integer field's value: a JSON number or a string holding a JSON
/// number, integral (`1e3` and `1000.0` are 1000) and within the type's range.
pub(super) fn integer(token: &Token<'_>, kind: IntegerKind, at: &Path<'_>) -> Result<i128, String> {
    let number = match token {
        Token::U64(value) => Some(i128::from(*value)),
        Token::I64(value) => Some(i128::from(*value)),
        Token::F64(value) => integral(*value),
        Token::Str(text) => {
            if let Some(value) = plain_digits(text) {
                return in_range(i128::from(value), token, kind, at);
            }
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
        Token::Bool(_) | Token::Compound(_) => {
            return Err(format!(
                "{at}: expected an integer ({}), found {}",
                kind.name(),
                describe(&token.to_value())
            ));
        }
    };
    match number {
        Some(number) => in_range(number, token, kind, at),
        None if !is_integral(token) => Err(format!(
            "{at}: {} is not an integer",
            compact(&token.to_value())
        )),
        None => Err(out_of_range(token, kind, at)),
    }
}

/// An integral `number` read from `token`, if `kind` holds it.
fn in_range(
    number: i128,
    token: &Token<'_>,
    kind: IntegerKind,
    at: &Path<'_>,
) -> Result<i128, String> {
    let (low, high) = kind.range();
    if (low..=high).contains(&number) {
        Ok(number)
    } else {
        Err(out_of_range(token, kind, at))
    }
}

fn out_of_range(token: &Token<'_>, kind: IntegerKind, at: &Path<'_>) -> String {
    let (low, high) = kind.range();
    format!(
        "{at}: {} is out of range for {} ({low} to {high})",
        compact(&token.to_value()),
        kind.name()
    )
}

/// The common string form of an integer, what 64-bit integers are written
/// as: digits without a leading zero, within u64.
fn plain_digits(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    if !matches!(bytes.len(), 1..=20) || (bytes[0] == b'0' && bytes.len() > 1) {
        return None;
    }
    bytes.iter().try_fold(0_u64, |value, &digit| {
        if !digit.is_ascii_digit() {
            return None;
        }
        value.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
    })
}

/// `Some` for a finite float without fraction that fits an i128.
fn integral(float: f64) -> Option<i128> {
    const LIMIT: f64 = 1.7e38; // below 2^127
    (float.is_finite() && float.fract() == 0.0 && float.abs() < LIMIT).then_some(float as i128)
}

/// Whether a number (or a string holding one) has no fractional part.
fn is_integral(token: &Token<'_>) -> bool {
    let float = match token {
        Token::U64(value) => Some(*value as f64),
        Token::I64(value) => Some(*value as f64),
        Token::F64(value) => Some(*value),
        Token::Str(text) => text.parse::<f64>().ok(),
        Token::Bool(_) | Token::Compound(_) => None,
    };
    float.is_some_and(|float| !float.is_finite() || float.fract() == 0.0)
}

/// A float field's value: a JSON number, or a string holding one or naming
/// `NaN`, `Infinity` or `-Infinity`.
pub(super) fn float(token: &Token<'_>) -> Option<f64> {
    match token {
        Token::U64(value) => Some(*value as f64),
        Token::I64(value) => Some(*value as f64),
        Token::F64(value) => Some(*value),
        Token::Str("NaN") => Some(f64::NAN),
        Token::Str("Infinity") => Some(f64::INFINITY),
        Token::Str("-Infinity") => Some(f64::NEG_INFINITY),
        Token::Str(text) if is_json_number(text) => text.parse().ok(),
        _ => None,
    }
}

/// Standard or URL-safe base64, padded or not, as proto3 JSON allows.
pub(super) fn base64(text: &str) -> Option<Vec<u8>> {
    const CONFIG: GeneralPurposeConfig =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    const STANDARD: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, CONFIG);
    const URL_SAFE: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, CONFIG);
    STANDARD
        .decode(text)
        .or_else(|_| URL_SAFE.decode(text))
        .ok()
}

/// The JSON number grammar: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn is_json_number(text: &str) -> bool {
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

/// A value as an error message shows it: short, and never more than a line.
pub(super) fn compact(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 40 {
        format!("{}...", text.chars().take(40).collect::<String>())
    } else {
        text
    }
}

/// A value as a refusal names what was found: its JSON type, then the value.
pub(super) fn describe(value: &Value) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_number_grammar() {
        for good in ["0", "-0", "12", "1.5", "1e3", "1E-3", "-1.25e+10"] {
            assert!(is_json_number(good), "{good}");
        }
        for bad in [
            "", "-", "01", "+1", "1.", ".5", "1e", "1e+", " 1", "1 ", "0x1", "NaN", "1_0",
        ] {
            assert!(!is_json_number(bad), "{bad}");
        }
        for (text, plain) in [
            ("0", Some(0)),
            ("7", Some(7)),
            ("9999999999999999999", Some(9_999_999_999_999_999_999)),
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None),
            ("99999999999999999999", None),
            ("01", None),
            ("-1", None),
            ("1e3", None),
            ("", None),
        ] {
            assert_eq!(plain_digits(text), plain, "{text}");
        }
    }
}
