//! The documentation checked against the program, so it cannot drift: the
//! flag reference is the binary's own `--help`, and every shell example
//! marked `<!-- run: demo -->` runs as written against a real `--demo`
//! (only its address differs: the test's demo listens on a port the kernel
//! picks, so `127.0.0.1:8336` and `localhost:8336` are replaced by it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{Launch, bounded, heavy, http_client, run_bounded};

/// Marks the fenced `sh` block on the next line as one CI runs.
const RUN_MARK: &str = "<!-- run: demo -->";

/// `UPDATE_DOCS=1 cargo test --test it docs::` rewrites the flag reference.
#[test]
fn flag_reference_is_the_help_output() {
    let program = env!("CARGO_BIN_EXE_yadcc-scheduler");
    let mut command = Command::new(program);
    command.arg("--help");
    // The help shows a variable's value when it is set: show none.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("YADCC_") {
            command.env_remove(name);
        }
    }
    let output = command.output().expect("run --help");
    assert!(output.status.success(), "--help failed: {output:?}");
    let help = String::from_utf8(output.stdout).expect("help is UTF-8");
    let page = format!(
        "# Flags\n\n\
         Generated from `yadcc-scheduler --help`; a test (`tests/it/docs.rs`)\n\
         fails when this page and the binary disagree, and\n\
         `UPDATE_DOCS=1 cargo test --test it docs::` rewrites it. Every flag is\n\
         also accepted in kebab-case and as the `YADCC_*` variable named here;\n\
         gflags' forms are in [running.md](running.md). Durations are written\n\
         `10s`, `500ms`, `2m` (a bare number is seconds).\n\n\
         ```text\n{help}```\n"
    );
    let path = repository().join("docs/flags.md");
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &page).expect("write docs/flags.md");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == page,
        "docs/flags.md differs from --help: run `UPDATE_DOCS=1 cargo test --test it docs::`"
    );
}

#[test]
fn example_blocks_are_found_only_after_the_mark() {
    let text = "intro\n```sh\nnot run\n```\n<!-- run: demo -->\n```sh\necho one\n```\n\n```sh\nnot either\n```\n";
    assert_eq!(marked_blocks(text), vec!["echo one\n".to_owned()]);
    // A mark not followed by a fence at once is a mistake in the page.
    let stray = "<!-- run: demo -->\ntext\n```sh\necho\n```\n";
    assert_eq!(marked_blocks(stray), vec![String::new()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn marked_examples_run_against_the_demo() {
    let examples = marked_examples();
    assert!(
        examples.iter().any(|(page, _)| page.ends_with("README.md")),
        "the README has no example marked {RUN_MARK}"
    );
    let _heavy = heavy().await;
    let demo = Launch {
        flags: &["--demo"],
        tokens: false,
        ..Launch::default()
    }
    .start();
    let base = format!("http://{}", demo.addr);
    wait_for_demo_servants(&base).await;
    for (page, block) in &examples {
        assert!(
            !block.trim().is_empty(),
            "{}: {RUN_MARK} must be followed at once by a ```sh block",
            page.display()
        );
        let script = block
            .replace("127.0.0.1:8336", &demo.addr.to_string())
            .replace("localhost:8336", &demo.addr.to_string());
        let mut command = bounded(Duration::from_secs(60), "bash");
        command
            .arg("-euo")
            .arg("pipefail")
            .arg("-c")
            .arg(&script)
            .current_dir(repository());
        let output = run_bounded(command).await;
        assert!(
            output.status.success(),
            "an example of {} failed ({}):\n{script}\n--- stdout\n{}\n--- stderr\n{}",
            page.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
    }
}

/// The demo's daemons register within a few seconds of its start; the
/// examples (a grant, the task list) are about a farm that has servants.
async fn wait_for_demo_servants(base: &str) {
    let client = http_client();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let servants = async {
            let answer = client
                .get(format!(
                    "{base}/inspect/vars/yadcc/task_dispatcher/servants_up"
                ))
                .send()
                .await
                .ok()?;
            answer.text().await.ok()?.trim().parse::<u32>().ok()
        }
        .await;
        if servants.is_some_and(|count| count > 0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the demo's servants never registered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every marked block of the README and of `docs/`, with its page.
fn marked_examples() -> Vec<(PathBuf, String)> {
    let root = repository();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
        .into_iter()
        .flat_map(|page| {
            let text = read(&page);
            marked_blocks(&text)
                .into_iter()
                .map(move |block| (page.clone(), block))
        })
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The body of each ```sh block that follows a [`RUN_MARK`] line; an empty
/// string where the mark is not followed by one.
fn marked_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != RUN_MARK {
            continue;
        }
        if lines.next().map(str::trim) != Some("```sh") {
            blocks.push(String::new());
            continue;
        }
        let mut block = String::new();
        for line in lines.by_ref() {
            if line.trim_start().starts_with("```") {
                break;
            }
            block.push_str(line);
            block.push('\n');
        }
        blocks.push(block);
    }
    blocks
}
