//! The error responses: which rows of the one error table
//! ([`ErrorKind::wire`]) each operation can meet, and those rows as the
//! Markdown tables of the descriptions.

use serde_json::{Map, Value, json};

use super::{
    CONNECT_TIMEOUT_MS, RPC_ERROR_CODE, RPC_TIMEOUT,
    comments::{member_comment, table_cell},
    schemas::schema_ref,
};
use crate::{
    pb::{self, Method, Service},
    rpc::error::ErrorKind,
    service,
};

/// The rows of the error table a call of `method` on its documented route
/// (right path, POST) can meet.
pub fn operation_errors(method: Method) -> Vec<ErrorKind> {
    let admin = method.service() == Service::Admin;
    ErrorKind::ALL
        .into_iter()
        .filter(|kind| match kind {
            ErrorKind::Scheduler(status) => service::failure_statuses(method).contains(status),
            // Only the operators' service asks for a credential in a header;
            // only it refuses on a standby taking over, or when its state
            // cannot be saved.
            ErrorKind::Unauthenticated => admin,
            ErrorKind::Overloaded => admin,
            // The documented path and verb are right by construction.
            ErrorKind::MethodNotAllowed
            | ErrorKind::ServiceNotFound
            | ErrorKind::MethodNotFound => false,
            // Only the daemons' binary protocol meets this.
            ErrorKind::CompressionNotSupported => false,
            ErrorKind::DeadlineExceeded
            | ErrorKind::MalformedRequest
            | ErrorKind::UnsupportedMediaType
            | ErrorKind::CrossSite
            | ErrorKind::PayloadTooLarge
            | ErrorKind::Internal => true,
        })
        .collect()
}

/// The scheduler's status enum, whose names `ErrorBody.status` carries.
const STATUS_ENUM: &str = "yadcc.scheduler.Status";

/// `ErrorBody.status` holds a name of [`STATUS_ENUM`]: a reference to the
/// enum's schema says which names, and documents the enum, which no message
/// field uses.
pub(super) fn refer_to_status_enum(schemas: &mut Map<String, Value>) {
    let status = &mut schemas["ErrorBody"]["properties"]["status"];
    let description = status["description"].take();
    *status = json!({
        "$ref": schema_ref(STATUS_ENUM),
        "description": description,
    });
}

/// Markdown table of error-table rows. With `with_status`, the HTTP status is a column.
pub(super) fn error_table(kinds: &[ErrorKind], with_status: bool) -> String {
    let pool = &*pb::DESCRIPTOR_POOL;
    let status_enum = pool.get_enum_by_name(STATUS_ENUM);
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
                "Not an error the scheduler gives: 0 is the enum's default, which stands for no error (the seed calls it `rpc.STATUS_SUCCESS`). Seen with a 500, it is a bug in the scheduler."
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
        ErrorKind::Unauthenticated => "A call of the operators' service without \
            `Authorization: Bearer <admin token>` (a wrong token is 403)."
            .to_owned(),
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
        ErrorKind::CrossSite => "The `Origin` is neither this server's nor in \
            `--cors_allowed_origins`: a page of another site called."
            .to_owned(),
        ErrorKind::PayloadTooLarge => "The body is larger than the configured limit.".to_owned(),
        ErrorKind::MethodNotAllowed => "Not a POST (the answer has `Allow: POST`).".to_owned(),
        ErrorKind::ServiceNotFound => {
            "No such path: another service on the Connect or gRPC path, or no RPC path at all."
                .to_owned()
        }
        ErrorKind::MethodNotFound => "No such method; under `/rpc/` any name this server does \
            not know, another service's too, as the daemons' framework answers."
            .to_owned(),
        ErrorKind::Overloaded => "Too many calls in flight on one daemon connection; or, for \
            the operators' service, this instance does not lead or cannot save its state now; \
            retry."
            .to_owned(),
        ErrorKind::CompressionNotSupported => {
            "A compressed call of the daemons' binary protocol, or a compressed gRPC message \
             (`grpc-encoding`); send it uncompressed."
                .to_owned()
        }
        ErrorKind::Internal => "A bug in the server.".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        http::dialect::RouteStyle,
        openapi::{JSON_MEDIA_TYPE, document},
    };

    #[test]
    fn error_responses_follow_the_error_table() {
        let json = document();
        for method in Method::ALL {
            for dialect in [RouteStyle::HttpPb, RouteStyle::Connect] {
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
