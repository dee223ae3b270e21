//! Tidy checks that keep the tree honest, run by `cargo test`:
//! every module (crate roots, their modules, tests, examples) opens with a `//!` doc stating
//! its job, every test that `docs/SPECIFICATION.md` names as the proof of a promise exists at
//! the whole path it is named by, and nothing the tests, tools or README use reaches outside
//! the repository for its fixtures.

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

/// The folders whose Rust files are the workspace's modules.
const SOURCE_DIRS: [&str; 4] = ["crates", "bins", "xtask", "examples"];

#[test]
fn every_module_opens_with_its_job() {
    let root = root();
    let mut files = Vec::new();
    for d in SOURCE_DIRS {
        rust_files(&root.join(d), &mut files);
    }
    assert!(files.len() >= 50, "found only {files:?}");
    for must in ["xtask/src/main.rs", "crates/plimsoll-core/src/lib.rs"] {
        assert!(files.contains(&root.join(must)), "{must} was not checked");
    }
    let missing: Vec<_> = files
        .iter()
        .filter(|p| {
            !std::fs::read_to_string(p)
                .unwrap()
                .trim_start()
                .starts_with("//!")
        })
        .map(|p| p.strip_prefix(&root).unwrap_or(p).to_owned())
        .collect();
    assert!(
        missing.is_empty(),
        "these modules must open with a `//!` doc stating their one job: {missing:?}"
    );
}

/// Every package of the workspace by its crate name (`-` as `_`), with its folder.
fn packages(root: &Path) -> Vec<(String, PathBuf)> {
    let mut dirs = vec![root.join("xtask")];
    for d in ["crates", "bins", "examples"] {
        for e in std::fs::read_dir(root.join(d)).unwrap().flatten() {
            dirs.push(e.path());
        }
    }
    dirs.into_iter()
        .filter_map(|dir| {
            let toml = std::fs::read_to_string(dir.join("Cargo.toml")).ok()?;
            let name = toml
                .lines()
                .skip_while(|l| l.trim() != "[package]")
                .find_map(|l| l.trim().strip_prefix("name = "))?
                .trim_matches('"')
                .replace('-', "_");
            Some((name, dir))
        })
        .collect()
}

/// The file a test path names (`crate::target_or_module::…::test_fn`), when every segment
/// resolves: the crate to a package; the next segment to an integration test, an example,
/// a bench or a module under `src/`; each further segment to a module file below that, or
/// to a module written inline (`mod tests { … }`). The file must define `fn test_fn(`.
fn resolve(packages: &[(String, PathBuf)], path: &str) -> Result<PathBuf, String> {
    let segs: Vec<&str> = path.split("::").collect();
    let (krate, rest) = segs.split_first().ok_or("empty path")?;
    let (test, modules) = rest.split_last().ok_or("no test name")?;
    let (_, dir) = packages
        .iter()
        .find(|(n, _)| n == krate)
        .ok_or_else(|| format!("no package is named {krate}"))?;
    let file_or_mod = |base: &Path, m: &str| -> Option<PathBuf> {
        [base.join(format!("{m}.rs")), base.join(m).join("mod.rs")]
            .into_iter()
            .find(|p| p.is_file())
    };
    let mut file = match modules.first() {
        None => ["src/lib.rs", "src/main.rs"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.is_file())
            .ok_or_else(|| format!("{krate} has no crate root"))?,
        Some(first) => ["tests", "examples", "benches", "src"]
            .iter()
            .find_map(|d| {
                file_or_mod(&dir.join(d), first).or_else(|| {
                    Some(dir.join(d).join(first).join("main.rs")).filter(|p| p.is_file())
                })
            })
            .or_else(|| {
                // A module written inline in the crate root (`mod tests { … }` in lib.rs).
                ["src/lib.rs", "src/main.rs"]
                    .iter()
                    .map(|f| dir.join(f))
                    .find(|p| {
                        std::fs::read_to_string(p)
                            .is_ok_and(|t| t.contains(&format!("mod {first} {{")))
                    })
            })
            .ok_or_else(|| format!("{krate} has no test target or module {first}"))?,
    };
    for m in modules.iter().skip(1) {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let base = match file.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "main.rs" | "lib.rs") => file.parent().unwrap().to_owned(),
            _ => file.with_extension(""),
        };
        if let Some(next) = file_or_mod(&base, m) {
            file = next;
        } else if !text.contains(&format!("mod {m} {{")) {
            return Err(format!("{} has no module {m}", file.display()));
        }
    }
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    if !text.contains(&format!("fn {test}(")) {
        return Err(format!("{} has no fn {test}", file.display()));
    }
    Ok(file)
}

/// The test paths the proof column of `docs/SPECIFICATION.md`'s tables names.
fn proofs(spec: &str) -> Vec<&str> {
    spec.lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .filter_map(|l| l.trim_end().trim_end_matches('|').rsplit('|').next())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2))
        .filter(|s| s.contains("::") && !s.contains(' '))
        .collect()
}

#[test]
fn every_test_named_in_the_specification_exists() {
    let root = root();
    let spec = std::fs::read_to_string(root.join("docs/SPECIFICATION.md")).unwrap();
    let names = proofs(&spec);
    assert!(
        names.len() >= 10,
        "the specification names only {} tests",
        names.len()
    );
    let packages = packages(&root);
    let missing: Vec<String> = names
        .iter()
        .filter_map(|n| resolve(&packages, n).err().map(|e| format!("{n}: {e}")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/SPECIFICATION.md names tests that do not exist at their path:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_path_check_resolves_every_kind_of_path_and_refuses_a_wrong_one() {
    let packages = packages(&root());
    for ok in [
        "plimsoll_daemon::daemon::health_ready_and_metrics_endpoints",
        "plimsoll_withheld::git::tests::deltas_copy_and_insert",
        "plimsoll_tls::pem::loads_pkcs8_ecdsa_pair",
        "xtask::tidy::every_module_opens_with_its_job",
    ] {
        resolve(&packages, ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for wrong in [
        "plimsoll_nonesuch::daemon::health_ready_and_metrics_endpoints",
        "plimsoll_daemon::nonesuch::health_ready_and_metrics_endpoints",
        "plimsoll_core::daemon::health_ready_and_metrics_endpoints",
        "plimsoll_daemon::daemon::nonesuch",
        "plimsoll_withheld::git::nonesuch::deltas_copy_and_insert",
    ] {
        assert!(resolve(&packages, wrong).is_err(), "{wrong} resolved");
    }
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
    for d in SOURCE_DIRS.iter().chain([&".ci"]) {
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
