//! Tidy checks that keep the tree honest, run by `cargo test`:
//! every library and binary opens with a `//!` doc stating its job, every test that
//! `docs/SPECIFICATION.md` names as the proof of a promise exists in the tree, and nothing the
//! tests, tools or README use reaches outside the repository for its fixtures.

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

/// Every file under `dir` (recursively), skipping `target` and dot folders.
fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || (p.is_dir() && name.to_string_lossy().starts_with('.')) {
            continue;
        }
        if p.is_dir() {
            all_files(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// The places a clone must not depend on: the steering repository's folder beside the
/// checkout, and the variable that used to point at it. Built from pieces so this file does
/// not match itself.
fn outside_paths() -> Vec<String> {
    let dir = ["sha", "red"].concat();
    vec![
        format!("../{dir}"),
        format!("{dir}/fixtures"),
        format!("PLIMSOLL_{}_DIR", dir.to_uppercase()),
    ]
}

fn files_reading_outside(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for d in ["crates", "bins", "xtask", "examples", ".ci"] {
        all_files(&root.join(d), &mut files);
    }
    files.push(root.join("README.md"));
    let needles = outside_paths();
    let mut found = Vec::new();
    for f in files {
        let Ok(bytes) = std::fs::read(&f) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        for (no, line) in text.lines().enumerate() {
            if needles.iter().any(|n| line.contains(n.as_str())) {
                let rel = f.strip_prefix(root).unwrap_or(&f);
                found.push(format!("{}:{}: {}", rel.display(), no + 1, line.trim()));
            }
        }
    }
    found
}

#[test]
fn nothing_reads_fixtures_from_outside_the_repository() {
    let found = files_reading_outside(&root());
    assert!(
        found.is_empty(),
        "these lines reach outside the repository; copy the fixture in beside its test \
         (see crates/plimsoll-core/tests/fixtures/README.md):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_outside_path_check_finds_a_planted_reference() {
    let dir = tempfile::tempdir().unwrap();
    let tests = dir.path().join("crates/x/tests");
    std::fs::create_dir_all(&tests).unwrap();
    std::fs::write(dir.path().join("README.md"), "nothing here\n").unwrap();
    let planted = format!("let p = \"{}/fixtures/a.json\";\n", outside_paths()[0]);
    std::fs::write(tests.join("t.rs"), planted).unwrap();
    let found = files_reading_outside(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("crates/x/tests/t.rs:1:"), "{found:?}");
}
