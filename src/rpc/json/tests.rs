//! The reader end to end: the API's own messages, and a test file with every
//! field kind checked against prost-reflect's JSON parser.

use prost::{Message, Name};
use prost_reflect::{DescriptorPool, DynamicMessage};
use prost_types::{
    DescriptorProto, FieldDescriptorProto, FileDescriptorProto, MessageOptions,
    OneofDescriptorProto,
    field_descriptor_proto::{Label, Type},
};
use serde_json::json;

use super::{JsonError, PLANS, plan::Plans, to_binary};
use crate::pb;

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
    let error =
        read::<pb::HeartbeatRequest>(r#"{"envDescs": [{}, {"compiler_digest": 7}]}"#).unwrap_err();
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
        let theirs = DynamicMessage::deserialize(descriptor.clone(), &mut deserializer).unwrap();
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
