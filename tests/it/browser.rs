//! The dashboard in real headless Chromium: the DOM after its scripts ran
//! shows the servants, grants, requesters and totals of a populated
//! scheduler (each tab drawn when shown: `#tab=name` opens one), the history
//! chart's range choices, cards and legend that agree, and the per-machine
//! grant rate on the first load; with 1,000 servants the page stays paged. The page is served with
//! its `Content-Security-Policy`, so this also proves the page works under it.
//!
//! The script is ES modules (`app.js` imports the rest): a module that 404s,
//! comes with the wrong `Content-Type` or throws while loading stops the whole
//! graph, and the page stays as served, without rows, cards or chart; an error
//! thrown later, a CSP violation or a warning reaches the console, which the
//! test reads from Chromium's log and requires empty.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use prost::Message;
use yadcc_pb as pb;

use crate::support::*;

/// Longest one headless Chromium run may take: its virtual time budget is
/// 8 s, the rest is start-up on a loaded machine.
const CHROMIUM_LIMIT: Duration = Duration::from_secs(120);

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| dirs.iter().map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Chromium, or None (the test skips) outside CI when it is not installed.
pub(crate) fn chromium_or_skip() -> Option<PathBuf> {
    let found = chromium();
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must install chromium (scripts/test.sh does)"
        );
        eprintln!("SKIPPED: no chromium on PATH; scripts/test.sh installs it");
    }
    found
}

/// What Chromium printed: stdout, and the page's console messages (uncaught
/// errors included) from its log.
pub(crate) struct ChromiumRun {
    pub(crate) stdout: String,
    pub(crate) console: Vec<String>,
}

/// Headless, and nothing the test machine's closed network would refuse
/// (background connections to Google's hosts).
pub(crate) const HEADLESS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// Runs Chromium headless against `url` with the extra flags.
pub(crate) fn run_chromium(binary: &Path, url: &str, extra: &[String]) -> ChromiumRun {
    // One profile per run: tests may run Chromium concurrently.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profile = std::env::temp_dir().join(format!("yadcc-chromium-{}-{run}", std::process::id()));
    let output = bounded(CHROMIUM_LIMIT, binary)
        .args(HEADLESS)
        .args([
            "--hide-scrollbars",
            "--virtual-time-budget=8000",
            // The page's console goes to stderr as `...:CONSOLE:<line>] "<message>", source: <url>`.
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .output()
        .expect("chromium starts");
    let _ = std::fs::remove_dir_all(&profile);
    assert_ne!(
        output.status.code(),
        Some(124),
        "chromium ran for over {CHROMIUM_LIMIT:?} and was stopped: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    ChromiumRun {
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        console: String::from_utf8_lossy(&output.stderr)
            .lines()
            .filter(|line| line.contains(":CONSOLE"))
            .map(str::to_owned)
            .collect(),
    }
}

/// The value of `attribute` on the first element whose start tag contains `marker`.
fn attribute_of(dom: &str, marker: &str, attribute: &str) -> Option<String> {
    let at = dom.find(marker)?;
    let tag_start = dom[..at].rfind('<')?;
    let tag_end = at + dom[at..].find('>')?;
    let tag = &dom[tag_start..tag_end];
    let key = format!("{attribute}=\"");
    let value_start = tag.find(&key)? + key.len();
    let value_len = tag[value_start..].find('"')?;
    Some(tag[value_start..value_start + value_len].to_owned())
}

/// The text right after the start tag that contains `marker`.
fn text_after_tag(dom: &str, marker: &str) -> Option<String> {
    let at = dom.find(marker)?;
    let content = &dom[at + dom[at..].find('>')? + 1..];
    Some(content[..content.find('<')?].to_owned())
}

/// The text of the cell of column `column` in the first row whose start tag
/// contains `row_marker`.
fn cell_text(dom: &str, row_marker: &str, column: &str) -> Option<String> {
    let row_start = dom.find(row_marker)?;
    let row = &dom[row_start..row_start + dom[row_start..].find("</tr>")?];
    let at = row.find(&format!(r#"data-col="{column}""#))?;
    let content_start = at + row[at..].find('>')? + 1;
    let content = &row[content_start..];
    let end = content.find("</t")?;
    // Drop nested tags (buttons, spans): the text is what a person reads.
    let mut text = String::new();
    let mut in_tag = false;
    for ch in content[..end].chars() {
        match ch {
            '<' => in_tag = true,
            '>' => in_tag = false,
            _ if !in_tag => text.push(ch),
            _ => {}
        }
    }
    Some(text)
}

/// The servants of the main test: address, reported location (the last one
/// behind NAT), capacity.
const SERVANTS: [(&str, &str, u32); 3] = [
    ("127.0.0.2", "127.0.0.2:8335", 8),
    ("127.0.0.3", "127.0.0.3:8335", 4),
    ("127.0.0.4", "192.168.77.5:8335", 4),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_cluster_in_a_real_browser() {
    let _heavy = heavy().await;
    let Some(binary) = chromium_or_skip() else {
        return;
    };
    let server = Server::start_inspectable().await;
    for (ip, location, capacity) in SERVANTS {
        heartbeat_from(&server, ip, location, capacity).await;
    }
    let granted = acquire(&server, 2, 1).await;
    assert_eq!(granted.grants.len(), 3);
    // The server measures each machine's grant rate once a second: wait for
    // the sample that saw these grants, so the first load must show it.
    let deadline = std::time::Instant::now() + STEP;
    loop {
        let overview = crate::protocols::overview(&server).await;
        if overview["requesters"][0]["grantsPerSecond"].as_f64() > Some(0.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sampler measured the rate: {overview}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // Four Chromium runs can outlast a heartbeat's period or a lease on a
    // loaded machine: keep the servants and grants alive as daemons would.
    let ids: Vec<u64> = granted.grants.iter().map(|g| g.task_grant_id).collect();
    let keeper = tokio::spawn({
        let addr = server.addr;
        async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                for (ip, location, capacity) in SERVANTS {
                    let mut connection =
                        Connection::open_from(addr, Some(ip.parse().unwrap())).await;
                    let body = heartbeat(location, capacity).encode_to_vec();
                    connection
                        .send(&daemon_request(Method::Heartbeat, 1, &body, None))
                        .await;
                    connection.read_response().await;
                }
                let renewal = pb::KeepTaskAliveRequest {
                    token: USER_TOKEN.into(),
                    task_grant_ids: ids.clone(),
                    next_keep_alive_in_ms: 15_000,
                };
                call_http_pb(addr, Method::KeepTaskAlive, &renewal).await;
            }
        }
    });

    let url = server.url("/");
    let dump = |tab: &str| {
        let binary = binary.clone();
        let url = format!("{url}#tab={tab}");
        tokio::task::spawn_blocking(move || run_chromium(&binary, &url, &["--dump-dom".to_owned()]))
    };
    let mut tabs = std::collections::HashMap::new();
    for tab in ["requesters", "grants", "environments"] {
        let run = dump(tab).await.expect("chromium task");
        assert!(run.console.is_empty(), "{tab}: {:#?}", run.console);
        tabs.insert(tab, run.stdout);
    }
    let run = dump("servants").await.expect("chromium task");
    let dom = run.stdout;

    assert!(
        dom.contains(r#"<script type="module" src="app.js">"#),
        "the page loads its script as a module"
    );
    assert!(
        run.console.is_empty(),
        "the page logged nothing (no uncaught error, CSP violation or failed poll): {:#?}",
        run.console
    );
    // Each panel's toolbar is built by the shared table module from the
    // panel's view module: present only when both loaded and ran.
    for (panel, placeholder) in [
        (
            "servants",
            "Filter by location, version, reason, environment digest…",
        ),
        (
            "grants",
            "Filter by id, servant, requester, environment, task…",
        ),
        ("environments", "Filter by compiler digest…"),
        ("requesters", "Filter by machine or protocol…"),
    ] {
        assert_eq!(
            attribute_of(&dom, &format!(r#"id="{panel}-filter""#), "placeholder").as_deref(),
            Some(placeholder),
            "the {panel} panel was built by its module (a module that 404s or throws while loading stops them all)"
        );
        assert!(
            dom.contains(&format!(r#"id="{panel}-table""#)),
            "the {panel} table"
        );
    }
    assert_eq!(
        text_after_tag(&dom, r#"id="servants-info""#).as_deref(),
        Some("3 servants"),
        "the table module counted the rows"
    );

    assert_eq!(
        attribute_of(&dom, r#"data-metric="servantsUp""#, "data-value").as_deref(),
        Some("3"),
        "summary card after scripts ran"
    );
    assert_eq!(
        attribute_of(&dom, r#"data-metric="grants""#, "data-value").as_deref(),
        Some("3")
    );
    for location in ["127.0.0.2:8335", "127.0.0.3:8335", "127.0.0.4:8335"] {
        assert!(
            dom.contains(&format!(r#"data-location="{location}""#)),
            "servant row {location}"
        );
    }
    assert!(
        dom.contains("differs from the observed"),
        "NAT reason shown in words"
    );
    // A hidden tab's table is not drawn until it is shown.
    assert!(
        !dom.contains("data-grant-id="),
        "the grants table waits for its tab"
    );
    assert!(
        !dom.contains(r#"data-requester="127.0.0.1""#),
        "the requesters table waits for its tab"
    );
    // Cards and legend come from the same overview: they agree.
    for metric in ["capacity", "running", "waiters", "grantsPerSecond"] {
        let card = text_after_tag(&dom, &format!(r#"data-metric="{metric}""#));
        let legend = text_after_tag(&dom, &format!(r#"data-legend="{metric}""#));
        assert!(
            card.is_some() && card.as_deref() != Some("—"),
            "{metric}: {card:?}"
        );
        assert_eq!(card, legend, "card and legend of {metric}");
    }
    assert_eq!(
        text_after_tag(&dom, r#"data-metric="capacity""#).as_deref(),
        Some("12"),
        "8 + 4 slots (the servant behind NAT offers none)"
    );
    let grants_dom = &tabs["grants"];
    for grant in &granted.grants {
        // Rows are keyed by the id's fingerprint; the id is never shown.
        let fingerprint = yadcc_scheduler::dashboard::grant_fingerprint(grant.task_grant_id);
        assert!(
            grants_dom.contains(&format!(r#"data-grant-id="{fingerprint}""#)),
            "grant row {}",
            grant.task_grant_id
        );
    }
    assert!(
        tabs["environments"].contains(&format!(r#"data-digest="{DIGEST}""#)),
        "environment row"
    );
    assert!(
        dom.contains(r#"data-location="127.0.0.2:8335""#) && dom.contains(r#"data-col="protocol""#),
        "the servants table has a Protocol column"
    );

    // The history chart: 5 min / 15 min / 1 h, and it spans the data it has
    // (a fresh server has seconds of it), not a fixed hour.
    for range in ["300", "900", "3600"] {
        assert!(
            dom.contains(&format!(r#"data-range="{range}""#)),
            "range choice {range}"
        );
    }
    assert_eq!(
        attribute_of(&dom, r#"data-range="3600""#, "aria-pressed").as_deref(),
        Some("true"),
        "one hour is the default choice"
    );
    assert_eq!(
        attribute_of(&dom, r#"id="chart""#, "data-range-seconds").as_deref(),
        Some("3600")
    );
    // The chart module drew the server's samples (a fresh server has at
    // least its first): each series is a non-empty path.
    for series in [
        "line s-capacity",
        "line s-running",
        "line s-waiters",
        "line s-gps",
    ] {
        let path = attribute_of(&dom, &format!(r#"class="{series}""#), "d").unwrap_or_default();
        assert!(
            path.starts_with('M'),
            "chart series {series} drawn: {path:?}"
        );
    }
    assert!(
        dom.contains(r#"<svg class="chart-svg""#),
        "the chart's SVG is in the page"
    );
    let span: u64 = attribute_of(&dom, r#"id="chart""#, "data-span-seconds")
        .and_then(|span| span.parse().ok())
        .expect("the chart says what it spans");
    assert!(
        span < 600,
        "a fresh server's chart spans its data: {span} s"
    );

    // Requesters, as icemon lists its clients: the machine that took the
    // three grants, with the engine's counters, and its grant rate as the
    // server measured it (over its last 10 s, which may have slid past the
    // grants by now), on the page's first load: a figure, not a dash.
    let dom = &tabs["requesters"];
    let requester = r#"data-requester="127.0.0.1""#;
    let rate = cell_text(dom, requester, "rate").unwrap_or_default();
    assert!(
        rate.parse::<f64>().is_ok_and(|rate| rate >= 0.0),
        "a grant rate on the first load: {rate:?}"
    );
    assert!(dom.contains(requester), "requester row");
    assert_eq!(
        cell_text(dom, requester, "grantsHeld").as_deref(),
        Some("3"),
        "grants held"
    );
    assert_eq!(
        cell_text(dom, requester, "waiting").as_deref(),
        Some("0"),
        "waiting, from the overview's requesters"
    );
    assert_eq!(
        cell_text(dom, requester, "grantsTotal").as_deref(),
        Some("3"),
        "grants total, from the overview's requesters"
    );
    assert_eq!(cell_text(dom, requester, "refused").as_deref(), Some("0"));
    assert_eq!(
        cell_text(dom, requester, "capRefusals").as_deref(),
        Some("0"),
        "no waiter cap bit"
    );

    let status = attribute_of(dom, r#"id="status""#, "class").unwrap_or_default();
    assert!(
        status.contains("live") || dom.contains(">live<"),
        "connection state is live: {status}"
    );

    let artifacts = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("test-artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifact dir");
    let screenshot = artifacts.join("dashboard.png");
    let _ = std::fs::remove_file(&screenshot);
    let shot = tokio::task::spawn_blocking({
        let screenshot = screenshot.clone();
        move || {
            run_chromium(
                &binary,
                &url,
                &[
                    format!("--screenshot={}", screenshot.display()),
                    "--window-size=1400,1000".to_owned(),
                ],
            )
        }
    })
    .await
    .expect("chromium task");
    assert!(
        shot.console.is_empty(),
        "the page logged nothing at 1400 px wide either: {:#?}",
        shot.console
    );
    let size = std::fs::metadata(&screenshot)
        .map(|meta| meta.len())
        .unwrap_or(0);
    assert!(
        size > 10_000,
        "screenshot kept at {} ({size} bytes)",
        screenshot.display()
    );
    keeper.abort();
    server.stop().await;
}

/// Servants in the large-cluster test.
const MANY_SERVANTS: u16 = 1000;
/// Rows a table shows per page (`PAGE_ROWS` in `web/table.js`).
const PAGE_ROWS: usize = 50;
/// The whole page's elements with a full page of servants: 50 rows of about
/// 35 elements (cells, meters, badges) and some 250 around them; a table of
/// every servant would hold 35,000.
const MAX_ELEMENTS: usize = 2200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_stays_light_with_a_thousand_servants() {
    let _heavy = heavy().await;
    let Some(binary) = chromium_or_skip() else {
        return;
    };
    let server = Server::start_inspectable().await;
    // On one connection, as one daemon's pipeline would, with the longest
    // heartbeat period: registering them all must not outlast the first.
    let mut connection = Connection::open(server.addr).await;
    for port in 0..MANY_SERVANTS {
        let mut request = heartbeat(&servant_location("127.0.0.1", 10_000 + port), 8);
        request.next_heartbeat_in_ms = 30_000;
        connection
            .send(&daemon_request(
                Method::Heartbeat,
                u64::from(port),
                &request.encode_to_vec(),
                None,
            ))
            .await;
        assert_eq!(connection.read_response().await.status, 200);
    }
    let url = server.url("/");
    let run = tokio::task::spawn_blocking(move || {
        run_chromium(&binary, &url, &["--dump-dom".to_owned()])
    })
    .await
    .expect("chromium task");
    assert!(run.console.is_empty(), "{:#?}", run.console);
    let dom = run.stdout;
    // What the page said about its connection, should the data be missing.
    let connection = format!(
        "status {:?}, banner {:?}",
        text_after_tag(&dom, r#"id="status""#),
        text_after_tag(&dom, r#"id="banner-text""#)
    );
    assert_eq!(
        text_after_tag(&dom, r#"id="servants-info""#).as_deref(),
        Some("1,000 servants"),
        "{connection}"
    );
    assert_eq!(
        attribute_of(&dom, r#"data-metric="servantsUp""#, "data-value").as_deref(),
        Some("1000")
    );
    let rows = dom.matches("data-location=").count();
    assert_eq!(rows, PAGE_ROWS, "one page of servant rows");
    assert!(
        dom.contains("page 1 of 20"),
        "the pager says where the rest are"
    );
    let elements = dom.matches('<').count() - dom.matches("</").count();
    assert!(
        elements < MAX_ELEMENTS,
        "{elements} elements with {MANY_SERVANTS} servants"
    );
    server.stop().await;
}
