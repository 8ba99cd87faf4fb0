//! Reloads over the real binary (issue 45): SIGHUP never stops the process,
//! one watcher reloads the TLS pair and the tenants file on SIGHUP and on a
//! change, and a reload runs every check of the start (admin tokens, empty
//! tokens, weights), keeping the running configuration when one fails.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::fixtures::eventually_within;
use crate::support::{Binary, SERVANT_TOKEN, STEP, http_client, run_bounded};
use crate::tls::{Ca, Dir, connector, handshake, start};

fn hangup(binary: &Binary) {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &binary.child.id().to_string()])
        .status()
        .expect("kill -HUP");
    assert!(status.success());
}

async fn status_of(addr: SocketAddr, path: &str) -> u16 {
    http_client()
        .get(format!("http://{addr}{path}"))
        .send()
        .await
        .map_or(0, |answer| answer.status().as_u16())
}

async fn logged(binary: &Binary, text: &str) -> bool {
    eventually_within(STEP, || binary.log().iter().any(|line| line.contains(text))).await
}

#[tokio::test]
async fn sighup_without_a_tenants_file_or_tls_is_logged_and_the_farm_keeps_serving() {
    let mut binary = Binary::start(&[], None);
    assert_eq!(status_of(binary.addr, "/readyz").await, 200);
    for _ in 0..3 {
        hangup(&binary);
    }
    assert!(
        logged(&binary, "SIGHUP: nothing to reload").await,
        "{:?}",
        binary.log()
    );
    // SIGHUP's default action would have ended it by now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        binary.child.try_wait().unwrap().is_none(),
        "the process ended"
    );
    assert_eq!(status_of(binary.addr, "/readyz").await, 200);
}

/// `text` padded with newlines to `len` bytes (PEM ignores them): a file
/// replaced by one of the same length and modification time is invisible to
/// the periodic look, so only SIGHUP can reload it.
fn padded(text: &str, len: usize) -> String {
    assert!(text.len() <= len, "{} > {len}", text.len());
    format!("{text}{}", "\n".repeat(len - text.len()))
}

fn write_same_stamp(dir: &Dir, name: &str, text: &str, like: &std::fs::Metadata) {
    let path = PathBuf::from(dir.path(name));
    dir.write(name, text);
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(like.modified().unwrap()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), like.len());
}

#[tokio::test]
async fn a_certificate_rotated_behind_the_poll_s_back_is_served_after_sighup() {
    const CERT_LEN: usize = 2048;
    const KEY_LEN: usize = 1024;
    let dir = Dir::new("sighup");
    let ca = Ca::new("test CA");
    let (cert, key, first) = ca.issue("first", false);
    dir.write("cert.pem", &padded(&cert, CERT_LEN));
    dir.write("key.pem", &padded(&key, KEY_LEN));
    let binary = start(&dir, false, &[]);
    let client = connector(&ca.pem(), &[b"h2"], None);
    assert_eq!(handshake(binary.addr, &client).await.unwrap().0, first);

    let (cert, key, second) = ca.issue("second", false);
    let cert_was = std::fs::metadata(dir.path("cert.pem")).unwrap();
    let key_was = std::fs::metadata(dir.path("key.pem")).unwrap();
    write_same_stamp(&dir, "cert.pem", &padded(&cert, CERT_LEN), &cert_was);
    write_same_stamp(&dir, "key.pem", &padded(&key, KEY_LEN), &key_was);
    // Two periodic looks later, the old pair is still served...
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(handshake(binary.addr, &client).await.unwrap().0, first);
    // ...and SIGHUP serves the new one.
    hangup(&binary);
    assert!(logged(&binary, "reloaded from").await, "{:?}", binary.log());
    assert_eq!(handshake(binary.addr, &client).await.unwrap().0, second);
    assert!(
        binary
            .log()
            .iter()
            .any(|line| line.contains("TLS certificate reloaded") && line.contains("after SIGHUP")),
        "{:?}",
        binary.log()
    );
}

/// A tenants file in a directory of its own.
struct TenantsFile(Dir);

impl TenantsFile {
    fn new(test: &str, text: &str) -> TenantsFile {
        let file = TenantsFile(Dir::new(&format!("reload-{test}")));
        file.write(text);
        file
    }

    fn write(&self, text: &str) {
        self.0.write("tenants.toml", text);
    }

    fn flag(&self) -> String {
        format!("--tenants_file={}", self.0.path("tenants.toml"))
    }
}

fn good(weight_of_b: u32) -> String {
    format!(
        "[servants]\ntokens = [\"{SERVANT_TOKEN}\"]\n\n[[tenant]]\nname = \"a\"\nweight = 1\n\
         user_tokens = [\"a-token\"]\n\n[[tenant]]\nname = \"b\"\nweight = {weight_of_b}\n\
         user_tokens = [\"b-token\"]\n"
    )
}

async fn weight_of_b(addr: SocketAddr) -> Option<f64> {
    let view: serde_json::Value = http_client()
        .get(format!("http://{addr}/api/v1/tenants"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    view["tenants"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == "b")?["weight"]
        .as_f64()
}

#[tokio::test]
async fn a_reload_runs_the_start_s_checks_and_a_refused_one_keeps_the_running_tenants() {
    let file = TenantsFile::new("checks", &good(2));
    let binary = Binary::start_exactly(
        "127.0.0.1:0".parse().unwrap(),
        &[
            &file.flag(),
            "--admin_tokens=ops-token",
            "--debugging_no_inspect_auth",
        ],
        &[],
        None,
    );
    assert_eq!(weight_of_b(binary.addr).await, Some(2.0));
    let bad = [
        (
            good(3).replace("\"b-token\"", "\"ops-token\""),
            "a user token is also an --admin_tokens token",
        ),
        (
            good(3).replace(&format!("\"{SERVANT_TOKEN}\""), "\"ops-token\""),
            "[servants]: a token is also an --admin_tokens token",
        ),
        (
            good(3).replace("\"b-token\"", "\"b-token\", \"\""),
            "an empty token",
        ),
        (
            good(3).replace(&format!("\"{SERVANT_TOKEN}\""), "\"\""),
            "an empty token",
        ),
        (good(3).replace("\"b\"", "\"a\""), "is also named on line"),
        (
            good(3).replace("\"b-token\"", "\"a-token\""),
            "also in tenant \"a\"",
        ),
        (
            good(3).replace("weight = 3", "weight = 0.000001"),
            "from 0.001 to 1000",
        ),
    ];
    for (round, (text, says)) in bad.iter().enumerate() {
        // Warnings are limited to one a second per kind (logging.rs).
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        file.write(text);
        // By the periodic look on even rounds, by SIGHUP on odd ones.
        if round % 2 == 1 {
            hangup(&binary);
        }
        let refused = eventually_within(STEP, || {
            binary
                .log()
                .iter()
                .filter(|line| line.contains("tenants not reloaded"))
                .count()
                > round
        })
        .await;
        assert!(refused, "round {round} ({says}): {:?}", binary.log());
        let last = binary
            .log()
            .into_iter()
            .rfind(|line| line.contains("tenants not reloaded"))
            .unwrap();
        assert!(
            last.contains(says) && last.contains("the running configuration stays"),
            "{last}"
        );
        assert_eq!(weight_of_b(binary.addr).await, Some(2.0), "{says}");
    }
    // A good file still loads after them.
    file.write(&good(5));
    hangup(&binary);
    let deadline = tokio::time::Instant::now() + STEP;
    while weight_of_b(binary.addr).await != Some(5.0) {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", binary.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What the start refuses, the reload refuses too (above): the same
/// messages stop the start.
#[tokio::test]
async fn an_empty_token_or_an_admin_token_in_the_file_stops_the_start() {
    let program = env!("CARGO_BIN_EXE_yadcc-scheduler");
    let file = TenantsFile::new("start", &good(1).replace("\"b-token\"", "\"\""));
    let admin = TenantsFile::new("start-admin", &good(1));
    let cases: [(Vec<String>, &str); 4] = [
        (vec![file.flag()], "an empty token"),
        (
            vec![admin.flag(), "--admin_tokens=a-token".to_owned()],
            "a user token is also an --admin_tokens token",
        ),
        (
            vec![
                "--acceptable_user_tokens=user-token,".to_owned(),
                format!("--acceptable_servant_tokens={SERVANT_TOKEN}"),
            ],
            "--acceptable_user_tokens has an empty entry",
        ),
        (
            vec![
                "--acceptable_user_tokens=user-token".to_owned(),
                format!("--acceptable_servant_tokens=,{SERVANT_TOKEN}"),
            ],
            "--acceptable_servant_tokens has an empty entry",
        ),
    ];
    for (flags, says) in cases {
        let mut command = std::process::Command::new(program);
        command.args(&flags).arg("--listen=127.0.0.1:0");
        let output = run_bounded(command).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}
