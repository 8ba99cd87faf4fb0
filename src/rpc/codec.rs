//! Bytes <-> prost messages. Binary protobuf is prost's; JSON is pbjson's
//! canonical proto3 mapping (lowerCamelCase out, both spellings in, 64-bit
//! integers as strings out, enums by name out). On the way in, [`super::json`]
//! first brings every form canonical proto3 JSON allows (integers as numbers
//! or strings, exponent forms, `null` as the default, enums by name or number,
//! unknown fields of any shape) to one pbjson reads, and refuses the rest
//! naming the field.

use serde::{Serialize, de::DeserializeOwned};

use super::{
    error::{ApiError, ErrorKind},
    json::{self, StrictJson},
};
use crate::pb::{self, Encoding};

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
    use prost::Message;

    use super::*;
    use crate::pb;

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
