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

use std::{collections::HashSet, fmt, sync::LazyLock};

use base64::{
    Engine as _, alphabet,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
};
use prost::encoding::WireType;
use prost_reflect::{DescriptorPool, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor};
use serde::{
    Deserialize as _,
    de::{
        self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor,
        value::{MapAccessDeserializer, SeqAccessDeserializer},
    },
};
use serde_json::Value;

use crate::pb;

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

/// What reading JSON needs to know of every message and enum of a
/// descriptor pool, indexed by position so messages may refer to each other.
#[derive(Debug)]
struct Plans {
    messages: Vec<MessagePlan>,
    enums: Vec<EnumPlan>,
}

#[derive(Debug)]
struct MessagePlan {
    full_name: Box<str>,
    fields: Vec<FieldPlan>,
    /// Names of the message's real (not synthetic) oneofs.
    oneofs: Vec<Box<str>>,
}

#[derive(Debug)]
struct FieldPlan {
    number: u32,
    name: Box<str>,
    json_name: Box<str>,
    shape: Shape,
    /// Index in the message's `oneofs`.
    oneof: Option<usize>,
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    Single(ValueKind),
    List(ValueKind),
    /// Entries are messages with the key as field 1 and the value as field 2.
    Map {
        key: ValueKind,
        value: ValueKind,
    },
}

#[derive(Debug, Clone, Copy)]
enum ValueKind {
    Integer(IntegerKind, IntegerWire),
    Bool,
    String,
    Bytes,
    Float,
    Double,
    /// Index in [`Plans::enums`].
    Enum(usize),
    /// Index in [`Plans::messages`].
    Message(usize),
    /// Index in [`Plans::messages`] of a message this reader cannot read.
    Unsupported(usize),
}

/// How an integer is written on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IntegerWire {
    Varint,
    ZigZag,
    Fixed,
}

#[derive(Debug)]
struct EnumPlan {
    full_name: Box<str>,
    /// In declaration order, as error messages list them.
    values: Vec<(Box<str>, i32)>,
}

impl Plans {
    fn compile(pool: &DescriptorPool) -> Plans {
        let messages: Vec<MessageDescriptor> = pool.all_messages().collect();
        let enums: Vec<EnumDescriptor> = pool.all_enums().collect();
        let message_index = |message: &MessageDescriptor| {
            messages
                .iter()
                .position(|known| known == message)
                .expect("a field's message type is in its pool")
        };
        let enum_index = |enumeration: &EnumDescriptor| {
            enums
                .iter()
                .position(|known| known == enumeration)
                .expect("a field's enum type is in its pool")
        };
        let value_kind = |field: &FieldDescriptor| match field.kind() {
            Kind::Message(message) if message.full_name().starts_with("google.protobuf.") => {
                ValueKind::Unsupported(message_index(&message))
            }
            Kind::Message(message) => ValueKind::Message(message_index(&message)),
            Kind::Enum(enumeration) => ValueKind::Enum(enum_index(&enumeration)),
            Kind::Bool => ValueKind::Bool,
            Kind::String => ValueKind::String,
            Kind::Bytes => ValueKind::Bytes,
            Kind::Float => ValueKind::Float,
            Kind::Double => ValueKind::Double,
            integer => {
                let wire = match integer {
                    Kind::Sint32 | Kind::Sint64 => IntegerWire::ZigZag,
                    Kind::Fixed32 | Kind::Fixed64 | Kind::Sfixed32 | Kind::Sfixed64 => {
                        IntegerWire::Fixed
                    }
                    _ => IntegerWire::Varint,
                };
                let range = IntegerKind::of(&integer).expect("every other kind is an integer");
                ValueKind::Integer(range, wire)
            }
        };
        let plans = messages
            .iter()
            .map(|message| {
                let oneofs: Vec<_> = message
                    .oneofs()
                    .filter(|oneof| !oneof.is_synthetic())
                    .collect();
                let fields = message
                    .fields()
                    .map(|field| {
                        let shape = if field.is_map() {
                            let Kind::Message(entry) = field.kind() else {
                                unreachable!("a map field's kind is its entry message")
                            };
                            Shape::Map {
                                key: value_kind(&entry.map_entry_key_field()),
                                value: value_kind(&entry.map_entry_value_field()),
                            }
                        } else if field.is_list() {
                            Shape::List(value_kind(&field))
                        } else {
                            Shape::Single(value_kind(&field))
                        };
                        FieldPlan {
                            number: field.number(),
                            name: field.name().into(),
                            json_name: field.json_name().into(),
                            shape,
                            oneof: field
                                .containing_oneof()
                                .and_then(|oneof| oneofs.iter().position(|real| *real == oneof)),
                        }
                    })
                    .collect();
                MessagePlan {
                    full_name: message.full_name().into(),
                    fields,
                    oneofs: oneofs.iter().map(|oneof| oneof.name().into()).collect(),
                }
            })
            .collect();
        let enums = enums
            .iter()
            .map(|enumeration| EnumPlan {
                full_name: enumeration.full_name().into(),
                values: enumeration
                    .values()
                    .map(|value| (value.name().into(), value.number()))
                    .collect(),
            })
            .collect();
        Plans {
            messages: plans,
            enums,
        }
    }

    /// The message `package.name`, without building the full name.
    fn find(&self, package: &str, name: &str) -> Option<usize> {
        self.messages.iter().position(|message| {
            let full = &*message.full_name;
            if package.is_empty() {
                full == name
            } else {
                full.strip_prefix(package)
                    .and_then(|rest| rest.strip_prefix('.'))
                    == Some(name)
            }
        })
    }

    /// Fields whose type this reader cannot read, as `message.field: type`.
    #[cfg(test)]
    fn unsupported_fields(&self) -> Vec<String> {
        let mut found = Vec::new();
        for message in &self.messages {
            for field in &message.fields {
                let kinds = match field.shape {
                    Shape::Single(kind) | Shape::List(kind) => [Some(kind), None],
                    Shape::Map { key, value } => [Some(key), Some(value)],
                };
                for kind in kinds.into_iter().flatten() {
                    if let ValueKind::Unsupported(index) = kind {
                        found.push(format!(
                            "{}.{}: {}",
                            message.full_name, field.name, self.messages[index].full_name
                        ));
                    }
                }
            }
        }
        found
    }

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
            Ok(text) => writer.read(message, serde_json::Deserializer::from_str(text)),
            Err(_) => writer.read(message, serde_json::Deserializer::from_slice(body)),
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

/// Where in the request a value is, for error messages; built on the stack
/// as the reader descends, and spelt out only when something is refused.
#[derive(Debug, Clone, Copy)]
enum Path<'a> {
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
    fn prefix(&self) -> String {
        match self {
            Path::Root => String::new(),
            _ => format!("{self}: "),
        }
    }
}

/// The binary message being written, and why it was refused, if it was.
struct Writer<'p> {
    plans: &'p Plans,
    out: Vec<u8>,
    refusal: Option<JsonError>,
}

impl Writer<'_> {
    /// The whole document, a message of type `message`.
    fn read<'de, R: serde_json::de::Read<'de>>(
        &mut self,
        message: usize,
        mut deserializer: serde_json::Deserializer<R>,
    ) -> Result<Present, serde_json::Error> {
        let present = ValueSeed {
            writer: self,
            number: None,
            shape: Shape::Single(ValueKind::Message(message)),
            at: &Path::Root,
            oneof: None,
        }
        .deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(present)
    }

    /// Records why the request is refused; the serde error returned only
    /// stops the reading (its text is not used).
    fn refuse<E: de::Error>(&mut self, message: String) -> E {
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
    fn enclose(&mut self, number: u32, start: usize) {
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
    fn scalar(
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

/// Whether a value was there (and written), or was `null`.
enum Present {
    Written,
    Null,
}

/// One scalar JSON value as serde_json hands it over, or an array or object
/// read whole where a scalar was expected (only ever to describe it).
enum Token<'a> {
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    Str(&'a str),
    Compound(Value),
}

impl Token<'_> {
    /// The value as serde_json would have parsed it, for error messages.
    fn to_value(&self) -> Value {
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

/// Before a present value of a oneof member is read: no other member of the
/// same oneof may be present.
struct OneofCheck<'a> {
    members: &'a mut Vec<(usize, String)>,
    oneof: usize,
    name: &'a str,
    key: &'a str,
}

impl OneofCheck<'_> {
    fn check(self, at: &Path<'_>) -> Result<(), String> {
        if let Some((_, other)) = self.members.iter().find(|(oneof, _)| *oneof == self.oneof) {
            return Err(format!(
                "{at}: {other:?} and {:?} are members of oneof {}; set at most one",
                self.key, self.name
            ));
        }
        self.members.push((self.oneof, self.key.to_owned()));
        Ok(())
    }
}

/// One JSON value of a field's shape, written as field `number` (or, with
/// no number, as the message itself: the request's root). `null` writes
/// nothing.
struct ValueSeed<'w, 'p, 'a> {
    writer: &'w mut Writer<'p>,
    number: Option<u32>,
    shape: Shape,
    at: &'a Path<'a>,
    oneof: Option<OneofCheck<'a>>,
}

impl ValueSeed<'_, '_, '_> {
    /// A present value that is not an array or object of the field's shape:
    /// the oneof check, then a scalar, or why it is the wrong type.
    fn token<E: de::Error>(mut self, token: Token<'_>) -> Result<Present, E> {
        self.check_oneof()?;
        let at = self.at;
        let written = match self.shape {
            Shape::Single(ValueKind::Message(index)) => Err(not_an_object(
                &self.writer.plans.messages[index],
                at,
                &token.to_value(),
            )),
            Shape::Single(ValueKind::Unsupported(index)) => {
                self.writer.refusal = Some(JsonError::Unsupported(format!(
                    "{}reading {} from JSON is not implemented",
                    at.prefix(),
                    self.writer.plans.messages[index].full_name
                )));
                return Err(E::custom("unsupported"));
            }
            Shape::Single(kind) => {
                let number = self.number.expect("only a message is read as the root");
                self.writer.scalar(number, kind, &token, at)
            }
            Shape::List(_) => Err(format!(
                "{at}: expected a JSON array (a repeated field), found {}",
                describe(&token.to_value())
            )),
            Shape::Map { .. } => Err(format!(
                "{at}: expected a JSON object (a map), found {}",
                describe(&token.to_value())
            )),
        };
        written.map_err(|message| self.writer.refuse(message))?;
        Ok(Present::Written)
    }

    fn check_oneof<E: de::Error>(&mut self) -> Result<(), E> {
        match self.oneof.take() {
            Some(check) => check
                .check(self.at)
                .map_err(|message| self.writer.refuse(message)),
            None => Ok(()),
        }
    }

    /// A repeated field's elements. They go out unpacked, one key each:
    /// protobuf decoders read both forms of a packable field.
    fn list<'de, A: SeqAccess<'de>>(self, kind: ValueKind, mut seq: A) -> Result<(), A::Error> {
        let number = self.number.expect("a list is a field");
        for index in 0.. {
            let here = Path::Index(self.at, index);
            let seed = ValueSeed {
                writer: &mut *self.writer,
                number: Some(number),
                shape: Shape::Single(kind),
                at: &here,
                oneof: None,
            };
            match seq.next_element_seed(seed)? {
                None => break,
                Some(Present::Written) => {}
                Some(Present::Null) => {
                    return Err(self
                        .writer
                        .refuse(format!("{here}: null is not allowed as a list element")));
                }
            }
        }
        Ok(())
    }

    /// A map field's entries, each a message with the key as field 1 and
    /// the value as field 2. JSON writes every key as a string.
    fn map<'de, A: MapAccess<'de>>(
        self,
        key_kind: ValueKind,
        value_kind: ValueKind,
        mut map: A,
    ) -> Result<(), A::Error> {
        let number = self.number.expect("a map is a field");
        let mut keys: HashSet<Text<'de>> = HashSet::new();
        while let Some(key) = map.next_key_seed(TextSeed)? {
            let here = Path::MapKey(self.at, &key);
            let start = self.writer.out.len();
            // The value first, as its errors come before the key's; an
            // entry's fields may come in any order.
            let seed = ValueSeed {
                writer: &mut *self.writer,
                number: Some(2),
                shape: Shape::Single(value_kind),
                at: &here,
                oneof: None,
            };
            if let Present::Null = map.next_value_seed(seed)? {
                return Err(self
                    .writer
                    .refuse(format!("{here}: null is not allowed as a map value")));
            }
            if !keys.insert(key.clone()) {
                return Err(twice(&key));
            }
            let key_token = match (key_kind, &*key) {
                (ValueKind::Bool, "true") => Token::Bool(true),
                (ValueKind::Bool, "false") => Token::Bool(false),
                _ => Token::Str(&key),
            };
            let written = self.writer.scalar(1, key_kind, &key_token, &here);
            written.map_err(|message| self.writer.refuse(message))?;
            self.writer.enclose(number, start);
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_, '_, '_> {
    type Value = Present;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Present, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_, '_, '_> {
    type Value = Present;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Present, E> {
        Ok(Present::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Present, E> {
        Ok(Present::Null)
    }

    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Present, E> {
        self.token(Token::Bool(value))
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Present, E> {
        self.token(Token::U64(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Present, E> {
        self.token(Token::I64(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Present, E> {
        if !value.is_finite() {
            return Err(E::custom("a number is not finite"));
        }
        self.token(Token::F64(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Present, E> {
        self.token(Token::Str(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Present, A::Error> {
        let Shape::List(kind) = self.shape else {
            let value = Value::deserialize(SeqAccessDeserializer::new(seq))?;
            return self.token(Token::Compound(value));
        };
        self.list(kind, seq)?;
        Ok(Present::Written)
    }

    fn visit_map<A: MapAccess<'de>>(mut self, map: A) -> Result<Present, A::Error> {
        match self.shape {
            Shape::Single(ValueKind::Message(index)) => {
                self.check_oneof()?;
                let start = self.writer.out.len();
                read_message(self.writer, index, self.at, map)?;
                if let Some(number) = self.number {
                    self.writer.enclose(number, start);
                }
            }
            Shape::Map { key, value } => self.map(key, value, map)?,
            _ => {
                let value = Value::deserialize(MapAccessDeserializer::new(map))?;
                return self.token(Token::Compound(value));
            }
        }
        Ok(Present::Written)
    }
}

/// The fields of one JSON object, a message of type `message`.
fn read_message<'de, A: MapAccess<'de>>(
    writer: &mut Writer<'_>,
    message: usize,
    at: &Path<'_>,
    mut map: A,
) -> Result<(), A::Error> {
    let plans = writer.plans;
    let plan = &plans.messages[message];
    let mut seen = FieldSet::default();
    let mut seen_as_json_name = FieldSet::default();
    let mut unknown_keys: Option<HashSet<Text<'de>>> = None;
    let mut oneof_members: Vec<(usize, String)> = Vec::new();
    while let Some(key) = map.next_key_seed(TextSeed)? {
        let Some((index, as_json_name)) = plan.field(&key) else {
            map.next_value_seed(StrictSkip)?;
            if !unknown_keys.get_or_insert_default().insert(key.clone()) {
                return Err(twice(&key));
            }
            continue;
        };
        let field = &plan.fields[index];
        let here = Path::Key(at, &key);
        if seen.contains(index) {
            let previous = if seen_as_json_name.contains(index) {
                &field.json_name
            } else {
                &field.name
            };
            return Err(writer.refuse(format!(
                "{here}: field {} is given twice (as {previous:?} and {:?})",
                field.name, &*key
            )));
        }
        seen.insert(index);
        if as_json_name {
            seen_as_json_name.insert(index);
        }
        let oneof = field.oneof.map(|oneof| OneofCheck {
            members: &mut oneof_members,
            oneof,
            name: &plan.oneofs[oneof],
            key: &key,
        });
        map.next_value_seed(ValueSeed {
            writer: &mut *writer,
            number: Some(field.number),
            shape: field.shape,
            at: &here,
            oneof,
        })?;
    }
    Ok(())
}

impl MessagePlan {
    /// The field a key names, by JSON name first, then by proto name, and
    /// whether it was the JSON name.
    fn field(&self, key: &str) -> Option<(usize, bool)> {
        if let Some(index) = self
            .fields
            .iter()
            .position(|field| *field.json_name == *key)
        {
            return Some((index, true));
        }
        self.fields
            .iter()
            .position(|field| *field.name == *key)
            .map(|index| (index, false))
    }
}

/// The error of a key given twice in one object; the same words as the
/// syntax check's, which is what the caller hears.
fn twice<E: de::Error>(key: &str) -> E {
    E::custom(format!("the key {key:?} appears twice in one object"))
}

/// A JSON string, borrowed from the body when it has no escapes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Text<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl std::ops::Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Text::Borrowed(text) => text,
            Text::Owned(text) => text,
        }
    }
}

impl std::borrow::Borrow<str> for Text<'_> {
    fn borrow(&self) -> &str {
        self
    }
}

struct TextSeed;

impl<'de> DeserializeSeed<'de> for TextSeed {
    type Value = Text<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Text<'de>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for TextSeed {
    type Value = Text<'de>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, value: &'de str) -> Result<Text<'de>, E> {
        Ok(Text::Borrowed(value))
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Text<'de>, E> {
        Ok(Text::Owned(value.to_owned()))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<Text<'de>, E> {
        Ok(Text::Owned(value))
    }
}

/// Any JSON value, read and dropped; an object with a key twice is an
/// error, as everywhere in a request.
struct StrictSkip;

impl<'de> DeserializeSeed<'de> for StrictSkip {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictSkip {
    type Value = ();

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<(), E> {
        if value.is_finite() {
            Ok(())
        } else {
            Err(E::custom("a number is not finite"))
        }
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(StrictSkip)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys: HashSet<Text<'de>> = HashSet::new();
        while let Some(key) = map.next_key_seed(TextSeed)? {
            map.next_value_seed(StrictSkip)?;
            if !keys.insert(key.clone()) {
                return Err(twice(&key));
            }
        }
        Ok(())
    }
}

/// The first syntax error of `body` read as plain JSON (a key twice in one
/// object counts), if it has one.
fn syntax_error(body: &[u8]) -> Option<serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    StrictSkip
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end())
        .err()
}

/// Field indexes of one message: inline up to 64 fields, no allocation.
#[derive(Default)]
struct FieldSet {
    low: u64,
    high: Vec<u64>,
}

impl FieldSet {
    fn contains(&self, index: usize) -> bool {
        if index < 64 {
            self.low & (1 << index) != 0
        } else {
            let (word, bit) = ((index - 64) / 64, index % 64);
            self.high.get(word).is_some_and(|w| w & (1 << bit) != 0)
        }
    }

    fn insert(&mut self, index: usize) {
        if index < 64 {
            self.low |= 1 << index;
        } else {
            let (word, bit) = ((index - 64) / 64, index % 64);
            if self.high.len() <= word {
                self.high.resize(word + 1, 0);
            }
            self.high[word] |= 1 << bit;
        }
    }
}

fn not_an_object(message: &MessagePlan, at: &Path<'_>, value: &Value) -> String {
    format!(
        "{}expected a JSON object (message {}), found {}",
        at.prefix(),
        message.full_name,
        describe(value)
    )
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

/// An integer field's value: a JSON number or a string holding a JSON
/// number, integral (`1e3` and `1000.0` are 1000) and within the type's range.
fn integer(token: &Token<'_>, kind: IntegerKind, at: &Path<'_>) -> Result<i128, String> {
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
fn float(token: &Token<'_>) -> Option<f64> {
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
fn base64(text: &str) -> Option<Vec<u8>> {
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

#[cfg(test)]
mod tests {
    use prost::{Message, Name};
    use prost_reflect::DynamicMessage;
    use prost_types::{
        DescriptorProto, FieldDescriptorProto, FileDescriptorProto, MessageOptions,
        OneofDescriptorProto,
        field_descriptor_proto::{Label, Type},
    };
    use serde_json::json;

    use super::*;

    /// `body` read as a `T`, or the refusal as the caller hears it.
    fn read<T: Message + Name + Default>(body: &str) -> Result<T, String> {
        let binary = to_binary(T::PACKAGE, T::NAME, body.as_bytes()).expect("a known message");
        match binary {
            Ok(binary) => Ok(T::decode(&binary[..]).expect("prost reads what was written")),
            Err(JsonError::Invalid(reason)) => Err(reason),
            Err(JsonError::Syntax(error)) => Err(format!("syntax: {error}")),
            Err(JsonError::Unsupported(reason)) => Err(format!("unsupported: {reason}")),
        }
    }

    fn keep_alive(value: serde_json::Value) -> Result<pb::KeepTaskAliveRequest, String> {
        read(&value.to_string())
    }

    #[test]
    fn every_message_of_the_api_is_readable() {
        assert_eq!(PLANS.unsupported_fields(), Vec::<String>::new());
        for message in pb::DESCRIPTOR_POOL.all_messages() {
            let (package, name) = message
                .full_name()
                .rsplit_once('.')
                .expect("every message is in a package");
            assert!(
                PLANS.find(package, name).is_some(),
                "{}",
                message.full_name()
            );
        }
        assert!(to_binary("yadcc.scheduler", "NoSuchRequest", b"{}").is_none());
        assert!(to_binary("yadcc.sched", "HeartbeatRequest", b"{}").is_none());
    }

    #[test]
    fn integers_in_every_canonical_form() {
        for form in [
            json!(1000),
            json!(1e3),
            json!(1000.0),
            json!("1000"),
            json!("1e3"),
            json!("1E+3"),
            json!("10000e-1"),
            json!("1000.0"),
        ] {
            assert_eq!(
                keep_alive(json!({"nextKeepAliveInMs": form, "taskGrantIds": [form]})).unwrap(),
                pb::KeepTaskAliveRequest {
                    token: String::new(),
                    task_grant_ids: vec![1000],
                    next_keep_alive_in_ms: 1000,
                },
                "{form}"
            );
        }
        let extremes =
            keep_alive(json!({"taskGrantIds": ["18446744073709551615", "-0", "0", 0]})).unwrap();
        assert_eq!(extremes.task_grant_ids, vec![u64::MAX, 0, 0, 0]);
    }

    #[test]
    fn refusals_name_the_field_and_the_reason() {
        for (value, expected) in [
            (
                json!({"nextKeepAliveInMs": 1.5}),
                "nextKeepAliveInMs: 1.5 is not an integer",
            ),
            (
                json!({"nextKeepAliveInMs": "1.5"}),
                "nextKeepAliveInMs: \"1.5\" is not an integer",
            ),
            (
                json!({"nextKeepAliveInMs": -1}),
                "nextKeepAliveInMs: -1 is out of range for uint32 (0 to 4294967295)",
            ),
            (
                json!({"nextKeepAliveInMs": 4294967296_u64}),
                "is out of range for uint32",
            ),
            (
                json!({"nextKeepAliveInMs": "4294967296"}),
                "nextKeepAliveInMs: \"4294967296\" is out of range for uint32",
            ),
            (
                json!({"nextKeepAliveInMs": " 1"}),
                "nextKeepAliveInMs: \" 1\" is not a number",
            ),
            (json!({"nextKeepAliveInMs": "0x10"}), "is not a number"),
            (json!({"nextKeepAliveInMs": "01"}), "is not a number"),
            (json!({"nextKeepAliveInMs": ""}), "is not a number"),
            (
                json!({"nextKeepAliveInMs": true}),
                "expected an integer (uint32), found a boolean",
            ),
            (
                json!({"nextKeepAliveInMs": [1]}),
                "nextKeepAliveInMs: expected an integer (uint32), found an array ([1])",
            ),
            (
                json!({"taskGrantIds": ["18446744073709551616"]}),
                "taskGrantIds[0]: \"18446744073709551616\" is out of range for uint64",
            ),
            (
                json!({"taskGrantIds": ["1".repeat(50)]}),
                "taskGrantIds[0]: \"111111111111111111111111111111111111111... is out of range",
            ),
            (
                json!({"taskGrantIds": [1, null]}),
                "taskGrantIds[1]: null is not allowed as a list element",
            ),
            (
                json!({"taskGrantIds": 1}),
                "taskGrantIds: expected a JSON array (a repeated field), found a number (1)",
            ),
            (
                json!({"token": 5}),
                "token: expected a string, found a number (5)",
            ),
            (
                json!({"token": {"a": [1, 2]}}),
                "token: expected a string, found an object ({\"a\":[1,2]})",
            ),
            (
                json!({"nextKeepAliveInMs": 1, "next_keep_alive_in_ms": 2}),
                "next_keep_alive_in_ms: field next_keep_alive_in_ms is given twice \
                 (as \"nextKeepAliveInMs\" and \"next_keep_alive_in_ms\")",
            ),
            (
                json!({"next_keep_alive_in_ms": null, "nextKeepAliveInMs": 2}),
                "field next_keep_alive_in_ms is given twice \
                 (as \"next_keep_alive_in_ms\" and \"nextKeepAliveInMs\")",
            ),
            (
                json!([]),
                "expected a JSON object (message yadcc.scheduler.KeepTaskAliveRequest), found an array ([])",
            ),
        ] {
            let error = keep_alive(value.clone()).unwrap_err();
            assert!(error.contains(expected), "{value}: {error}");
        }
        let error = read::<pb::KeepTaskAliveRequest>("null").unwrap_err();
        assert_eq!(
            error,
            "expected a JSON object (message yadcc.scheduler.KeepTaskAliveRequest), found null"
        );
        let error = read::<pb::HeartbeatRequest>(r#"{"envDescs": [{}, {"compiler_digest": 7}]}"#)
            .unwrap_err();
        assert_eq!(
            error,
            "envDescs[1].compiler_digest: expected a string, found a number (7)"
        );
        let error = read::<pb::WaitForStartingTaskRequest>(r#"{"envDesc": "d"}"#).unwrap_err();
        assert_eq!(
            error,
            "envDesc: expected a JSON object (message yadcc.EnvironmentDesc), found a string (\"d\")"
        );
    }

    #[test]
    fn null_is_the_default_and_unknown_fields_of_any_shape_are_skipped() {
        assert_eq!(
            keep_alive(json!({
                "token": null, "taskGrantIds": null, "nextKeepAliveInMs": null,
                "future": {"nested": [1, null, {"x": "y"}]}, "other": null
            }))
            .unwrap(),
            pb::KeepTaskAliveRequest::default()
        );
        let wait: pb::WaitForStartingTaskRequest =
            read(r#"{"env_desc": {"compiler_digest": "d", "x": 1}}"#).unwrap();
        assert_eq!(wait.env_desc.unwrap().compiler_digest, "d");
        let absent: pb::WaitForStartingTaskRequest = read(r#"{"envDesc": null}"#).unwrap();
        assert_eq!(absent.env_desc, None);
        // An optional message given empty is present, as in binary.
        let empty: pb::WaitForStartingTaskRequest = read(r#"{"envDesc": {}}"#).unwrap();
        assert_eq!(empty.env_desc, Some(pb::EnvironmentDesc::default()));
    }

    #[test]
    fn strings_keep_their_escapes_and_any_length() {
        let long = "x".repeat(300);
        let text = format!(r#"{{"token": "a\"b\\c\u00e9\n", "location": "{long}"}}"#);
        let heartbeat: pb::HeartbeatRequest = read(&text).unwrap();
        assert_eq!(heartbeat.token, "a\"b\\c\u{e9}\n");
        assert_eq!(heartbeat.location, long);
    }

    #[test]
    fn enums_take_known_names_and_numbers() {
        for form in [
            json!("SERVANT_PRIORITY_USER"),
            json!(2),
            json!(2.0),
            json!("2e0"),
        ] {
            let heartbeat: Result<pb::HeartbeatRequest, _> =
                read(&json!({"servantPriority": form}).to_string());
            match form {
                // A string is a name, never a number.
                serde_json::Value::String(ref text) if text == "2e0" => {
                    assert!(heartbeat.unwrap_err().contains("is not a value of enum"));
                }
                _ => assert_eq!(heartbeat.unwrap().servant_priority, 2, "{form}"),
            }
        }
        for (form, expected) in [
            (
                json!("USER"),
                "servantPriority: \"USER\" is not a value of enum yadcc.scheduler.ServantPriority; \
                 use one of SERVANT_PRIORITY_UNKNOWN, SERVANT_PRIORITY_DEDICATED, \
                 SERVANT_PRIORITY_USER or its number",
            ),
            (
                json!(7),
                "servantPriority: 7 is not a number of enum yadcc.scheduler.ServantPriority; \
                 use one of 0, 1, 2 or its name",
            ),
            (json!(1.5), "servantPriority: 1.5 is not an integer"),
            (
                json!(-1),
                "servantPriority: -1 is not a number of enum yadcc.scheduler.ServantPriority; \
                 use one of 0, 1, 2 or its name",
            ),
            (
                json!(true),
                "servantPriority: expected an enum value name (a string) or number, found a boolean (true)",
            ),
        ] {
            let error = read::<pb::HeartbeatRequest>(&json!({"servantPriority": form}).to_string())
                .unwrap_err();
            assert_eq!(error, expected, "{form}");
        }
    }

    #[test]
    fn a_key_twice_is_refused_anywhere_as_malformed_json() {
        for (body, key, column) in [
            (r#"{"token": "a", "token": "b"}"#, "token", 28),
            (r#"{"a": {"b": 1, "b": 2}}"#, "b", 22),
            (r#"{"x": 1, "x": [2]}"#, "x", 18),
            (
                r#"{"envDesc": {"compilerDigest": "a", "compilerDigest": "b"}}"#,
                "compilerDigest",
                58,
            ),
        ] {
            let error = read::<pb::WaitForStartingTaskRequest>(body).unwrap_err();
            assert_eq!(
                error,
                format!(
                    "syntax: the key {key:?} appears twice in one object at line 1 column {column}"
                ),
                "{body}"
            );
        }
    }

    #[test]
    fn malformed_json_anywhere_comes_before_a_field_error() {
        for (body, expected) in [
            (
                r#"{"token": 5, "x": }"#,
                "syntax: expected value at line 1 column 19",
            ),
            (
                r#"{"token": 5, "x": 1, "x": 2}"#,
                "syntax: the key \"x\" appears twice",
            ),
            (
                r#"{"token": 5} x"#,
                "syntax: trailing characters at line 1 column 14",
            ),
            (r#"{"token": 5"#, "syntax: EOF while parsing an object"),
            (
                "{\"token\": \"\u{00e9}",
                "syntax: EOF while parsing a string",
            ),
        ] {
            let error = read::<pb::GetConfigRequest>(body).unwrap_err();
            assert!(error.starts_with(expected), "{body}: {error}");
        }
        // Not UTF-8: serde_json's own error.
        let error = to_binary(
            "yadcc.scheduler",
            "GetConfigRequest",
            b"{\"token\": \"\xff\"}",
        )
        .unwrap()
        .unwrap_err();
        assert!(
            matches!(&error, JsonError::Syntax(e) if e.to_string().contains("invalid unicode")),
            "{error:?}"
        );
    }

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

    /// A proto3 file with every kind of field the API does not use yet, so
    /// the reader is checked against prost-reflect's own JSON parser.
    fn kinds_pool() -> DescriptorPool {
        fn field(name: &str, number: i32, kind: Type) -> FieldDescriptorProto {
            FieldDescriptorProto {
                name: Some(name.into()),
                number: Some(number),
                label: Some(Label::Optional as i32),
                r#type: Some(kind as i32),
                ..Default::default()
            }
        }
        fn of(mut field: FieldDescriptorProto, type_name: &str) -> FieldDescriptorProto {
            field.type_name = Some(type_name.into());
            field
        }
        fn repeated(mut field: FieldDescriptorProto) -> FieldDescriptorProto {
            field.label = Some(Label::Repeated as i32);
            field
        }
        fn in_oneof(mut field: FieldDescriptorProto, index: i32) -> FieldDescriptorProto {
            field.oneof_index = Some(index);
            field
        }
        fn map_entry(name: &str, key: Type, value: FieldDescriptorProto) -> DescriptorProto {
            DescriptorProto {
                name: Some(name.into()),
                field: vec![field("key", 1, key), value],
                options: Some(MessageOptions {
                    map_entry: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            }
        }
        let mut maybe = in_oneof(field("maybe", 15, Type::Int32), 1);
        maybe.proto3_optional = Some(true);
        let kinds = DescriptorProto {
            name: Some("Kinds".into()),
            field: vec![
                repeated(of(
                    field("counts", 1, Type::Message),
                    ".test.Kinds.CountsEntry",
                )),
                repeated(of(
                    field("by_id", 2, Type::Message),
                    ".test.Kinds.ByIdEntry",
                )),
                repeated(of(
                    field("flags", 3, Type::Message),
                    ".test.Kinds.FlagsEntry",
                )),
                in_oneof(field("a", 4, Type::String), 0),
                in_oneof(of(field("b", 5, Type::Message), ".test.Inner"), 0),
                field("f", 6, Type::Float),
                field("d", 7, Type::Double),
                field("raw", 8, Type::Bytes),
                field("s32", 9, Type::Sint32),
                field("s64", 10, Type::Sint64),
                field("fx32", 11, Type::Fixed32),
                field("sfx64", 12, Type::Sfixed64),
                field("i32", 13, Type::Int32),
                repeated(field("many", 14, Type::Int32)),
                maybe,
                of(
                    field("when", 16, Type::Message),
                    ".google.protobuf.Timestamp",
                ),
                field("flag", 17, Type::Bool),
                repeated(field("sfx32s", 18, Type::Sfixed32)),
                repeated(field("fx64s", 19, Type::Fixed64)),
                repeated(field("i64s", 20, Type::Int64)),
            ],
            nested_type: vec![
                map_entry("CountsEntry", Type::String, field("value", 2, Type::Int32)),
                map_entry(
                    "ByIdEntry",
                    Type::Int64,
                    of(field("value", 2, Type::Message), ".test.Inner"),
                ),
                map_entry("FlagsEntry", Type::Bool, field("value", 2, Type::String)),
            ],
            oneof_decl: vec![
                OneofDescriptorProto {
                    name: Some("choice".into()),
                    ..Default::default()
                },
                OneofDescriptorProto {
                    name: Some("_maybe".into()),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let inner = DescriptorProto {
            name: Some("Inner".into()),
            field: vec![field("name", 1, Type::String)],
            ..Default::default()
        };
        let mut pool = DescriptorPool::global();
        pool.add_file_descriptor_proto(FileDescriptorProto {
            name: Some("test/kinds.proto".into()),
            package: Some("test".into()),
            dependency: vec!["google/protobuf/timestamp.proto".into()],
            message_type: vec![kinds, inner],
            syntax: Some("proto3".into()),
            ..Default::default()
        })
        .expect("a valid test file");
        pool
    }

    #[test]
    fn every_field_kind_reads_as_prost_reflect_reads_it() {
        let pool = kinds_pool();
        let plans = Plans::compile(&pool);
        let kinds = plans.find("test", "Kinds").expect("compiled");
        let descriptor = pool.get_message_by_name("test.Kinds").unwrap();
        for body in [
            json!({"counts": {"a": 1, "b": "-2", "": 3}}),
            json!({"byId": {"-5": {"name": "x"}, "9223372036854775807": {}}}),
            json!({"flags": {"true": "yes", "false": ""}}),
            json!({"a": "one"}),
            json!({"b": {"name": "inner"}}),
            json!({"a": null, "b": {}}),
            json!({"f": 1.5, "d": -2.25e300}),
            json!({"f": "-Infinity", "d": "-Infinity"}),
            json!({"f": "Infinity", "d": "1e3"}),
            json!({"raw": "aGVsbG8/Pz8="}),
            json!({"raw": "aGVsbG8_Pz8"}),
            json!({"s32": -2147483648_i64, "s64": "-9223372036854775808"}),
            json!({"fx32": 4294967295_u64, "sfx64": "-1"}),
            json!({"i32": -1, "many": [1, -1, "3"], "maybe": 0}),
            json!({"flag": true, "sfx32s": [-1, 2], "fx64s": ["18446744073709551615"], "i64s": [-3]}),
            json!({"maybe": null}),
        ] {
            let text = body.to_string();
            let binary = plans
                .to_binary(kinds, text.as_bytes())
                .unwrap_or_else(|error| {
                    panic!("{text}: {error:?}");
                });
            let ours = DynamicMessage::decode(descriptor.clone(), &binary[..]).unwrap();
            let mut deserializer = serde_json::Deserializer::from_str(&text);
            let theirs =
                DynamicMessage::deserialize(descriptor.clone(), &mut deserializer).unwrap();
            assert_eq!(ours, theirs, "{text}");
        }
        let nan = DynamicMessage::decode(
            descriptor.clone(),
            &plans
                .to_binary(kinds, br#"{"f": "NaN", "d": "NaN"}"#)
                .unwrap()[..],
        )
        .unwrap();
        assert!(
            nan.get_field_by_name("f")
                .unwrap()
                .as_f32()
                .unwrap()
                .is_nan()
        );
        assert!(
            nan.get_field_by_name("d")
                .unwrap()
                .as_f64()
                .unwrap()
                .is_nan()
        );
        let maybe = DynamicMessage::decode(
            descriptor.clone(),
            &plans.to_binary(kinds, br#"{"maybe": 0}"#).unwrap()[..],
        )
        .unwrap();
        assert!(maybe.has_field_by_name("maybe"), "an explicit 0 is present");
        let both = plans.to_binary(kinds, br#"{"b": {}, "s32": 1, "a": "x"}"#);
        let Err(JsonError::Invalid(error)) = both else {
            panic!("{both:?}")
        };
        assert_eq!(
            error,
            "a: \"b\" and \"a\" are members of oneof choice; set at most one"
        );
    }

    #[test]
    fn every_field_kind_refuses_what_it_cannot_hold() {
        let pool = kinds_pool();
        let plans = Plans::compile(&pool);
        let kinds = plans.find("test", "Kinds").expect("compiled");
        for (body, expected) in [
            (
                json!({"counts": {"a": null}}),
                "counts[\"a\"]: null is not allowed as a map value",
            ),
            (
                json!({"counts": [1]}),
                "counts: expected a JSON object (a map), found an array ([1])",
            ),
            (
                json!({"counts": {"a": 1.5}}),
                "counts[\"a\"]: 1.5 is not an integer",
            ),
            (
                json!({"byId": {"x": {}}}),
                "byId[\"x\"]: \"x\" is not a number",
            ),
            (
                json!({"byId": {"1": 2}}),
                "byId[\"1\"]: expected a JSON object (message test.Inner), found a number (2)",
            ),
            (
                json!({"flags": {"yes": "y"}}),
                "flags[\"yes\"]: expected true or false, found a string (\"yes\")",
            ),
            (json!({"f": 1e39}), "f: 1e+39 is out of range for float"),
            (json!({"f": "fast"}), "f: \"fast\" is not a number"),
            (
                json!({"d": true}),
                "d: expected a number, found a boolean (true)",
            ),
            (
                json!({"raw": "not base64!"}),
                "raw: \"not base64!\" is not base64 (standard or URL-safe)",
            ),
            (
                json!({"raw": 1}),
                "raw: expected a base64 string, found a number (1)",
            ),
            (
                json!({"s32": 2147483648_u64}),
                "s32: 2147483648 is out of range for int32",
            ),
            (
                json!({"many": [1, null]}),
                "many[1]: null is not allowed as a list element",
            ),
            (
                json!({"flag": 1}),
                "flag: expected true or false, found a number (1)",
            ),
        ] {
            let text = body.to_string();
            match plans.to_binary(kinds, text.as_bytes()) {
                Err(JsonError::Invalid(error)) => {
                    assert!(error.starts_with(expected), "{text}: {error}")
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        // A key twice in a map is malformed JSON, as anywhere.
        let twice = plans.to_binary(kinds, br#"{"counts": {"a": 1, "a": 2}}"#);
        assert!(matches!(twice, Err(JsonError::Syntax(_))), "{twice:?}");
        // A well-known type is not read: a server bug, not the client's.
        let when = plans.to_binary(kinds, br#"{"when": "1970-01-01T00:00:00Z"}"#);
        let Err(JsonError::Unsupported(reason)) = when else {
            panic!("{when:?}")
        };
        assert_eq!(
            reason,
            "when: reading google.protobuf.Timestamp from JSON is not implemented"
        );
        let unsupported: Vec<String> = plans
            .unsupported_fields()
            .into_iter()
            .filter(|field| field.starts_with("test."))
            .collect();
        assert_eq!(unsupported, ["test.Kinds.when: google.protobuf.Timestamp"]);
        // Absent, it costs nothing.
        assert!(
            plans
                .to_binary(kinds, br#"{"when": null, "i32": 1}"#)
                .is_ok()
        );
    }
}
