//! The operators' panel in real headless Chromium, driven as an operator
//! uses it: without a token the page only shows what is cordoned; a wrong
//! token is refused and not kept; the right one is kept in this tab's
//! session storage (never a cookie) and brings the cordon, drain and
//! uncordon buttons, each acting only once confirmed, sending the token as
//! an `Authorization` header; the servants table marks a cordoned servant
//! with its reason and who. Under the page's CSP, with nothing logged but
//! the refused token's 403.

use std::time::Duration;

use prost::Message;
use serde_json::json;
use yadcc_engine::CordonState;

use crate::{admin::ADMIN_TOKEN, browser::chromium_or_skip, cdp::Browser, support::*};

/// Longest a page may take to show what it should, on a loaded machine.
const PAGE_LIMIT: Duration = Duration::from_secs(30);
const CORDONED: &str = "127.0.0.2:8335";

/// Sets the input `id` to `value` as typing does (an `input` event).
fn type_into(id: &str, value: &str) -> String {
    format!(
        "(() => {{ const e = document.getElementById({id:?}); e.value = {value:?}; \
         e.dispatchEvent(new Event('input', {{ bubbles: true }})); return true; }})()"
    )
}

fn click(selector: &str) -> String {
    format!("(() => {{ document.querySelector({selector:?}).click(); return true; }})()")
}

/// The text of the state cell of the servant row at `location`.
fn state_cell(location: &str) -> String {
    format!(
        "((document.querySelector('#servants-table tr[data-location=\"{location}\"] \
         [data-col=\"state\"]') || {{}}).textContent || '')"
    )
}

/// Waits for the confirmation, checks it names `location`, and answers it.
async fn confirm(page: &mut Browser, location: &str, yes: bool) {
    page.wait_for(
        "document.getElementById('operator-confirm').open === true",
        "the confirmation opens",
        PAGE_LIMIT,
    )
    .await;
    let question = page
        .eval("document.getElementById('operator-question').textContent")
        .await;
    assert!(
        question
            .as_str()
            .is_some_and(|text| text.contains(location)),
        "{question}"
    );
    page.eval(&click(if yes { "#operator-yes" } else { "#operator-no" }))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_cordons_drains_and_uncordons_from_the_dashboard() {
    let _heavy = heavy().await;
    let Some(binary) = chromium_or_skip() else {
        return;
    };
    let server = Server::start_with_admin(&[ADMIN_TOKEN]).await;
    for ip in ["127.0.0.2", "127.0.0.3"] {
        let mut connection = Connection::open_from(server.addr, Some(ip.parse().unwrap())).await;
        let mut beat = heartbeat(&format!("{ip}:8335"), 4);
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
    let mut page = Browser::open(&binary, &server.url("/")).await;
    page.wait_for(
        "document.querySelectorAll('#servants-table tbody tr').length === 2",
        "the servants are listed",
        PAGE_LIMIT,
    )
    .await;

    // Without a token: the token field, no action.
    assert_eq!(
        page.eval("document.getElementById('operator-login').hidden")
            .await,
        json!(false)
    );
    assert_eq!(
        page.eval("document.getElementById('operator-act').hidden")
            .await,
        json!(true)
    );
    assert_eq!(
        page.eval("document.getElementById('operator-token').type")
            .await,
        "password"
    );

    // A wrong token is refused, and not kept.
    page.eval(&type_into("operator-token", "not-the-token"))
        .await;
    page.eval(&click("#operator-use")).await;
    page.wait_for(
        "document.getElementById('operator-status').textContent.includes('refused')",
        "the wrong token is refused",
        PAGE_LIMIT,
    )
    .await;
    assert_eq!(
        page.eval("sessionStorage.getItem('yadcc-admin-token')")
            .await,
        json!(null)
    );
    assert_eq!(
        page.eval("document.getElementById('operator-act').hidden")
            .await,
        json!(true)
    );

    // The right one: kept in this tab, never in a cookie.
    page.eval(&type_into("operator-token", ADMIN_TOKEN)).await;
    page.eval(&click("#operator-use")).await;
    page.wait_for(
        "document.getElementById('operator-act').hidden === false",
        "the actions appear",
        PAGE_LIMIT,
    )
    .await;
    assert_eq!(
        page.eval("sessionStorage.getItem('yadcc-admin-token')")
            .await,
        ADMIN_TOKEN
    );
    assert_eq!(page.eval("document.cookie").await, "");
    assert_eq!(
        page.eval("localStorage.getItem('yadcc-admin-token')").await,
        json!(null)
    );

    // Cordon, cancelled: nothing happens.
    page.eval(&type_into("operator-location", CORDONED)).await;
    page.eval(&type_into("operator-reason", "bad disk")).await;
    page.eval(&click("button[data-action=\"CordonServant\"]"))
        .await;
    confirm(&mut page, CORDONED, false).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        server.engine.cordons().is_empty(),
        "a cancel acts on nothing"
    );

    // Cordon, confirmed (the page kept as a picture, confirmation open).
    page.eval(&click(
        "#operator-act button[data-action=\"CordonServant\"]",
    ))
    .await;
    let artifacts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&artifacts).expect("artifact directory");
    page.wait_for(
        "document.getElementById('operator-confirm').open === true",
        "the confirmation opens",
        PAGE_LIMIT,
    )
    .await;
    page.screenshot(&artifacts.join("operator-confirm.png"))
        .await;
    confirm(&mut page, CORDONED, true).await;
    page.wait_for(
        &format!("{}.includes('Cordoned')", state_cell(CORDONED)),
        "the servants table marks it",
        PAGE_LIMIT,
    )
    .await;
    let cordons = server.engine.cordons();
    assert_eq!(cordons.len(), 1);
    assert_eq!(cordons[0].location.to_string(), CORDONED);
    assert_eq!(cordons[0].cordon.reason, "bad disk");
    let who = "token:admin-token-1";
    assert_eq!(cordons[0].cordon.by, who);
    page.eval("document.getElementById('operator').scrollIntoView()")
        .await;
    page.screenshot(&artifacts.join("operator.png")).await;
    let cell = page.eval(&state_cell(CORDONED)).await;
    let cell = cell.as_str().unwrap();
    assert!(cell.contains("bad disk") && cell.contains(who), "{cell}");
    assert!(
        page.eval(&state_cell("127.0.0.3:8335"))
            .await
            .as_str()
            .unwrap()
            .contains("Accepting"),
        "the other servant is as it was"
    );

    // A reload of the tab keeps the token; drain from the list of cordons.
    page.reload().await;
    page.wait_for(
        &format!("!!document.querySelector('#operator-cordons tr[data-cordon=\"{CORDONED}\"] button[data-action=\"DrainServant\"]')"),
        "the list offers a drain after a reload",
        PAGE_LIMIT,
    )
    .await;
    page.eval(&click(&format!(
        "#operator-cordons tr[data-cordon=\"{CORDONED}\"] button[data-action=\"DrainServant\"]"
    )))
    .await;
    confirm(&mut page, CORDONED, true).await;
    page.wait_for(
        &format!("{}.includes('Drained')", state_cell(CORDONED)),
        "drained: nothing runs there",
        PAGE_LIMIT,
    )
    .await;
    assert_eq!(server.engine.cordons()[0].state, CordonState::Drained);

    // Uncordon.
    page.eval(&click(&format!(
        "#operator-cordons tr[data-cordon=\"{CORDONED}\"] button[data-action=\"UncordonServant\"]"
    )))
    .await;
    confirm(&mut page, CORDONED, true).await;
    page.wait_for(
        &format!("{}.includes('Accepting')", state_cell(CORDONED)),
        "back in rotation",
        PAGE_LIMIT,
    )
    .await;
    assert!(server.engine.cordons().is_empty());

    // Forgotten: gone from the tab.
    page.eval(&click("#operator-forget")).await;
    assert_eq!(
        page.eval("sessionStorage.getItem('yadcc-admin-token')")
            .await,
        json!(null)
    );

    // The actions went out with the token in a header, audited as such.
    let (status, events) =
        crate::admin::admin_json(server.addr, "ListAuditEvents", Some(ADMIN_TOKEN), json!({}))
            .await;
    assert_eq!(status, 200);
    assert_eq!(
        crate::admin::audit_actions(&events),
        ["UncordonServant", "DrainServant", "CordonServant"],
        "every confirmed action, newest first"
    );
    // Nothing logged but the refused token's answer (and the browser's
    // verbose advice on forms, which is no error).
    let unexpected: Vec<&String> = page
        .logged
        .iter()
        .filter(|line| !(line.contains("403") && line.contains("network")))
        .filter(|line| !line.contains(" verbose)"))
        .collect();
    assert!(unexpected.is_empty(), "{:#?}", page.logged);
    drop(page);
    server.stop().await;
}
