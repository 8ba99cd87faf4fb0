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
    cited(&root.join("src"), &mut found);
    assert!(found.len() > 30, "the rules cited: {found:?}");
    for (name, file) in found {
        assert!(
            rules.contains(&format!("\n| {name} |")),
            "{file} cites rule {name:?}, which RULES.md lacks"
        );
    }
}
