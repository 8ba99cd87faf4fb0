//! The RPC operations: one per method and route style ([`RouteStyle`]), their
//! request and response bodies in every media type, the header parameters
//! and response headers the route styles use.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use prost_reflect::MessageDescriptor;
use utoipa::openapi::{
    ContentBuilder, HeaderBuilder, HttpMethod, KnownFormat, ObjectBuilder, PathItem, Paths,
    PathsBuilder, Ref, ResponseBuilder, SchemaFormat, Type,
    extensions::ExtensionsBuilder,
    path::{OperationBuilder, ParameterBuilder, ParameterIn},
    request_body::RequestBodyBuilder,
    schema::SchemaType,
};

use super::{
    CONNECT_TIMEOUT_MS, JSON_MEDIA_TYPE, PROTOBUF_MEDIA_TYPE, RPC_ERROR_CODE, RPC_ERROR_REASON,
    RPC_SEQ_NO, RPC_TIMEOUT, TAG_ADMIN, TAG_CONNECT, TAG_HTTP_PB,
    comments::{comment, first_sentence, push_paragraph},
    errors::{error_table, operation_errors},
};
use crate::{
    contract::{FieldRule, Rule},
    grammar,
    http::dialect::RouteStyle,
    pb::{Encoding, Method, Service},
    rpc::{codec::MEDIA_TYPES, error::ErrorKind},
};

/// Every RPC in both route styles, `http+pb` first.
pub(super) fn rpc_paths(rules: &[FieldRule]) -> Paths {
    let mut paths = PathsBuilder::new();
    for dialect in [RouteStyle::HttpPb, RouteStyle::Connect] {
        for method in Method::ALL {
            paths = paths.path(
                dialect.path(method),
                PathItem::new(HttpMethod::Post, rpc_operation(dialect, method, rules)),
            );
        }
    }
    paths.build()
}

/// The `operationId` of one RPC in one route style.
pub fn operation_id(dialect: RouteStyle, method: Method) -> String {
    let style = match dialect {
        RouteStyle::HttpPb => "httpPb",
        RouteStyle::Connect => "connect",
    };
    format!("{}_{style}", method.name())
}

fn rpc_operation(
    dialect: RouteStyle,
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
                RouteStyle::HttpPb => "The `http+pb` framing of the yadcc daemons.",
                RouteStyle::Connect => {
                    "A Connect unary call. The same path answers gRPC (`application/grpc`, \
                     HTTP/2) and gRPC-Web (`application/grpc-web`, `application/grpc-web-text`) \
                     with the same messages, told apart by `Content-Type`."
                }
            }
        ),
    );

    // One tag each: Swagger UI lists an operation under every tag it has,
    // so an admin operation tagged with its route style too showed twice.
    // Its route style is in its path, summary and operation id.
    let tag = match (rpc.service(), dialect) {
        (Service::Admin, _) => TAG_ADMIN,
        (_, RouteStyle::HttpPb) => TAG_HTTP_PB,
        (_, RouteStyle::Connect) => TAG_CONNECT,
    };
    let mut operation = OperationBuilder::new()
        .tag(tag)
        .summary(Some(summary))
        .description(Some(description))
        .operation_id(Some(operation_id(dialect, rpc)));
    for name in dialect_parameters(dialect) {
        operation = operation.parameter_ref(Ref::new(format!("#/components/parameters/{name}")));
    }
    // A message with required fields cannot be empty; any other can. Either
    // way the body is required: a request without a `Content-Type` is
    // refused (another site's page could send it), and an empty binary
    // message is still a body of that type.
    let required = rules
        .iter()
        .any(|rule| rule.message == input.full_name() && rule.rule == Rule::Required);
    operation = operation.request_body(Some(
        RequestBodyBuilder::new()
            .description(Some(format!(
                "`{}`, with its `Content-Type` (a request without one is refused, 415). \
                 An empty binary body is the message with every field at its \
                 default{}; in JSON that message is `{{}}`, and an empty JSON body is refused.",
                input.full_name(),
                if required {
                    ", which this call refuses"
                } else {
                    ""
                }
            )))
            .required(Some(utoipa::openapi::Required::True))
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
    // style's default binary type): every one of them is documented, JSON
    // first, since client generators read the first as the answer's type.
    for (media_type, encoding) in json_first(MEDIA_TYPES) {
        ok = ok.content(
            *media_type,
            match encoding {
                Encoding::Json => json_content(&output),
                Encoding::Binary => protobuf_content(&output, media_type),
            },
        );
    }
    if dialect == RouteStyle::HttpPb {
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
        if dialect == RouteStyle::HttpPb {
            response = response.header_ref(RPC_SEQ_NO, header_ref(RPC_SEQ_NO));
        }
        operation = operation.response(status.as_str(), response.build());
    }
    operation.build()
}

/// `media_types` with the JSON ones first, each group in its own order.
fn json_first(
    media_types: &'static [(&'static str, Encoding)],
) -> impl Iterator<Item = &'static (&'static str, Encoding)> {
    let json = media_types
        .iter()
        .filter(|(_, encoding)| *encoding == Encoding::Json);
    let binary = media_types
        .iter()
        .filter(|(_, encoding)| *encoding == Encoding::Binary);
    json.chain(binary)
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

fn dialect_parameters(dialect: RouteStyle) -> &'static [&'static str] {
    match dialect {
        RouteStyle::HttpPb => &[RPC_SEQ_NO, RPC_TIMEOUT],
        RouteStyle::Connect => &[CONNECT_TIMEOUT_MS],
    }
}

pub(super) fn header_parameters() -> Vec<(&'static str, utoipa::openapi::path::Parameter)> {
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
            .pattern(Some(grammar::integer_pattern(
                (*range.start()).into(),
                (*range.end()).into(),
            )))
    };
    let millis = || integer(&grammar::TIMEOUT_MS).examples([10000]);
    vec![
        header(
            RPC_SEQ_NO,
            "Sequence number of the call; echoed in the answer so that pipelined \
             answers can be matched to their calls.",
            integer(&grammar::SEQ_NO).examples([17]),
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

pub(super) fn response_headers() -> Vec<(&'static str, utoipa::openapi::Header)> {
    vec![
        (
            RPC_SEQ_NO,
            HeaderBuilder::new()
                .schema(Some(
                    ObjectBuilder::new()
                        .schema_type(SchemaType::from_iter([Type::Integer, Type::String]))
                        .minimum(Some(*grammar::SEQ_NO.start()))
                        .maximum(Some(*grammar::SEQ_NO.end()))
                        .pattern(Some(grammar::integer_pattern(
                            (*grammar::SEQ_NO.start()).into(),
                            (*grammar::SEQ_NO.end()).into(),
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
