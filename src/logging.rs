//! Logs an operator can keep: which calls the access log writes
//! ([`AccessLog`], `--access_log`), and a limit of one line per second per
//! kind ([`RateLimit`]) on what a client can make the server write: access
//! lines of failed and slow calls, and every warning ([`LimitedWarnings`]).
//! A line written after others of its kind were left out says how many. A
//! leaf: the call core and the HTTP access log decide with it, `main`
//! installs the warnings' limit.

use std::{collections::HashMap, fmt, hash::Hash, sync::Mutex, time::Duration};

use tokio::time::Instant;
use tracing::{Event, Level, Subscriber, callsite};
use tracing_subscriber::{
    fmt::{FmtContext, FormatEvent, FormatFields, format::Writer},
    registry::LookupSpan,
};

/// Which calls get a line in the access log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum AccessLog {
    /// Every call and request.
    All,
    /// Failed and slow ones only, at most one line per second per kind.
    #[default]
    Errors,
    /// None.
    Off,
}

/// A call or request that takes longer than this is slow, and logged as a
/// failure is. `WaitForStartingTask` is never slow: waiting is what it does.
pub const SLOW_CALL: Duration = Duration::from_secs(1);

/// How often a line of one kind may be written.
pub const LINE_PERIOD: Duration = Duration::from_secs(1);

/// Lines of at most [`MAX_KINDS`] kinds are tracked; beyond, every new kind
/// waits for the next clean-up.
const MAX_KINDS: usize = 4096;

/// One line per [`LINE_PERIOD`] per kind.
#[derive(Debug)]
pub struct RateLimit<K> {
    kinds: Mutex<HashMap<K, Period>>,
}

#[derive(Debug, Clone, Copy)]
struct Period {
    started: Instant,
    left_out: u64,
}

impl<K> Default for RateLimit<K> {
    fn default() -> Self {
        Self {
            kinds: Mutex::default(),
        }
    }
}

impl<K: Hash + Eq> RateLimit<K> {
    /// Whether a line of `kind` may be written now: Some with the number of
    /// lines of that kind left out since the last one written, or None
    /// (this one is left out and counted).
    pub fn admit(&self, kind: K) -> Option<u64> {
        let now = Instant::now();
        let mut kinds = self
            .kinds
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if kinds.len() >= MAX_KINDS && !kinds.contains_key(&kind) {
            kinds.retain(|_, period| now.duration_since(period.started) < LINE_PERIOD);
            if kinds.len() >= MAX_KINDS {
                return None;
            }
        }
        match kinds.get_mut(&kind) {
            Some(period) if now.duration_since(period.started) < LINE_PERIOD => {
                period.left_out += 1;
                None
            }
            Some(period) => {
                let left_out = period.left_out;
                *period = Period {
                    started: now,
                    left_out: 0,
                };
                Some(left_out)
            }
            None => {
                kinds.insert(
                    kind,
                    Period {
                        started: now,
                        left_out: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

/// The log's format with warnings and errors limited: at most one line per
/// second from each place in the code that writes one, the next line after
/// some were left out saying how many (`left_out`). Every other level goes
/// through as is.
#[derive(Debug)]
pub struct LimitedWarnings<F> {
    inner: F,
    limit: RateLimit<callsite::Identifier>,
}

impl<F> LimitedWarnings<F> {
    pub fn new(inner: F) -> Self {
        Self {
            inner,
            limit: RateLimit::default(),
        }
    }
}

impl<S, N, F> FormatEvent<S, N> for LimitedWarnings<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = *event.metadata().level();
        if level > Level::WARN {
            return self.inner.format_event(ctx, writer, event);
        }
        match self.limit.admit(event.metadata().callsite()) {
            // Left out: nothing is written.
            None => Ok(()),
            Some(0) => self.inner.format_event(ctx, writer, event),
            Some(left_out) => {
                let mut line = String::new();
                self.inner
                    .format_event(ctx, Writer::new(&mut line), event)?;
                writeln!(
                    writer,
                    "{}",
                    with_left_out(line.trim_end_matches('\n'), left_out)
                )
            }
        }
    }
}

/// A formatted line with the count of the lines of its kind left out: a
/// key of its own in a JSON object (`--log_format=json`), else a last field.
fn with_left_out(line: &str, left_out: u64) -> String {
    match line.strip_suffix('}') {
        Some(object) if line.starts_with('{') => format!("{object},\"left_out\":{left_out}}}"),
        _ => format!("{line} left_out={left_out}"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_second_per_kind_then_the_count_of_those_left_out() {
        let limit = RateLimit::default();
        assert_eq!(limit.admit("reset"), Some(0));
        assert_eq!(limit.admit("reset"), None);
        assert_eq!(limit.admit("reset"), None);
        assert_eq!(limit.admit("accept"), Some(0), "kinds are apart");
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(limit.admit("reset"), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(limit.admit("reset"), Some(3));
        assert_eq!(limit.admit("reset"), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(limit.admit("reset"), Some(1));
        assert_eq!(limit.admit("accept"), Some(0));
    }

    #[tokio::test(start_paused = true)]
    async fn the_kinds_tracked_are_bounded() {
        let limit = RateLimit::default();
        for kind in 0..MAX_KINDS {
            assert_eq!(limit.admit(kind), Some(0));
        }
        assert_eq!(limit.admit(MAX_KINDS), None, "no room for a new kind");
        tokio::time::advance(LINE_PERIOD).await;
        assert_eq!(
            limit.admit(MAX_KINDS),
            Some(0),
            "the old ones are cleaned up"
        );
    }

    #[test]
    fn the_count_is_a_field_of_a_text_line_and_a_key_of_a_json_one() {
        assert_eq!(
            with_left_out("WARN x: reset", 3),
            "WARN x: reset left_out=3"
        );
        let json = with_left_out(r#"{"level":"WARN","fields":{"message":"reset"}}"#, 3);
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["left_out"], 3);
        assert_eq!(parsed["fields"]["message"], "reset");
    }

    /// What the log writes, line by line.
    #[derive(Debug, Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_warnings_is_one_line_a_second_with_a_count() {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .with_ansi(false)
            .event_format(LimitedWarnings::new(
                tracing_subscriber::fmt::format().without_time(),
            ))
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        let flood = |count| {
            for index in 0..count {
                tracing::warn!("connection reset {index}");
                tracing::info!("call {index}");
            }
        };
        flood(600);
        tokio::time::advance(LINE_PERIOD).await;
        flood(2);
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let warnings: Vec<&str> = log
            .lines()
            .filter(|line| line.contains("WARN"))
            .map(str::trim)
            .collect();
        assert_eq!(
            warnings,
            [
                "WARN yadcc_scheduler::logging::tests: connection reset 0",
                "WARN yadcc_scheduler::logging::tests: connection reset 0 left_out=599"
            ]
        );
        assert_eq!(
            log.lines().filter(|line| line.contains("INFO")).count(),
            602,
            "other levels are not limited"
        );
    }
}
