//! The check of the task lists the scheduler sends: every distinct
//! `GetRunningTasks` answer is inflated and decoded whole once; an answer
//! equal to the last one checked (the scheduler sends every caller the same
//! list for a while) is compared byte for byte instead. So a simulated
//! machine pays for a list what a daemon pays to receive it, not a decoding
//! each: decoding every copy made the simulator's cost grow with the square
//! of the cluster.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prost::Message;

use super::{
    client::{CallError, Reply, lock},
    wire::Compression,
};
use yadcc_pb as pb;

/// One task list checked: what it came as, and what it held.
#[derive(Debug)]
struct CheckedList {
    message: Bytes,
    compression: Compression,
    message_bytes: usize,
    tasks: usize,
}

/// What one `GetRunningTasks` answer held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListFigures {
    /// The list's bytes inflated.
    pub(crate) message_bytes: usize,
    pub(crate) tasks: usize,
}

/// The last task list checked.
#[derive(Debug, Default)]
pub(crate) struct TaskLists {
    last: Mutex<Option<Arc<CheckedList>>>,
}

impl TaskLists {
    pub(crate) fn check(&self, reply: &Reply) -> Result<ListFigures, CallError> {
        let last = lock(&self.last).clone();
        if let Some(last) = last
            && last.compression == reply.compression
            && last.message == reply.message
        {
            return Ok(ListFigures {
                message_bytes: last.message_bytes,
                tasks: last.tasks,
            });
        }
        let inflated = reply.inflated()?;
        let list = pb::GetRunningTasksResponse::decode(inflated.as_ref())
            .map_err(|error| CallError::Decode(error.to_string()))?;
        let checked = CheckedList {
            // A copy, so the reader's buffer is not held.
            message: Bytes::copy_from_slice(&reply.message),
            compression: reply.compression,
            message_bytes: inflated.len(),
            tasks: list.running_tasks.len(),
        };
        let figures = ListFigures {
            message_bytes: checked.message_bytes,
            tasks: checked.tasks,
        };
        *lock(&self.last) = Some(Arc::new(checked));
        Ok(figures)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn reply(message: &[u8], compression: Compression) -> Reply {
        Reply {
            message: Bytes::copy_from_slice(message),
            compression,
            answer_bytes: message.len() + 24,
            latency: Duration::ZERO,
        }
    }

    /// A list is decoded when it differs from the last one checked; a broken
    /// one is an error even right after a good one of the same length.
    #[test]
    fn task_lists_are_checked_once_per_distinct_answer() {
        let list = |digest: &str| {
            pb::GetRunningTasksResponse {
                running_tasks: vec![pb::RunningTask {
                    servant_task_id: 1,
                    task_grant_id: 0,
                    servant_location: "127.1.0.1:8335".into(),
                    task_digest: digest.into(),
                }],
            }
            .encode_to_vec()
        };
        let lists = TaskLists::default();
        let first = list("aa");
        let figures = lists.check(&reply(&first, Compression::None)).unwrap();
        assert_eq!((figures.tasks, figures.message_bytes), (1, first.len()));
        let zstd = Compression::Zstd.compress(&first);
        let figures = lists.check(&reply(&zstd, Compression::Zstd)).unwrap();
        assert_eq!((figures.tasks, figures.message_bytes), (1, first.len()));
        let mut broken = first.clone();
        // The length of the only task becomes longer than the message.
        broken[1] += 1;
        assert!(lists.check(&reply(&broken, Compression::None)).is_err());
        assert!(lists.check(&reply(&first, Compression::None)).is_ok());
        let empty = lists.check(&reply(&[], Compression::None)).unwrap();
        assert_eq!(empty.tasks, 0);
    }
}
