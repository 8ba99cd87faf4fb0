//! `Debug` for the protobuf messages that carry a secret (`build.rs` skips
//! prost's derive for them): every field as usual, tokens as the engine's
//! [`Redacted`]. Here rather than in `pb`, which stays free of the engine: the
//! service layer is where protobuf and engine types meet.

use std::fmt;

use crate::{
    engine::Redacted,
    pb::{
        FreeTaskRequest, GetConfigRequest, GetConfigResponse, HeartbeatRequest, HeartbeatResponse,
        KeepTaskAliveRequest, WaitForStartingTaskRequest,
    },
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
    use super::*;

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
