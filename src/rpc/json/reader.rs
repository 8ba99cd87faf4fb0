//! The descriptor-driven walk: each value serde_json hands over is checked
//! against what the plan expects at that field and written to the binary
//! message at once; nested messages, lists and maps recurse on the stack.
//! An array or object is read whole only where a scalar was expected, to
//! describe it in the refusal.

use std::{collections::HashSet, fmt};

use serde::{
    Deserialize as _,
    de::{
        self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor,
        value::{MapAccessDeserializer, SeqAccessDeserializer},
    },
};
use serde_json::Value;

use super::{
    JsonError,
    path::Path,
    plan::{MessagePlan, Shape, ValueKind},
    scalars::{Token, describe},
    syntax::{StrictSkip, Text, TextSeed, key_given_twice},
    writer::Writer,
};

/// The whole document, a message of type `message`.
pub(super) fn read_document<'de, R: serde_json::de::Read<'de>>(
    writer: &mut Writer<'_>,
    message: usize,
    mut deserializer: serde_json::Deserializer<R>,
) -> Result<Present, serde_json::Error> {
    let present = ValueSeed {
        writer,
        number: None,
        shape: Shape::Single(ValueKind::Message(message)),
        at: &Path::Root,
        oneof: None,
    }
    .deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(present)
}

/// Whether a value was there (and written), or was `null`.
pub(super) enum Present {
    Written,
    Null,
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
                return Err(key_given_twice(&key));
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
                return Err(key_given_twice(&key));
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

pub(super) fn not_an_object(message: &MessagePlan, at: &Path<'_>, value: &Value) -> String {
    format!(
        "{}expected a JSON object (message {}), found {}",
        at.prefix(),
        message.full_name,
        describe(value)
    )
}
