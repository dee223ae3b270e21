//! Tidy checks that keep the tree honest, run by `cargo test`:
//! every library and binary opens with a `//!` doc stating its job, and every test that
//! `docs/SPECIFICATION.md` names as the proof of a promise exists in the tree.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_crate_root_opens_with_its_job() {
    let root = root();
    let mut roots = Vec::new();
    for (dir, file) in [("crates", "src/lib.rs"), ("bins", "src/main.rs")] {
        for e in std::fs::read_dir(root.join(dir)).unwrap().flatten() {
            let p = e.path().join(file);
            if p.exists() {
                roots.push(p);
            }
        }
    }
    roots.push(root.join("xtask/src/main.rs"));
    assert!(roots.len() >= 5, "found only {roots:?}");
    let missing: Vec<_> = roots
        .iter()
        .filter(|p| {
            !std::fs::read_to_string(p)
                .unwrap()
                .trim_start()
                .starts_with("//!")
        })
        .collect();
    assert!(
        missing.is_empty(),
        "these files must open with a `//!` doc stating their one job: {missing:?}"
    );
}

#[test]
fn every_test_named_in_the_specification_exists() {
    let root = root();
    let spec = std::fs::read_to_string(root.join("docs/SPECIFICATION.md")).unwrap();
    // Proofs are written as `path::to::test_name` in backticks; the last segment is the fn.
    let names: Vec<&str> = spec
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.contains("::") && !s.contains(' '))
        .filter_map(|s| s.rsplit("::").next())
        .collect();
    assert!(
        names.len() >= 10,
        "the specification names only {} tests",
        names.len()
    );
    let mut files = Vec::new();
    for d in ["crates", "bins", "xtask"] {
        rust_files(&root.join(d), &mut files);
    }
    let sources: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect();
    let missing: Vec<_> = names
        .iter()
        .filter(|n| !sources.contains(&format!("fn {n}(")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/SPECIFICATION.md names tests that do not exist: {missing:?}"
    );
}
