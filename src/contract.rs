//! What the fields of a request must satisfy to be served, as data
//! ([`field_rules`]): the bounds of the engine's [`Limits`] and the fields the
//! engine requires, which the engine checks. `openapi` turns each into
//! `required`, `maximum`, `maxItems`, `maxLength` or `pattern`. The text forms
//! of values (a location, a header's integer) are [`crate::grammar`]'s.
//!
//! `tests/it/openapi_contract.rs` sends each bound and one past it to a real
//! server, so the table cannot drift from the checks; schemathesis
//! (`scripts/test.sh`) probes the rest.

use crate::engine::Limits;

/// What one field of a request must satisfy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// Present and not `null`.
    Required,
    /// A string matching [`crate::grammar::location_pattern`]: `a.b.c.d:port` or `[v6]:port`.
    Location,
    /// An integer of at most this value.
    AtMost(u64),
    /// A list of at most this many elements.
    MaxItems(usize),
    /// A string of at most this many characters.
    MaxLength(usize),
    /// A string on one line ([`crate::grammar::is_one_line`]).
    OneLine,
}

/// A rule on one field: `path` leads from `message` (full proto name) to the
/// field through proto field names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRule {
    pub message: &'static str,
    pub path: &'static [&'static str],
    pub rule: Rule,
}

const HEARTBEAT: &str = "yadcc.scheduler.HeartbeatRequest";
const WAIT: &str = "yadcc.scheduler.WaitForStartingTaskRequest";
const KEEP_ALIVE: &str = "yadcc.scheduler.KeepTaskAliveRequest";
const FREE: &str = "yadcc.scheduler.FreeTaskRequest";
const CORDON: &str = "yadcc.scheduler.CordonServantRequest";
const UNCORDON: &str = "yadcc.scheduler.UncordonServantRequest";
const DRAIN: &str = "yadcc.scheduler.DrainServantRequest";

/// Every field rule the server enforces, with the bounds of `limits`.
pub fn field_rules(limits: &Limits) -> Vec<FieldRule> {
    let millis =
        |duration: std::time::Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    let rule = |message, path, rule| FieldRule {
        message,
        path,
        rule,
    };
    vec![
        rule(HEARTBEAT, &["location"], Rule::Required),
        rule(HEARTBEAT, &["location"], Rule::Location),
        rule(
            HEARTBEAT,
            &["next_heartbeat_in_ms"],
            Rule::AtMost(millis(limits.max_next_heartbeat)),
        ),
        rule(
            HEARTBEAT,
            &["env_descs"],
            Rule::MaxItems(limits.max_environments_per_servant),
        ),
        rule(
            HEARTBEAT,
            &["running_tasks"],
            Rule::MaxItems(limits.max_running_tasks_per_servant),
        ),
        rule(
            HEARTBEAT,
            &["env_descs", "compiler_digest"],
            Rule::MaxLength(limits.max_digest_chars),
        ),
        rule(
            HEARTBEAT,
            &["running_tasks", "task_digest"],
            Rule::MaxLength(limits.max_digest_chars),
        ),
        // An empty or missing digest is no argument error: it names an
        // environment nobody offers (`STATUS_ENVIRONMENT_NOT_AVAILABLE`, or
        // `STATUS_NO_QUOTA_AVAILABLE` for a prefetch-only call), and a call
        // asking for no grant gets none (`STATUS_NO_QUOTA_AVAILABLE`), as
        // the original answers them.
        rule(
            WAIT,
            &["env_desc", "compiler_digest"],
            Rule::MaxLength(limits.max_digest_chars),
        ),
        rule(
            WAIT,
            &["milliseconds_to_wait"],
            Rule::AtMost(millis(limits.max_wait)),
        ),
        rule(
            WAIT,
            &["next_keep_alive_in_ms"],
            Rule::AtMost(millis(limits.max_keep_alive)),
        ),
        rule(
            KEEP_ALIVE,
            &["next_keep_alive_in_ms"],
            Rule::AtMost(millis(limits.max_keep_alive)),
        ),
        rule(
            KEEP_ALIVE,
            &["task_grant_ids"],
            Rule::MaxItems(limits.max_ids_per_request),
        ),
        rule(
            FREE,
            &["task_grant_ids"],
            Rule::MaxItems(limits.max_ids_per_request),
        ),
        // The operators name a servant as it reports itself.
        rule(CORDON, &["location"], Rule::Required),
        rule(CORDON, &["location"], Rule::Location),
        rule(
            CORDON,
            &["reason"],
            Rule::MaxLength(limits.max_cordon_reason_chars),
        ),
        rule(CORDON, &["reason"], Rule::OneLine),
        rule(UNCORDON, &["location"], Rule::Required),
        rule(UNCORDON, &["location"], Rule::Location),
        rule(DRAIN, &["location"], Rule::Required),
        rule(DRAIN, &["location"], Rule::Location),
        rule(
            DRAIN,
            &["reason"],
            Rule::MaxLength(limits.max_cordon_reason_chars),
        ),
        rule(DRAIN, &["reason"], Rule::OneLine),
    ]
}

/// The rules on fields of `message` whose path starts with `prefix`.
pub fn rules_under<'a>(
    rules: &'a [FieldRule],
    message: &'a str,
    prefix: &'a [&'a str],
) -> impl Iterator<Item = &'a FieldRule> + 'a {
    rules
        .iter()
        .filter(move |rule| rule.message == message && rule.path.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_names_a_real_field() {
        let pool = &*crate::pb::DESCRIPTOR_POOL;
        for rule in field_rules(&Limits::default()) {
            let mut message = pool.get_message_by_name(rule.message).expect(rule.message);
            for (index, name) in rule.path.iter().enumerate() {
                let field = message
                    .get_field_by_name(name)
                    .unwrap_or_else(|| panic!("{rule:?}: no field {name}"));
                if index + 1 < rule.path.len() {
                    let prost_reflect::Kind::Message(inner) = field.kind() else {
                        panic!("{rule:?}: {name} is not a message");
                    };
                    message = inner;
                }
            }
        }
    }
}
