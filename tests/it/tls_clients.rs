//! Stock clients over https with the test CA (tests/it/tls.rs makes it):
//! `buf curl` with `--cacert`, a Python grpcio secure channel running the
//! whole gRPC check list, and headless Chromium on the dashboard trusting
//! the server's key by its SPKI hash. (A plaintext flare heartbeat on the
//! same port: tests/it/tls.rs.)

use std::path::{Path, PathBuf};

use base64::Engine as _;
use rcgen::PublicKeyData as _;
use sha2::{Digest, Sha256};
use yadcc_scheduler::security::{SecuritySettings, TlsFiles};

use crate::{
    browser::{chromium_or_skip, run_chromium},
    grpc::{rpc_path, server_secured},
    grpc_clients::python_client_passes,
    support::*,
    tls::{Ca, Dir, server_files, start},
    tools::{installed, run, tool},
};

/// The server's TLS files in `dir` (`cert.pem`, `key.pem`) and the CA file.
fn tls_files(dir: &Dir) -> (SecuritySettings, String) {
    let ca = Ca::new("clients' test CA");
    server_files(dir, &ca, "scheduler");
    let ca_file = dir.write("ca.pem", &ca.pem());
    let security = SecuritySettings {
        tls: Some(TlsFiles {
            cert: PathBuf::from(dir.path("cert.pem")),
            key: PathBuf::from(dir.path("key.pem")),
            client_ca: None,
        }),
        ..SecuritySettings::default()
    };
    (security, ca_file)
}

#[tokio::test]
async fn buf_curl_lists_and_calls_over_https_with_the_ca() {
    let Some(buf) = installed("npm/node_modules/.bin/buf") else {
        return;
    };
    let dir = Dir::new("buf");
    let (security, ca_file) = tls_files(&dir);
    let server = server_secured(security).await;
    let base = format!("https://localhost:{}", server.addr.port());
    for protocol in ["grpc", "grpcweb", "connect"] {
        let mut list = tool(&buf);
        list.args(["curl", "--cacert", &ca_file, "--protocol", protocol])
            .args(["--list-methods", &base]);
        let output = run(list).await;
        let listed = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{protocol}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(listed.contains("SchedulerService/Heartbeat"), "{listed}");

        let mut call = tool(&buf);
        let data = format!(r#"{{"token":"{USER_TOKEN}"}}"#);
        call.args(["curl", "--cacert", &ca_file, "--protocol", protocol])
            .args(["-d", &data, &format!("{base}{}", rpc_path("GetConfig"))]);
        let output = run(call).await;
        assert!(
            output.status.success(),
            "{protocol}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert!(answer["servingDaemonToken"].is_string(), "{answer}");
    }
    // Without the CA, buf refuses the server: the certificate is checked.
    let mut untrusted = tool(&buf);
    untrusted.args(["curl", "--protocol", "grpc", "--list-methods", &base]);
    let output = run(untrusted).await;
    assert!(!output.status.success(), "an unknown CA is refused");
    server.stop().await;
}

#[tokio::test]
async fn a_python_grpcio_secure_channel_calls_every_rpc() {
    let Some(python_path) = installed("python/grpc_tools") else {
        return;
    };
    let _heavy = heavy().await;
    let dir = Dir::new("grpcio");
    let (security, ca_file) = tls_files(&dir);
    let server = server_secured(security).await;
    // The name the certificate carries.
    let target = format!("localhost:{}", server.addr.port());
    python_client_passes(&python_path, &target, Some(Path::new(&ca_file))).await;
    server.stop().await;
}

#[tokio::test]
async fn chromium_shows_the_dashboard_over_https_trusting_the_servers_key() {
    let _heavy = heavy().await;
    let Some(binary) = chromium_or_skip() else {
        return;
    };
    let dir = Dir::new("chromium");
    let ca = Ca::new("browser test CA");
    let (cert, key, _) = ca.issue("scheduler", false);
    dir.write("cert.pem", &cert);
    dir.write("key.pem", &key);
    // What Chromium's --ignore-certificate-errors-spki-list takes: the
    // base64 SHA-256 of the server key's SubjectPublicKeyInfo.
    let spki = rcgen::KeyPair::from_pem(&key)
        .unwrap()
        .subject_public_key_info();
    let pin = base64::engine::general_purpose::STANDARD.encode(Sha256::digest(&spki));
    let server = start(&dir, false, &["--debugging_no_inspect_auth"]);
    let url = format!("https://localhost:{}/#tab=servants", server.addr.port());
    let dump = |extra: Vec<String>| {
        let (binary, url) = (binary.clone(), url.clone());
        tokio::task::spawn_blocking(move || {
            let mut flags = vec!["--dump-dom".to_owned()];
            flags.extend(extra);
            run_chromium(&binary, &url, &flags)
        })
    };
    let run = dump(vec![format!("--ignore-certificate-errors-spki-list={pin}")])
        .await
        .expect("chromium task");
    assert!(
        run.stdout.contains(r#"id="servants-filter""#),
        "the dashboard's modules ran over https: {}",
        run.stdout
    );
    assert!(
        run.console.is_empty(),
        "no failed fetch, CSP violation or error over https: {:#?}",
        run.console
    );
    // Without the pin the certificate is unknown: no dashboard.
    let refused = dump(Vec::new()).await.expect("chromium task");
    assert!(
        !refused.stdout.contains(r#"id="servants-filter""#),
        "an unknown CA's certificate is not trusted"
    );
}
