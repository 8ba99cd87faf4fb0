//! The document's prose: the overview (with the whole error table) and the
//! route styles' descriptions.

use prost_reflect::ServiceDescriptor;

use super::{
    CONNECT_TIMEOUT_MS, RPC_ERROR_CODE, RPC_ERROR_REASON, RPC_SEQ_NO, RPC_TIMEOUT,
    comments::{comment, push_paragraph},
    errors::error_table,
};
use crate::{
    http::dialect::RouteStyle,
    pb::{self, Encoding},
    rpc::{codec::MEDIA_TYPES, error::ErrorKind, state::DEFAULT_MAX_BODY_BYTES},
};

pub(super) fn overview(service: &ServiceDescriptor) -> String {
    let mut text =
        comment(service.parent_file_descriptor_proto(), service.path()).unwrap_or_default();
    push_paragraph(
        &mut text,
        format!(
            "The yadcc compile scheduler: it decides which compile servant runs which \
             compilation, for a whole cluster. Every RPC of `{}` is served on two routes, \
             `POST /rpc/{0}.<Method>` (`http+pb`, what the yadcc daemons speak) and \
             `POST /{0}/<Method>` (Connect unary). Both take and return the same bodies.\n\n\
             This document is generated from the proto files by `src/openapi/`.",
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
         - Unknown fields in a request are ignored. An empty binary body is the message with \
         every field at its default; in JSON that message is `{}`, and a JSON body that is \
         empty or only whitespace is refused (400).",
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

/// The operators' service: its proto comment, and how to call it.
pub(super) fn admin_description() -> String {
    let service = pb::Service::Admin.descriptor();
    let mut text =
        comment(service.parent_file_descriptor_proto(), service.path()).unwrap_or_default();
    push_paragraph(
        &mut text,
        format!(
            "`{0}` is served on both route styles (`POST /rpc/{0}.<Method>`, \
             `POST /{0}/<Method>`, gRPC and gRPC-Web), not on the daemons' binary \
             protocol. Its operations carry the `adminToken` security scheme.",
            service.full_name()
        ),
    );
    text
}

pub(super) fn dialect_description(dialect: RouteStyle) -> String {
    let service = pb::SCHEDULER_SERVICE;
    match dialect {
        RouteStyle::HttpPb => format!(
            "`POST /rpc/{service}.<Method>`: the framing of the yadcc daemons' RPC framework \
             (`--scheduler_uri=http+pb://HOST:PORT`). `{RPC_SEQ_NO}` is echoed; \
             `{RPC_TIMEOUT}` is the caller's deadline in milliseconds. A failure is a non-200 \
             status with `{RPC_ERROR_CODE}` and `{RPC_ERROR_REASON}`."
        ),
        RouteStyle::Connect => format!(
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
             (`grpc.reflection.v1`, `v1alpha`) describes the API to gRPC and Connect tools \
             without a schema file, and the gRPC health service (`grpc.health.v1.Health`) \
             reports the readiness of `/readyz`; both answer gRPC, gRPC-Web and Connect \
             in binary protobuf, and are not listed here."
        ),
    }
}
