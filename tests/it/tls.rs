//! TLS on the daemons' port, over real sockets with the real binary: a test
//! CA made here (rcgen), curl with `--cacert`, HTTP/2 by ALPN, a plaintext
//! flare heartbeat on the same port, certificate rotation, client
//! certificates accepted and refused, the inspection credential refused over
//! plain HTTP (the guessing limit: `guessing.rs`).

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::{
    TlsConnector,
    rustls::{
        self, ClientConfig, RootCertStore,
        pki_types::{CertificateDer, ServerName, pem::PemObject},
    },
};

use crate::support::{
    Binary, Connection, Launch, Method, STEP, bounded, heartbeat, run_bounded, servant_location,
};

pub(crate) const CREDENTIAL: &str = "ops:s3cret";

/// A CA of the test's own.
pub(crate) struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate and its key, PEM: for `localhost` and 127.0.0.1 (a
    /// server's), or a client's named `name`.
    pub(crate) fn issue(
        &self,
        name: &str,
        client: bool,
    ) -> (String, String, CertificateDer<'static>) {
        let names = if client {
            Vec::new()
        } else {
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()]
        };
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.issuer).unwrap();
        (
            certificate.pem(),
            key.serialize_pem(),
            certificate.der().clone(),
        )
    }
}

/// Files in a directory of the test's own, removed when dropped.
pub(crate) struct Dir(PathBuf);

impl Dir {
    pub(crate) fn new(test: &str) -> Dir {
        let path = std::env::temp_dir().join(format!("yadcc-tls-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Dir(path)
    }

    pub(crate) fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        // Replaced as a deployment tool does: a new file moved over the old.
        let staged = self.0.join(format!("{name}.new"));
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(&staged, &path).unwrap();
        path.display().to_string()
    }

    pub(crate) fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A scheduler with TLS from `dir` (`cert.pem`, `key.pem`, and `client-ca.pem`
/// when `client_ca`), the inspection credential, and `more` flags.
pub(crate) fn start(dir: &Dir, client_ca: bool, more: &[&str]) -> Binary {
    let mut flags = vec![
        format!("--tls_cert_file={}", dir.path("cert.pem")),
        format!("--tls_key_file={}", dir.path("key.pem")),
        format!("--inspect_credential={CREDENTIAL}"),
    ];
    if client_ca {
        flags.push(format!(
            "--tls_client_ca_file={}",
            dir.path("client-ca.pem")
        ));
    }
    flags.extend(more.iter().map(|flag| (*flag).to_owned()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Launch {
        flags: &flags,
        ..Launch::default()
    }
    .start()
}

/// curl with `args`: (exit status, stdout).
async fn curl(args: &[&str]) -> (i32, String) {
    let mut command = bounded(STEP, "curl");
    command.args(["--silent", "--show-error", "--max-time", "8"]);
    command.args(args);
    let output = run_bounded(command).await;
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

/// A TLS client trusting `ca_pem`, offering `alpn`, with a client
/// certificate if given.
pub(crate) fn connector(
    ca_pem: &str,
    alpn: &[&[u8]],
    client: Option<(&str, &str)>,
) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(certificate.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(Result::unwrap)
                    .collect(),
                rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

/// A handshake with the server: the certificate it served and the protocol
/// ALPN chose.
pub(crate) async fn handshake(
    addr: SocketAddr,
    connector: &TlsConnector,
) -> std::io::Result<(CertificateDer<'static>, Option<Vec<u8>>)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    let stream = tokio::time::timeout(STEP, connector.connect(name, tcp))
        .await
        .expect("handshake in time")?;
    let (_, connection) = stream.get_ref();
    let served = connection.peer_certificates().unwrap()[0].clone();
    Ok((served, connection.alpn_protocol().map(<[u8]>::to_vec)))
}

/// One HTTP/1.1 request on a fresh plaintext connection, sent after
/// `prefix` (a PROXY header); the status code and the whole answer.
pub(crate) async fn plain_request(addr: SocketAddr, prefix: &str, head: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("{prefix}{head}Host: x\r\nConnection: close\r\n\r\n");
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
    (status, answer)
}

pub(crate) fn basic(credential: &str) -> String {
    use base64::Engine as _;
    format!(
        "Authorization: Basic {}\r\n",
        base64::engine::general_purpose::STANDARD.encode(credential)
    )
}

/// A PROXY v1 header naming `client` (a scheduler that trusts loopback as a
/// proxy sees the request as `client`'s).
pub(crate) fn proxied_from(client: &str) -> String {
    format!("PROXY TCP4 {client} 127.0.0.1 40000 8336\r\n")
}

pub(crate) async fn metric(addr: SocketAddr, series: &str) -> u64 {
    let (_, text) = plain_request(addr, "", "GET /metrics HTTP/1.1\r\n").await;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

pub(crate) fn server_files(dir: &Dir, ca: &Ca, name: &str) -> CertificateDer<'static> {
    let (cert, key, der) = ca.issue(name, false);
    dir.write("key.pem", &key);
    dir.write("cert.pem", &cert);
    der
}

#[tokio::test]
async fn https_by_alpn_and_plaintext_daemons_share_the_port() {
    let dir = Dir::new("alpn");
    let ca = Ca::new("test CA");
    server_files(&dir, &ca, "scheduler");
    let ca_file = dir.write("ca.pem", &ca.pem());
    let server = start(&dir, false, &[]);
    let url = format!("https://localhost:{}/healthz", server.addr.port());

    let (status, version) = curl(&[
        "--cacert",
        &ca_file,
        "-o",
        "/dev/null",
        "-w",
        "%{http_version}",
        &url,
    ])
    .await;
    assert_eq!((status, version.as_str()), (0, "2"), "curl negotiates h2");
    let (status, version) = curl(&[
        "--cacert",
        &ca_file,
        "--http1.1",
        "-o",
        "/dev/null",
        "-w",
        "%{http_version}",
        &url,
    ])
    .await;
    assert_eq!((status, version.as_str()), (0, "1.1"));
    let (status, _) = curl(&["-o", "/dev/null", &url]).await;
    assert_eq!(status, 60, "without the test CA curl does not trust it");

    // JSON over TLS, HTTP/2.
    let body = format!(
        "{{\"token\":\"{}\",\"version\":1}}",
        crate::support::USER_TOKEN
    );
    let (status, answer) = curl(&[
        "--cacert",
        &ca_file,
        "-H",
        "Content-Type: application/json",
        "--data",
        &body,
        &format!(
            "https://localhost:{}/rpc/yadcc.scheduler.SchedulerService.GetConfig",
            server.addr.port()
        ),
    ])
    .await;
    assert_eq!(status, 0);
    assert!(answer.contains("servingDaemonToken"), "{answer}");

    let (_, alpn) = handshake(
        server.addr,
        &connector(&ca.pem(), &[b"h2", b"http/1.1"], None),
    )
    .await
    .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    let (_, alpn) = handshake(server.addr, &connector(&ca.pem(), &[b"http/1.1"], None))
        .await
        .unwrap();
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));

    // A stock daemon's plaintext heartbeat on the same port.
    let mut daemon = Connection::open(server.addr).await;
    let answer = daemon
        .flare_call(
            1,
            Method::Heartbeat,
            &heartbeat(&servant_location("127.0.0.1", 9000), 4),
        )
        .await;
    assert_eq!(answer.status(), 0, "{}", answer.description());
}

#[tokio::test]
async fn a_replaced_certificate_is_served_to_new_connections_and_a_bad_one_is_not() {
    let dir = Dir::new("rotation");
    let ca = Ca::new("test CA");
    let first = server_files(&dir, &ca, "first");
    let server = start(&dir, false, &[]);
    let client = connector(&ca.pem(), &[b"h2"], None);
    assert_eq!(handshake(server.addr, &client).await.unwrap().0, first);

    let second = server_files(&dir, &ca, "second");
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let (served, _) = handshake(server.addr, &client).await.unwrap();
        if served == second {
            break;
        }
        assert_eq!(served, first);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate is not served: {:?}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A rotation may have caught the new key beside the old certificate.
    let failures = metric(server.addr, "yadcc_scheduler_tls_reload_failures_total").await;
    dir.write(
        "cert.pem",
        "-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n",
    );
    let deadline = tokio::time::Instant::now() + STEP;
    while metric(server.addr, "yadcc_scheduler_tls_reload_failures_total").await == failures {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", server.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(handshake(server.addr, &client).await.unwrap().0, second);
    assert!(
        server
            .log()
            .iter()
            .any(|line| line.contains("still serving the previous certificate")),
        "{:?}",
        server.log()
    );
}

#[tokio::test]
async fn a_client_certificate_the_ca_signed_is_an_inspector_and_another_is_refused() {
    let dir = Dir::new("mtls");
    let ca = Ca::new("server CA");
    server_files(&dir, &ca, "scheduler");
    let ca_file = dir.write("ca.pem", &ca.pem());
    let clients = Ca::new("inspectors CA");
    dir.write("client-ca.pem", &clients.pem());
    let (cert, key, _) = clients.issue("alice", true);
    let (cert_file, key_file) = (dir.write("alice.pem", &cert), dir.write("alice.key", &key));
    let strangers = Ca::new("another CA");
    let (cert, key, _) = strangers.issue("mallory", true);
    let (stranger_cert, stranger_key) = (
        dir.write("mallory.pem", &cert),
        dir.write("mallory.key", &key),
    );
    let server = start(&dir, true, &[]);
    let url = format!("https://localhost:{}/api/v1/overview", server.addr.port());
    let code = |args: &[&str]| {
        let mut all = vec![
            "--cacert",
            ca_file.as_str(),
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ];
        all.extend_from_slice(args);
        all.push(url.as_str());
        all.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };

    let with_cert = code(&["--cert", &cert_file, "--key", &key_file]);
    let with_cert: Vec<&str> = with_cert.iter().map(String::as_str).collect();
    assert_eq!(
        curl(&with_cert).await,
        (0, "200".to_owned()),
        "no password needed"
    );
    let without = code(&[]);
    let without: Vec<&str> = without.iter().map(String::as_str).collect();
    assert_eq!(
        curl(&without).await,
        (0, "401".to_owned()),
        "served, not let in"
    );
    let stranger = code(&["--cert", &stranger_cert, "--key", &stranger_key]);
    let stranger: Vec<&str> = stranger.iter().map(String::as_str).collect();
    let (status, _) = curl(&stranger).await;
    assert_ne!(
        status, 0,
        "a certificate another CA signed fails the handshake"
    );
    assert!(metric(server.addr, "yadcc_scheduler_tls_handshake_failures_total").await >= 1);
}

#[tokio::test]
async fn a_replaced_client_ca_verifies_new_connections_and_its_predecessor_no_longer_does() {
    let dir = Dir::new("client-ca-rotation");
    let ca = Ca::new("server CA");
    server_files(&dir, &ca, "scheduler");
    let ca_file = dir.write("ca.pem", &ca.pem());
    let (old, new) = (Ca::new("old inspectors CA"), Ca::new("new inspectors CA"));
    dir.write("client-ca.pem", &old.pem());
    let client = |ca: &Ca, name: &str| {
        let (cert, key, _) = ca.issue(name, true);
        (
            dir.write(&format!("{name}.pem"), &cert),
            dir.write(&format!("{name}.key"), &key),
        )
    };
    let (alice, bob) = (client(&old, "alice"), client(&new, "bob"));
    let server = start(&dir, true, &[]);
    let url = format!("https://localhost:{}/api/v1/overview", server.addr.port());
    let overview = |(cert, key): &(String, String)| {
        let args = [
            "--cacert",
            &ca_file,
            "--cert",
            cert,
            "--key",
            key,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &url,
        ]
        .map(str::to_owned);
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            curl(&args).await
        }
    };
    let let_in = (0, "200".to_owned());
    assert_eq!(overview(&alice).await, let_in, "the old CA's client");
    assert_ne!(overview(&bob).await.0, 0, "the new CA is not trusted yet");

    dir.write("client-ca.pem", &new.pem());
    let deadline = tokio::time::Instant::now() + STEP;
    while overview(&bob).await != let_in {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new client CA is not used: {:?}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_ne!(
        overview(&alice).await.0,
        0,
        "the old CA's client is refused"
    );
    assert!(
        server
            .log()
            .iter()
            .any(|line| line.contains("TLS client CA reloaded")),
        "{:?}",
        server.log()
    );

    // A CA file that does not load keeps the one before.
    let failures = metric(server.addr, "yadcc_scheduler_tls_reload_failures_total").await;
    dir.write("client-ca.pem", "not a certificate\n");
    let deadline = tokio::time::Instant::now() + STEP;
    while metric(server.addr, "yadcc_scheduler_tls_reload_failures_total").await == failures {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", server.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(overview(&bob).await, let_in, "still the new CA");
}

#[tokio::test]
async fn with_tls_the_credential_is_refused_over_plain_http_except_from_loopback() {
    let dir = Dir::new("plaintext");
    let ca = Ca::new("test CA");
    server_files(&dir, &ca, "scheduler");
    let trusting = ["--trusted_proxies=127.0.0.1"];
    let server = start(&dir, false, &trusting);
    let head = format!("GET /api/v1/overview HTTP/1.1\r\n{}", basic(CREDENTIAL));

    let (status, answer) = plain_request(server.addr, &proxied_from("192.0.2.10"), &head).await;
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("HTTPS only"), "{answer}");
    let (status, _) = plain_request(server.addr, "", &head).await;
    assert_eq!(status, 200, "from loopback");

    let allowing = start(&dir, false, &[trusting[0], "--allow_plaintext_inspection"]);
    let (status, _) = plain_request(allowing.addr, &proxied_from("192.0.2.10"), &head).await;
    assert_eq!(status, 200, "--allow_plaintext_inspection");

    // Over TLS from the same remote address: accepted.
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(proxied_from("192.0.2.10").as_bytes())
        .await
        .unwrap();
    let client = connector(&ca.pem(), &[b"http/1.1"], None);
    let mut tls = client
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(format!("{head}Host: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(STEP, tls.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// ListServantStates with `token`, as plain JSON from `prefix`'s client.
fn admin_head(token: &str, extra: &str) -> String {
    format!(
        "POST /rpc/yadcc.scheduler.AdminService.ListServantStates HTTP/1.1\r\n\
         Authorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Content-Length: 2\r\n{extra}"
    )
}

#[tokio::test]
async fn with_tls_an_admin_token_is_refused_in_clear_from_afar_through_any_proxy() {
    let dir = Dir::new("plaintext-admin");
    let ca = Ca::new("test CA");
    server_files(&dir, &ca, "scheduler");
    let flags = [
        "--admin_tokens=operator-token-1",
        "--trusted_proxies=127.0.0.1",
    ];
    let server = start(&dir, false, &flags);
    // plain_request ends the head; the two-byte body `{}` follows it.
    let call = |prefix: String, extra: &str| {
        let head = admin_head("operator-token-1", extra);
        async move {
            let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
            let request = format!("{prefix}{head}Host: x\r\nConnection: close\r\n\r\n{{}}");
            stream.write_all(request.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut answer)).await;
            String::from_utf8_lossy(&answer).into_owned()
        }
    };
    let answer = call(proxied_from("10.1.2.3"), "").await;
    assert!(answer.starts_with("HTTP/1.1 403"), "PROXY header: {answer}");
    assert!(answer.contains("HTTPS only"), "{answer}");
    let answer = call(String::new(), "X-Forwarded-For: 10.1.2.3\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 403"),
        "X-Forwarded-For: {answer}"
    );
    let answer = call(String::new(), "").await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "from loopback: {answer}"
    );
    assert_eq!(
        metric(
            server.addr,
            "yadcc_scheduler_failed_credentials_total{surface=\"admin_token\"}"
        )
        .await,
        0,
        "refused unread: no guess"
    );

    // Over TLS from the same remote address: accepted.
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(proxied_from("10.1.2.3").as_bytes())
        .await
        .unwrap();
    let client = connector(&ca.pem(), &[b"http/1.1"], None);
    let mut tls = client
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let head = admin_head("operator-token-1", "");
    tls.write_all(format!("{head}Host: x\r\nConnection: close\r\n\r\n{{}}").as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(STEP, tls.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "over TLS: {answer}");

    // The operator's choice, for a proxy that terminates TLS itself.
    let allowing = start(
        &dir,
        false,
        &[flags[0], flags[1], "--allow_plaintext_inspection"],
    );
    let mut stream = tokio::net::TcpStream::connect(allowing.addr).await.unwrap();
    let request = format!(
        "{}{}Host: x\r\nConnection: close\r\n\r\n{{}}",
        proxied_from("10.1.2.3"),
        admin_head("operator-token-1", "")
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "allowed: {answer}");
}
