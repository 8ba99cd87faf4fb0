//! The demo's dashboard with servants out of rotation, in real headless
//! Chromium at a phone's 400 px and a laptop's 1366 px: the cards, the
//! servants table and `/metrics` count the cordoned servants the same way
//! (not accepting, and why), the capacity split adds up, and the Operator
//! panel fits (no cell cut, nothing past its card, its header over its
//! columns, the Uncordon and Drain buttons inside).

use std::{net::SocketAddr, time::Duration};

use serde_json::{Value, json};

use crate::{
    browser::chromium_or_skip,
    cdp::Browser,
    docs::started_demo,
    support::{heavy, http_client, metrics_text},
};

/// Longest a page may take to show what it should, on a loaded machine.
const PAGE_LIMIT: Duration = Duration::from_secs(30);
const ADMIN_TOKEN: &str = "demo-admin-token";
const CORDONED: usize = 3;

async fn admin(base: &str, method: &str, body: Value) {
    let answer = http_client()
        .post(format!("{base}/rpc/yadcc.scheduler.AdminService.{method}"))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("admin call");
    assert_eq!(answer.status(), 200, "{method}");
}

/// The demo's simulated servants (`sim::ClusterConfig::demo`).
const DEMO_SERVANTS: f64 = 30.0;

/// Gauges of one `/metrics` scrape, so they describe the same moment.
async fn gauges<const N: usize>(addr: SocketAddr, names: [&str; N]) -> [f64; N] {
    let text = metrics_text(addr).await;
    names.map(|name| {
        let series = format!("yadcc_scheduler_{name} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&series))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("/metrics has no {series}"))
    })
}

/// The cards as one render drew them (one overview), and the servants
/// table's rows out of rotation.
const CARDS: &str = r#"(() => {
  const value = (m) => Number(document.querySelector(`#summary [data-metric="${m}"]`).dataset.value);
  const sub = (m) => document.querySelector(`#summary [data-sub="${m}"]`);
  return {
    up: value('servantsUp'), accepting: value('servantsAccepting'), capacity: value('capacity'),
    running: value('running'), available: value('capacityAvailable'), unavailable: value('capacityUnavailable'),
    over: Number(sub('capacity').dataset.over), acceptingSub: sub('servantsAccepting').textContent,
    cordonedRows: document.querySelectorAll('#servants-table tbody tr.st-cordoned').length,
  };
})()"#;

/// What the Operator panel measures of itself: cells whose text is cut,
/// elements past the card, buttons too near its edge, and, where the list
/// has a visible header, how far each header cell sits from its column.
const OPERATOR_LAYOUT: &str = r#"(() => {
  const card = document.getElementById('operator').getBoundingClientRect();
  const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ' "' + e.textContent.slice(0, 30) + '"';
  const list = document.getElementById('operator-cordons');
  const cut = Array.from(list.querySelectorAll('th, td, button'))
    .filter((e) => e.getBoundingClientRect().width > 0 && e.scrollWidth > e.clientWidth + 0.5)
    .map(name);
  const outside = Array.from(document.querySelectorAll('#operator *')).filter((e) => {
    const r = e.getBoundingClientRect();
    if (r.width === 0 || e.closest('dialog, thead')) return false;
    return r.left < card.left - 0.5 || r.right > card.right + 0.5;
  }).map(name);
  const buttons = Array.from(list.querySelectorAll('button')).map((b) => {
    const r = b.getBoundingClientRect();
    return { text: b.textContent, left: r.left - card.left, right: card.right - r.right };
  });
  const header = Array.from(list.tHead.rows[0].cells);
  const first = list.tBodies[0].rows[0];
  const headerVisible = list.tHead.getBoundingClientRect().height > 0;
  const offsets = headerVisible ? header.map((th, i) => {
    const td = first.cells[i];
    const start = (e) => e.getBoundingClientRect().left + parseFloat(getComputedStyle(e).paddingLeft);
    return Math.abs(start(th) - start(td)) + Math.abs(th.getBoundingClientRect().width - td.getBoundingClientRect().width);
  }) : [];
  return {
    rows: list.tBodies[0].rows.length, cut, outside, buttons, headerVisible, offsets,
    scrollWidth: document.documentElement.scrollWidth, clientWidth: document.documentElement.clientWidth,
  };
})()"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordoned_servants_count_the_same_everywhere_and_the_operator_panel_fits() {
    let _heavy = heavy().await;
    let Some(binary) = chromium_or_skip() else {
        return;
    };
    let (demo, base) = started_demo().await;
    // Every servant joined, so the counts below hold still.
    let deadline = std::time::Instant::now() + PAGE_LIMIT;
    while gauges(demo.addr, ["servants_up"]).await[0] < DEMO_SERVANTS {
        assert!(
            std::time::Instant::now() < deadline,
            "the demo's servants did not all join"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let overview: Value = http_client()
        .get(format!("{base}/api/v1/overview"))
        .send()
        .await
        .expect("GET /api/v1/overview")
        .json()
        .await
        .expect("JSON");
    let locations: Vec<String> = overview["servants"]
        .as_array()
        .expect("servants")
        .iter()
        .take(CORDONED)
        .map(|s| s["reportedLocation"].as_str().expect("location").to_owned())
        .collect();
    assert_eq!(locations.len(), CORDONED, "the demo's servants are up");
    for (index, location) in locations.iter().enumerate() {
        let reason = "a long reason, as operators write them: compiler upgrade pending";
        admin(
            &base,
            "CordonServant",
            json!({"location": location, "reason": reason}),
        )
        .await;
        if index == 0 {
            admin(&base, "DrainServant", json!({"location": location})).await;
        }
    }

    // /metrics: out of rotation is not accepting.
    let [up, cordoned, accepting] = gauges(
        demo.addr,
        ["servants_up", "servants_cordoned", "servants_accepting"],
    )
    .await;
    assert_eq!((up, cordoned), (DEMO_SERVANTS, CORDONED as f64));
    assert_eq!(
        accepting,
        up - CORDONED as f64,
        "/metrics counts a cordoned servant as not accepting"
    );

    for (width, mobile) in [(1366, false), (400, true)] {
        let url = format!("{base}/");
        let mut page = if mobile {
            Browser::open_on_phone(&binary, &url, width).await
        } else {
            Browser::open_on_desktop(&binary, &url, width).await
        };
        page.wait_for(
            &format!(
                "document.querySelectorAll('#operator-cordons tbody tr').length === {CORDONED}"
            ),
            "the operator panel lists the cordons",
            PAGE_LIMIT,
        )
        .await;
        page.eval(
            "(() => { const e = document.getElementById('operator-token'); \
             e.value = 'demo-admin-token'; document.getElementById('operator-use').click(); return true; })()",
        )
        .await;
        page.wait_for(
            "document.querySelectorAll('#operator-cordons button[data-action]').length >= 3",
            "the operator's buttons appear",
            PAGE_LIMIT,
        )
        .await;

        let cards = page.eval(CARDS).await;
        let number = |key: &str| cards[key].as_f64().unwrap_or(f64::NAN);
        assert_eq!(
            number("running") + number("available") + number("unavailable"),
            number("capacity") + number("over"),
            "{width} px: Running + Available + Unavailable = Capacity (+ beyond): {cards}"
        );
        assert_eq!(
            number("accepting"),
            number("up") - CORDONED as f64,
            "{width} px: the Accepting card leaves the cordoned out: {cards}"
        );
        let why = cards["acceptingSub"].as_str().unwrap_or_default();
        assert!(
            why.contains("2 cordoned") && why.contains("drain"),
            "{width} px: the Accepting card says why: {cards}"
        );
        if !mobile {
            assert_eq!(
                cards["cordonedRows"],
                json!(CORDONED),
                "the servants table marks the same servants: {cards}"
            );
        }

        let layout = page.eval(OPERATOR_LAYOUT).await;
        assert_eq!(layout["rows"], json!(CORDONED), "{width} px: {layout}");
        assert_eq!(
            layout["cut"],
            json!([]),
            "{width} px: no cell cut: {layout}"
        );
        assert_eq!(
            layout["outside"],
            json!([]),
            "{width} px: nothing past the card: {layout}"
        );
        assert_eq!(
            layout["scrollWidth"], layout["clientWidth"],
            "{width} px: the page does not scroll sideways: {layout}"
        );
        let buttons = layout["buttons"].as_array().expect("buttons");
        assert_eq!(buttons.len(), CORDONED * 2 - 1, "{width} px: {layout}");
        for button in buttons {
            let margin = |side: &str| button[side].as_f64().unwrap_or(-1.0);
            assert!(
                margin("left") >= 8.0 && margin("right") >= 8.0,
                "{width} px: {} sits inside the card, clear of its edges: {layout}",
                button["text"]
            );
        }
        if mobile {
            assert_eq!(layout["headerVisible"], json!(false), "{layout}");
        } else {
            let offsets = layout["offsets"].as_array().expect("offsets");
            assert_eq!(offsets.len(), 7, "{layout}");
            assert!(
                offsets.iter().all(|o| o.as_f64().is_some_and(|o| o < 1.0)),
                "{width} px: each header cell sits over its column: {layout}"
            );
        }
        let artifacts =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
        std::fs::create_dir_all(&artifacts).expect("artifact dir");
        page.eval("document.getElementById('operator').scrollIntoView()")
            .await;
        page.screenshot(&artifacts.join(format!("operator-cordoned-{width}px.png")))
            .await;
        assert_eq!(
            page.logged,
            Vec::<String>::new(),
            "{width} px: nothing logged"
        );
    }
}
