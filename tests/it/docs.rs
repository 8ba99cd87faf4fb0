//! The documentation checked against the program, so it cannot drift: the
//! flag reference is the binary's own `--help`, and every shell example
//! marked `<!-- run: demo -->` runs as written against a real `--demo`
//! (only its address differs: the test's demo listens on a port the kernel
//! picks, so `127.0.0.1:8336` and `localhost:8336` are replaced by it).
//! Every other shell block says on the line before why CI does not run it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{Binary, Launch, bounded, heavy, http_client, run_bounded};

/// Marks the fenced `sh` block on the next line as one CI runs.
const RUN_MARK: &str = "<!-- run: demo -->";
/// Marks the shell block on the next line as one CI does not run, and says
/// why: `<!-- not run: REASON -->`.
const NOT_RUN_MARK: &str = "<!-- not run: ";
/// Anywhere in a page: none of its blocks runs, for the reason given
/// (a record of commands as they were run, like the benchmarks' history).
const PAGE_NOT_RUN_MARK: &str = "<!-- no block of this page runs: ";

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

#[test]
fn every_shell_block_runs_or_says_why_not() {
    let unmarked: Vec<String> = pages()
        .iter()
        .flat_map(|page| {
            unmarked_shell_blocks(&read(page))
                .into_iter()
                .map(move |line| format!("{}:{line}", page.display()))
        })
        .collect();
    assert!(
        unmarked.is_empty(),
        "shell blocks with neither {RUN_MARK} (CI runs it against the demo) nor \
         {NOT_RUN_MARK}REASON --> on the line before:\n{}",
        unmarked.join("\n")
    );
}

#[test]
fn unmarked_shell_blocks_are_found() {
    let text = "<!-- run: demo -->\n```sh\nok\n```\n\
                <!-- not run: needs etcd -->\n  ```bash\nok\n```\n\
                ```toml\nnot a command\n```\n\
                ```sh\nunmarked\n```\n\
                <!-- not run:  -->\n```console\nno reason given\n```\n";
    assert_eq!(unmarked_shell_blocks(text), vec![12, 16]);
    let history = format!("{PAGE_NOT_RUN_MARK}old builds -->\n```sh\nx\n```\n");
    assert!(unmarked_shell_blocks(&history).is_empty());
}

/// Line numbers (from 1) of the shell blocks whose previous line is neither
/// mark, unless the page says none of its blocks runs.
fn unmarked_shell_blocks(text: &str) -> Vec<usize> {
    if text
        .lines()
        .any(|line| has_reason(line.trim(), PAGE_NOT_RUN_MARK))
    {
        return Vec::new();
    }
    let mut unmarked = Vec::new();
    let mut previous = "";
    let mut in_block = false;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            if !in_block {
                let shell = matches!(info.trim(), "sh" | "bash" | "shell" | "console");
                let marked = previous == RUN_MARK || has_reason(previous, NOT_RUN_MARK);
                if shell && !marked {
                    unmarked.push(index + 1);
                }
            }
            in_block = !in_block;
        }
        previous = trimmed;
    }
    unmarked
}

/// Whether `line` is `mark` + a reason + ` -->`.
fn has_reason(line: &str, mark: &str) -> bool {
    line.strip_prefix(mark)
        .and_then(|rest| rest.strip_suffix("-->"))
        .is_some_and(|reason| !reason.trim().is_empty())
}

#[tokio::test(flavor = "multi_thread")]
async fn marked_examples_run_against_the_demo() {
    let examples = marked_examples();
    assert!(
        examples.iter().any(|(page, _)| page.ends_with("README.md")),
        "the README has no example marked {RUN_MARK}"
    );
    let _heavy = heavy().await;
    let (demo, _) = started_demo().await;
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

/// `--demo` started as a user would (no test tokens), once its servants
/// registered, with its base URL.
pub async fn started_demo() -> (Binary, String) {
    let demo = Launch {
        flags: &["--demo"],
        tokens: false,
        ..Launch::default()
    }
    .start();
    let base = format!("http://{}", demo.addr);
    wait_for_demo_servants(&base).await;
    (demo, base)
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

/// The README and every page of `docs/`.
fn pages() -> Vec<PathBuf> {
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
}

/// Every marked block of the README and of `docs/`, with its page.
fn marked_examples() -> Vec<(PathBuf, String)> {
    pages()
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
