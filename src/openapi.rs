//! The OpenAPI 3.1 document and its two endpoints: `GET /openapi.json` and
//! Swagger UI at `/docs/`, served from the vendored bundle, so both work on a
//! network without internet access.
//!
//! The document is built from the descriptor pool the server decodes with
//! ([`pb::DESCRIPTOR_POOL`]). No message is described by hand. Every RPC of the
//! service gets one operation per route style ([`Dialect`]). Every message and
//! enum gets a schema. The proto's leading comments become the descriptions.
//! The schemas describe the proto3 JSON mapping that the server reads and
//! writes (pbjson): lowerCamelCase names, 64-bit integers as decimal strings,
//! enums by name. The error responses come from the one error table,
//! [`ErrorKind::ALL`].
//!
//! Endpoints that are not RPCs are documented with utoipa's derive:
//! `non_rpc_apis` is where their `OpenApi` structs are merged in.
//!
//! The committed copy, `openapi/scheduler.openapi.json`, is what [`render`]
//! returns. `tests/it/openapi.rs` fails when that copy is stale and prints
//! the command that regenerates it.

use std::{borrow::Cow, collections::BTreeMap, sync::LazyLock};

use axum::{
    Router,
    http::{StatusCode, header},
    routing::get,
};
use prost_reflect::{EnumDescriptor, FieldDescriptor, Kind, MessageDescriptor, ServiceDescriptor};
use prost_types::FileDescriptorProto;
use serde_json::{Map, Value, json};
use utoipa::{
    OpenApi as _,
    openapi::{
        ComponentsBuilder, ContentBuilder, HeaderBuilder, HttpMethod, InfoBuilder, KnownFormat,
        LicenseBuilder, ObjectBuilder, OpenApi, OpenApiBuilder, PathItem, PathsBuilder, Ref,
        ResponseBuilder, SchemaFormat, ServerBuilder, Type,
        extensions::ExtensionsBuilder,
        path::{OperationBuilder, ParameterBuilder, ParameterIn},
        request_body::RequestBodyBuilder,
        schema::SchemaType,
        tag::TagBuilder,
    },
};
use utoipa_swagger_ui::{Config, SwaggerUi};

use crate::{
    contract::{self, FieldRule, Rule},
    engine::Limits,
    http::{
        codec::MEDIA_TYPES,
        dialect::Dialect,
        error::{ErrorBody, ErrorKind},
        json::IntegerKind,
        state::DEFAULT_MAX_BODY_BYTES,
    },
    pb::{self, Encoding, Method},
    service, sim,
};

/// Where the document is served.
pub const SPEC_PATH: &str = "/openapi.json";
/// Where Swagger UI is served (`/docs` redirects to `/docs/`).
pub const DOCS_PATH: &str = "/docs";
/// The committed copy of [`render`]'s output, relative to the crate root.
pub const COMMITTED_SPEC: &str = "openapi/scheduler.openapi.json";

/// `pattern` of an unsigned 64-bit integer written as a JSON string.
pub const UNSIGNED_DIGITS: &str = "^[0-9]+$";
/// `pattern` of a signed 64-bit integer written as a JSON string.
pub const SIGNED_DIGITS: &str = "^-?[0-9]+$";

/// The media type under which binary protobuf is documented. The other
/// binary media types of [`MEDIA_TYPES`] are named in its description.
pub const PROTOBUF_MEDIA_TYPE: &str = "application/x-protobuf";
/// The media type under which proto3 JSON is documented.
pub const JSON_MEDIA_TYPE: &str = "application/json";

/// Header names as the yadcc daemons write them. The server matches header
/// names case-insensitively; a test checks that these are the dialect's headers.
pub const RPC_SEQ_NO: &str = "Rpc-SeqNo";
pub const RPC_TIMEOUT: &str = "Rpc-Timeout";
pub const CONNECT_TIMEOUT_MS: &str = "Connect-Timeout-Ms";
pub const RPC_ERROR_CODE: &str = "Rpc-Error-Code";
pub const RPC_ERROR_REASON: &str = "Rpc-Error-Reason";

/// Tags of the two route styles, in the order they are listed.
const TAG_HTTP_PB: &str = "http+pb";
const TAG_CONNECT: &str = "Connect";

/// Name of the basic-auth security scheme of the inspection API.
pub const INSPECT_SECURITY: &str = "inspectCredential";

/// Path prefixes of the inspection API that [`INSPECT_SECURITY`] guards: the
/// dashboard's JSON and the original's inspection pages.
pub const INSPECT_API_PREFIXES: [&str; 2] = ["/api/v1/", "/inspect/"];

/// Whether `path` is behind the inspection credential.
pub fn is_inspection_path(path: &str) -> bool {
    INSPECT_API_PREFIXES
        .iter()
        .any(|prefix| path.starts_with(prefix))
}

/// The document as served, rendered once per inspection posture.
static SPEC_INSPECT_AUTH: LazyLock<String> = LazyLock::new(|| render_for(true));
static SPEC_INSPECT_OPEN: LazyLock<String> = LazyLock::new(|| render_for(false));

const HEARTBEAT_REQUEST: &str = "yadcc.scheduler.HeartbeatRequest";

/// The whole OpenAPI document as committed: the inspection API behind basic
/// auth, the default posture.
pub fn document() -> Value {
    document_for(true)
}

/// The whole OpenAPI document: the RPCs from the descriptor pool with the
/// constraints of [`contract`], then every other endpoint from
/// `non_rpc_apis`. With `inspect_auth`, the `/api/v1/` operations carry
/// the basic-auth security scheme.
pub fn document_for(inspect_auth: bool) -> Value {
    let pool = &*pb::DESCRIPTOR_POOL;
    let service = pool
        .get_service_by_name(pb::SCHEDULER_SERVICE)
        .expect("the descriptor pool holds the scheduler service");
    let rules = contract::field_rules(&Limits::default());

    let mut paths = PathsBuilder::new();
    for dialect in [Dialect::HttpPb, Dialect::Connect] {
        for method in Method::ALL {
            paths = paths.path(
                dialect.path(method),
                PathItem::new(HttpMethod::Post, rpc_operation(dialect, method, &rules)),
            );
        }
    }

    let mut components = ComponentsBuilder::new();
    components = components.schema_from::<ErrorBody>();
    for (name, parameter) in header_parameters() {
        components = components.parameter(name, parameter);
    }
    for (name, header) in response_headers() {
        components = components.header(name, header);
    }

    let mut document = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("yadcc scheduler")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(overview(&service)))
                .license(Some(
                    LicenseBuilder::new()
                        .name("BSD-3-Clause")
                        .identifier(Some("BSD-3-Clause"))
                        .build(),
                ))
                .build(),
        )
        .servers(Some([ServerBuilder::new()
            .url("/")
            .description(Some("This server (the one serving this document)"))
            .build()]))
        .tags(Some([
            TagBuilder::new()
                .name(TAG_HTTP_PB)
                .description(Some(dialect_description(Dialect::HttpPb)))
                .build(),
            TagBuilder::new()
                .name(TAG_CONNECT)
                .description(Some(dialect_description(Dialect::Connect)))
                .build(),
        ]))
        .paths(paths.build())
        .components(Some(components.build()))
        .build();
    for api in non_rpc_apis() {
        document.merge(api);
    }

    let mut json = serde_json::to_value(&document).expect("the document serializes to JSON");
    let schemas = json["components"]["schemas"]
        .as_object_mut()
        .expect("components has schemas");
    for message in pool.all_messages() {
        if message.is_map_entry() || is_well_known(message.full_name()) {
            continue;
        }
        schemas.insert(
            message.full_name().to_owned(),
            message_schema(&message, &rules),
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
    if inspect_auth {
        json["components"]["securitySchemes"] = json!({
            INSPECT_SECURITY: {
                "type": "http",
                "scheme": "basic",
                "description": "The `user:password` of `--inspect_credential`, \
                    guarding the dashboard and its API.",
            }
        });
        for (path, item) in json["paths"]
            .as_object_mut()
            .expect("paths is an object")
            .iter_mut()
        {
            if !is_inspection_path(path) {
                continue;
            }
            for operation in item
                .as_object_mut()
                .into_iter()
                .flat_map(|ops| ops.values_mut())
            {
                operation["security"] = json!([{ INSPECT_SECURITY: [] }]);
            }
        }
    }
    json
}

/// The endpoints that are not RPCs, each group as a utoipa-derived `OpenApi`
/// (`#[utoipa::path]` on the handlers, `ToSchema` on their types). A new
/// group, such as the dashboard's `/api/v1/` API, is one more entry here.
fn non_rpc_apis() -> Vec<OpenApi> {
    vec![
        OperationsApi::openapi(),
        crate::dashboard::DashboardApi::openapi(),
    ]
}

/// [`document`] as committed: pretty JSON and a final newline.
pub fn render() -> String {
    render_for(true)
}

/// [`document_for`] as served: pretty JSON and a final newline.
pub fn render_for(inspect_auth: bool) -> String {
    let mut json = serde_json::to_string_pretty(&document_for(inspect_auth))
        .expect("the OpenAPI document serializes to JSON");
    json.push('\n');
    json
}

/// `GET /openapi.json` and Swagger UI under `/docs/`. Merge it into the app
/// router; `inspect_auth` tells whether the inspection API asks for basic auth.
pub fn router<S: Clone + Send + Sync + 'static>(inspect_auth: bool) -> Router<S> {
    let config = Config::new([SPEC_PATH])
        .try_it_out_enabled(true)
        .display_request_duration(true)
        .display_operation_id(true)
        .filter(true)
        // The default sends the document to an online validator: not offline.
        .validator_url("none");
    Router::new()
        .route(
            SPEC_PATH,
            get(move || async move {
                let spec = if inspect_auth {
                    &SPEC_INSPECT_AUTH
                } else {
                    &SPEC_INSPECT_OPEN
                };
                ([(header::CONTENT_TYPE, JSON_MEDIA_TYPE)], spec.as_str())
            }),
        )
        .merge(SwaggerUi::new(DOCS_PATH).config(config))
}

/// The `operationId` of one RPC in one route style.
pub fn operation_id(dialect: Dialect, method: Method) -> String {
    let style = match dialect {
        Dialect::HttpPb => "httpPb",
        Dialect::Connect => "connect",
    };
    format!("{}_{style}", method.name())
}

/// The rows of the error table a call of `method` on its documented route
/// (right path, POST) can meet.
pub fn operation_errors(method: Method) -> Vec<ErrorKind> {
    ErrorKind::ALL
        .into_iter()
        .filter(|kind| match kind {
            ErrorKind::Scheduler(status) => service::failure_statuses(method).contains(status),
            // The documented path and verb are right by construction.
            ErrorKind::MethodNotAllowed
            | ErrorKind::ServiceNotFound
            | ErrorKind::MethodNotFound => false,
            // Only the daemons' binary protocol meets these.
            ErrorKind::Overloaded | ErrorKind::CompressionNotSupported => false,
            ErrorKind::DeadlineExceeded
            | ErrorKind::MalformedRequest
            | ErrorKind::UnsupportedMediaType
            | ErrorKind::PayloadTooLarge
            | ErrorKind::Internal => true,
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Operations

fn rpc_operation(
    dialect: Dialect,
    rpc: Method,
    rules: &[FieldRule],
) -> utoipa::openapi::path::Operation {
    let method = rpc.descriptor();
    let input = method.input();
    let output = method.output();
    let comment = comment(method.parent_file().file_descriptor_proto(), method.path());
    let summary = comment
        .as_deref()
        .map(first_sentence)
        .unwrap_or_else(|| method.name().to_owned());
    let mut description = comment.unwrap_or_default();
    push_paragraph(
        &mut description,
        format!(
            "Request `{}`, response `{}`, in proto3 JSON or binary protobuf; \
             the response has the request's content type. {}",
            input.full_name(),
            output.full_name(),
            match dialect {
                Dialect::HttpPb => "The `http+pb` framing of the yadcc daemons.",
                Dialect::Connect => {
                    "A Connect unary call. The same path answers gRPC (`application/grpc`, \
                     HTTP/2) and gRPC-Web (`application/grpc-web`, `application/grpc-web-text`) \
                     with the same messages, told apart by `Content-Type`."
                }
            }
        ),
    );

    let mut operation = OperationBuilder::new()
        .tag(match dialect {
            Dialect::HttpPb => TAG_HTTP_PB,
            Dialect::Connect => TAG_CONNECT,
        })
        .summary(Some(summary))
        .description(Some(description))
        .operation_id(Some(operation_id(dialect, rpc)));
    for name in dialect_parameters(dialect) {
        operation = operation.parameter_ref(Ref::new(format!("#/components/parameters/{name}")));
    }
    // A message with required fields cannot be empty; any other can.
    let required = rules
        .iter()
        .any(|rule| rule.message == input.full_name() && rule.rule == Rule::Required);
    operation = operation.request_body(Some(
        RequestBodyBuilder::new()
            .description(Some(format!(
                "`{}`. An empty body is the message with every field at its default{}.",
                input.full_name(),
                if required {
                    ", which this call refuses"
                } else {
                    ""
                }
            )))
            .required(Some(if required {
                utoipa::openapi::Required::True
            } else {
                utoipa::openapi::Required::False
            }))
            .content(JSON_MEDIA_TYPE, json_content(&input))
            .content(
                PROTOBUF_MEDIA_TYPE,
                protobuf_content(&input, PROTOBUF_MEDIA_TYPE),
            )
            .build(),
    ));

    let mut ok = ResponseBuilder::new().description(format!(
        "`{}`, in the request's media type.",
        output.full_name()
    ));
    // The answer has the request's media type (or, without one, the route
    // style's default binary type): every one of them is documented.
    for (media_type, encoding) in MEDIA_TYPES {
        ok = ok.content(
            *media_type,
            match encoding {
                Encoding::Json => json_content(&output),
                Encoding::Binary => protobuf_content(&output, media_type),
            },
        );
    }
    if dialect == Dialect::HttpPb {
        ok = ok.header_ref(RPC_SEQ_NO, header_ref(RPC_SEQ_NO));
    }
    operation = operation.response("200", ok.build());

    let mut by_status: BTreeMap<StatusCode, Vec<ErrorKind>> = BTreeMap::new();
    for kind in operation_errors(rpc) {
        by_status
            .entry(kind.wire().http_status)
            .or_default()
            .push(kind);
    }
    for (status, kinds) in by_status {
        let mut response = ResponseBuilder::new()
            .description(format!(
                "{}. The body is JSON whatever the request's content type.\n\n{}",
                status.canonical_reason().unwrap_or("Error"),
                error_table(&kinds, false)
            ))
            .content(
                JSON_MEDIA_TYPE,
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .header_ref(RPC_ERROR_CODE, header_ref(RPC_ERROR_CODE))
            .header_ref(RPC_ERROR_REASON, header_ref(RPC_ERROR_REASON));
        if dialect == Dialect::HttpPb {
            response = response.header_ref(RPC_SEQ_NO, header_ref(RPC_SEQ_NO));
        }
        operation = operation.response(status.as_str(), response.build());
    }
    operation.build()
}

fn json_content(message: &MessageDescriptor) -> utoipa::openapi::Content {
    ContentBuilder::new()
        .schema(Some(Ref::from_schema_name(message.full_name())))
        .build()
}

/// Binary bodies have no JSON schema: a note naming the message stands in.
fn protobuf_content(message: &MessageDescriptor, media_type: &str) -> utoipa::openapi::Content {
    let aliases: Vec<String> = MEDIA_TYPES
        .iter()
        .filter(|(name, encoding)| *encoding == Encoding::Binary && *name != media_type)
        .map(|(name, _)| format!("`{name}`"))
        .collect();
    let schema = ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
        .content_media_type(media_type)
        .description(Some(format!(
            "Binary protobuf of message `{}`: one message in the proto3 wire format, \
             no length prefix. Also accepted as {}.",
            message.full_name(),
            aliases.join(", ")
        )))
        .extensions(Some(
            ExtensionsBuilder::new()
                .add("x-protobuf-message", message.full_name())
                .build(),
        ));
    ContentBuilder::new().schema(Some(schema)).build()
}

fn dialect_parameters(dialect: Dialect) -> &'static [&'static str] {
    match dialect {
        Dialect::HttpPb => &[RPC_SEQ_NO, RPC_TIMEOUT],
        Dialect::Connect => &[CONNECT_TIMEOUT_MS],
    }
}

fn header_parameters() -> Vec<(&'static str, utoipa::openapi::path::Parameter)> {
    let header = |name: &'static str, description: &str, schema: ObjectBuilder| {
        (
            name,
            ParameterBuilder::new()
                .name(name)
                .parameter_in(ParameterIn::Header)
                .required(utoipa::openapi::Required::False)
                .description(Some(description))
                .schema(Some(schema))
                .build(),
        )
    };
    // A header is text: the integer is documented both as an integer with
    // its range and as the decimal digits that spell it, which is what
    // schemathesis and other validators read headers as.
    let integer = |range: &std::ops::RangeInclusive<u64>| {
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Integer, Type::String]))
            .minimum(Some(*range.start()))
            .maximum(Some(*range.end()))
            .pattern(Some(contract::integer_pattern(
                (*range.start()).into(),
                (*range.end()).into(),
            )))
    };
    let millis = || integer(&contract::TIMEOUT_MS).examples([10000]);
    vec![
        header(
            RPC_SEQ_NO,
            "Sequence number of the call; echoed in the answer so that pipelined \
             answers can be matched to their calls.",
            integer(&contract::SEQ_NO).examples([17]),
        ),
        header(
            RPC_TIMEOUT,
            "The caller's deadline in milliseconds. When it passes, the answer is \
             `504` with `Rpc-Error-Code: 3`.",
            millis(),
        ),
        header(
            CONNECT_TIMEOUT_MS,
            "The caller's deadline in milliseconds. When it passes, the answer is \
             `504` with Connect code `deadline_exceeded`.",
            millis(),
        ),
    ]
}

fn response_headers() -> Vec<(&'static str, utoipa::openapi::Header)> {
    vec![
        (
            RPC_SEQ_NO,
            HeaderBuilder::new()
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(SchemaType::from_iter([Type::Integer, Type::String]))
                        .minimum(Some(*contract::SEQ_NO.start()))
                        .maximum(Some(*contract::SEQ_NO.end()))
                        .pattern(Some(contract::integer_pattern(
                            (*contract::SEQ_NO.start()).into(),
                            (*contract::SEQ_NO.end()).into(),
                        ))),
                ))
                .description(Some("The request's `Rpc-SeqNo`, when it had one."))
                .build(),
        ),
        (
            RPC_ERROR_CODE,
            HeaderBuilder::new()
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(0)),
                ))
                .description(Some(
                    "The numeric error code (`rpcErrorCode` of the body): 1000 and above \
                     are scheduler `Status` values, below 1000 the RPC framework's codes.",
                ))
                .build(),
        ),
        (
            RPC_ERROR_REASON,
            HeaderBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                .description(Some(
                    "What went wrong, on one line of printable ASCII (the body's `message`).",
                ))
                .build(),
        ),
    ]
}

fn header_ref(name: &str) -> Ref {
    Ref::new(format!("#/components/headers/{name}"))
}

// ---------------------------------------------------------------------------
// Schemas
//
// Written as JSON: the keywords below (type lists with "null", anyOf, allOf
// with siblings) are plain JSON Schema 2020-12, which OpenAPI 3.1 uses as is.

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
    let positive: Vec<Value> = contract::any_positive()
        .into_iter()
        .filter(|rule| rule.message == message.full_name())
        .flat_map(|rule| rule.fields.to_vec())
        .filter_map(|name| message.get_field_by_name(name))
        .map(|field| {
            let own = own_rules(rules, message.full_name(), &[], field.name());
            let (_, high) = integer_bounds(&field.kind(), &own).expect("an integer field");
            json!({
                "required": [field.json_name()],
                "properties": { field.json_name(): integer_schema(1, high) },
            })
        })
        .collect();
    if !positive.is_empty() {
        object.insert("anyOf".into(), Value::Array(positive));
    }
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

fn enum_schema(enumeration: &EnumDescriptor) -> Value {
    let file = enumeration.parent_file_descriptor_proto();
    let mut description = comment(file, enumeration.path()).unwrap_or_default();
    push_paragraph(
        &mut description,
        format!(
            "Proto enum `{}`, written by value name; the number is accepted on input too.",
            enumeration.full_name()
        ),
    );
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
    push_paragraph(&mut description, table);
    let names = enumeration.values().map(|value| json!(value.name()));
    let numbers = enumeration.values().map(|value| json!(value.number()));
    json!({
        "type": ["string", "integer"],
        "enum": names.chain(numbers).collect::<Vec<_>>(),
        "description": description,
    })
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
                    Rule::NonEmpty => schema["minLength"] = json!(1),
                    Rule::MaxLength(most) => schema["maxLength"] = json!(most),
                    Rule::Location => schema["pattern"] = json!(contract::location_pattern()),
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
                panic!("no JSON mapping for {name} yet: add it to openapi::value_schema")
            }
            name => json!({"$ref": schema_ref(name)}),
        },
        Kind::Enum(enumeration) => json!({"$ref": schema_ref(enumeration.full_name())}),
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
        "pattern": contract::integer_pattern(low, high),
    })
}

fn schema_ref(name: &str) -> String {
    format!("#/components/schemas/{name}")
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
            Rule::NonEmpty => " Must not be empty.".to_owned(),
            Rule::Location => {
                " `a.b.c.d:port` (IPv4) or `[v6]:port` (IPv6), no zone id.".to_owned()
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
        });
    }
    push_paragraph(&mut description, notes);
    description
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

/// Example values shown by Swagger UI and used by the tests' example requests,
/// by full proto field name (tokens and compiler digests are the demo's, from
/// [`field_example`]). A test checks that every name is a real field.
pub const FIELD_EXAMPLES: &[(&str, &str)] = &[
    ("yadcc.scheduler.RunningTask.servant_task_id", r#""42""#),
    ("yadcc.scheduler.RunningTask.task_grant_id", r#""7""#),
    (
        "yadcc.scheduler.RunningTask.servant_location",
        r#""192.0.2.10:8335""#,
    ),
    (
        "yadcc.scheduler.RunningTask.task_digest",
        r#""d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35""#,
    ),
    (
        "yadcc.scheduler.HeartbeatRequest.next_heartbeat_in_ms",
        "10000",
    ),
    ("yadcc.scheduler.HeartbeatRequest.version", "1"),
    (
        "yadcc.scheduler.HeartbeatRequest.location",
        r#""192.0.2.10:8335""#,
    ),
    ("yadcc.scheduler.HeartbeatRequest.num_processors", "16"),
    ("yadcc.scheduler.HeartbeatRequest.current_load", "2"),
    (
        "yadcc.scheduler.HeartbeatRequest.not_accepting_task_reason",
        "0",
    ),
    ("yadcc.scheduler.HeartbeatRequest.capacity", "12"),
    (
        "yadcc.scheduler.HeartbeatRequest.total_memory_in_bytes",
        r#""68719476736""#,
    ),
    (
        "yadcc.scheduler.HeartbeatRequest.memory_available_in_bytes",
        r#""34359738368""#,
    ),
    (
        "yadcc.scheduler.HeartbeatResponse.acceptable_tokens",
        r#"["3f1c9a4be07d4c55a1e2b6f08d9c7e21"]"#,
    ),
    (
        "yadcc.scheduler.HeartbeatResponse.expired_tasks",
        r#"["7"]"#,
    ),
    (
        "yadcc.scheduler.GetConfigResponse.serving_daemon_token",
        r#""3f1c9a4be07d4c55a1e2b6f08d9c7e21""#,
    ),
    ("yadcc.scheduler.StartingTaskGrant.task_grant_id", r#""7""#),
    (
        "yadcc.scheduler.StartingTaskGrant.servant_location",
        r#""192.0.2.10:8335""#,
    ),
    (
        "yadcc.scheduler.WaitForStartingTaskRequest.milliseconds_to_wait",
        "1000",
    ),
    (
        "yadcc.scheduler.WaitForStartingTaskRequest.immediate_reqs",
        "1",
    ),
    (
        "yadcc.scheduler.WaitForStartingTaskRequest.prefetch_reqs",
        "0",
    ),
    (
        "yadcc.scheduler.WaitForStartingTaskRequest.next_keep_alive_in_ms",
        "15000",
    ),
    (
        "yadcc.scheduler.WaitForStartingTaskRequest.min_version",
        "1",
    ),
    (
        "yadcc.scheduler.KeepTaskAliveRequest.task_grant_ids",
        r#"["7"]"#,
    ),
    (
        "yadcc.scheduler.KeepTaskAliveRequest.next_keep_alive_in_ms",
        "10000",
    ),
    ("yadcc.scheduler.KeepTaskAliveResponse.statuses", "[true]"),
    ("yadcc.scheduler.FreeTaskRequest.task_grant_ids", r#"["7"]"#),
];

/// The example of a field: the demo's tokens and first compiler for those
/// fields, so that "Try it out" works against `--demo`, else [`FIELD_EXAMPLES`].
fn field_example(field: &FieldDescriptor) -> Option<Value> {
    let full_name = field.full_name();
    if field.name() == "token" && field.kind() == Kind::String {
        return Some(json!(if full_name.starts_with(HEARTBEAT_REQUEST) {
            sim::DEMO_SERVANT_TOKEN
        } else {
            sim::DEMO_USER_TOKEN
        }));
    }
    if full_name == "yadcc.EnvironmentDesc.compiler_digest" {
        return Some(json!(sim::environment_digest(0)));
    }
    FIELD_EXAMPLES
        .iter()
        .find(|(name, _)| *name == full_name)
        .map(|(name, example)| {
            serde_json::from_str(example)
                .unwrap_or_else(|error| panic!("example of {name} is not JSON: {error}"))
        })
}

// ---------------------------------------------------------------------------
// Prose

fn overview(service: &ServiceDescriptor) -> String {
    let mut text =
        comment(service.parent_file_descriptor_proto(), service.path()).unwrap_or_default();
    push_paragraph(
        &mut text,
        format!(
            "The yadcc compile scheduler: it decides which compile servant runs which \
             compilation, for a whole cluster. Every RPC of `{}` is served on two routes, \
             `POST /rpc/{0}.<Method>` (`http+pb`, what the yadcc daemons speak) and \
             `POST /{0}/<Method>` (Connect unary). Both take and return the same bodies.\n\n\
             This document is generated from the proto files by `src/openapi.rs`.",
            service.full_name()
        ),
    );
    let mut media = String::from("## Bodies\n\n| Content-Type | Encoding |\n| --- | --- |");
    for (name, encoding) in MEDIA_TYPES {
        media.push_str(&format!(
            "\n| `{name}` | {} |",
            match encoding {
                Encoding::Json => "proto3 JSON",
                Encoding::Binary => "binary protobuf",
            }
        ));
    }
    media.push_str(&format!(
        "\n\nThe response has the request's content type. A request without `Content-Type` is \
         read as binary protobuf. Bodies are limited to {} MiB by default.",
        DEFAULT_MAX_BODY_BYTES / (1024 * 1024)
    ));
    push_paragraph(&mut text, media);
    push_paragraph(
        &mut text,
        "## JSON mapping\n\n\
         The canonical proto3 JSON mapping:\n\n\
         - Property names are lowerCamelCase (`nextHeartbeatInMs`); the proto names \
         (`next_heartbeat_in_ms`) are accepted on input too.\n\
         - 64-bit integers are decimal strings (`\"18446744073709551615\"`); JSON numbers are \
         accepted on input too.\n\
         - Enums are written by value name; numbers are accepted on input too.\n\
         - A field at its default value (0, `\"\"`, `false`, empty list, the zero enum value) \
         is left out of responses, unless it is declared `optional`.\n\
         - Unknown fields in a request are ignored. An empty body is the message with every \
         field at its default.",
    );
    push_paragraph(
        &mut text,
        format!(
            "## Errors\n\n\
             A failed call has the same HTTP status, headers and JSON body (`ErrorBody`) on \
             both route styles, whatever the request's content type: `{RPC_ERROR_CODE}` \
             carries the numeric code that `http+pb` clients read, `code` in the body the \
             Connect code. Each operation lists the rows it can meet.\n\n{}",
            error_table(&ErrorKind::ALL, true)
        ),
    );
    text
}

fn dialect_description(dialect: Dialect) -> String {
    let service = pb::SCHEDULER_SERVICE;
    match dialect {
        Dialect::HttpPb => format!(
            "`POST /rpc/{service}.<Method>`: the framing of the yadcc daemons' RPC framework \
             (`--scheduler_uri=http+pb://HOST:PORT`). `{RPC_SEQ_NO}` is echoed; \
             `{RPC_TIMEOUT}` is the caller's deadline in milliseconds. A failure is a non-200 \
             status with `{RPC_ERROR_CODE}` and `{RPC_ERROR_REASON}`."
        ),
        Dialect::Connect => format!(
            "`POST /{service}/<Method>`: Connect unary calls. `{CONNECT_TIMEOUT_MS}` is the \
             caller's deadline. A failure is a non-200 status with a JSON body whose `code` \
             and `message` Connect clients read.\n\n\
             The same path serves gRPC (`application/grpc`, `+proto`, `+json`; HTTP/2 \
             cleartext with prior knowledge) and gRPC-Web (`application/grpc-web`, `+proto`, \
             `+json`, and base64 `application/grpc-web-text`), told apart by `Content-Type`: \
             one length-prefixed message each way, `grpc-timeout` as the deadline, the \
             outcome as `grpc-status` and percent-encoded `grpc-message` (HTTP/2 trailers, or \
             a gRPC-Web trailer frame) carrying the Connect code of the error table by its \
             gRPC number, always with HTTP status 200. Server reflection \
             (`grpc.reflection.v1`, `v1alpha`) describes the API to gRPC tools without a \
             schema file; those routes are gRPC streams and not listed here."
        ),
    }
}

/// Markdown table of error-table rows. With `with_status`, the HTTP status is a column.
fn error_table(kinds: &[ErrorKind], with_status: bool) -> String {
    let pool = &*pb::DESCRIPTOR_POOL;
    let status_enum = pool.get_enum_by_name("yadcc.scheduler.Status");
    let mut table = String::new();
    if with_status {
        table.push_str("| HTTP status | ");
    } else {
        table.push_str("| ");
    }
    table.push_str(&format!(
        "{RPC_ERROR_CODE} | Connect code | Status | When |\n"
    ));
    table.push_str(if with_status {
        "| --- | --- | --- | --- | --- |"
    } else {
        "| --- | --- | --- | --- |"
    });
    for kind in kinds {
        let wire = kind.wire();
        let meaning = match kind {
            ErrorKind::Scheduler(pb::Status::Unknown) => {
                "Never sent on purpose: it means success in the seed, so as an error it is a bug."
                    .to_owned()
            }
            ErrorKind::Scheduler(status) => status_enum
                .as_ref()
                .and_then(|enumeration| enumeration.get_value(*status as i32))
                .and_then(|value| {
                    member_comment(value.parent_file().file_descriptor_proto(), value.path())
                })
                .unwrap_or_default(),
            other => transport_meaning(*other),
        };
        table.push('\n');
        if with_status {
            table.push_str(&format!("| {} ", wire.http_status.as_u16()));
        }
        table.push_str(&format!(
            "| {} | `{}` | {} | {} |",
            wire.rpc_code,
            wire.connect_code,
            kind.status_name()
                .map(|name| format!("`{name}`"))
                .unwrap_or_default(),
            table_cell(&meaning)
        ));
    }
    table
}

fn transport_meaning(kind: ErrorKind) -> String {
    match kind {
        ErrorKind::Scheduler(status) => format!("Scheduler status {}.", status.as_str_name()),
        ErrorKind::DeadlineExceeded => format!(
            "The caller's deadline (`{RPC_TIMEOUT}` or `{CONNECT_TIMEOUT_MS}`) passed first."
        ),
        ErrorKind::MalformedRequest => "The body does not decode as the request message, or a \
            header (such as a timeout) is malformed."
            .to_owned(),
        ErrorKind::UnsupportedMediaType => {
            "The `Content-Type` is not one of the bodies above, or the body is compressed."
                .to_owned()
        }
        ErrorKind::PayloadTooLarge => "The body is larger than the configured limit.".to_owned(),
        ErrorKind::MethodNotAllowed => "Not a POST (the answer has `Allow: POST`).".to_owned(),
        ErrorKind::ServiceNotFound => "No such service, or no such path.".to_owned(),
        ErrorKind::MethodNotFound => "The service has no such method.".to_owned(),
        ErrorKind::Overloaded => {
            "Too many calls in flight on one daemon connection; retry.".to_owned()
        }
        ErrorKind::CompressionNotSupported => {
            "A compressed call of the daemons' binary protocol, or a compressed gRPC message \
             (`grpc-encoding`); send it uncompressed."
                .to_owned()
        }
        ErrorKind::Internal => "A bug in the server.".to_owned(),
    }
}

// ---------------------------------------------------------------------------
// Comments

/// The leading comment of the element at `path` (detached comments, such as
/// banners between RPCs, are not documentation).
fn comment(file: &FileDescriptorProto, path: &[i32]) -> Option<String> {
    comment_at(file, path, false)
}

/// The leading comment of a field or enum value, else its trailing one
/// (`uint32 capacity = 3;  // ...`). Only for these: the trailing comment of
/// a message or service is whatever follows its opening brace.
fn member_comment(file: &FileDescriptorProto, path: &[i32]) -> Option<String> {
    comment_at(file, path, true)
}

fn comment_at(file: &FileDescriptorProto, path: &[i32], trailing: bool) -> Option<String> {
    let location = file
        .source_code_info
        .as_ref()?
        .location
        .iter()
        .find(|location| location.path == path)?;
    let raw = location.leading_comments.as_deref().or(if trailing {
        location.trailing_comments.as_deref()
    } else {
        None
    })?;
    let text = raw
        .lines()
        .map(|line| line.strip_prefix(' ').unwrap_or(line).trim_end())
        .collect::<Vec<_>>()
        .join("\n");
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The first sentence of a comment, on one line.
fn first_sentence(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.find(". ") {
        Some(end) => flat[..=end].to_owned(),
        None => flat,
    }
}

fn push_paragraph(text: &mut String, paragraph: impl AsRef<str>) {
    if !text.is_empty() {
        text.push_str("\n\n");
    }
    text.push_str(paragraph.as_ref());
}

fn table_cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

// ---------------------------------------------------------------------------
// Endpoints that are not RPCs

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "documentation",
    responses((status = 200, description = "This OpenAPI document", content_type = "application/json", body = Object)))]
#[allow(dead_code)]
fn openapi_json() {}

// The handlers below live in `http::routes`; these items carry their
// documentation only. A test calls each documented path on a real server.

/// Swagger UI for this document, from the bundle built into the binary.
#[utoipa::path(get, path = "/docs/", tag = "documentation",
    responses((status = 200, description = "Swagger UI", content_type = "text/html", body = String)))]
#[allow(dead_code)]
fn docs() {}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Up", content_type = "text/plain", body = String, example = "ok\n")))]
#[allow(dead_code)]
fn healthz() {}

/// Ready to take calls: not shutting down.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", content_type = "text/plain", body = String, example = "ready\n"),
        (status = 503, description = "Shutting down", content_type = "text/plain", body = String, example = "shutting down\n"),
    ))]
#[allow(dead_code)]
fn readyz() {}

/// Prometheus metrics (OpenMetrics text format).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Metrics of the gateway and the engine",
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String)))]
#[allow(dead_code)]
fn metrics() {}

#[derive(utoipa::OpenApi)]
#[openapi(
    paths(healthz, readyz, metrics, openapi_json, docs),
    tags(
        (name = "operations", description = "Health, readiness and metrics, for load balancers and monitoring."),
        (name = "documentation", description = "This document and Swagger UI."),
    )
)]
struct OperationsApi;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_are_the_dialects_headers() {
        use crate::http::{dialect, error};
        for (ours, theirs) in [
            (RPC_SEQ_NO, dialect::RPC_SEQ_NO),
            (RPC_TIMEOUT, dialect::RPC_TIMEOUT),
            (CONNECT_TIMEOUT_MS, dialect::CONNECT_TIMEOUT_MS),
            (RPC_ERROR_CODE, error::RPC_ERROR_CODE),
            (RPC_ERROR_REASON, error::RPC_ERROR_REASON),
        ] {
            assert!(
                ours.eq_ignore_ascii_case(theirs.as_str()),
                "{ours} vs {theirs}"
            );
        }
    }

    #[test]
    fn documented_media_types_are_served() {
        let served = |name: &str| MEDIA_TYPES.iter().any(|(served, _)| *served == name);
        assert!(served(JSON_MEDIA_TYPE));
        assert!(served(PROTOBUF_MEDIA_TYPE));
    }

    #[test]
    fn every_example_names_a_real_field() {
        for (name, example) in FIELD_EXAMPLES {
            let (message, field) = name.rsplit_once('.').unwrap();
            let message = pb::DESCRIPTOR_POOL
                .get_message_by_name(message)
                .unwrap_or_else(|| panic!("{name}: no message"));
            let field = message
                .get_field_by_name(field)
                .unwrap_or_else(|| panic!("{name}: no field"));
            let value: Value = serde_json::from_str(example).unwrap();
            assert_eq!(value.is_array(), field.is_list(), "{name}");
        }
    }

    #[test]
    fn comments_become_descriptions() {
        let json = document();
        let heartbeat = &json["paths"]["/rpc/yadcc.scheduler.SchedulerService.Heartbeat"]["post"];
        assert_eq!(
            heartbeat["summary"],
            "Called periodically by daemons to report their states."
        );
        let field = &json["components"]["schemas"]["yadcc.scheduler.HeartbeatRequest"]["properties"]
            ["nextHeartbeatInMs"];
        let description = field["description"].as_str().unwrap();
        assert!(
            description.starts_with("Expected time of next heartbeat."),
            "{description}"
        );
        assert!(
            description.contains("`uint32 next_heartbeat_in_ms = 7`"),
            "{description}"
        );
        let priority =
            json["components"]["schemas"]["yadcc.scheduler.ServantPriority"]["description"]
                .as_str()
                .unwrap();
        assert!(
            priority.contains("| `SERVANT_PRIORITY_DEDICATED` | 1 | Dedicated servant."),
            "{priority}"
        );
    }

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
            contract::integer_pattern(0, u64::MAX.into())
        );
        assert_eq!(heartbeat["numProcessors"]["maximum"], json!(u32::MAX));
        assert_eq!(
            heartbeat["servantPriority"]["anyOf"][0]["$ref"],
            "#/components/schemas/yadcc.scheduler.ServantPriority"
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
        let status = &schemas["yadcc.scheduler.Status"]["enum"];
        assert_eq!(status[0], "STATUS_UNKNOWN");
        assert!(status.as_array().unwrap().contains(&json!(1004)));
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
            contract::location_pattern()
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
        assert_eq!(wait["required"], json!(["envDesc"]));
        let env = &wait["properties"]["envDesc"];
        assert_eq!(env["required"], json!(["compilerDigest"]));
        assert_eq!(env["properties"]["compilerDigest"]["minLength"], 1);
        assert_eq!(
            env["allOf"][0]["$ref"],
            "#/components/schemas/yadcc.EnvironmentDesc"
        );
        assert_eq!(
            wait["properties"]["millisecondsToWait"]["maximum"],
            json!(limits.max_wait.as_millis())
        );
        assert_eq!(
            wait["anyOf"][0]["properties"]["immediateReqs"]["minimum"],
            1
        );
        assert_eq!(wait["anyOf"][1]["required"], json!(["prefetchReqs"]));
        let keep = &schemas["yadcc.scheduler.KeepTaskAliveRequest"]["properties"];
        assert_eq!(
            keep["taskGrantIds"]["maxItems"],
            json!(limits.max_ids_per_request)
        );
        let heartbeat_path = &json["paths"]["/rpc/yadcc.scheduler.SchedulerService.Heartbeat"];
        assert_eq!(heartbeat_path["post"]["requestBody"]["required"], true);
        let config_path = &json["paths"]["/rpc/yadcc.scheduler.SchedulerService.GetConfig"];
        assert_eq!(config_path["post"]["requestBody"]["required"], false);
        let timeout = &json["components"]["parameters"][RPC_TIMEOUT]["schema"];
        assert_eq!(timeout["type"], json!(["integer", "string"]));
        assert_eq!(timeout["maximum"], json!(contract::TIMEOUT_MS.end()));
    }

    #[test]
    fn basic_auth_covers_the_inspection_api_when_on() {
        for inspect_auth in [true, false] {
            let json = document_for(inspect_auth);
            let mut guarded = 0;
            for (path, item) in json["paths"].as_object().unwrap() {
                for operation in item.as_object().unwrap().values() {
                    let security = &operation["security"];
                    if inspect_auth && is_inspection_path(path) {
                        assert_eq!(security, &json!([{ INSPECT_SECURITY: [] }]), "{path}");
                        guarded += 1;
                    } else {
                        assert!(security.is_null(), "{path}");
                    }
                }
            }
            // The dashboard's two and the dump's three GET operations.
            assert_eq!(guarded, if inspect_auth { 5 } else { 0 });
            assert_eq!(
                json["components"]["securitySchemes"][INSPECT_SECURITY]["scheme"]
                    .as_str()
                    .is_some(),
                inspect_auth
            );
        }
    }

    #[test]
    fn examples_are_the_demos() {
        let json = document();
        let schemas = &json["components"]["schemas"];
        let example = |message: &str, field: &str| {
            schemas[message]["properties"][field]["examples"][0].clone()
        };
        assert_eq!(
            example("yadcc.scheduler.HeartbeatRequest", "token"),
            sim::DEMO_SERVANT_TOKEN
        );
        assert_eq!(
            example("yadcc.scheduler.GetConfigRequest", "token"),
            sim::DEMO_USER_TOKEN
        );
        assert_eq!(
            example("yadcc.EnvironmentDesc", "compilerDigest"),
            json!(sim::environment_digest(0))
        );
    }

    #[test]
    fn error_responses_follow_the_error_table() {
        let json = document();
        for method in Method::ALL {
            for dialect in [Dialect::HttpPb, Dialect::Connect] {
                let responses = &json["paths"][dialect.path(method)]["post"]["responses"];
                for kind in operation_errors(method) {
                    let wire = kind.wire();
                    let response = &responses[wire.http_status.as_str()];
                    let description = response["description"].as_str().unwrap();
                    assert!(
                        description
                            .contains(&format!("| {} | `{}` |", wire.rpc_code, wire.connect_code)),
                        "{} {kind:?}: {description}",
                        method.name()
                    );
                    assert_eq!(
                        response["content"][JSON_MEDIA_TYPE]["schema"]["$ref"],
                        "#/components/schemas/ErrorBody"
                    );
                }
            }
        }
    }
}
