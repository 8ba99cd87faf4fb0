//! JSON as plain JSON, below any descriptor: object keys (borrowed from the
//! body when they have no escapes), values skipped with a key given twice in
//! one object refused, as Google's parser refuses it, and the syntax check a
//! refused body gets before any field error is reported.

use std::{collections::HashSet, fmt};

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// The error of a key given twice in one object; the same words as the
/// syntax check's, which is what the caller hears.
pub(super) fn key_given_twice<E: de::Error>(key: &str) -> E {
    E::custom(format!("the key {key:?} appears twice in one object"))
}

/// A JSON string, borrowed from the body when it has no escapes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Text<'de> {
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

pub(super) struct TextSeed;

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
pub(super) struct StrictSkip;

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
                return Err(key_given_twice(&key));
            }
        }
        Ok(())
    }
}

/// The first syntax error of `body` read as plain JSON (a key twice in one
/// object counts), if it has one.
pub(super) fn syntax_error(body: &[u8]) -> Option<serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    StrictSkip
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end())
        .err()
}
