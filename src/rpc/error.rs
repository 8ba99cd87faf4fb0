//! The one error model. Every failure, whether the scheduler's own (`Status`
//! 1001..1006) or the transport's, is an [`ApiError`], and [`ErrorKind::wire`]
//! is the single table that gives it an HTTP status, the framework's numeric
//! `Rpc-Error-Code` (what `http+pb` clients read) and a Connect code (what
//! Connect clients read). Each protocol writes a row in its own form (the
//! HTTP one, headers and JSON body, is [`crate::http::dialect`]'s), so a
//! client of any protocol sees the same outcome.

use axum::http::StatusCode;
use serde::Serialize;

use crate::{admin::AdminError, pb, service::RpcStatus};

/// What went wrong, independent of how it is written on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A scheduler outcome (`Status` of the seed).
    Scheduler(pb::Status),
    /// The operators' service without a credential: 401, with the status
    /// of a refused token (`STATUS_ACCESS_DENIED`); a wrong credential is
    /// `Scheduler(AccessDenied)`, 403.
    Unauthenticated,
    /// The caller's `Rpc-Timeout` / `Connect-Timeout-Ms` passed.
    DeadlineExceeded,
    /// The body does not decode as the method's request message, or a header is malformed.
    MalformedRequest,
    /// The `Content-Type` is not one this server decodes, or is one any
    /// page may send across sites (or none).
    UnsupportedMediaType,
    /// An `Origin` neither this server's nor in `--cors_allowed_origins`.
    CrossSite,
    /// The body is larger than the configured limit.
    PayloadTooLarge,
    /// Not a POST.
    MethodNotAllowed,
    /// No route: a path that names no RPC of this server (another service on
    /// the Connect or gRPC path, or no RPC path at all).
    ServiceNotFound,
    /// No such method; under `/rpc/` and on the binary protocol any name the
    /// server does not know, another service's too, as the daemons' framework
    /// answers.
    MethodNotFound,
    /// The server will not take the call now (a per-connection limit of
    /// calls in flight, the call waited past its deadline before it ran, or
    /// this instance is a hot standby).
    Overloaded,
    /// A compression this server cannot inflate: a flare
    /// `compression_algorithm` the framework defines no algorithm for, a
    /// gRPC message compressed as its `grpc-encoding` says.
    CompressionNotSupported,
    /// A bug: never expected.
    Internal,
}

/// One row of the error table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorRow {
    pub http_status: StatusCode,
    /// `Rpc-Error-Code`: scheduler codes are >= 1000, framework codes below.
    pub rpc_code: u32,
    /// Connect protocol error code.
    pub connect_code: &'static str,
}

const fn row(http_status: StatusCode, rpc_code: u32, connect_code: &'static str) -> ErrorRow {
    ErrorRow {
        http_status,
        rpc_code,
        connect_code,
    }
}

impl ErrorKind {
    /// The error table. The table of docs/api.md is this function, row by row, and a
    /// test checks every row over a real socket.
    pub fn wire(self) -> ErrorRow {
        use pb::Status;
        match self {
            ErrorKind::Scheduler(Status::NoQuotaAvailable) => {
                row(StatusCode::TOO_MANY_REQUESTS, 1001, "resource_exhausted")
            }
            ErrorKind::Scheduler(Status::NotImplemented) => {
                row(StatusCode::NOT_IMPLEMENTED, 1002, "unimplemented")
            }
            ErrorKind::Scheduler(Status::AccessDenied) => {
                row(StatusCode::FORBIDDEN, 1003, "permission_denied")
            }
            ErrorKind::Unauthenticated => row(StatusCode::UNAUTHORIZED, 1003, "unauthenticated"),
            ErrorKind::Scheduler(Status::InvalidArgument) => {
                row(StatusCode::BAD_REQUEST, 1004, "invalid_argument")
            }
            ErrorKind::Scheduler(Status::VersionTooOld) => {
                row(StatusCode::BAD_REQUEST, 1005, "failed_precondition")
            }
            ErrorKind::Scheduler(Status::EnvironmentNotAvailable) => {
                row(StatusCode::NOT_FOUND, 1006, "not_found")
            }
            // 0 is the enum's default, standing for no error (the seed's
            // `rpc.STATUS_SUCCESS`): raised as an error, it is our bug.
            ErrorKind::Scheduler(Status::Unknown) | ErrorKind::Internal => {
                row(StatusCode::INTERNAL_SERVER_ERROR, 99, "internal")
            }
            ErrorKind::DeadlineExceeded => row(StatusCode::GATEWAY_TIMEOUT, 3, "deadline_exceeded"),
            ErrorKind::MalformedRequest => row(StatusCode::BAD_REQUEST, 5, "invalid_argument"),
            ErrorKind::UnsupportedMediaType => {
                row(StatusCode::UNSUPPORTED_MEDIA_TYPE, 5, "invalid_argument")
            }
            ErrorKind::CrossSite => row(StatusCode::FORBIDDEN, 5, "permission_denied"),
            ErrorKind::PayloadTooLarge => {
                row(StatusCode::PAYLOAD_TOO_LARGE, 5, "resource_exhausted")
            }
            ErrorKind::MethodNotAllowed => row(StatusCode::METHOD_NOT_ALLOWED, 5, "unimplemented"),
            ErrorKind::ServiceNotFound => row(StatusCode::NOT_FOUND, 9, "unimplemented"),
            ErrorKind::MethodNotFound => row(StatusCode::NOT_FOUND, 10, "unimplemented"),
            ErrorKind::Overloaded => row(StatusCode::SERVICE_UNAVAILABLE, 11, "unavailable"),
            ErrorKind::CompressionNotSupported => {
                row(StatusCode::UNSUPPORTED_MEDIA_TYPE, 101, "unimplemented")
            }
        }
    }

    /// Every kind, for tests and documentation.
    pub const ALL: [ErrorKind; 19] = [
        ErrorKind::Scheduler(pb::Status::NoQuotaAvailable),
        ErrorKind::Scheduler(pb::Status::NotImplemented),
        ErrorKind::Scheduler(pb::Status::AccessDenied),
        ErrorKind::Scheduler(pb::Status::InvalidArgument),
        ErrorKind::Scheduler(pb::Status::VersionTooOld),
        ErrorKind::Scheduler(pb::Status::EnvironmentNotAvailable),
        ErrorKind::Scheduler(pb::Status::Unknown),
        ErrorKind::Unauthenticated,
        ErrorKind::DeadlineExceeded,
        ErrorKind::MalformedRequest,
        ErrorKind::UnsupportedMediaType,
        ErrorKind::CrossSite,
        ErrorKind::PayloadTooLarge,
        ErrorKind::MethodNotAllowed,
        ErrorKind::ServiceNotFound,
        ErrorKind::MethodNotFound,
        ErrorKind::Overloaded,
        ErrorKind::CompressionNotSupported,
        ErrorKind::Internal,
    ];

    /// The seed's enum name for scheduler outcomes (`STATUS_ACCESS_DENIED`).
    pub fn status_name(self) -> Option<&'static str> {
        self.status().map(|status| status.as_str_name())
    }

    /// The scheduler `Status` the outcome carries, if any.
    pub fn status(self) -> Option<pb::Status> {
        match self {
            ErrorKind::Scheduler(status) => Some(status),
            ErrorKind::Unauthenticated => Some(pb::Status::AccessDenied),
            _ => None,
        }
    }
}

/// A failed call: what went wrong and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
}

/// The JSON body of every error, on both route styles. `code` and `message`
/// are what Connect clients read; the rest helps people and scripts.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// Connect error code, e.g. `permission_denied`.
    pub code: &'static str,
    /// What went wrong, for people.
    pub message: String,
    /// The numeric code also sent as `Rpc-Error-Code` (>= 1000: scheduler `Status`).
    pub rpc_error_code: u32,
    /// The scheduler `Status` name, for scheduler outcomes only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
}

impl ApiError {
    /// The message is bounded ([`crate::edge::MESSAGE_BYTES`]): it goes
    /// back in a header and the body, and may quote what the client sent.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > crate::edge::MESSAGE_BYTES {
            message = crate::edge::echo_within(&message, crate::edge::MESSAGE_BYTES).into_owned();
        }
        Self { kind, message }
    }

    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::MalformedRequest, message)
    }

    /// The response body, as documented in the OpenAPI spec.
    pub fn body(&self) -> ErrorBody {
        let wire = self.kind.wire();
        ErrorBody {
            code: wire.connect_code,
            message: self.message.clone(),
            rpc_error_code: wire.rpc_code,
            status: self.kind.status_name(),
        }
    }
}

impl From<RpcStatus> for ApiError {
    fn from(status: RpcStatus) -> Self {
        Self::new(ErrorKind::Scheduler(status.code), status.message)
    }
}

impl From<AdminError> for ApiError {
    fn from(error: AdminError) -> Self {
        let kind = match &error {
            AdminError::Unauthenticated(_) => ErrorKind::Unauthenticated,
            AdminError::Forbidden(_) => ErrorKind::Scheduler(pb::Status::AccessDenied),
            AdminError::InvalidArgument(_) => ErrorKind::Scheduler(pb::Status::InvalidArgument),
            // Another instance (the leader), or a moment later, can act.
            AdminError::NotLeading(_) | AdminError::NotSaved(_) => ErrorKind::Overloaded,
        };
        Self::new(kind, error.to_string())
    }
}

impl ApiError {
    /// The JSON error body ([`ErrorBody`]), served as `application/json`.
    pub fn json_body(&self) -> Vec<u8> {
        crate::pb::json_answer(&self.body()).unwrap_or_else(|_| b"{}\n".to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_codes_are_the_seed_status_numbers() {
        for kind in ErrorKind::ALL {
            if let Some(status) = kind.status()
                && status != pb::Status::Unknown
            {
                assert_eq!(kind.wire().rpc_code, status as u32);
            } else {
                assert!(kind.wire().rpc_code < 1000, "{kind:?}");
            }
        }
    }

    #[test]
    fn the_documented_error_table_is_this_table() {
        let readme = include_str!("../../docs/api.md");
        for kind in ErrorKind::ALL {
            let wire = kind.wire();
            let row = format!(
                "| {} | {} | {} |",
                wire.http_status.as_u16(),
                wire.rpc_code,
                wire.connect_code
            );
            let named = kind.status_name().is_none_or(|name| {
                readme
                    .lines()
                    .any(|line| line.contains(name) && line.ends_with(&row))
            });
            assert!(
                readme.contains(&row) && named,
                "docs/api.md lacks {kind:?}: {row}"
            );
        }
    }

    #[test]
    fn every_row_of_the_documented_error_table_is_a_row_of_this_table() {
        let readme = include_str!("../../docs/api.md");
        let rows: Vec<Vec<&str>> = readme
            .lines()
            .skip_while(|line| !line.starts_with("| outcome | HTTP | Rpc-Error-Code |"))
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .map(|line| line.trim_matches('|').split('|').map(str::trim).collect())
            .collect();
        assert!(rows.len() >= ErrorKind::ALL.len() - 1, "{rows:?}");
        for row in rows {
            let [outcome, http_status, rpc_code, connect_code] = row[..] else {
                panic!("not a row of four cells: {row:?}");
            };
            let named = outcome
                .strip_prefix('`')
                .and_then(|rest| rest.split_once('`'))
                .map(|(name, _)| name)
                .filter(|name| name.starts_with("STATUS_"));
            let matches = ErrorKind::ALL.iter().any(|kind| {
                let wire = kind.wire();
                wire.http_status.as_str() == http_status
                    && wire.rpc_code.to_string() == rpc_code
                    && wire.connect_code == connect_code
                    && named.is_none_or(|name| kind.status_name() == Some(name))
            });
            assert!(
                matches,
                "the docs/api.md row {outcome:?} is no row of the code"
            );
        }
    }
}
