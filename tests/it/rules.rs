//! `RULES.md` lists every rule a comment cites as `Rule "name"`, so a cited
//! rule can always be looked up.

use std::path::Path;

/// Every `Rule "name"` and `rule "name"` cited under `dir`, with its file.
fn cited(dir: &Path, found: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("source directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            cited(&path, found);
            continue;
        }
        // This file names the markers, not rules.
        if path.extension().is_none_or(|ext| ext != "rs") || path.ends_with(file!()) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("source file");
        for marker in ["Rule \"", "rule \""] {
            for (at, _) in text.match_indices(marker) {
                let rest = &text[at + marker.len()..];
                if let Some(end) = rest.find('"') {
                    found.push((rest[..end].to_owned(), path.display().to_string()));
                }
            }
        }
    }
}

#[test]
fn every_rule_a_comment_cites_is_in_rules_md() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = std::fs::read_to_string(root.join("RULES.md")).expect("RULES.md");
    let mut found = Vec::new();
    // The server's modules and every crate of the workspace.
    cited(&root.join("src"), &mut found);
    cited(&root.join("crates"), &mut found);
    assert!(found.len() > 30, "the rules cited: {found:?}");
    for (name, file) in found {
        assert!(
            rules.contains(&format!("\n| {name} |")),
            "{file} cites rule {name:?}, which RULES.md lacks"
        );
    }
}

/// The names a `//!` map lists (`- [`name`]:` or `- `name`:`) between the
/// line that starts with `heading` and the end of the doc comment.
fn mapped(source: &str, heading: &str) -> Vec<String> {
    let docs = source.lines().take_while(|line| line.starts_with("//!"));
    let mut names: Vec<String> = docs
        .skip_while(|line| !line.starts_with(heading))
        .filter_map(|line| line.strip_prefix("//! - "))
        .filter_map(|item| {
            let item = item.trim_start_matches('[').strip_prefix('`')?;
            Some(item[..item.find('`')?].to_owned())
        })
        .collect();
    names.sort();
    names
}

/// The modules `source` declares at its top level (`mod x;`, `pub mod x;`),
/// tests aside.
fn declared(source: &str) -> Vec<String> {
    let mut names: Vec<String> = source
        .lines()
        .filter_map(|line| {
            ["pub mod ", "pub(crate) mod ", "mod "]
                .iter()
                .find_map(|prefix| line.strip_prefix(prefix))
        })
        .filter_map(|rest| rest.strip_suffix(';'))
        .filter(|name| *name != "tests")
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

#[test]
fn the_maps_of_lib_rs_and_the_engine_list_every_module_and_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).expect("src/lib.rs");
    assert_eq!(
        mapped(&lib, "//! Modules"),
        declared(&lib),
        "src/lib.rs's module list"
    );

    let engine =
        std::fs::read_to_string(root.join("crates/engine/src/lib.rs")).expect("the engine");
    assert_eq!(
        mapped(&engine, "//! Module map"),
        declared(&engine),
        "crates/engine/src/lib.rs's module map"
    );

    let mut crates: Vec<String> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|entry| {
            format!(
                "yadcc-{}",
                entry.expect("entry").file_name().to_string_lossy()
            )
        })
        .collect();
    crates.sort();
    let mut listed = mapped(&lib, "//! This package is the server");
    listed.retain(|name| name.starts_with("yadcc-"));
    assert_eq!(
        listed, crates,
        "src/lib.rs's list of the workspace's crates"
    );
}
