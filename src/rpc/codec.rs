//! Bytes <-> prost messages. Binary protobuf is prost's; JSON is pbjson's
//! canonical proto3 mapping (lowerCamelCase out, both spellings in, 64-bit
//! integers as strings out, enums by name out). On the way in, [`super::json`]
//! first brings every form canonical proto3 JSON allows (integers as numbers
//! or strings, exponent forms, `null` as the default, enums by name or number,
//! unknown fields of any shape) to one pbjson reads, and refuses the rest
//! naming the field.

use axum::http::{HeaderMap, header};
use serde::{Serialize, de::DeserializeOwned};

use super::{
    error::{ApiError, ErrorKind},
    json::{self, StrictJson},
};
use crate::pb::{self, Encoding};

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

/// Decodes a request message. An empty JSON body is read as `{}` so that
/// `curl -d ''` works for requests without fields.
pub fn decode<T>(encoding: Encoding, body: &[u8]) -> Result<T, ApiError>
where
    T: prost::Message + prost::Name + Default + DeserializeOwned,
{
    match encoding {
        Encoding::Binary => T::decode(body).map_err(|error| {
            ApiError::malformed(format!("body is not a valid protobuf message: {error}"))
        }),
        // JSON's whitespace only: a form feed (which `is_ascii_whitespace`
        // counts) is not JSON.
        Encoding::Json
            if body
                .iter()
                .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) =>
        {
            Ok(T::default())
        }
        Encoding::Json => {
            let name = T::full_name();
            let descriptor = pb::DESCRIPTOR_POOL
                .get_message_by_name(&name)
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorKind::Internal,
                        format!("no descriptor for message {name}"),
                    )
                })?;
            let StrictJson(value) = serde_json::from_slice(body)
                .map_err(|error| ApiError::malformed(format!("body is not valid JSON: {error}")))?;
            let value = json::normalise(&descriptor, value).map_err(|error| {
                ApiError::malformed(format!("body is not a valid proto3 JSON {name}: {error}"))
            })?;
            serde_json::from_value(value).map_err(|error| {
                ApiError::malformed(format!("body is not a valid proto3 JSON {name}: {error}"))
            })
        }
    }
}

/// Encodes a response message.
pub fn encode<T>(encoding: Encoding, message: &T) -> Result<Vec<u8>, ApiError>
where
    T: prost::Message + Serialize,
{
    match encoding {
        Encoding::Binary => Ok(message.encode_to_vec()),
        Encoding::Json => serde_json::to_vec(message).map_err(|error| {
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
            r#"{"acceptableTokens":["t"],"expiredTasks":["18446744073709551615"]}"#
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
        let empty: pb::GetRunningTasksRequest = decode(Encoding::Json, b" \t\r\n").unwrap();
        assert_eq!(empty, pb::GetRunningTasksRequest {});
        let error = decode::<pb::GetRunningTasksRequest>(Encoding::Json, b"\x0c").unwrap_err();
        assert_eq!(error.kind, ErrorKind::MalformedRequest);
    }
}
