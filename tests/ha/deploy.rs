//! The deployment material of `scripts/deploy/`, checked by the tools that
//! read it: HAProxy's own check of its configuration (it also runs in the
//! failover tests), `systemd-analyze verify` of the units where the machine
//! has it, and the Kubernetes example parsed as YAML and checked for what
//! docs/failover.md says it holds.

use std::{path::Path, process::Command};

use crate::support::tool;

fn deploy(file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/deploy")
        .join(file)
}

#[test]
fn the_haproxy_configuration_is_valid() {
    let Some(haproxy) = tool("haproxy") else {
        return;
    };
    let output = Command::new("timeout")
        .args(["10", &haproxy.display().to_string(), "-c", "-f"])
        .arg(deploy("haproxy.cfg"))
        .env("YADCC_LB_BIND", "127.0.0.1:8336")
        .env("YADCC_SCHEDULER_A", "127.0.0.1:18336")
        .env("YADCC_SCHEDULER_B", "127.0.0.1:28336")
        .output()
        .expect("haproxy -c");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_systemd_units_verify() {
    let Some(analyze) = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"]
        .into_iter()
        .map(Path::new)
        .find(|path| path.is_file())
    else {
        eprintln!("skipped: no systemd-analyze on this machine");
        return;
    };
    let scratch = crate::support::Scratch::new("units");
    for unit in ["yadcc-scheduler.service", "yadcc-haproxy.service"] {
        // The units name installed paths; verify needs the programs to exist.
        let text = std::fs::read_to_string(deploy(unit))
            .expect("unit")
            .replace(
                "/usr/local/bin/yadcc-scheduler",
                env!("CARGO_BIN_EXE_yadcc-scheduler"),
            );
        let text = match tool("haproxy") {
            Some(haproxy) => text.replace("/usr/sbin/haproxy", &haproxy.display().to_string()),
            None if unit.contains("haproxy") => continue,
            None => text,
        };
        let path = scratch.0.join(unit);
        std::fs::write(&path, text).expect("copy the unit");
        let output = Command::new("timeout")
            .arg("30")
            .arg(analyze)
            .arg("verify")
            .arg(&path)
            .output()
            .expect("systemd-analyze verify");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success(), "{unit}: {said}");
        let about_unit: Vec<&str> = said.lines().filter(|line| line.contains(unit)).collect();
        assert!(about_unit.is_empty(), "{unit}: {said}");
    }
}

/// The Python with PyYAML: `$PYTHON`, else the environment
/// scripts/python_deps.sh makes (schemathesis brings PyYAML), else `python3`.
fn python() -> std::ffi::OsString {
    if let Some(python) = std::env::var_os("PYTHON") {
        return python;
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-tools/venv/bin/python");
    if venv.exists() {
        venv.into_os_string()
    } else {
        "python3".into()
    }
}

#[test]
fn the_kubernetes_example_parses_and_holds_what_the_failover_page_says() {
    let output = Command::new("timeout")
        .arg("30")
        .arg(python())
        .arg(deploy("check_kubernetes.py"))
        .arg(deploy("kubernetes.yaml"))
        .output()
        .expect("python3");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
