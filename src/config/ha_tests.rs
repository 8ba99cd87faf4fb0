//! The hot standby's flags (`--ha_*`): the election, and how etcd is
//! reached (TLS, client certificates, etcd's users).

use super::{Cli, tests::cli};

#[test]
fn a_hot_standby_needs_the_shared_secret_and_whole_second_leases() {
    let tokens = [
        "--acceptable_user_tokens=u",
        "--acceptable_servant_tokens=s",
    ];
    let with = |extra: &[&str]| {
        let mut args = tokens.to_vec();
        args.extend_from_slice(extra);
        cli(&args).settings()
    };
    // Without the flag nothing changes.
    assert_eq!(with(&[]).unwrap().ha, None);
    let error = with(&["--ha_etcd_endpoints=127.0.0.1:2379"]).unwrap_err();
    assert!(error.contains("--serving_daemon_token_secret"), "{error}");
    let ha = with(&[
        "--ha_etcd_endpoints=127.0.0.1:2379,http://etcd-2:2379",
        "--serving_daemon_token_secret=x",
    ])
    .unwrap()
    .ha
    .expect("HA settings");
    assert_eq!(
        ha.endpoints,
        ["http://127.0.0.1:2379", "http://etcd-2:2379"],
        "a bare address is http"
    );
    assert_eq!(ha.election_name, "yadcc-scheduler");
    assert_eq!(ha.lease_ttl, std::time::Duration::from_secs(3));
    assert_eq!(
        ha.resign_unchecked_after,
        Some(std::time::Duration::from_secs(3)),
        "a leader no balancer reaches resigns by default: well above HAProxy's \
         300 ms checks (2 missed mark it down)"
    );
    let never = with(&[
        "--ha_etcd_endpoints=etcd:2379",
        "--serving_daemon_token_secret=x",
        "--ha_resign_unchecked_after=0s",
    ])
    .unwrap()
    .ha
    .expect("HA settings");
    assert_eq!(never.resign_unchecked_after, None, "0 turns it off");
    for (bad, says) in [
        ("--ha_lease_ttl=2500ms", "whole seconds"),
        ("--ha_lease_ttl=1s", "at least 2s"),
        (
            "--ha_etcd_endpoints=https://etcd:2379",
            "need --ha_etcd_ca_file",
        ),
        (
            "--ha_etcd_endpoints=https://etcd-1:2379,http://etcd-2:2379",
            "every endpoint is https:// or none",
        ),
        (
            "--ha_etcd_endpoints=grpc://etcd:2379",
            "not an http:// or https://",
        ),
        ("--ha_election_name=", "must not be empty"),
    ] {
        let mut extra = vec!["--serving_daemon_token_secret=x", bad];
        if !bad.starts_with("--ha_etcd_endpoints") {
            extra.push("--ha_etcd_endpoints=etcd:2379");
        }
        let error = with(&extra).unwrap_err();
        assert!(error.contains(says), "{bad}: {error}");
    }
}

#[test]
fn etcd_tls_and_credentials_are_checked_and_read_at_start() {
    let dir = std::env::temp_dir().join(format!("etcd-access-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let certificate = rcgen::CertificateParams::new(vec!["etcd".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        format!("{}", path.display())
    };
    let ca = file("ca.pem", &certificate.pem());
    let key_file = file("key.pem", &key.serialize_pem());
    let password = file("password", "s3cret\n");
    let with = |extra: &[&str]| {
        let mut args = vec![
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
            "--serving_daemon_token_secret=x",
        ];
        args.extend_from_slice(extra);
        cli(&args)
            .settings()
            .map(|settings| settings.ha.expect("HA").access)
    };
    let https = "--ha_etcd_endpoints=https://etcd-1:2379,https://etcd-2:2379";
    let ca_flag = format!("--ha_etcd_ca_file={ca}");
    let access = with(&[
        https,
        &ca_flag,
        &format!("--ha_etcd_cert_file={ca}"),
        &format!("--ha_etcd_key_file={key_file}"),
        "--ha_etcd_user=yadcc",
        &format!("--ha_etcd_password_file={password}"),
    ])
    .unwrap();
    let credentials = access.credentials.expect("credentials");
    assert_eq!(credentials.user, "yadcc");
    assert_eq!(
        credentials.password.0, "s3cret",
        "the newline is not the password's"
    );
    assert!(!format!("{credentials:?}").contains("s3cret"), "redacted");
    assert!(access.client_identity.is_some());
    assert_eq!(
        with(&["--ha_etcd_endpoints=etcd:2379"]).unwrap(),
        crate::ha::EtcdAccess::default()
    );

    let missing = format!("{}", dir.join("missing").display());
    let not_pem = file("not.pem", "not a certificate\n");
    let two_lines = file("two-lines", "a\nb\n");
    for (flags, says) in [
        (
            vec!["--ha_etcd_endpoints=etcd:2379", &ca_flag],
            "for https://",
        ),
        (
            vec![https, "--ha_etcd_ca_file=/nonexistent/ca.pem"],
            "/nonexistent/ca.pem",
        ),
        (
            vec![https, &format!("--ha_etcd_ca_file={not_pem}")],
            "no PEM certificate",
        ),
        (
            vec![
                https,
                &ca_flag,
                "--ha_etcd_user=yadcc",
                &format!("--ha_etcd_password_file={missing}"),
            ],
            "--ha_etcd_password_file",
        ),
        (
            vec![
                https,
                &ca_flag,
                "--ha_etcd_user=yadcc",
                &format!("--ha_etcd_password_file={two_lines}"),
            ],
            "on one line",
        ),
    ] {
        let error = with(&flags).unwrap_err();
        assert!(error.contains(says), "{flags:?}: {error}");
    }
    // A user without a password file, or a certificate without its key:
    // clap refuses the command line.
    let cert_only = format!("--ha_etcd_cert_file={ca}");
    for lonely in ["--ha_etcd_user=yadcc", cert_only.as_str()] {
        let parsed = Cli::try_parse_args(["yadcc-scheduler", https, lonely]);
        assert!(parsed.is_err(), "{lonely}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn failsafe_needs_a_secret_file_of_16_bytes_or_more() {
    let dir = std::env::temp_dir().join(format!("failsafe-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        format!("--ha_failsafe_secret_file={}", path.display())
    };
    let with = |extra: &str| {
        let mut args = vec![
            "--acceptable_user_tokens=u",
            "--acceptable_servant_tokens=s",
            "--serving_daemon_token_secret=x",
            "--ha_etcd_endpoints=etcd:2379",
        ];
        args.extend([extra].into_iter().filter(|flag| !flag.is_empty()));
        cli(&args)
            .settings()
            .map(|settings| settings.ha.expect("HA").failsafe_secret)
    };
    assert_eq!(with("").unwrap(), None, "off without the file");
    let good = file("good", "0123456789abcdef\n");
    assert_eq!(
        with(&good).unwrap().map(|secret| secret.0),
        Some(b"0123456789abcdef".to_vec()),
        "the newline is not the secret's"
    );
    let short = file("short", "0123456789abcde\n");
    assert!(with(&short).unwrap_err().contains("at least 16"));
    let missing = format!(
        "--ha_failsafe_secret_file={}",
        dir.join("missing").display()
    );
    assert!(
        with(&missing)
            .unwrap_err()
            .contains("--ha_failsafe_secret_file")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
