//! What reading JSON needs to know of each message and enum, compiled once
//! from the descriptor pool: field names in both spellings, each field's
//! shape and wire form, enum values, oneofs. Messages refer to each other by
//! index, so the reader walks plain vectors instead of descriptors.

use prost_reflect::{DescriptorPool, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor};

use super::IntegerKind;

/// What reading JSON needs to know of every message and enum of a
/// descriptor pool, indexed by position so messages may refer to each other.
#[derive(Debug)]
pub(super) struct Plans {
    pub(super) messages: Vec<MessagePlan>,
    pub(super) enums: Vec<EnumPlan>,
}

#[derive(Debug)]
pub(super) struct MessagePlan {
    pub(super) full_name: Box<str>,
    pub(super) fields: Vec<FieldPlan>,
    /// Names of the message's real (not synthetic) oneofs.
    pub(super) oneofs: Vec<Box<str>>,
}

#[derive(Debug)]
pub(super) struct FieldPlan {
    pub(super) number: u32,
    pub(super) name: Box<str>,
    pub(super) json_name: Box<str>,
    pub(super) shape: Shape,
    /// Index in the message's `oneofs`.
    pub(super) oneof: Option<usize>,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Shape {
    Single(ValueKind),
    List(ValueKind),
    /// Entries are messages with the key as field 1 and the value as field 2.
    Map {
        key: ValueKind,
        value: ValueKind,
    },
}

#[derive(Debug, Clone, Copy)]
pub(super) enum ValueKind {
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
pub(super) enum IntegerWire {
    Varint,
    ZigZag,
    Fixed,
}

#[derive(Debug)]
pub(super) struct EnumPlan {
    pub(super) full_name: Box<str>,
    /// In declaration order, as error messages list them.
    pub(super) values: Vec<(Box<str>, i32)>,
}

impl Plans {
    pub(super) fn compile(pool: &DescriptorPool) -> Plans {
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
    pub(super) fn find(&self, package: &str, name: &str) -> Option<usize> {
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
    pub(super) fn unsupported_fields(&self) -> Vec<String> {
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
}

impl MessagePlan {
    /// The field a key names, by JSON name first, then by proto name, and
    /// whether it was the JSON name.
    pub(super) fn field(&self, key: &str) -> Option<(usize, bool)> {
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
