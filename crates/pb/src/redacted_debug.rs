//! `Debug` for the protobuf messages that carry a secret (`build.rs` skips
//! prost's derive for them): every field as usual, tokens as the engine's
//! [`Redacted`] (from `yadcc-text`, which the engine shares). Here, beside
//! the types, because Rust lets only this crate implement `Debug` for them.

use std::fmt;

use yadcc_text::Redacted;

use crate::{
    FreeTaskRequest, GetConfigRequest, GetConfigResponse, HeartbeatRequest, HeartbeatResponse,
    KeepTaskAliveRequest, WaitForStartingTaskRequest,
};

impl fmt::Debug for HeartbeatRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeartbeatRequest")
            .field("token", &Redacted(&self.token))
            .field("next_heartbeat_in_ms", &self.next_heartbeat_in_ms)
            .field("version", &self.version)
            .field("location", &self.location)
            .field("num_processors", &self.num_processors)
            .field("current_load", &self.current_load)
            .field("servant_priority", &self.servant_priority)
            .field("not_accepting_task_reason", &self.not_accepting_task_reason)
            .field("capacity", &self.capacity)
            .field("total_memory_in_bytes", &self.total_memory_in_bytes)
            .field("memory_available_in_bytes", &self.memory_available_in_bytes)
            .field("env_descs", &self.env_descs)
            .field("running_tasks", &self.running_tasks)
            .finish()
    }
}

impl fmt::Debug for HeartbeatResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeartbeatResponse")
            .field("acceptable_tokens", &Redacted(&self.acceptable_tokens))
            .field("expired_tasks", &self.expired_tasks)
            .finish()
    }
}

impl fmt::Debug for GetConfigRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetConfigRequest")
            .field("token", &Redacted(&self.token))
            .finish()
    }
}

impl fmt::Debug for GetConfigResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetConfigResponse")
            .field(
                "serving_daemon_token",
                &Redacted(&self.serving_daemon_token),
            )
            .finish()
    }
}

impl fmt::Debug for WaitForStartingTaskRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitForStartingTaskRequest")
            .field("token", &Redacted(&self.token))
            .field("milliseconds_to_wait", &self.milliseconds_to_wait)
            .field("env_desc", &self.env_desc)
            .field("immediate_reqs", &self.immediate_reqs)
            .field("prefetch_reqs", &self.prefetch_reqs)
            .field("next_keep_alive_in_ms", &self.next_keep_alive_in_ms)
            .field("min_version", &self.min_version)
            .finish()
    }
}

impl fmt::Debug for KeepTaskAliveRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeepTaskAliveRequest")
            .field("token", &Redacted(&self.token))
            .field("task_grant_ids", &self.task_grant_ids)
            .field("next_keep_alive_in_ms", &self.next_keep_alive_in_ms)
            .finish()
    }
}

impl fmt::Debug for FreeTaskRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FreeTaskRequest")
            .field("token", &Redacted(&self.token))
            .field("task_grant_ids", &self.task_grant_ids)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use prost::{Message, Name};
    use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, Value};

    use super::*;
    use crate::DESCRIPTOR_POOL;

    const SECRET: &str = "pb-secret-token";

    /// A field whose value is a credential: every such field of the
    /// scheduler's messages has "token" in its name.
    fn is_secret(field: &FieldDescriptor) -> bool {
        field.name().contains("token")
    }

    /// One value of `kind`, distinct per field where the kind allows.
    fn sample(field: &FieldDescriptor) -> Value {
        match field.kind() {
            Kind::String if is_secret(field) => Value::String(SECRET.into()),
            Kind::String => Value::String(format!("shown-{}", field.name())),
            Kind::Bytes => Value::Bytes(b"shown".to_vec().into()),
            Kind::Bool => Value::Bool(true),
            Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(7),
            Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(7),
            Kind::Uint32 | Kind::Fixed32 => Value::U32(7),
            Kind::Uint64 | Kind::Fixed64 => Value::U64(7),
            Kind::Float => Value::F32(7.0),
            Kind::Double => Value::F64(7.0),
            Kind::Enum(values) => Value::EnumNumber(
                values
                    .values()
                    .map(|value| value.number())
                    .max()
                    .unwrap_or(0),
            ),
            Kind::Message(message) => Value::Message(DynamicMessage::new(message)),
        }
    }

    /// `T` with every field of its descriptor set (lists to one element),
    /// built from the descriptor so that a field added to the proto is set
    /// too, and its `Debug`.
    fn debug_of_full<T: Message + Name + Default + fmt::Debug>() -> (MessageDescriptor, String) {
        let descriptor = DESCRIPTOR_POOL
            .get_message_by_name(&T::full_name())
            .expect("a descriptor for every generated message");
        let mut message = DynamicMessage::new(descriptor.clone());
        for field in descriptor.fields() {
            assert!(
                !field.is_map(),
                "{}: maps are not sampled",
                field.full_name()
            );
            let value = match sample(&field) {
                one if field.is_list() => Value::List(vec![one]),
                one => one,
            };
            message.set_field(&field, value);
        }
        let typed = T::decode(message.encode_to_vec().as_slice()).expect("decodes");
        (descriptor, format!("{typed:?}"))
    }

    /// Every field of every message with a secret is printed, tokens
    /// redacted: a field added to the proto and not to the hand-written
    /// `Debug` above fails here by name.
    #[test]
    fn every_field_is_printed_and_every_token_redacted() {
        let checked = [
            debug_of_full::<HeartbeatRequest>(),
            debug_of_full::<HeartbeatResponse>(),
            debug_of_full::<GetConfigRequest>(),
            debug_of_full::<GetConfigResponse>(),
            debug_of_full::<WaitForStartingTaskRequest>(),
            debug_of_full::<KeepTaskAliveRequest>(),
            debug_of_full::<FreeTaskRequest>(),
        ];
        for (descriptor, shown) in &checked {
            assert!(!shown.contains(SECRET), "{shown}");
            for field in descriptor.fields() {
                assert!(
                    shown.contains(&format!("{}: ", field.name())),
                    "{} is missing from the Debug of {}: {shown}",
                    field.name(),
                    descriptor.full_name(),
                );
                if is_secret(&field) {
                    assert!(
                        shown.contains(&format!("{}: <redacted>", field.name())),
                        "{shown}"
                    );
                } else if field.kind() == Kind::String {
                    assert!(
                        shown.contains(&format!("shown-{}", field.name())),
                        "{shown}"
                    );
                }
            }
        }
    }

    /// The messages `build.rs` leaves without prost's `Debug` are exactly
    /// the scheduler's messages with a token field, and each is checked
    /// above: a new message with a token cannot print it.
    #[test]
    fn the_messages_with_a_token_are_the_ones_redacted() {
        let build = include_str!("../build.rs");
        let list = &build[build.find("const SECRET_MESSAGES").expect("the list")..];
        let list = &list[..list.find("];").expect("its end")];
        let mut skipped: Vec<&str> = list
            .split('"')
            .skip(1)
            .step_by(2)
            .map(|name| name.trim_start_matches('.'))
            .collect();
        skipped.sort_unstable();
        let mut with_token: Vec<String> = DESCRIPTOR_POOL
            .all_messages()
            .filter(|message| message.full_name().starts_with("yadcc."))
            .filter(|message| message.fields().any(|field| is_secret(&field)))
            .map(|message| message.full_name().to_owned())
            .collect();
        with_token.sort_unstable();
        assert_eq!(skipped, with_token);
        let mut covered = [
            HeartbeatRequest::full_name(),
            HeartbeatResponse::full_name(),
            GetConfigRequest::full_name(),
            GetConfigResponse::full_name(),
            WaitForStartingTaskRequest::full_name(),
            KeepTaskAliveRequest::full_name(),
            FreeTaskRequest::full_name(),
        ];
        covered.sort_unstable();
        assert_eq!(covered.to_vec(), with_token);
    }

    /// Every message with a token prints it redacted, its other fields as usual.
    #[test]
    fn messages_with_secrets_redact_them_in_debug() {
        let secret = "pb-secret-token";
        let shown = format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            HeartbeatRequest {
                token: secret.into(),
                location: "10.0.0.1:8335".into(),
                ..Default::default()
            },
            HeartbeatResponse {
                acceptable_tokens: vec![secret.into()],
                expired_tasks: vec![7],
            },
            GetConfigRequest {
                token: secret.into()
            },
            GetConfigResponse {
                serving_daemon_token: secret.into()
            },
            WaitForStartingTaskRequest {
                token: secret.into(),
                immediate_reqs: 3,
                ..Default::default()
            },
            KeepTaskAliveRequest {
                token: secret.into(),
                ..Default::default()
            },
            FreeTaskRequest {
                token: secret.into(),
                ..Default::default()
            },
        );
        assert!(!shown.contains(secret), "{shown}");
        assert_eq!(shown.matches("<redacted>").count(), 7, "{shown}");
        assert!(shown.contains("10.0.0.1:8335") && shown.contains("immediate_reqs: 3"));
        assert!(shown.contains("expired_tasks: [7]"));
    }
}
