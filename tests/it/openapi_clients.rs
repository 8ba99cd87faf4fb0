//! The OpenAPI document as its consumers use it: Redocly's and Spectral's
//! linters find nothing wrong, a Python client generated from the served
//! document calls every RPC on both route styles (the operators' service
//! with its bearer token), and the TypeScript types generated from it
//! compile under `tsc --strict`, and a TypeScript client built on them
//! calls the operators' service. The tools are pinned and
//! installed by scripts/test.sh into target/test-tools.

use std::path::{Path, PathBuf};
use yadcc_scheduler::openapi;

use crate::{
    support::{Server, heavy},
    tools::{ScratchDir, installed, python, run, said, tool},
};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The served document, written to `dir`.
async fn served_document(server: &Server, dir: &Path) -> PathBuf {
    let body = reqwest::get(server.url(openapi::SPEC_PATH))
        .await
        .expect("GET the document")
        .bytes()
        .await
        .unwrap();
    let path = dir.join("served.openapi.json");
    std::fs::write(&path, &body).unwrap();
    path
}

/// A node tool from the OpenAPI tool set, without telemetry or update checks
/// (the test machines reach no other network than the package registries).
fn npm_tool(bin: &Path) -> std::process::Command {
    let mut command = tool(bin);
    command
        .current_dir(repo())
        .env("REDOCLY_TELEMETRY", "off")
        .env("REDOCLY_SUPPRESS_UPDATE_NOTICE", "true");
    command
}

/// Both postures: the committed document (inspection API behind basic auth)
/// and the one a server without a credential serves (open operations only).
#[tokio::test]
async fn redocly_and_spectral_find_nothing_to_fix() {
    let (Some(redocly), Some(spectral)) = (
        installed("openapi-npm/node_modules/.bin/redocly"),
        installed("openapi-npm/node_modules/.bin/spectral"),
    ) else {
        return;
    };
    // Node and Python tool chains: seconds of CPU each.
    let _heavy = heavy().await;
    let server = Server::start().await;
    let scratch = ScratchDir::new("openapi-lint");
    let served = served_document(&server, &scratch.0).await;
    server.stop().await;
    for document in [repo().join(openapi::COMMITTED_SPEC), served] {
        // Redocly's recommended rules: any error fails (warnings are
        // advice, such as a 4xx answer for /healthz).
        let mut lint = npm_tool(&redocly);
        lint.arg("lint").arg(&document).arg("--format=stylish");
        let output = run(lint).await;
        assert!(
            output.status.success(),
            "redocly lint {}: {}",
            document.display(),
            said(&output)
        );

        // spectral:oas (the repository's .spectral.yaml): not even a warning.
        let mut lint = npm_tool(&spectral);
        lint.arg("lint")
            .arg(&document)
            .arg("--ruleset")
            .arg(repo().join(".spectral.yaml"))
            .arg("--fail-severity=warn");
        let output = run(lint).await;
        assert!(
            output.status.success(),
            "spectral lint {}: {}",
            document.display(),
            said(&output)
        );
    }
}

#[tokio::test]
async fn a_generated_python_client_calls_every_rpc_on_both_route_styles() {
    let Some(tools) = installed("openapi-python/openapi_python_client") else {
        return;
    };
    // Node and Python tool chains: seconds of CPU each.
    let _heavy = heavy().await;
    let tools = tools.parent().unwrap().to_owned();
    // The admin token tests/openapi/python_client.py acts with.
    let server = Server::start_with_admin(&["openapi-admin-token"]).await;
    let scratch = ScratchDir::new("openapi-python");
    let mut client = python();
    client
        .arg(repo().join("tests/openapi/python_client.py"))
        .arg(server.url(""))
        .arg(&scratch.0)
        .arg(repo().join("openapi/python-client.yaml"))
        .env("PYTHONPATH", &tools)
        // The generator formats its output with ruff, which it runs by name.
        .env("PATH", path_with(&tools.join("bin")));
    let output = run(client).await;
    assert!(
        output.status.success(),
        "generated Python client: {}",
        said(&output)
    );
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("all generated-client checks passed"),
        "{}",
        said(&output)
    );
    server.stop().await;
}

#[tokio::test]
async fn generated_typescript_types_compile_strictly() {
    let (Some(generator), Some(tsc)) = (
        installed("openapi-npm/node_modules/.bin/openapi-typescript"),
        installed("openapi-npm/node_modules/.bin/tsc"),
    ) else {
        return;
    };
    // Node and Python tool chains: seconds of CPU each.
    let _heavy = heavy().await;
    let server = Server::start_with_admin(&[TYPESCRIPT_ADMIN_TOKEN]).await;
    let scratch = ScratchDir::new("openapi-typescript");
    let mut generate = npm_tool(&generator);
    generate
        .arg(server.url(openapi::SPEC_PATH))
        .arg("--output")
        .arg(scratch.0.join("scheduler.d.ts"));
    let output = run(generate).await;
    assert!(
        output.status.success(),
        "openapi-typescript: {}",
        said(&output)
    );

    let check = scratch.0.join("typescript_check.ts");
    std::fs::copy(repo().join("tests/openapi/typescript_check.ts"), &check).unwrap();
    let mut compile = npm_tool(&tsc);
    compile.args([
        "--strict",
        "--noEmit",
        "--target",
        "es2022",
        "--module",
        "esnext",
        "--moduleResolution",
        "bundler",
    ]);
    compile.arg(&check);
    let output = run(compile).await;
    assert!(output.status.success(), "tsc --strict: {}", said(&output));

    // A typed client of the operators' service, compiled and run with node
    // against the server that served the document.
    let client = scratch.0.join("typescript_admin.ts");
    std::fs::copy(repo().join("tests/openapi/typescript_admin.ts"), &client).unwrap();
    let mut compile = npm_tool(&tsc);
    compile.args(["--strict", "--target", "es2022", "--module", "commonjs"]);
    compile.arg("--outDir").arg(&scratch.0).arg(&client);
    let output = run(compile).await;
    assert!(output.status.success(), "tsc --strict: {}", said(&output));
    let mut node = tool("node");
    node.arg(scratch.0.join("typescript_admin.js"))
        .arg(server.url(""))
        .arg(TYPESCRIPT_ADMIN_TOKEN);
    let output = run(node).await;
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("all TypeScript client checks passed"),
        "the TypeScript client: {}",
        said(&output)
    );
    server.stop().await;
}

/// The admin token the TypeScript client acts with.
const TYPESCRIPT_ADMIN_TOKEN: &str = "typescript-admin-token";

/// `PATH` with `first` in front.
fn path_with(first: &Path) -> std::ffi::OsString {
    let mut paths = vec![first.to_owned()];
    paths.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(paths).expect("PATH entries")
}
