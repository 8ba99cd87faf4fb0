//! The Grafana dashboard (`scripts/grafana/yadcc-scheduler.json`): importable
//! as it is (its data source is a variable, every panel uses it), and every
//! series its queries name is one `/metrics` serves.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::support::*;

const DASHBOARD: &str = include_str!("../../scripts/grafana/yadcc-scheduler.json");

/// PromQL words that are not series names.
const PROMQL_WORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
];

/// Every PromQL query in the dashboard: panel targets and variable queries.
fn queries(dashboard: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        if let Some(nested) = panel["panels"].as_array() {
            panels.extend(nested);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            found.push(target["expr"].as_str().expect("a PromQL target").to_owned());
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] == "query" {
            found.push(variable["query"]["query"].as_str().unwrap().to_owned());
        }
    }
    found
}

/// Removes every span from `open` to its matching `close`.
fn without_spans(text: &str, open: char, close: char) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for ch in text.chars() {
        if ch == open {
            depth += 1;
        } else if ch == close && depth > 0 {
            depth -= 1;
        } else if depth == 0 {
            out.push(ch);
        }
    }
    out
}

/// The series names a query reads: identifiers that are not functions,
/// keywords, label names (in `{...}`, `by (...)`, `without (...)`) or
/// strings and ranges.
fn series_names(query: &str) -> BTreeSet<String> {
    let mut text = without_spans(query, '{', '}');
    text = without_spans(&text, '[', ']');
    // Quoted strings (in label_values and label matchers) are gone with the
    // braces; grouping clauses name labels.
    for clause in ["by", "without", "on", "ignoring"] {
        let mut rest = String::new();
        let mut remaining = text.as_str();
        while let Some(at) = find_word(remaining, clause) {
            rest.push_str(&remaining[..at]);
            let after = remaining[at + clause.len()..].trim_start();
            remaining = match after.strip_prefix('(') {
                Some(inner) => &inner[inner.find(')').map_or(inner.len(), |end| end + 1)..],
                None => after,
            };
        }
        rest.push_str(remaining);
        text = rest;
    }
    let mut names = BTreeSet::new();
    let chars: Vec<char> = text.chars().collect();
    let mut at = 0;
    while at < chars.len() {
        if chars[at].is_ascii_alphabetic() || chars[at] == '_' || chars[at] == ':' {
            let start = at;
            while at < chars.len()
                && (chars[at].is_ascii_alphanumeric() || chars[at] == '_' || chars[at] == ':')
            {
                at += 1;
            }
            let word: String = chars[start..at].iter().collect();
            let called = chars[at..]
                .iter()
                .find(|ch| !ch.is_whitespace())
                .is_some_and(|ch| *ch == '(');
            if !called && !PROMQL_WORDS.contains(&word.to_ascii_lowercase().as_str()) {
                names.insert(word);
            }
        } else if chars[at].is_ascii_digit() || chars[at] == '.' {
            while at < chars.len() && (chars[at].is_ascii_alphanumeric() || chars[at] == '.') {
                at += 1;
            }
        } else {
            at += 1;
        }
    }
    names
}

/// Where `word` starts in `text` as a whole word.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let is_name = |ch: char| ch.is_ascii_alphanumeric() || ch == '_';
    text.match_indices(word).map(|(at, _)| at).find(|&at| {
        !text[..at].chars().next_back().is_some_and(is_name)
            && !text[at + word.len()..].chars().next().is_some_and(is_name)
    })
}

#[test]
fn the_query_parser_finds_series_names_only() {
    assert_eq!(
        series_names(
            r#"histogram_quantile(0.99, sum by (le, method) (rate(a_bucket{x=~"$i",y!="b c"}[$__rate_interval])))"#
        ),
        BTreeSet::from(["a_bucket".to_owned()])
    );
    assert_eq!(
        series_names("label_values(b_info{job=~\"$job\"}, instance)"),
        BTreeSet::from(["b_info".to_owned(), "instance".to_owned()]),
        "label_values' label is an identifier too: the caller checks names it knows"
    );
    assert_eq!(
        series_names("a / on (x) group_left b + 1e3 * c offset 5m"),
        BTreeSet::from(["a".to_owned(), "b".to_owned(), "c".to_owned()])
    );
}

#[test]
fn the_dashboard_is_importable_as_it_is() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    for key in ["title", "uid", "schemaVersion", "panels", "templating"] {
        assert!(!dashboard[key].is_null(), "{key}");
    }
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "the data source is chosen on the dashboard, not baked in"
    );
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(
            ids.insert(panel["id"].as_u64().expect("panel id")),
            "ids are unique"
        );
        assert!(panel["gridPos"]["w"].as_u64().is_some(), "{panel}");
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{}",
                panel["title"]
            );
            for target in panel["targets"].as_array().unwrap() {
                assert_eq!(target["datasource"]["uid"], "${datasource}");
            }
        }
    }
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|panel| panel["title"].as_str())
        .collect();
    for wanted in [
        "Servants",
        "Waiters",
        "Grants / s",
        "Latency p99 by RPC and protocol",
    ] {
        assert!(titles.contains(&wanted), "{wanted} in {titles:?}");
    }
}

#[tokio::test]
async fn every_series_the_dashboard_reads_is_served() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let server = Server::start().await;
    // Calls of every kind the queries look at: a heartbeat, a grant, a
    // renewal, a free, a refused call, a wait that gets no quota.
    register_servant(&server, 8335, 1).await;
    let granted = acquire(&server, 1, 0).await;
    let ids: Vec<u64> = granted.grants.iter().map(|g| g.task_grant_id).collect();
    let denied = call_http_pb(
        server.addr,
        Method::WaitForStartingTask,
        &wait_request(0, 1, 0),
    )
    .await;
    assert_eq!(denied.status, 429, "the only slot is taken");
    let renewed = call_http_pb(
        server.addr,
        Method::KeepTaskAlive,
        &yadcc_pb::KeepTaskAliveRequest {
            token: USER_TOKEN.into(),
            task_grant_ids: ids.clone(),
            next_keep_alive_in_ms: 10_000,
        },
    )
    .await;
    assert_eq!(renewed.status, 200);
    let (_, text) = crate::operations::scrape(&server, None).await;
    let served: BTreeSet<&str> = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| line.split(['{', ' ']).next().unwrap())
        .collect();
    let labels: BTreeSet<&str> = ["instance", "job"].into();
    let mut read = BTreeSet::new();
    for query in queries(&dashboard) {
        for name in series_names(&query) {
            if labels.contains(name.as_str()) {
                continue;
            }
            assert!(
                served.contains(name.as_str()),
                "the dashboard's query {query:?} reads {name}, which /metrics does not serve"
            );
            read.insert(name);
        }
    }
    for wanted in [
        "yadcc_scheduler_servants_up",
        "yadcc_scheduler_capacity",
        "yadcc_scheduler_running",
        "yadcc_scheduler_waiters",
        "yadcc_scheduler_grants_issued_total",
        "yadcc_scheduler_rpc_duration_seconds_bucket",
        "yadcc_scheduler_renewals_refused_total",
        "yadcc_scheduler_connections_refused_total",
        "yadcc_scheduler_build_info",
        "process_cpu_seconds_total",
    ] {
        assert!(read.contains(wanted), "the dashboard shows {wanted}");
    }
    server.stop().await;
}
