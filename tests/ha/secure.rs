//! The hot standby on an etcd that asks for TLS, a client certificate
//! (`--client-cert-auth`) and a user's password (etcd's `auth enable`),
//! with tokens that lapse within seconds (`--auth-token-ttl`): a CA made
//! here (rcgen), Debian's etcd, the scheduler binary.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use base64::{Engine, engine::general_purpose::STANDARD};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

use crate::support::*;

/// etcd's `--auth-token-ttl`: short, so that a standby's token lapses
/// while it waits in its campaign.
const TOKEN_TTL: Duration = Duration::from_secs(2);
/// The schedulers' etcd user: allowed the election's keys only.
const USER: &str = "yadcc";
const PASSWORD: &str = "etcd-test-password";

/// The test CA, etcd's certificate, the schedulers' client certificate and
/// the password file, written into a scratch directory.
struct Files {
    ca: PathBuf,
    etcd_cert: PathBuf,
    etcd_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    password: PathBuf,
}

impl Files {
    fn write(dir: &Path) -> Files {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "etcd test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let issue = |names: Vec<String>, name: &str, purpose| {
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![purpose];
            let key = KeyPair::generate().unwrap();
            let certificate = params.signed_by(&key, &ca).unwrap();
            (certificate.pem(), key.serialize_pem())
        };
        let (etcd_cert, etcd_key) = issue(
            vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
            "etcd",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        // Not an etcd user's name: etcd would take a certificate's common
        // name as the user of a call without a token.
        let (client_cert, client_key) = issue(
            Vec::new(),
            "scheduler-client",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        let file = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        Files {
            ca: file("ca.pem", &ca.pem()),
            etcd_cert: file("etcd.pem", &etcd_cert),
            etcd_key: file("etcd.key", &etcd_key),
            client_cert: file("client.pem", &client_cert),
            client_key: file("client.key", &client_key),
            password: file("password", &format!("{PASSWORD}\n")),
        }
    }

    /// The flags of a scheduler on this etcd, with `password` as its
    /// password file.
    fn flags(&self, password: &Path) -> Vec<String> {
        vec![
            format!("--ha_etcd_ca_file={}", self.ca.display()),
            format!("--ha_etcd_cert_file={}", self.client_cert.display()),
            format!("--ha_etcd_key_file={}", self.client_key.display()),
            format!("--ha_etcd_user={USER}"),
            format!("--ha_etcd_password_file={}", password.display()),
            NO_BALANCER.to_owned(),
        ]
    }
}

/// etcd serving its clients over TLS with client certificates, plus a
/// plaintext loopback port for the test's own setup (users, `auth enable`).
struct SecureEtcd {
    _process: External,
    https_url: String,
    setup_port: u16,
}

impl SecureEtcd {
    fn start(program: &Path, dir: &Path, files: &Files) -> SecureEtcd {
        for attempt in 1..=ETCD_STARTS {
            // A member that exited may have begun its data under the old ports.
            let _ = std::fs::remove_dir_all(dir.join("etcd"));
            match SecureEtcd::try_start(program, dir, files) {
                Ok(etcd) => return etcd,
                Err(log) if attempt < ETCD_STARTS => {
                    eprintln!(
                        "etcd exited before answering; again on fresh ports. Its log:\n{log}"
                    );
                }
                Err(log) => {
                    panic!("etcd exited before answering, {attempt} times; its log:\n{log}")
                }
            }
        }
        unreachable!("the last start returns or panics")
    }

    fn try_start(program: &Path, dir: &Path, files: &Files) -> Result<SecureEtcd, String> {
        let (client_port, setup_port, peer_port) = (free_port(), free_port(), free_port());
        let https_url = format!("https://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut command = guarded(program);
        command.args([
            "--name=ha-secure".to_owned(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={https_url},http://127.0.0.1:{setup_port}"),
            format!("--advertise-client-urls={https_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=ha-secure={peer_url}"),
            format!("--cert-file={}", files.etcd_cert.display()),
            format!("--key-file={}", files.etcd_key.display()),
            format!("--trusted-ca-file={}", files.ca.display()),
            "--client-cert-auth".to_owned(),
            "--auth-token=simple".to_owned(),
            format!("--auth-token-ttl={}", TOKEN_TTL.as_secs()),
            "--log-level=error".to_owned(),
        ]);
        let log = dir.join("etcd.log");
        let mut process = External::spawn_logged(command, &log);
        etcd_answers(&mut process, setup_port, &log)?;
        Ok(SecureEtcd {
            _process: process,
            https_url,
            setup_port,
        })
    }

    /// One call of etcd's JSON gateway (before `auth enable`: no token).
    fn call(&self, path: &str, body: &str) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.setup_port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        write!(
            stream,
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.0 200"), "{path}: {answer}");
    }

    /// `root` (which `auth enable` needs) and the schedulers' user, whose
    /// role may read and write the keys beginning with the election's name
    /// only (the election's keys and its saved state), then `auth enable`:
    /// what docs/failover.md tells operators to run with etcdctl.
    fn enable_auth(&self) {
        let prefix = "yadcc-scheduler";
        let end = "yadcc-schedules";
        for (path, body) in [
            (
                "/v3/auth/user/add",
                r#"{"name":"root","password":"root-password"}"#.to_owned(),
            ),
            ("/v3/auth/role/add", r#"{"name":"root"}"#.to_owned()),
            (
                "/v3/auth/user/grant",
                r#"{"user":"root","role":"root"}"#.to_owned(),
            ),
            (
                "/v3/auth/user/add",
                format!(r#"{{"name":"{USER}","password":"{PASSWORD}"}}"#),
            ),
            ("/v3/auth/role/add", r#"{"name":"yadcc"}"#.to_owned()),
            (
                "/v3/auth/role/grant",
                format!(
                    r#"{{"name":"yadcc","perm":{{"permType":"READWRITE","key":"{}","range_end":"{}"}}}}"#,
                    STANDARD.encode(prefix),
                    STANDARD.encode(end)
                ),
            ),
            (
                "/v3/auth/user/grant",
                format!(r#"{{"user":"{USER}","role":"yadcc"}}"#),
            ),
            ("/v3/auth/enable", "{}".to_owned()),
        ] {
            self.call(path, &body);
        }
    }
}

/// etcd with TLS, client certificates and authentication, and its files;
/// None (a skip, outside CI) without etcd.
fn secure_etcd(name: &str) -> Option<(SecureEtcd, Files, Scratch)> {
    let program = tool("etcd")?;
    let scratch = Scratch::new(name);
    let files = Files::write(&scratch.0);
    let etcd = SecureEtcd::start(&program, &scratch.0, &files);
    etcd.enable_auth();
    Some((etcd, files, scratch))
}

#[test]
fn over_mutual_tls_as_an_etcd_user_one_of_two_leads_and_lapsed_tokens_are_renewed() {
    let _turn = one_at_a_time();
    let Some((etcd, files, _scratch)) = secure_etcd("secure") else {
        return;
    };
    let flags = files.flags(&files.password);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut a = Scheduler::start_with(free_port(), &etcd.https_url, &flags);
    let mut b = Scheduler::start_with(free_port(), &etcd.https_url, &flags);
    let (leader, standby) = roles(&mut a, &mut b);
    let named = format!("standby, leader is {}", leader.name());
    wait_until(
        Duration::from_secs(5),
        "the standby names the leader",
        || standby.readyz() == Some((503, named.clone())),
    );
    // The standby waits in its campaign; its token lapses meanwhile.
    std::thread::sleep(TOKEN_TTL * 2);
    leader.kill_9();
    let took = wait_until(Duration::from_secs(15), "the standby leads", || {
        standby.is_ready()
    });
    assert!(took < Duration::from_secs(10), "took over in {took:?}");
    let log = standby.log();
    assert!(
        log.iter()
            .any(|line| line.contains("authenticated again") && line.contains("invalid auth token")),
        "the lapsed token was renewed: {log:#?}"
    );
    assert!(
        !log.iter().any(|line| line.contains("not campaigning")),
        "{log:#?}"
    );
}

#[test]
fn a_wrong_etcd_password_stops_the_start_with_the_reason() {
    let _turn = one_at_a_time();
    let Some((etcd, files, scratch)) = secure_etcd("password") else {
        return;
    };
    let wrong = scratch.0.join("wrong-password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    let mut command = crate::processes::command(env!("CARGO_BIN_EXE_yadcc-scheduler"));
    command
        .args([
            format!("--listen=127.0.0.1:{}", free_port()),
            format!("--acceptable_user_tokens={USER_TOKEN}"),
            format!("--acceptable_servant_tokens={SERVANT_TOKEN}"),
            format!("--serving_daemon_token_secret={SECRET}"),
            format!("--ha_etcd_endpoints={}", etcd.https_url),
        ])
        .args(files.flags(&wrong))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = crate::processes::spawn(command).expect("start the scheduler");
    let deadline = Instant::now() + START_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running with a wrong password");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("refused user \"{USER}\""))
            && stderr.contains("--ha_etcd_password_file")
            && stderr.contains("invalid user ID or password"),
        "{stderr}"
    );
}
