//! Rule "guessing costs time" against the real binary: the inspection
//! password, admin tokens and daemons' tokens share one limit per address
//! block (a PROXY header from a trusted loopback proxy names the client);
//! past it a wrong credential is answered after a second, a right one at
//! once, so nobody behind the same address can lock an operator out; IPv6
//! counts per /56 unless `--guessing_ipv6_prefix` says otherwise.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use yadcc_pb as pb;

use crate::{
    support::{Binary, STEP, USER_TOKEN},
    tls::{CREDENTIAL, basic, metric, plain_request, proxied_from},
};

const ADMIN_TOKEN: &str = "operator-token-1";

/// At least this long: a slowed answer (a second).
const SLOWED: Duration = Duration::from_millis(950);
/// At most this long: an answer that was not slowed, on a busy machine.
const PROMPT: Duration = Duration::from_millis(900);

/// A JSON RPC from `prefix`'s client: the status, the answer, how long it took.
pub(crate) async fn json_call(
    addr: SocketAddr,
    prefix: &str,
    path: &str,
    bearer: Option<&str>,
    body: &str,
) -> (u16, String, Duration) {
    let started = Instant::now();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let authorization = bearer.map_or(String::new(), |token| {
        format!("Authorization: Bearer {token}\r\n")
    });
    let request = format!(
        "{prefix}POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         {authorization}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(STEP, stream.read_to_end(&mut answer))
        .await
        .expect("an answer in time")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    (status, answer, started.elapsed())
}

fn admin(method: &str) -> String {
    format!("/rpc/{}.{method}", pb::ADMIN_SERVICE)
}

const GET_CONFIG: &str = "/rpc/yadcc.scheduler.SchedulerService.GetConfig";

async fn timed(addr: SocketAddr, prefix: &str, head: &str) -> (u16, String, Duration) {
    let started = Instant::now();
    let (status, answer) = plain_request(addr, prefix, head).await;
    (status, answer, started.elapsed())
}

#[tokio::test]
async fn every_credential_shares_one_limit_and_the_right_one_always_passes() {
    let server = Binary::start(
        &[
            &format!("--inspect_credential={CREDENTIAL}"),
            &format!("--admin_tokens={ADMIN_TOKEN}"),
            "--trusted_proxies=127.0.0.1",
        ],
        None,
    );
    let addr = server.addr;
    let office = proxied_from("192.0.2.66");
    let list = admin("ListServantStates");
    let wrong_basic = format!("GET /api/v1/overview HTTP/1.1\r\n{}", basic("ops:guess"));
    let right_basic = format!("GET /api/v1/overview HTTP/1.1\r\n{}", basic(CREDENTIAL));
    let wrong_config = r#"{"token": "not-a-token"}"#;

    // Ten failures, on three surfaces, from one address: none slowed yet.
    for _ in 0..4 {
        let (status, answer, took) = json_call(addr, &office, &list, Some("guess"), "{}").await;
        assert_eq!(status, 403, "{answer}");
        assert!(took < PROMPT, "{took:?}");
    }
    for _ in 0..3 {
        let (status, _, took) = timed(addr, &office, &wrong_basic).await;
        assert_eq!(status, 401);
        assert!(took < PROMPT, "{took:?}");
    }
    for _ in 0..3 {
        let (status, answer, _) = json_call(addr, &office, GET_CONFIG, None, wrong_config).await;
        assert_eq!(status, 403, "{answer}");
    }

    // Slowed: every wrong credential, whatever the surface.
    let (status, answer, took) = json_call(addr, &office, &list, Some("guess"), "{}").await;
    assert_eq!(status, 403, "{answer}");
    assert!(took >= SLOWED, "a wrong admin token waits: {took:?}");
    assert!(answer.contains("too many failed credentials"), "{answer}");
    let (status, answer, took) = timed(addr, &office, &wrong_basic).await;
    assert_eq!(
        status, 401,
        "a wrong password stays 401 (schemathesis ST401): {answer}"
    );
    assert!(answer.contains("too many failed credentials"), "{answer}");
    assert!(took >= SLOWED, "a wrong password waits: {took:?}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: "),
        "{answer}"
    );
    let (status, answer, took) = json_call(addr, &office, GET_CONFIG, None, wrong_config).await;
    assert_eq!(status, 403, "{answer}");
    assert!(took >= SLOWED, "a wrong daemon token waits: {took:?}");

    // The right ones, from the same address, pass at once.
    let (status, answer, took) = json_call(addr, &office, &list, Some(ADMIN_TOKEN), "{}").await;
    assert_eq!(status, 200, "{answer}");
    assert!(took < PROMPT, "{took:?}");
    let (status, answer, took) = timed(addr, &office, &right_basic).await;
    assert_eq!(status, 200, "{answer}");
    assert!(took < PROMPT, "{took:?}");
    let right_config = format!(r#"{{"token": "{USER_TOKEN}"}}"#);
    let (status, answer, took) = json_call(addr, &office, GET_CONFIG, None, &right_config).await;
    assert_eq!(status, 200, "{answer}");
    assert!(took < PROMPT, "{took:?}");

    // Another address is not slowed; no credential is no guess.
    let (status, _, took) = json_call(
        addr,
        &proxied_from("192.0.2.67"),
        &list,
        Some("guess"),
        "{}",
    )
    .await;
    assert_eq!(status, 403);
    assert!(took < PROMPT, "{took:?}");
    let (status, _, took) = json_call(addr, &office, &list, None, "{}").await;
    assert_eq!(status, 401);
    assert!(took < PROMPT, "{took:?}");

    for (surface, failed, refused) in [
        ("admin_token", 6, 1),
        ("inspect", 4, 1),
        ("rpc_token", 4, 1),
    ] {
        let labels = format!("{{surface=\"{surface}\"}}");
        assert_eq!(
            metric(
                addr,
                &format!("yadcc_scheduler_failed_credentials_total{labels}")
            )
            .await,
            failed,
            "{surface}"
        );
        assert_eq!(
            metric(
                addr,
                &format!("yadcc_scheduler_guesses_refused_total{labels}")
            )
            .await,
            refused,
            "{surface}"
        );
    }
    assert!(
        server
            .log()
            .iter()
            .any(|line| line.contains("10 failed credentials within 60 s")
                && line.contains("192.0.2.66")),
        "{:?}",
        server.log()
    );
}

/// Ten wrong passwords from ten /64s of one /56, then one from an eleventh:
/// whether that one was answered as from a slowed block (every answer is 401;
/// a slowed one says so and carries Retry-After).
async fn eleventh_from_the_same_slash_56_is_slowed(addr: SocketAddr) -> bool {
    let wrong = format!("GET /api/v1/overview HTTP/1.1\r\n{}", basic("ops:guess"));
    for subnet in 0..10 {
        let prefix = format!("PROXY TCP6 2001:db8:0:{subnet:x}::1 ::1 40000 8336\r\n");
        let (status, answer) = plain_request(addr, &prefix, &wrong).await;
        assert_eq!(status, 401);
        assert!(!answer.contains("too many failed credentials"), "{answer}");
    }
    let prefix = "PROXY TCP6 2001:db8:0:ff::7 ::1 40000 8336\r\n";
    let (status, answer) = plain_request(addr, prefix, &wrong).await;
    assert_eq!(status, 401, "{answer}");
    answer.contains("too many failed credentials")
        && answer.to_ascii_lowercase().contains("retry-after: ")
}

#[tokio::test]
async fn ipv6_clients_count_per_slash_56_unless_the_operator_says_otherwise() {
    let credential = format!("--inspect_credential={CREDENTIAL}");
    let flags = [credential.as_str(), "--trusted_proxies=127.0.0.1,::1"];
    let by_default = Binary::start(&flags, None);
    assert!(eleventh_from_the_same_slash_56_is_slowed(by_default.addr).await);

    let per_64 = Binary::start(&[flags[0], flags[1], "--guessing_ipv6_prefix=64"], None);
    assert!(!eleventh_from_the_same_slash_56_is_slowed(per_64.addr).await);
}
