//! What the scheduler says about its certificate, with the real binary and
//! certificates made by openssl and rcgen: when it expires (the log at start
//! and on reload, `yadcc_scheduler_tls_certificate_expiry_timestamp_seconds`),
//! and why an encrypted key does not load.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::{STEP, bounded, run_bounded};
use crate::tls::{Dir, metric, start};

const EXPIRY: &str = "yadcc_scheduler_tls_certificate_expiry_timestamp_seconds";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `openssl` with `args`, which must succeed.
async fn openssl(dir: &Dir, args: &[&str]) {
    let mut command = bounded(STEP, "openssl");
    command.args(args).current_dir(dir.path(""));
    let output = run_bounded(command).await;
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A self-signed certificate for localhost valid for `days`, as an
/// operator makes one (`cert.pem`, `key.pem`).
async fn self_signed(dir: &Dir, days: u32) {
    let days = days.to_string();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            &days,
            "-subj",
            "/CN=localhost",
            "-keyout",
            "key.pem.new",
            "-out",
            "cert.pem.new",
        ],
    )
    .await;
    // Moved in as a deployment tool does, key first.
    std::fs::rename(dir.path("key.pem.new"), dir.path("key.pem")).unwrap();
    std::fs::rename(dir.path("cert.pem.new"), dir.path("cert.pem")).unwrap();
}

#[tokio::test]
async fn a_certificate_about_to_expire_or_expired_is_warned_about_and_its_expiry_published() {
    let dir = Dir::new("expiry");
    self_signed(&dir, 10).await;
    let before = now();
    let server = start(&dir, false, &[]);
    let expiry = metric(server.addr, EXPIRY).await;
    let ten_days = 10 * 86_400;
    assert!(
        (before + ten_days - 120..=now() + ten_days + 120).contains(&expiry),
        "{expiry} is not in 10 days"
    );
    assert!(
        server
            .log()
            .iter()
            .any(|line| line.contains("expires in 9 days") || line.contains("expires in 10 days")),
        "{:?}",
        server.log()
    );

    // Replaced by one that already expired (made by rcgen: openssl makes
    // no certificate valid for less than a day).
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2019, 1, 1);
    params.not_after = rcgen::date_time_ymd(2020, 1, 1);
    let key = rcgen::KeyPair::generate().unwrap();
    let expired = params.self_signed(&key).unwrap();
    dir.write("key.pem", &key.serialize_pem());
    dir.write("cert.pem", &expired.pem());
    let new_year_2020 = 1_577_836_800;
    let deadline = tokio::time::Instant::now() + STEP;
    while metric(server.addr, EXPIRY).await != new_year_2020 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", server.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        server.log().iter().any(|line| line.contains("expired")
            && line.contains("Wed, 01 Jan 2020 00:00:00 GMT")
            && line.contains("clients refuse it")),
        "{:?}",
        server.log()
    );
}

#[tokio::test]
async fn an_encrypted_key_is_refused_with_what_to_do() {
    let dir = Dir::new("encrypted");
    self_signed(&dir, 30).await;
    openssl(
        &dir,
        &[
            "pkey",
            "-in",
            "key.pem",
            "-aes256",
            "-passout",
            "pass:secret",
            "-out",
            "encrypted.pem",
        ],
    )
    .await;
    let mut scheduler = bounded(STEP, env!("CARGO_BIN_EXE_yadcc-scheduler"));
    scheduler.args([
        "--listen=127.0.0.1:0".to_owned(),
        "--acceptable_user_tokens=u".to_owned(),
        "--acceptable_servant_tokens=s".to_owned(),
        format!("--tls_cert_file={}", dir.path("cert.pem")),
        format!("--tls_key_file={}", dir.path("encrypted.pem")),
    ]);
    let output = run_bounded(scheduler).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "started with an encrypted key");
    assert!(
        stderr.contains("encrypted.pem") && stderr.contains("encrypted with a passphrase"),
        "{stderr}"
    );
    assert!(stderr.contains("openssl pkey -in"), "{stderr}");
}
