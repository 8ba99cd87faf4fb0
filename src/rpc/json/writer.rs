//! The binary protobuf a JSON request becomes, written as it is read: keys,
//! varints, length-delimited fields (a message's length is written after its
//! fields, then rotated in front of them), and every scalar kind.

use prost::encoding::WireType;
use serde::de;

use super::{
    IntegerKind, JsonError,
    path::Path,
    plan::{IntegerWire, Plans, ValueKind},
    scalars::{Token, base64, compact, describe, float, integer},
};

/// The binary message being written, and why it was refused, if it was.
pub(super) struct Writer<'p> {
    pub(super) plans: &'p Plans,
    pub(super) out: Vec<u8>,
    pub(super) refusal: Option<JsonError>,
}

impl Writer<'_> {
    /// Records why the request is refused; the serde error returned only
    /// stops the reading (its text is not used).
    pub(super) fn refuse<E: de::Error>(&mut self, message: String) -> E {
        self.refusal = Some(JsonError::Invalid(message));
        E::custom("refused")
    }

    fn key(&mut self, number: u32, wire_type: WireType) {
        self.varint(u64::from(number << 3 | wire_type as u32));
    }

    fn varint(&mut self, mut value: u64) {
        while value >= 0x80 {
            self.out.push(value as u8 | 0x80);
            value >>= 7;
        }
        self.out.push(value as u8);
    }

    /// Turns what was written since `start` into field `number`,
    /// length-delimited: its key and length are written after it, then
    /// rotated in front of it.
    pub(super) fn enclose(&mut self, number: u32, start: usize) {
        let length = self.out.len() - start;
        self.key(number, WireType::LengthDelimited);
        self.varint(length as u64);
        let prefix_length = self.out.len() - start - length;
        self.out[start..].rotate_right(prefix_length);
    }

    fn length_delimited(&mut self, number: u32, bytes: &[u8]) {
        self.key(number, WireType::LengthDelimited);
        self.varint(bytes.len() as u64);
        self.out.extend_from_slice(bytes);
    }

    /// A scalar value (any kind but a message) as field `number`.
    pub(super) fn scalar(
        &mut self,
        number: u32,
        kind: ValueKind,
        token: &Token<'_>,
        at: &Path<'_>,
    ) -> Result<(), String> {
        let wrong_type = |expected: &str| {
            Err(format!(
                "{at}: expected {expected}, found {}",
                describe(&token.to_value())
            ))
        };
        match kind {
            ValueKind::Integer(integer_kind, wire) => {
                let value = integer(token, integer_kind, at)?;
                self.integer(number, integer_kind, wire, value);
            }
            ValueKind::Enum(index) => {
                let enumeration = &self.plans.enums[index];
                let value = match token {
                    Token::Str(name) => enumeration
                        .values
                        .iter()
                        .find(|(known, _)| **known == **name)
                        .map(|&(_, number)| number)
                        .ok_or_else(|| {
                            let names: Vec<&str> =
                                enumeration.values.iter().map(|(name, _)| &**name).collect();
                            format!(
                                "{at}: {name:?} is not a value of enum {}; use one of {} or its number",
                                enumeration.full_name,
                                names.join(", ")
                            )
                        })?,
                    Token::U64(_) | Token::I64(_) | Token::F64(_) => {
                        let value = integer(token, IntegerKind::Int32, at)?;
                        let value = i32::try_from(value).expect("in int32 range, checked above");
                        if !enumeration.values.iter().any(|&(_, known)| known == value) {
                            let numbers: Vec<String> = enumeration
                                .values
                                .iter()
                                .map(|(_, number)| number.to_string())
                                .collect();
                            return Err(format!(
                                "{at}: {value} is not a number of enum {}; use one of {} or its name",
                                enumeration.full_name,
                                numbers.join(", ")
                            ));
                        }
                        value
                    }
                    _ => return wrong_type("an enum value name (a string) or number"),
                };
                self.integer(
                    number,
                    IntegerKind::Int32,
                    IntegerWire::Varint,
                    value.into(),
                );
            }
            ValueKind::Bool => {
                let Token::Bool(value) = token else {
                    return wrong_type("true or false");
                };
                self.key(number, WireType::Varint);
                self.varint(u64::from(*value));
            }
            ValueKind::String => {
                let Token::Str(text) = token else {
                    return wrong_type("a string");
                };
                self.length_delimited(number, text.as_bytes());
            }
            ValueKind::Bytes => {
                let Token::Str(text) = token else {
                    return wrong_type("a base64 string");
                };
                let bytes = base64(text).ok_or_else(|| {
                    format!(
                        "{at}: {} is not base64 (standard or URL-safe)",
                        compact(&token.to_value())
                    )
                })?;
                self.length_delimited(number, &bytes);
            }
            ValueKind::Float | ValueKind::Double => {
                let Some(value) = float(token) else {
                    return match token {
                        Token::Str(_) => Err(format!(
                            "{at}: {} is not a number",
                            compact(&token.to_value())
                        )),
                        _ => wrong_type("a number"),
                    };
                };
                if matches!(kind, ValueKind::Float) {
                    if value.is_finite() && value.abs() > f64::from(f32::MAX) {
                        return Err(format!(
                            "{at}: {} is out of range for float",
                            compact(&token.to_value())
                        ));
                    }
                    self.key(number, WireType::ThirtyTwoBit);
                    self.out.extend_from_slice(&(value as f32).to_le_bytes());
                } else {
                    self.key(number, WireType::SixtyFourBit);
                    self.out.extend_from_slice(&value.to_le_bytes());
                }
            }
            ValueKind::Message(_) | ValueKind::Unsupported(_) => {
                unreachable!("messages are read by ValueSeed")
            }
        }
        Ok(())
    }

    /// An integer already checked against `kind`'s range.
    fn integer(&mut self, number: u32, kind: IntegerKind, wire: IntegerWire, value: i128) {
        let bits64 = matches!(kind, IntegerKind::Int64 | IntegerKind::Uint64);
        match wire {
            IntegerWire::Varint => {
                self.key(number, WireType::Varint);
                // Negative values are sign-extended to 64 bits, as protobuf
                // writes an int32 too.
                self.varint(value as i64 as u64);
            }
            IntegerWire::ZigZag => {
                self.key(number, WireType::Varint);
                let value = value as i64;
                let zigzag = if bits64 {
                    ((value << 1) ^ (value >> 63)) as u64
                } else {
                    let value = value as i32;
                    u64::from(((value << 1) ^ (value >> 31)) as u32)
                };
                self.varint(zigzag);
            }
            IntegerWire::Fixed if bits64 => {
                self.key(number, WireType::SixtyFourBit);
                self.out.extend_from_slice(&(value as u64).to_le_bytes());
            }
            IntegerWire::Fixed => {
                self.key(number, WireType::ThirtyTwoBit);
                self.out.extend_from_slice(&(value as u32).to_le_bytes());
            }
        }
    }
}
