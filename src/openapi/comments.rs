//! The proto's comments, which every description starts from, and the
//! Markdown the descriptions are written in.

use prost_types::FileDescriptorProto;

/// The leading comment of the element at `path` (detached comments, such as
/// banners between RPCs, are not documentation).
pub(super) fn comment(file: &FileDescriptorProto, path: &[i32]) -> Option<String> {
    comment_at(file, path, false)
}

/// The leading comment of a field or enum value, else its trailing one
/// (`uint32 capacity = 3;  // ...`). Only for these: the trailing comment of
/// a message or service is whatever follows its opening brace.
pub(super) fn member_comment(file: &FileDescriptorProto, path: &[i32]) -> Option<String> {
    comment_at(file, path, true)
}

fn comment_at(file: &FileDescriptorProto, path: &[i32], trailing: bool) -> Option<String> {
    let location = file
        .source_code_info
        .as_ref()?
        .location
        .iter()
        .find(|location| location.path == path)?;
    let raw = location.leading_comments.as_deref().or(if trailing {
        location.trailing_comments.as_deref()
    } else {
        None
    })?;
    let text = raw
        .lines()
        .map(|line| line.strip_prefix(' ').unwrap_or(line).trim_end())
        .collect::<Vec<_>>()
        .join("\n");
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// The first sentence of a comment, on one line.
pub(super) fn first_sentence(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.find(". ") {
        Some(end) => flat[..=end].to_owned(),
        None => flat,
    }
}

pub(super) fn push_paragraph(text: &mut String, paragraph: impl AsRef<str>) {
    if !text.is_empty() {
        text.push_str("\n\n");
    }
    text.push_str(paragraph.as_ref());
}

pub(super) fn table_cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use crate::openapi::document;

    #[test]
    fn comments_become_descriptions() {
        let json = document();
        let heartbeat = &json["paths"]["/rpc/yadcc.scheduler.SchedulerService.Heartbeat"]["post"];
        assert_eq!(
            heartbeat["summary"],
            "Called periodically by daemons to report their states."
        );
        let field = &json["components"]["schemas"]["yadcc.scheduler.HeartbeatRequest"]["properties"]
            ["nextHeartbeatInMs"];
        let description = field["description"].as_str().unwrap();
        assert!(
            description.starts_with("Expected time of next heartbeat."),
            "{description}"
        );
        assert!(
            description.contains("`uint32 next_heartbeat_in_ms = 7`"),
            "{description}"
        );
        let priority =
            json["components"]["schemas"]["yadcc.scheduler.ServantPriority"]["description"]
                .as_str()
                .unwrap();
        assert!(
            priority.contains("| `SERVANT_PRIORITY_DEDICATED` | 1 | Dedicated servant."),
            "{priority}"
        );
    }
}
