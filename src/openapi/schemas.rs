//! The schemas of every message and enum of the descriptor pool, as the
//! proto3 JSON mapping reads and writes them, with the constraints of
//! [`contract`].
//!
//! Written as JSON: the keywords below (type lists with "null", anyOf, allOf
//! with siblings) are plain JSON Schema 2020-12, which OpenAPI 3.1 uses as is.

use std::borrow::Cow;

use prost_reflect::{DescriptorPool, EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor};
use serde_json::{Map, Value, json};

use super::{
    comments::{comment, member_comment, push_paragraph, table_cell},
    examples::field_example,
};
use crate::{
    contract::{self, FieldRule, Rule},
    grammar,
    rpc::json::IntegerKind,
};

/// `pattern` of an unsigned 64-bit integer written as a JSON string.
pub const UNSIGNED_DIGITS: &str = "^[0-9]+$";

/// `pattern` of a signed 64-bit integer written as a JSON string.
pub const SIGNED_DIGITS: &str = "^-?[0-9]+$";

/// Adds a schema for every message and enum of `pool` (well-known types
/// aside: they have their own JSON forms) to `schemas`.
pub(super) fn add_all(
    schemas: &mut Map<String, Value>,
    pool: &DescriptorPool,
    rules: &[FieldRule],
) {
    for message in pool.all_messages() {
        if message.is_map_entry() || is_well_known(message.full_name()) {
            continue;
        }
        schemas.insert(
            message.full_name().to_owned(),
            message_schema(&message, rules),
        );
    }
    for enumeration in pool.all_enums() {
        if is_well_known(enumeration.full_name()) {
            continue;
        }
        schemas.insert(
            enumeration.full_name().to_owned(),
            enum_schema(&enumeration),
        );
    }
}

/// Removes the schemas no operation reaches, directly or through other
/// schemas: messages and enums of the proto that no RPC carries (such as
/// `StartingTaskApplication`) document nothing a client sends or receives,
/// and linters flag them as unused.
pub(super) fn drop_unreachable(document: &mut Value) {
    let mut pending = Vec::new();
    for (key, value) in document.as_object().expect("the document is an object") {
        if key != "components" {
            collect_schema_refs(value, &mut pending);
            continue;
        }
        for (section, entries) in value.as_object().expect("components is an object") {
            if section != "schemas" {
                collect_schema_refs(entries, &mut pending);
            }
        }
    }
    let schemas = document["components"]["schemas"]
        .as_object_mut()
        .expect("components has schemas");
    let mut reached = std::collections::BTreeSet::new();
    while let Some(name) = pending.pop() {
        if let Some(schema) = schemas.get(&name)
            && reached.insert(name)
        {
            collect_schema_refs(schema, &mut pending);
        }
    }
    schemas.retain(|name, _| reached.contains(name));
}

/// The names of the component schemas `node` refers to, anywhere inside it.
fn collect_schema_refs(node: &Value, into: &mut Vec<String>) {
    match node {
        Value::Object(map) => {
            if let Some(name) = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|reference| reference.strip_prefix(SCHEMA_REF_PREFIX))
            {
                into.push(name.to_owned());
            }
            for child in map.values() {
                collect_schema_refs(child, into);
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|item| collect_schema_refs(item, into)),
        _ => {}
    }
}

fn message_schema(message: &MessageDescriptor, rules: &[FieldRule]) -> Value {
    let mut description =
        comment(message.parent_file_descriptor_proto(), message.path()).unwrap_or_default();
    push_paragraph(
        &mut description,
        if message.fields().len() == 0 {
            format!(
                "Proto message `{}`, which has no fields: `{{}}` in JSON, an empty body in binary.",
                message.full_name()
            )
        } else {
            format!(
                "Proto message `{}`. Properties may also be spelled as in the proto \
                 (`snake_case`); unknown properties are ignored.",
                message.full_name()
            )
        },
    );
    let mut schema = message_constraints(message, message.full_name(), rules, &[]);
    let object = schema.as_object_mut().expect("an object schema");
    object.insert("description".into(), json!(description));
    schema
}

/// `{"type": "object", "properties", "required"}` of `message`, reached
/// by the field path `prefix` from `rules_message`, whose rules apply.
fn message_constraints(
    message: &MessageDescriptor,
    rules_message: &str,
    rules: &[FieldRule],
    prefix: &[&str],
) -> Value {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for field in message.fields() {
        let own = own_rules(rules, rules_message, prefix, field.name());
        let mut deeper: Vec<&str> = prefix.to_vec();
        deeper.push(field.name());
        let nested = contract::rules_under(rules, rules_message, &deeper)
            .any(|rule| rule.path.len() > deeper.len());
        if own.contains(&Rule::Required) {
            required.push(field.json_name().to_owned());
        }
        let mut schema = if nested {
            let Kind::Message(inner) = field.kind() else {
                unreachable!("rules lead through message fields only")
            };
            let mut refined = message_constraints(&inner, rules_message, rules, &deeper);
            refined.as_object_mut().expect("an object schema").insert(
                "allOf".into(),
                json!([{"$ref": schema_ref(inner.full_name())}]),
            );
            if field.is_list() {
                // The rules apply to each element.
                let mut list = field_schema(&field, &own);
                list["items"] = refined;
                list
            } else {
                refined
            }
        } else {
            field_schema(&field, &own)
        };
        let object = schema.as_object_mut().expect("an object schema");
        // Nested fields are described by their own message's schema.
        if prefix.is_empty() {
            object.insert("description".into(), json!(field_description(&field, &own)));
        }
        if let Some(example) = field_example(&field) {
            object.insert("examples".into(), json!([example]));
        }
        properties.insert(field.json_name().to_owned(), schema);
    }
    let mut schema = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema
}

/// The rules on the field `name` at `prefix` in `message`.
fn own_rules(rules: &[FieldRule], message: &str, prefix: &[&str], name: &str) -> Vec<Rule> {
    rules
        .iter()
        .filter(|rule| {
            rule.message == message
                && rule.path.len() == prefix.len() + 1
                && rule.path.starts_with(prefix)
                && rule.path[prefix.len()] == name
        })
        .map(|rule| rule.rule.clone())
        .collect()
}

/// An enum by its value names only: `{"type": "string", "enum": [NAMES]}`.
/// The server also reads a value's number, but a schema mixing names and
/// numbers makes client generators drop the enum and every message using
/// it; the numbers are in the description's table instead.
fn enum_schema(enumeration: &EnumDescriptor) -> Value {
    let file = enumeration.parent_file_descriptor_proto();
    let mut description = comment(file, enumeration.path()).unwrap_or_default();
    push_paragraph(
        &mut description,
        format!(
            "Proto enum `{}`, written by value name. On input the value's number (in the \
             table) is accepted too.",
            enumeration.full_name()
        ),
    );
    push_paragraph(&mut description, enum_table(enumeration));
    let names: Vec<Value> = enumeration
        .values()
        .map(|value| json!(value.name()))
        .collect();
    json!({
        "type": "string",
        "enum": names,
        "description": description,
    })
}

/// A field of an enum type: the enum by name (its schema), or by number,
/// which the server reads too. Two alternatives, each of one type, rather
/// than one enum of mixed names and numbers, which client generators
/// refuse.
fn enum_field_schema(enumeration: &EnumDescriptor) -> Value {
    let numbers: Vec<Value> = enumeration
        .values()
        .map(|value| json!(value.number()))
        .collect();
    json!({
        "anyOf": [
            {"$ref": schema_ref(enumeration.full_name())},
            {"type": "integer", "enum": numbers},
        ]
    })
}

/// Markdown table of an enum's values: name, number and the proto comment.
fn enum_table(enumeration: &EnumDescriptor) -> String {
    let file = enumeration.parent_file_descriptor_proto();
    let mut table = String::from("| Name | Number | Meaning |\n| --- | --- | --- |");
    for value in enumeration.values() {
        let meaning = member_comment(file, value.path()).unwrap_or_default();
        table.push_str(&format!(
            "\n| `{}` | {} | {} |",
            value.name(),
            value.number(),
            table_cell(&meaning)
        ));
    }
    table
}

/// A field's schema: its value's, in a list or map when it is one, and
/// `null` allowed (it means the default) unless the field is required.
fn field_schema(field: &FieldDescriptor, own: &[Rule]) -> Value {
    if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            unreachable!("a map field's kind is its entry message")
        };
        let mut schema = json!({
            "type": ["object", "null"],
            "additionalProperties": value_schema(&entry.map_entry_value_field().kind(), &[]),
        });
        if let Some(pattern) = map_key_pattern(&entry.map_entry_key_field().kind()) {
            schema["propertyNames"] = json!({"type": "string", "pattern": pattern});
        }
        return schema;
    }
    if field.is_list() {
        let mut schema = json!({
            "type": ["array", "null"],
            "items": value_schema(&field.kind(), own),
        });
        for rule in own {
            if let Rule::MaxItems(most) = rule {
                schema["maxItems"] = json!(most);
            }
        }
        return schema;
    }
    let schema = value_schema(&field.kind(), own);
    if own.contains(&Rule::Required) {
        return schema;
    }
    match schema {
        Value::Object(mut object) if object.contains_key("type") => {
            let types = match object.remove("type") {
                Some(Value::Array(mut types)) => {
                    types.push(json!("null"));
                    types
                }
                Some(one) => vec![one, json!("null")],
                None => unreachable!("checked above"),
            };
            object.insert("type".into(), Value::Array(types));
            Value::Object(object)
        }
        Value::Object(mut object) if object.len() == 1 && object.contains_key("anyOf") => {
            if let Some(Value::Array(alternatives)) = object.get_mut("anyOf") {
                alternatives.push(json!({"type": "null"}));
            }
            Value::Object(object)
        }
        other => json!({"anyOf": [other, {"type": "null"}]}),
    }
}

/// The schema of one value of a field's type (one element, for a list).
fn value_schema(kind: &Kind, own: &[Rule]) -> Value {
    if let Some((low, high)) = integer_bounds(kind, own) {
        return integer_schema(low, high);
    }
    match kind {
        Kind::Double | Kind::Float => json!({"type": ["number", "string"]}),
        Kind::Bool => json!({"type": "boolean"}),
        Kind::String => {
            let mut schema = json!({"type": "string"});
            for rule in own {
                match rule {
                    Rule::MaxLength(most) => schema["maxLength"] = json!(most),
                    Rule::Location => schema["pattern"] = json!(grammar::location_pattern()),
                    Rule::OneLine => schema["pattern"] = json!(grammar::ONE_LINE_PATTERN),
                    _ => {}
                }
            }
            schema
        }
        Kind::Bytes => json!({"type": "string", "contentEncoding": "base64"}),
        Kind::Message(message) => match message.full_name() {
            "google.protobuf.Timestamp" => json!({"type": "string", "format": "date-time"}),
            "google.protobuf.Duration" => {
                json!({"type": "string", "pattern": r"^-?[0-9]+(\.[0-9]{1,9})?s$"})
            }
            "google.protobuf.Empty" => json!({"type": "object"}),
            name if is_well_known(name) => {
                panic!("no JSON mapping for {name} yet: add it to openapi::schemas::value_schema")
            }
            name => json!({"$ref": schema_ref(name)}),
        },
        Kind::Enum(enumeration) => enum_field_schema(enumeration),
        _ => unreachable!("integers are handled above"),
    }
}

/// The range of an integer field's values: its type's, narrowed by its rules.
fn integer_bounds(kind: &Kind, own: &[Rule]) -> Option<(i128, i128)> {
    let (low, mut high) = IntegerKind::of(kind)?.range();
    for rule in own {
        if let Rule::AtMost(most) = rule {
            high = high.min(i128::from(*most));
        }
    }
    Some((low, high))
}

/// An integer as proto3 JSON takes it: a number, or a string of decimal
/// digits (the form 64-bit integers are written in), within `low..=high`.
fn integer_schema(low: i128, high: i128) -> Value {
    let number = |value: i128| match u64::try_from(value) {
        Ok(unsigned) => json!(unsigned),
        Err(_) => json!(i64::try_from(value).expect("a 64-bit bound")),
    };
    json!({
        "type": ["integer", "string"],
        "minimum": number(low),
        "maximum": number(high),
        "pattern": grammar::integer_pattern(low, high),
    })
}

/// How a `$ref` to a component schema starts.
const SCHEMA_REF_PREFIX: &str = "#/components/schemas/";

pub(super) fn schema_ref(name: &str) -> String {
    format!("{SCHEMA_REF_PREFIX}{name}")
}

fn map_key_pattern(kind: &Kind) -> Option<&'static str> {
    match kind {
        Kind::Int32
        | Kind::Sint32
        | Kind::Sfixed32
        | Kind::Int64
        | Kind::Sint64
        | Kind::Sfixed64 => Some(SIGNED_DIGITS),
        Kind::Uint32 | Kind::Fixed32 | Kind::Uint64 | Kind::Fixed64 => Some(UNSIGNED_DIGITS),
        Kind::Bool => Some("^(true|false)$"),
        _ => None,
    }
}

fn is_well_known(full_name: &str) -> bool {
    full_name.starts_with("google.protobuf.")
}

fn field_description(field: &FieldDescriptor, own: &[Rule]) -> String {
    let message = field.parent_message();
    let mut description =
        member_comment(message.parent_file_descriptor_proto(), field.path()).unwrap_or_default();
    let proto = field.field_descriptor_proto();
    let label = if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            unreachable!("a map field's kind is its entry message")
        };
        format!(
            "map<{}, {}>",
            type_name(&entry.map_entry_key_field().kind()),
            type_name(&entry.map_entry_value_field().kind())
        )
    } else if field.is_list() {
        format!("repeated {}", type_name(&field.kind()))
    } else if proto.proto3_optional() {
        format!("optional {}", type_name(&field.kind()))
    } else {
        type_name(&field.kind()).into_owned()
    };
    let mut notes = format!(
        "Proto field `{label} {} = {}`",
        field.name(),
        field.number()
    );
    if field.json_name() != field.name() {
        notes.push_str(&format!(
            "; the name `{}` is accepted on input too",
            field.name()
        ));
    }
    notes.push('.');
    let element = if field.is_map() {
        let Kind::Message(entry) = field.kind() else {
            unreachable!("a map field's kind is its entry message")
        };
        entry.map_entry_value_field().kind()
    } else {
        field.kind()
    };
    match element {
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 | Kind::Uint64 | Kind::Fixed64 => notes.push_str(
            " A 64-bit integer, written as a decimal string; a JSON number is accepted on input \
             too, and so are integral exponent forms (`1e3`, `\"1e3\"`).",
        ),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 | Kind::Uint32 | Kind::Fixed32 => notes
            .push_str(
                " Written as a JSON number; a string holding one is accepted on input too, and \
                 so are integral exponent forms (`1e3`, `\"1e3\"`).",
            ),
        Kind::Enum(_) => {
            notes.push_str(" Written as the value's name; the number is accepted on input too.")
        }
        Kind::Bytes => notes.push_str(" Base64, standard or URL-safe alphabet."),
        _ => {}
    }
    if proto.proto3_optional() {
        notes.push_str(
            " `optional`: explicit presence. The field is written whenever it is set, \
             even to its default; leave it out for \"not set\".",
        );
    } else if let Some(oneof) = field.containing_oneof() {
        let members: Vec<String> = oneof
            .fields()
            .map(|member| format!("`{}`", member.json_name()))
            .collect();
        notes.push_str(&format!(
            " Member of oneof `{}`: set at most one of {}.",
            oneof.name(),
            members.join(", ")
        ));
    }
    if !own.contains(&Rule::Required) {
        notes.push_str(" `null` means the default.");
    }
    for rule in own {
        notes.push_str(&match rule {
            Rule::Required => {
                " Required: a request without it is refused (`STATUS_INVALID_ARGUMENT`).".to_owned()
            }
            Rule::Location => {
                " `a.b.c.d:port` (IPv4) or `[v6]:port` (IPv6), no zone id; the port may have \
                 leading zeros (`:080` is 80), as the original reads it."
                    .to_owned()
            }
            Rule::AtMost(most) => {
                format!(" At most {most}: larger values are refused (`STATUS_INVALID_ARGUMENT`).")
            }
            Rule::MaxItems(most) => format!(
                " At most {most} entries: longer lists are refused (`STATUS_INVALID_ARGUMENT`)."
            ),
            Rule::MaxLength(most) => format!(
                " At most {most} characters: longer strings are refused \
                 (`STATUS_INVALID_ARGUMENT`)."
            ),
            Rule::OneLine => " One line: a control character (U+0000 to U+001F, U+007F to \
                U+009F) is refused (`STATUS_INVALID_ARGUMENT`)."
                .to_owned(),
        });
    }
    push_paragraph(&mut description, notes);
    if let Some(enumeration) = integer_of_enum(field) {
        push_paragraph(
            &mut description,
            format!(
                "The values of proto enum `{}`:\n\n{}",
                enumeration.full_name(),
                enum_table(&enumeration)
            ),
        );
    }
    description
}

/// The enum an integer field holds the numbers of, when its comment says so
/// (`@sa: NotAcceptingTaskReason`): the daemons' protocol keeps such fields
/// integers, so no schema refers to the enum and its table goes here.
fn integer_of_enum(field: &FieldDescriptor) -> Option<EnumDescriptor> {
    IntegerKind::of(&field.kind())?;
    let message = field.parent_message();
    let comment = member_comment(message.parent_file_descriptor_proto(), field.path())?;
    let (_, named) = comment.split_once("@sa")?;
    let name = named
        .trim_start_matches([':', ' '])
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
        .next()?
        .trim_end_matches('.');
    let package = message.package_name();
    message
        .parent_pool()
        .get_enum_by_name(&format!("{package}.{name}"))
        .or_else(|| message.parent_pool().get_enum_by_name(name))
}

fn type_name(kind: &Kind) -> Cow<'static, str> {
    Cow::Borrowed(match kind {
        Kind::Double => "double",
        Kind::Float => "float",
        Kind::Int32 => "int32",
        Kind::Int64 => "int64",
        Kind::Uint32 => "uint32",
        Kind::Uint64 => "uint64",
        Kind::Sint32 => "sint32",
        Kind::Sint64 => "sint64",
        Kind::Fixed32 => "fixed32",
        Kind::Fixed64 => "fixed64",
        Kind::Sfixed32 => "sfixed32",
        Kind::Sfixed64 => "sfixed64",
        Kind::Bool => "bool",
        Kind::String => "string",
        Kind::Bytes => "bytes",
        Kind::Message(message) => return Cow::Owned(message.full_name().to_owned()),
        Kind::Enum(enumeration) => return Cow::Owned(enumeration.full_name().to_owned()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        engine::Limits,
        openapi::{RPC_TIMEOUT, document},
    };

    #[test]
    fn wire_mapping_of_field_types() {
        let json = document();
        let schemas = &json["components"]["schemas"];
        let heartbeat = &schemas["yadcc.scheduler.HeartbeatRequest"]["properties"];
        let memory = &heartbeat["totalMemoryInBytes"];
        assert_eq!(memory["type"], json!(["integer", "string", "null"]));
        assert_eq!(memory["maximum"], json!(u64::MAX));
        assert_eq!(
            memory["pattern"],
            grammar::integer_pattern(0, u64::MAX.into())
        );
        assert_eq!(heartbeat["numProcessors"]["maximum"], json!(u32::MAX));
        // By name or by number, then null: three alternatives of one type each.
        assert_eq!(
            heartbeat["servantPriority"]["anyOf"],
            json!([
                {"$ref": "#/components/schemas/yadcc.scheduler.ServantPriority"},
                {"type": "integer", "enum": [0, 1, 2]},
                {"type": "null"},
            ])
        );
        assert_eq!(heartbeat["envDescs"]["type"], json!(["array", "null"]));
        assert_eq!(
            heartbeat["envDescs"]["items"]["allOf"][0]["$ref"],
            "#/components/schemas/yadcc.EnvironmentDesc"
        );
        assert_eq!(
            heartbeat["envDescs"]["items"]["properties"]["compilerDigest"]["maxLength"],
            json!(Limits::default().max_digest_chars)
        );
        let wait = &schemas["yadcc.scheduler.WaitForStartingTaskRequest"]["properties"];
        assert!(
            wait["envDesc"]["description"]
                .as_str()
                .unwrap()
                .contains("`optional`")
        );
        // Enums by name only: generators refuse a mix of names and numbers.
        let status = &schemas["yadcc.scheduler.Status"];
        assert_eq!(status["type"], "string");
        assert_eq!(status["enum"][0], "STATUS_UNKNOWN");
        assert!(
            status["enum"]
                .as_array()
                .unwrap()
                .iter()
                .all(Value::is_string)
        );
        assert!(
            status["description"]
                .as_str()
                .unwrap()
                .contains("| `STATUS_INVALID_ARGUMENT` | 1004 |")
        );
        assert_eq!(
            schemas["ErrorBody"]["properties"]["status"]["$ref"],
            "#/components/schemas/yadcc.scheduler.Status"
        );
        // An integer field holding an enum's numbers shows that enum's table.
        assert!(
            heartbeat["notAcceptingTaskReason"]["description"]
                .as_str()
                .unwrap()
                .contains("| `NOT_ACCEPTING_TASK_REASON_BEHIND_NAT` | 4 |")
        );
    }

    #[test]
    fn the_contract_becomes_constraints() {
        let json = document();
        let limits = Limits::default();
        let schemas = &json["components"]["schemas"];
        let heartbeat = &schemas["yadcc.scheduler.HeartbeatRequest"];
        assert_eq!(heartbeat["required"], json!(["location"]));
        assert_eq!(
            heartbeat["properties"]["location"]["pattern"],
            grammar::location_pattern()
        );
        assert_eq!(
            heartbeat["properties"]["nextHeartbeatInMs"]["maximum"],
            json!(limits.max_next_heartbeat.as_millis())
        );
        assert_eq!(
            heartbeat["properties"]["envDescs"]["maxItems"],
            json!(limits.max_environments_per_servant)
        );
        let wait = &schemas["yadcc.scheduler.WaitForStartingTaskRequest"];
        assert!(wait.get("required").is_none(), "{wait}");
        let env = &wait["properties"]["envDesc"];
        assert!(env.get("required").is_none(), "{env}");
        assert_eq!(
            env["properties"]["compilerDigest"]["maxLength"],
            json!(limits.max_digest_chars)
        );
        assert_eq!(
            env["allOf"][0]["$ref"],
            "#/components/schemas/yadcc.EnvironmentDesc"
        );
        assert_eq!(
            wait["properties"]["millisecondsToWait"]["maximum"],
            json!(limits.max_wait.as_millis())
        );
        let keep = &schemas["yadcc.scheduler.KeepTaskAliveRequest"]["properties"];
        assert_eq!(
            keep["taskGrantIds"]["maxItems"],
            json!(limits.max_ids_per_request)
        );
        let heartbeat_path = &json["paths"]["/rpc/yadcc.scheduler.SchedulerService.Heartbeat"];
        assert_eq!(heartbeat_path["post"]["requestBody"]["required"], true);
        // Even a call whose empty message is valid needs a body's Content-Type:
        // without one the cross-site rule refuses it (415).
        let config_path = &json["paths"]["/rpc/yadcc.scheduler.SchedulerService.GetConfig"];
        assert_eq!(config_path["post"]["requestBody"]["required"], true);
        assert!(
            config_path["post"]["requestBody"]["description"]
                .as_str()
                .unwrap()
                .contains("415")
        );
        let timeout = &json["components"]["parameters"][RPC_TIMEOUT]["schema"];
        assert_eq!(timeout["type"], json!(["integer", "string"]));
        assert_eq!(timeout["maximum"], json!(grammar::TIMEOUT_MS.end()));
    }
}
