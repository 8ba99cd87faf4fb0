//! The dashboard on a phone, in real headless Chromium emulating one (a
//! mobile viewport 400 and 360 CSS pixels wide): the page never scrolls
//! sideways on any tab (a table wider than the phone scrolls inside its own
//! box), every tab is on screen, each range button keeps its label on one
//! line, the chart's title is whole, outside a hot standby no leadership
//! badge shows, and tables page by 20 rows (a phone's main thread lays out
//! fewer rows per refresh). Nothing is logged.

use std::time::Duration;

use prost::Message;
use serde_json::json;

use crate::{browser::chromium_or_skip, cdp::Browser, support::*};

/// Longest a page may take to show what it should, on a loaded machine.
const PAGE_LIMIT: Duration = Duration::from_secs(30);
/// The widths checked: a common phone's, and the narrowest the page supports.
const PHONE_WIDTHS: [u32; 2] = [400, 360];
const TABS: [&str; 4] = ["servants", "grants", "environments", "requesters"];

/// Servants with long names (what makes the tables wide): address, location.
const SERVANTS: [(&str, &str); 3] = [
    ("127.0.0.2", "127.0.0.2:8335"),
    ("127.0.0.3", "127.0.0.3:8335"),
    ("127.0.0.4", "192.168.177.205:8335"),
];

/// Servants with short names besides those, so the servants table has a
/// second page at phone width.
const MORE_SERVANTS: u8 = 22;
/// Rows per page at phone width (`PHONE_PAGE_ROWS` in `web/table.js`).
const PHONE_PAGE_ROWS: usize = 20;

/// What the page measures of itself with `tab` shown: how far it scrolls
/// sideways, and the elements (not clipped by a scrolling box) that stick
/// out of the viewport.
fn layout_with(tab: &str) -> String {
    format!(
        r#"(async () => {{
  document.getElementById('tab-{tab}').click();
  await new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)));
  const root = document.documentElement;
  const outside = Array.from(document.querySelectorAll('body *')).filter((e) => {{
    if (e.closest('.table-wrap, .visually-hidden')) return false;
    const r = e.getBoundingClientRect();
    return r.width > 0 && (r.right > root.clientWidth + 0.5 || r.left < -0.5);
  }}).map((e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' ' + Math.round(e.getBoundingClientRect().right));
  return {{
    scrollWidth: root.scrollWidth, clientWidth: root.clientWidth,
    bodyScrollWidth: document.body.scrollWidth, outside: outside,
    selected: document.getElementById('tab-{tab}').getAttribute('aria-selected'),
  }};
}})()"#
    )
}

/// The chart's heading, the range buttons and the leadership badge.
const HEAD: &str = r#"(() => {
  const title = document.getElementById('history-title');
  const buttons = Array.from(document.querySelectorAll('#range button'));
  return {
    title: title.textContent, titleScroll: title.scrollWidth, titleClient: title.clientWidth,
    buttons: buttons.map((b) => ({
      label: b.textContent, height: b.offsetHeight,
      lineHeight: parseFloat(getComputedStyle(b).lineHeight),
    })),
    leadership: getComputedStyle(document.getElementById('leadership')).display,
    description: (document.querySelector('meta[name="description"]') || {}).content || '',
  };
})()"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_fits_a_phone_without_sideways_scrolling() {
    let _heavy = heavy().await;
    let Some(binary) = chromium_or_skip() else {
        return;
    };
    let server = Server::start_inspectable().await;
    let more: Vec<(String, String)> = (1..=MORE_SERVANTS)
        .map(|n| (format!("127.0.1.{n}"), format!("127.0.1.{n}:8335")))
        .collect();
    let servants = SERVANTS.iter().copied().chain(
        more.iter()
            .map(|(ip, location)| (ip.as_str(), location.as_str())),
    );
    for (ip, location) in servants {
        let mut connection = Connection::open_from(server.addr, Some(ip.parse().unwrap())).await;
        let mut beat = heartbeat(location, 8);
        // The whole test within one heartbeat period.
        beat.next_heartbeat_in_ms = 30_000;
        connection
            .send(&daemon_request(
                Method::Heartbeat,
                1,
                &beat.encode_to_vec(),
                None,
            ))
            .await;
        assert_eq!(connection.read_response().await.status, 200);
    }
    // Rows in the grants, environments and requesters tables too.
    let granted = acquire(&server, 2, 1).await;
    assert_eq!(granted.grants.len(), 3);

    for width in PHONE_WIDTHS {
        let mut page = Browser::open_on_phone(&binary, &server.url("/"), width).await;
        page.wait_for(
            &format!(
                "(document.getElementById('servants-info') || {{}}).textContent === '{} servants'",
                SERVANTS.len() + usize::from(MORE_SERVANTS)
            ),
            "the servants are listed",
            PAGE_LIMIT,
        )
        .await;
        assert_eq!(
            page.eval("document.querySelectorAll('#servants-table tbody tr').length")
                .await,
            json!(PHONE_PAGE_ROWS),
            "{width} px: a page of rows at phone width"
        );
        let pager = page
            .eval("document.querySelector('#servants .more-text').textContent")
            .await;
        assert!(
            pager
                .as_str()
                .is_some_and(|text| text.ends_with("page 1 of 2")),
            "{width} px: the pager says where the rest are: {pager}"
        );
        assert_eq!(
            page.eval("document.documentElement.clientWidth").await,
            json!(width),
            "the page is laid out for the phone's width"
        );
        for tab in TABS {
            let layout = page.eval(&layout_with(tab)).await;
            assert_eq!(layout["selected"], "true", "{width} px, {tab}: {layout}");
            assert_eq!(
                layout["scrollWidth"],
                json!(width),
                "{width} px, {tab} tab: the page does not scroll sideways: {layout}"
            );
            assert_eq!(
                layout["bodyScrollWidth"],
                json!(width),
                "{width} px, {tab}: {layout}"
            );
            assert_eq!(
                layout["outside"],
                json!([]),
                "{width} px, {tab}: nothing outside the screen (tabs included)"
            );
        }
        let head = page.eval(HEAD).await;
        let title = head["title"].as_str().unwrap_or_default();
        assert!(
            title.starts_with("Since ") || title.starts_with("Last "),
            "{width} px: the chart's title: {head}"
        );
        assert!(
            head["titleScroll"].as_f64() <= head["titleClient"].as_f64(),
            "{width} px: the chart's title is whole, not cut: {head}"
        );
        let buttons = head["buttons"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        assert_eq!(buttons.len(), 3, "{head}");
        for button in buttons {
            let height = button["height"].as_f64().unwrap_or(f64::MAX);
            let line = button["lineHeight"].as_f64().unwrap_or(0.0);
            assert!(
                height < 2.0 * line,
                "{width} px: the range button {} keeps its label on one line: {button}",
                button["label"]
            );
        }
        assert_eq!(
            head["leadership"], "none",
            "{width} px: no leadership badge without a hot standby: {head}"
        );
        assert!(
            head["description"].as_str().is_some_and(|d| d.len() > 50),
            "a meta description: {head}"
        );
        assert_eq!(
            page.logged,
            Vec::<String>::new(),
            "{width} px: nothing logged"
        );
        let artifacts =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
        std::fs::create_dir_all(&artifacts).expect("artifact dir");
        page.screenshot(&artifacts.join(format!("dashboard-{width}px.png")))
            .await;
        drop(page);
    }
    server.stop().await;
}
