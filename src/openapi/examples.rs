//! Example values, so that Swagger UI's "Try it out" works against
//! `--demo` and the tests can build a valid request of every RPC from the
//! document alone.

use prost_reflect::{FieldDescriptor, Kind};
use serde_json::{Value, json};

use crate::sim;

const HEARTBEAT_REQUEST: &str = "yadcc.scheduler.HeartbeatRequest";

/// Example values shown by Swagger UI and used by the tests' example requests,
/// by full proto field name (tokens and compiler digests are the demo's, from
/// `field_example`). A test checks that every name is a real field.
pub const FIELD_EXAMPLES: &[(&str, &str)] = &[
    ("yadcc.scheduler.RunningTask.servant_task_id", r#""42""#),
    ("yadcc.scheduler.RunningTask.task_grant_id", r#""7""#),
    (
        "yadcc.scheduler.RunningTask.servant_location",
        r#""192.0.2.10:8335""#,
    ),
    (
        "yadcc.scheduler.RunningTask.task_digest",
        r#""d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35""#,
    ),
    (
        "yadcc.scheduler.HeartbeatRequest.next_heartbeat_in_ms",
        "10000",
    ),
    ("yadcc.scheduler.HeartbeatRequest.version", "1"),
    (
        "yadcc.scheduler.HeartbeatRequest.location",
        r#""192.0.2.10:8335""#,
    ),
    ("yadcc.scheduler.HeartbeatRequest.num_processors", "16"),
    ("yadcc.scheduler.HeartbeatRequest.current_load", "2"),
    (
        "yadcc.scheduler.HeartbeatRequest.not_accepting_task_reason",
        "0",
    ),
    ("yadcc.scheduler.HeartbeatRequest.capacity", "12"),
    (
        "yadcc.scheduler.HeartbeatRequest.total_memory_in_bytes",
        r#""68719476736""#,
    ),
    (
        "yadcc.scheduler.HeartbeatRequest.memory_available_in_bytes",
        r#""34359738368""#,
    ),
    (
        "yadcc.scheduler.HeartbeatResponse.acceptable_tokens",
        r#"["3f1c9a4be07d4c55a1e2b6f08d9c7e21"]"#,
    ),
    (
        "yadcc.scheduler.HeartbeatResponse.expired_tasks",
        r#"["7"]"#,
    ),
    (
        "yadcc.scheduler.GetConfigResponse.serving_daemon_token",
        r#""3f1c9a4be07d4c55a1e2b6f08d9c7e21""#,
    ),
    ("yadcc.scheduler.StartingTaskGrant.task_grant_id", r#""7""#),
    (
        "yadcc.scheduler.StartingTaskGrant.servant_location",
        r#""192.0.2.10:8335""#,
    ),
    (
        "yadcc.scheduler.WaitForStartingTaskRequest.milliseconds_to_wait",
        "1000",
    ),
    (
        "yadcc.scheduler.WaitForStartingTaskRequest.immediate_reqs",
        "1",
    ),
    (
        "yadcc.scheduler.WaitForStartingTaskRequest.prefetch_reqs",
        "0",
    ),
    (
        "yadcc.scheduler.WaitForStartingTaskRequest.next_keep_alive_in_ms",
        "15000",
    ),
    (
        "yadcc.scheduler.WaitForStartingTaskRequest.min_version",
        "1",
    ),
    (
        "yadcc.scheduler.KeepTaskAliveRequest.task_grant_ids",
        r#"["7"]"#,
    ),
    (
        "yadcc.scheduler.KeepTaskAliveRequest.next_keep_alive_in_ms",
        "10000",
    ),
    ("yadcc.scheduler.KeepTaskAliveResponse.statuses", "[true]"),
    ("yadcc.scheduler.FreeTaskRequest.task_grant_ids", r#"["7"]"#),
    (
        "yadcc.scheduler.CordonServantRequest.location",
        r#""192.0.2.10:8335""#,
    ),
    (
        "yadcc.scheduler.CordonServantRequest.reason",
        r#""compiler broken after an upgrade""#,
    ),
    (
        "yadcc.scheduler.UncordonServantRequest.location",
        r#""192.0.2.10:8335""#,
    ),
    (
        "yadcc.scheduler.DrainServantRequest.location",
        r#""192.0.2.10:8335""#,
    ),
    (
        "yadcc.scheduler.DrainServantRequest.reason",
        r#""disk replacement on Monday""#,
    ),
    (
        "yadcc.scheduler.ServantState.location",
        r#""192.0.2.10:8335""#,
    ),
    (
        "yadcc.scheduler.ServantState.who",
        r#""token:1ec1c26b50d5""#,
    ),
    (
        "yadcc.scheduler.ServantState.since_unix_ms",
        r#""1767225600000""#,
    ),
    ("yadcc.scheduler.AuditEvent.who", r#""token:1ec1c26b50d5""#),
    ("yadcc.scheduler.AuditEvent.action", r#""DrainServant""#),
    ("yadcc.scheduler.AuditEvent.peer", r#""192.0.2.99""#),
    ("yadcc.scheduler.AuditEvent.protocol", r#""connect""#),
];

/// The example of a field: the demo's tokens and first compiler for those
/// fields, so that "Try it out" works against `--demo`, else [`FIELD_EXAMPLES`].
pub(super) fn field_example(field: &FieldDescriptor) -> Option<Value> {
    let full_name = field.full_name();
    if field.name() == "token" && field.kind() == Kind::String {
        return Some(json!(if full_name.starts_with(HEARTBEAT_REQUEST) {
            sim::DEMO_SERVANT_TOKEN
        } else {
            sim::DEMO_USER_TOKEN
        }));
    }
    if full_name == "yadcc.EnvironmentDesc.compiler_digest" {
        return Some(json!(sim::environment_digest(0)));
    }
    FIELD_EXAMPLES
        .iter()
        .find(|(name, _)| *name == full_name)
        .map(|(name, example)| {
            serde_json::from_str(example)
                .unwrap_or_else(|error| panic!("example of {name} is not JSON: {error}"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{openapi::document, pb};

    #[test]
    fn every_example_names_a_real_field() {
        for (name, example) in FIELD_EXAMPLES {
            let (message, field) = name.rsplit_once('.').unwrap();
            let message = pb::DESCRIPTOR_POOL
                .get_message_by_name(message)
                .unwrap_or_else(|| panic!("{name}: no message"));
            let field = message
                .get_field_by_name(field)
                .unwrap_or_else(|| panic!("{name}: no field"));
            let value: Value = serde_json::from_str(example).unwrap();
            assert_eq!(value.is_array(), field.is_list(), "{name}");
        }
    }

    #[test]
    fn examples_are_the_demos() {
        let json = document();
        let schemas = &json["components"]["schemas"];
        let example = |message: &str, field: &str| {
            schemas[message]["properties"][field]["examples"][0].clone()
        };
        assert_eq!(
            example("yadcc.scheduler.HeartbeatRequest", "token"),
            sim::DEMO_SERVANT_TOKEN
        );
        assert_eq!(
            example("yadcc.scheduler.GetConfigRequest", "token"),
            sim::DEMO_USER_TOKEN
        );
        assert_eq!(
            example("yadcc.EnvironmentDesc", "compilerDigest"),
            json!(sim::environment_digest(0))
        );
    }
}
