//! Generated protobuf types (prost), their proto3-JSON mapping (pbjson) and the
//! descriptor pool the OpenAPI document and the RPC list are built from. The
//! only place where lints relax: generated code is not ours to style.

#![allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]

use std::sync::LazyLock;

use prost_reflect::DescriptorPool;

/// Package `yadcc` (`env_desc.proto`).
pub mod yadcc {
    include!(concat!(env!("OUT_DIR"), "/yadcc.rs"));
    include!(concat!(env!("OUT_DIR"), "/yadcc.serde.rs"));

    /// Package `yadcc.scheduler` (`scheduler.proto`).
    pub mod scheduler {
        include!(concat!(env!("OUT_DIR"), "/yadcc.scheduler.rs"));
        include!(concat!(env!("OUT_DIR"), "/yadcc.scheduler.serde.rs"));
    }
}

/// Package `flare.rpc`: the frame metadata of the daemons' binary protocol
/// (`rpc_meta.proto`, proto2: `required` fields are always encoded).
pub mod flare {
    pub mod rpc {
        include!(concat!(env!("OUT_DIR"), "/flare.rpc.rs"));
    }
}

pub use yadcc::EnvironmentDesc;
pub use yadcc::scheduler::*;

/// Encoded `FileDescriptorSet` of every proto file, comments included.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/descriptor_set.bin"));

/// Full name of the one service this server implements.
pub const SCHEDULER_SERVICE: &str = "yadcc.scheduler.SchedulerService";

/// Decoded descriptors, shared by everything that reflects on the API.
pub static DESCRIPTOR_POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(FILE_DESCRIPTOR_SET)
        .expect("descriptor set produced by build.rs must decode")
});

/// `Debug` for the messages that carry a secret (`build.rs` skips prost's):
/// every field as usual, tokens as [`Redacted`](crate::engine::Redacted).
mod redacted_debug {
    use std::fmt;

    use super::*;
    use crate::engine::Redacted;

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
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::flare::rpc::{MethodType, RpcMeta, RpcResponseMeta};

    /// Every message with a token prints it redacted, its other fields as usual.
    #[test]
    fn messages_with_secrets_redact_them_in_debug() {
        let secret = "pb-secret-token";
        let shown = format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            super::HeartbeatRequest {
                token: secret.into(),
                location: "10.0.0.1:8335".into(),
                ..Default::default()
            },
            super::HeartbeatResponse {
                acceptable_tokens: vec![secret.into()],
                expired_tasks: vec![7],
            },
            super::GetConfigRequest {
                token: secret.into()
            },
            super::GetConfigResponse {
                serving_daemon_token: secret.into()
            },
            super::WaitForStartingTaskRequest {
                token: secret.into(),
                immediate_reqs: 3,
                ..Default::default()
            },
            super::KeepTaskAliveRequest {
                token: secret.into(),
                ..Default::default()
            },
            super::FreeTaskRequest {
                token: secret.into(),
                ..Default::default()
            },
        );
        assert!(!shown.contains(secret), "{shown}");
        assert_eq!(shown.matches("<redacted>").count(), 7, "{shown}");
        assert!(shown.contains("10.0.0.1:8335") && shown.contains("immediate_reqs: 3"));
        assert!(shown.contains("expired_tasks: [7]"));
    }

    /// The daemons' decoder closes the connection when a proto2 `required`
    /// field is missing, so a zero status must still be on the wire
    /// (`32 02 08 00`, the smallest success of `flare-wire.md`).
    #[test]
    fn required_meta_fields_are_encoded_even_when_zero() {
        let meta = RpcMeta {
            correlation_id: 1,
            method_type: MethodType::Single as i32,
            response_meta: Some(RpcResponseMeta {
                status: 0,
                ..RpcResponseMeta::default()
            }),
            ..RpcMeta::default()
        };
        assert_eq!(
            meta.encode_to_vec(),
            [0x08, 0x01, 0x32, 0x02, 0x08, 0x00, 0x38, 0x01]
        );
    }
}
