//! The two text formats `/metrics` speaks, and which one a scraper gets.
//!
//! The registry writes OpenMetrics 1.0. Prometheus' classic text format
//! (0.0.4), which promtool, older Prometheus servers and most ad-hoc
//! scrapers read, differs from it in a few rules only, so the classic answer
//! is the OpenMetrics text rewritten line by line ([`to_prometheus_text`]):
//! a counter's `# HELP`/`# TYPE` name its `_total` series, an info metric is
//! a gauge named `_info`, `unknown` is `untyped`, and `# UNIT`, `# EOF` and
//! exemplars are dropped.

use axum::http::HeaderValue;

/// `Content-Type` of an OpenMetrics answer.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of a classic Prometheus text answer.
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/openmetrics-text`, version 1.0.0.
    OpenMetrics,
    /// `text/plain; version=0.0.4`.
    PrometheusText,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::PrometheusText => PROMETHEUS_TEXT_CONTENT_TYPE,
        }
    }

    /// The format for a request's `Accept`: OpenMetrics when it names
    /// `application/openmetrics-text` and ranks it at least as high as
    /// anything that matches `text/plain`, as Prometheus does; otherwise
    /// (`text/plain`, `*/*`, no header, an unreadable one) the classic text.
    pub fn negotiate(accept: Option<&HeaderValue>) -> Format {
        let Some(accept) = accept.and_then(|value| value.to_str().ok()) else {
            return Format::PrometheusText;
        };
        let mut openmetrics = 0.0_f32;
        let mut text = 0.0_f32;
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let quality = parts
                .filter_map(|parameter| parameter.split_once('='))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("q"))
                .map_or(Some(1.0), |(_, value)| value.trim().parse::<f32>().ok())
                .filter(|q| (0.0..=1.0).contains(q))
                .unwrap_or(0.0);
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
                "text/plain" | "text/*" | "*/*" => text = text.max(quality),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics >= text {
            Format::OpenMetrics
        } else {
            Format::PrometheusText
        }
    }
}

/// The classic Prometheus text (0.0.4) of an OpenMetrics exposition.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP waits for its TYPE, which says what the classic name is.
    let mut pending_help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            pending_help = Some((name, help));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let (suffix, kind) = match kind {
                "counter" => ("_total", "counter"),
                "info" => ("_info", "gauge"),
                "unknown" => ("", "untyped"),
                other => ("", other),
            };
            if let Some((help_name, help)) = pending_help.take()
                && help_name == name
            {
                out.push_str(&format!("# HELP {name}{suffix} {help}\n"));
            }
            out.push_str(&format!("# TYPE {name}{suffix} {kind}\n"));
        } else if line.starts_with('#') {
            // `# UNIT`, `# EOF`: OpenMetrics only.
        } else if !line.is_empty() {
            out.push_str(without_exemplar(line));
            out.push('\n');
        }
    }
    out
}

/// A sample line without its exemplar (` # {...} value`), which the classic
/// format lacks. Label values may hold `#`, so the search starts after the
/// label set.
fn without_exemplar(line: &str) -> &str {
    let mut in_quotes = false;
    let mut escaped = false;
    let mut labels_end = 0;
    for (at, ch) in line.char_indices() {
        match ch {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => {
                labels_end = at;
                break;
            }
            ' ' if !in_quotes && !line[..at].contains('{') => {
                labels_end = at;
                break;
            }
            _ => {}
        }
    }
    match line[labels_end..].find(" # ") {
        Some(at) => &line[..labels_end + at],
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn negotiate(accept: &str) -> Format {
        Format::negotiate(Some(&HeaderValue::from_str(accept).unwrap()))
    }

    #[test]
    fn openmetrics_only_when_asked_for_and_preferred() {
        assert_eq!(Format::negotiate(None), Format::PrometheusText);
        assert_eq!(negotiate("*/*"), Format::PrometheusText);
        assert_eq!(negotiate("text/plain"), Format::PrometheusText);
        assert_eq!(
            negotiate("text/plain;version=0.0.4;q=1,*/*;q=0.1"),
            Format::PrometheusText
        );
        // What Prometheus 2.x sends.
        assert_eq!(
            negotiate(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            ),
            Format::OpenMetrics
        );
        assert_eq!(
            negotiate("application/openmetrics-text"),
            Format::OpenMetrics
        );
        assert_eq!(
            negotiate("Application/OpenMetrics-Text; version=1.0.0"),
            Format::OpenMetrics
        );
        assert_eq!(
            negotiate("application/openmetrics-text;q=0.5, text/plain"),
            Format::PrometheusText,
            "ranked below the classic text"
        );
        assert_eq!(
            negotiate("application/openmetrics-text;q=0"),
            Format::PrometheusText,
            "q=0 refuses it"
        );
        assert_eq!(
            negotiate("application/openmetrics-text;q=bogus"),
            Format::PrometheusText
        );
    }

    #[test]
    fn the_classic_text_names_every_series_its_help_and_type_describe() {
        let openmetrics = "\
# HELP app_calls Calls.
# TYPE app_calls counter
app_calls_total{method=\"a # {b}\"} 3 # {trace=\"x\"} 1.0
# HELP app_build Build.
# TYPE app_build info
app_build_info{version=\"1\"} 1
# HELP app_size Size.
# TYPE app_size gauge
# UNIT app_size bytes
app_size 7
# HELP app_other Other.
# TYPE app_other unknown
app_other 1
# HELP app_latency Latency.
# TYPE app_latency histogram
app_latency_bucket{le=\"+Inf\"} 2
app_latency_sum 0.5
app_latency_count 2
# EOF
";
        assert_eq!(
            to_prometheus_text(openmetrics),
            "\
# HELP app_calls_total Calls.
# TYPE app_calls_total counter
app_calls_total{method=\"a # {b}\"} 3
# HELP app_build_info Build.
# TYPE app_build_info gauge
app_build_info{version=\"1\"} 1
# HELP app_size Size.
# TYPE app_size gauge
app_size 7
# HELP app_other Other.
# TYPE app_other untyped
app_other 1
# HELP app_latency Latency.
# TYPE app_latency histogram
app_latency_bucket{le=\"+Inf\"} 2
app_latency_sum 0.5
app_latency_count 2
"
        );
    }

    #[test]
    fn exemplars_go_also_from_series_without_labels() {
        assert_eq!(without_exemplar("a_total 1 # {t=\"1\"} 2"), "a_total 1");
        assert_eq!(without_exemplar("a_total 1"), "a_total 1");
        assert_eq!(
            without_exemplar("a_total{x=\"\\\"}# \"} 1"),
            "a_total{x=\"\\\"}# \"} 1"
        );
    }
}
