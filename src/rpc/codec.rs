//! Bytes <-> prost messages. Binary protobuf is prost's. JSON is the
//! canonical proto3 mapping: out, pbjson's (lowerCamelCase, 64-bit integers
//! as strings, enums by name); in, [`super::json`] reads every form
//! canonical proto3 JSON allows (both spellings, integers as numbers or
//! strings, exponent forms, `null` as the default, enums by name or number,
//! unknown fields of any shape) straight into binary protobuf, which prost
//! decodes as any binary request, and refuses the rest naming the field.

use axum::http::{HeaderMap, header};
use serde::Serialize;

use super::{
    error::{ApiError, ErrorKind},
    json::{self, JsonError},
};
use crate::pb::Encoding;

/// The media types a request may carry, each with the encoding it selects.
/// The response echoes the request's media type.
pub const MEDIA_TYPES: &[(&str, Encoding)] = &[
    ("application/x-protobuf", Encoding::Binary),
    ("application/protobuf", Encoding::Binary),
    ("application/proto", Encoding::Binary),
    ("application/octet-stream", Encoding::Binary),
    ("application/json", Encoding::Json),
    ("application/x-proto3-json", Encoding::Json),
];

/// A request's body format, as negotiated from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyFormat {
    pub encoding: Encoding,
    /// What the response says it is: the request's own media type.
    pub media_type: &'static str,
}

impl BodyFormat {
    /// Reads `Content-Type`; parameters such as `charset=utf-8` are ignored.
    /// Without one, `default` applies (the `http+pb` client always sends one,
    /// but hand-written tools often do not).
    pub fn from_headers(headers: &HeaderMap, default: BodyFormat) -> Result<Self, ApiError> {
        let Some(value) = headers.get(header::CONTENT_TYPE) else {
            return Ok(default);
        };
        let essence = value
            .to_str()
            .ok()
            .and_then(|text| text.split(';').next())
            .map(|text| text.trim().to_ascii_lowercase())
            .unwrap_or_default();
        MEDIA_TYPES
            .iter()
            .find(|(media_type, _)| *media_type == essence)
            .map(|&(media_type, encoding)| BodyFormat {
                encoding,
                media_type,
            })
            .ok_or_else(|| {
                let supported: Vec<&str> = MEDIA_TYPES.iter().map(|(name, _)| *name).collect();
                ApiError::new(
                    ErrorKind::UnsupportedMediaType,
                    format!(
                        "content type {:?} is not supported; use one of {}",
                        value.to_str().unwrap_or("<not text>"),
                        supported.join(", ")
                    ),
                )
            })
    }
}

/// Decodes a request message. An empty binary body is the message with
/// every field at its default, as protobuf defines; a JSON body must hold a
/// JSON value (`{}` for that message), as connect-go and Google's parsers
/// require.
pub fn decode<T>(encoding: Encoding, body: &[u8]) -> Result<T, ApiError>
where
    T: prost::Message + prost::Name + Default,
{
    let binary;
    let body = match encoding {
        Encoding::Binary => body,
        // JSON's whitespace only: a form feed (which `is_ascii_whitespace`
        // counts) is not JSON, and serde_json says so.
        Encoding::Json
            if body
                .iter()
                .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) =>
        {
            return Err(ApiError::malformed(format!(
                "body is {}: a JSON request must be an object (`{{}}` for a {} with every \
                 field at its default)",
                if body.is_empty() {
                    "empty"
                } else {
                    "only whitespace"
                },
                T::full_name()
            )));
        }
        Encoding::Json => {
            binary = json::to_binary(T::PACKAGE, T::NAME, body)
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorKind::Internal,
                        format!("no descriptor for message {}", T::full_name()),
                    )
                })?
                .map_err(|error| match error {
                    JsonError::Syntax(error) => {
                        ApiError::malformed(format!("body is not valid JSON: {error}"))
                    }
                    JsonError::Invalid(reason) => ApiError::malformed(format!(
                        "body is not a valid proto3 JSON {}: {reason}",
                        T::full_name()
                    )),
                    JsonError::Unsupported(reason) => ApiError::new(ErrorKind::Internal, reason),
                })?;
            &binary[..]
        }
    };
    T::decode(body).map_err(|error| {
        ApiError::malformed(format!("body is not a valid protobuf message: {error}"))
    })
}

/// Encodes a response message.
pub fn encode<T>(encoding: Encoding, message: &T) -> Result<Vec<u8>, ApiError>
where
    T: prost::Message + Serialize,
{
    match encoding {
        Encoding::Binary => Ok(message.encode_to_vec()),
        Encoding::Json => crate::pb::json_answer(message).map_err(|error| {
            ApiError::new(ErrorKind::Internal, format!("cannot encode JSON: {error}"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use prost::Message;

    use super::*;
    use crate::pb;

    const BINARY: BodyFormat = BodyFormat {
        encoding: Encoding::Binary,
        media_type: "application/x-protobuf",
    };

    fn format_of(content_type: &str) -> Result<BodyFormat, ApiError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(content_type).unwrap(),
        );
        BodyFormat::from_headers(&headers, BINARY)
    }

    #[test]
    fn media_types_select_encodings_and_ignore_parameters() {
        assert_eq!(
            format_of("application/json; charset=utf-8")
                .unwrap()
                .encoding,
            Encoding::Json
        );
        assert_eq!(
            format_of("Application/X-Protobuf").unwrap().media_type,
            "application/x-protobuf"
        );
        assert_eq!(
            format_of("application/proto").unwrap().encoding,
            Encoding::Binary
        );
        assert_eq!(
            format_of("text/x-protobuf").unwrap_err().kind,
            ErrorKind::UnsupportedMediaType
        );
        assert_eq!(
            BodyFormat::from_headers(&HeaderMap::new(), BINARY).unwrap(),
            BINARY
        );
    }

    #[test]
    fn json_uses_camel_case_out_and_accepts_both_spellings_in() {
        let response = pb::HeartbeatResponse {
            acceptable_tokens: vec!["t".into()],
            expired_tasks: vec![u64::MAX],
        };
        let json = String::from_utf8(encode(Encoding::Json, &response).unwrap()).unwrap();
        assert_eq!(
            json,
            "{\"acceptableTokens\":[\"t\"],\"expiredTasks\":[\"18446744073709551615\"]}\n"
        );

        let snake: pb::KeepTaskAliveRequest = decode(
            Encoding::Json,
            br#"{"task_grant_ids":[1,"2"],"next_keep_alive_in_ms":5}"#,
        )
        .unwrap();
        let camel: pb::KeepTaskAliveRequest = decode(
            Encoding::Json,
            br#"{"taskGrantIds":["1",2],"nextKeepAliveInMs":5,"future":true}"#,
        )
        .unwrap();
        assert_eq!(snake, camel);
        assert_eq!(snake.task_grant_ids, vec![1, 2]);
    }

    #[test]
    fn enums_decode_by_name_or_number() {
        let by_name: pb::HeartbeatRequest = decode(
            Encoding::Json,
            br#"{"servantPriority":"SERVANT_PRIORITY_DEDICATED"}"#,
        )
        .unwrap();
        let by_number: pb::HeartbeatRequest =
            decode(Encoding::Json, br#"{"servantPriority":1}"#).unwrap();
        assert_eq!(by_name.servant_priority, 1);
        assert_eq!(by_number.servant_priority, 1);
    }

    #[test]
    fn bad_bodies_are_malformed_requests() {
        let truncated = &pb::GetConfigRequest {
            token: "abc".into(),
        }
        .encode_to_vec()[..3];
        for (encoding, body) in [
            (Encoding::Binary, truncated),
            (Encoding::Json, &b"{not json"[..]),
            (Encoding::Json, &br#"{"token": 5}"#[..]),
        ] {
            let error = decode::<pb::GetConfigRequest>(encoding, body).unwrap_err();
            assert_eq!(error.kind, ErrorKind::MalformedRequest, "{body:?}");
        }
        let error = decode::<pb::GetRunningTasksRequest>(Encoding::Json, b"\x0c").unwrap_err();
        assert_eq!(error.kind, ErrorKind::MalformedRequest);
        assert!(
            error.message.starts_with("body is not valid JSON"),
            "{error:?}"
        );
    }

    #[test]
    fn an_empty_body_is_the_empty_message_in_binary_only() {
        let empty: pb::GetRunningTasksRequest = decode(Encoding::Binary, b"").unwrap();
        assert_eq!(empty, pb::GetRunningTasksRequest {});
        for (body, what) in [(&b""[..], "empty"), (b" \t\r\n", "only whitespace")] {
            let error = decode::<pb::GetRunningTasksRequest>(Encoding::Json, body).unwrap_err();
            assert_eq!(error.kind, ErrorKind::MalformedRequest);
            assert_eq!(
                error.message,
                format!(
                    "body is {what}: a JSON request must be an object (`{{}}` for a \
                     yadcc.scheduler.GetRunningTasksRequest with every field at its default)"
                )
            );
        }
        let braces: pb::GetRunningTasksRequest = decode(Encoding::Json, b" {}\n").unwrap();
        assert_eq!(braces, pb::GetRunningTasksRequest {});
    }

    #[test]
    fn json_refusals_say_which_kind_of_wrong() {
        let error =
            decode::<pb::KeepTaskAliveRequest>(Encoding::Json, br#"{"nextKeepAliveInMs": 1.5}"#)
                .unwrap_err();
        assert_eq!(
            error.message,
            "body is not a valid proto3 JSON yadcc.scheduler.KeepTaskAliveRequest: \
             nextKeepAliveInMs: 1.5 is not an integer"
        );
        let error =
            decode::<pb::KeepTaskAliveRequest>(Encoding::Json, br#"{"token": }"#).unwrap_err();
        assert_eq!(
            error.message,
            "body is not valid JSON: expected value at line 1 column 11"
        );
    }
}
