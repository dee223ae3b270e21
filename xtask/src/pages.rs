//! `cargo xtask pages`: the generated parts of the pages for newcomers (`docs/learn/`).
//!
//! - Runs the five programs of `what-a-sandbox-is.md` through a freshly built `plimsoll`
//!   (process provider) and writes their code and output blocks.
//! - With `--records` (or when `records/runs.jsonl` is missing): runs five requests through
//!   a real `plimsolld` (process provider: three single runs, then a session of two python
//!   cells) with `plimsoll-attest`, signed by a key made for this and then deleted, into
//!   `records/runs.jsonl` and `records/harness.pub`. Without it the shipped records stay as
//!   they are, so running the task twice changes nothing.
//! - Writes `check/bundle.js` from the records, and the table and `verify` output blocks of
//!   `proof-of-what-ran.md`.
//!
//! Needs node and python3 (the process provider's programs). The tests that compare the
//! pages with what this writes are `bins/plimsoll/tests/learn_page.rs` and
//! `bins/plimsoll-attest/tests/learn_records.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use plimsoll_learn::{blocks, programs, records};

use crate::dist::{cargo, target_dir, workspace_root};

/// The requests the shipped records come from (single runs; proto3 JSON).
const RUNS: [&str; 3] = [
    r#"{"javascript":{"code":"console.log(6 * 7)"}}"#,
    r#"{"minimumIsolation":"process","javascript":{"code":"console.log([3, 1, 2].sort().join(' '))"}}"#,
    r#"{"project":{"files":[{"path":"hello.sh","content":"echo hello from a project step\n"}],"steps":["sh hello.sh"]}}"#,
];
/// The session's calls (`plimsoll.v1.SessionRunRequest`, proto3 JSON).
const CALLS: [&str; 2] = [
    r#"{"cell":{"language":"python","code":"x = 41"}}"#,
    r#"{"cell":{"language":"python","code":"print(x + 1)"}}"#,
];

pub fn run(args: &[String]) -> Result<()> {
    let mut fresh_records = false;
    for a in args {
        match a.as_str() {
            "--records" => fresh_records = true,
            other => bail!("pages: unknown flag {other:?} (only --records)"),
        }
    }
    let st = cargo()
        .current_dir(workspace_root())
        .args([
            "build",
            "-p",
            "plimsoll",
            "-p",
            "plimsolld",
            "-p",
            "plimsoll-attest",
        ])
        .status()
        .context("running cargo build")?;
    if !st.success() {
        bail!("cargo build -p plimsoll -p plimsolld -p plimsoll-attest failed");
    }
    let bin = |name: &str| target_dir().join("debug").join(name);
    let learn = workspace_root().join("docs/learn");

    // Page 1: the five programs.
    let page_path = learn.join(plimsoll_learn::SANDBOX_PAGE);
    let page = std::fs::read_to_string(&page_path).context("read the page")?;
    let ran = programs::run_all(&bin("plimsoll"))?;
    write_if_changed(&page_path, &programs::render(&page, &ran)?)?;

    // Page 2: the records.
    if fresh_records || !learn.join(records::BUNDLE).is_file() {
        make_records(
            &bin("plimsolld"),
            &bin("plimsoll"),
            &bin("plimsoll-attest"),
            &learn,
        )?;
    }
    let jsonl = std::fs::read_to_string(learn.join(records::BUNDLE))?;
    let pub_pem = std::fs::read_to_string(learn.join(records::PUBLIC_KEY))?;
    write_if_changed(
        &learn.join(records::BUNDLE_JS),
        &records::bundle_js(&jsonl, &pub_pem),
    )?;
    let proof_path = learn.join(plimsoll_learn::PROOF_PAGE);
    let proof = std::fs::read_to_string(&proof_path).context("read the proof page")?;
    let proof = blocks::replace(&proof, "records-table", &records::table(&jsonl)?)?;
    let out = Command::new(bin("plimsoll-attest"))
        .current_dir(&learn)
        .args(["verify", "--pub", records::PUBLIC_KEY, records::BUNDLE])
        .output()?;
    if !out.status.success() {
        bail!(
            "the records do not verify: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let proof = blocks::replace(
        &proof,
        "verify-output",
        &records::console_block(
            &format!(
                "plimsoll-attest verify --pub {} {}",
                records::PUBLIC_KEY,
                records::BUNDLE
            ),
            &shown,
        ),
    )?;
    write_if_changed(&proof_path, &proof)?;
    Ok(())
}

fn write_if_changed(path: &Path, text: &str) -> Result<()> {
    if std::fs::read_to_string(path).ok().as_deref() == Some(text) {
        eprintln!("pages: {} unchanged", path.display());
        return Ok(());
    }
    std::fs::write(path, text).with_context(|| format!("write {}", path.display()))?;
    eprintln!("pages: wrote {}", path.display());
    Ok(())
}

fn make_records(plimsolld: &Path, plimsoll: &Path, attest: &Path, learn: &Path) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let callers = d.join("callers.json");
    let out = Command::new(plimsoll)
        .args(["callers", "add", "--file"])
        .arg(&callers)
        .args(["--id", "learn-pages"])
        .output()?;
    if !out.status.success() {
        bail!(
            "plimsoll callers add: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let token = String::from_utf8(out.stdout)?.trim().to_owned();
    let callers_s = callers.display().to_string();
    let mut daemon = plimsoll_testkit::plimsolld::Plimsolld::spawn(
        &plimsolld.display().to_string(),
        d,
        &[
            ("PLIMSOLL_CLIENTS_FILE", callers_s.as_str()),
            ("SANDBOX_MAX_SESSIONS", "2"),
            ("SANDBOX_MAX_SESSIONS_PER_CALLER", "2"),
        ],
    );
    let addr = daemon
        .serving()
        .context("plimsolld did not start (see its log above)")?;
    let url = if addr.contains("://") {
        addr
    } else {
        format!("http://{addr}")
    };
    let bundle = d.join("runs.jsonl");
    let attest_cmd = |args: &[&str], files: &[PathBuf]| -> Result<()> {
        let out = Command::new(attest)
            .env("PLIMSOLL_CALLER_TOKEN", &token)
            .env_remove("PLIMSOLL_ATTEST_KEY")
            .args(args)
            .args(files)
            .output()?;
        if !out.status.success() {
            bail!(
                "plimsoll-attest {}: {}",
                args[0],
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    };
    let key = d.join("harness");
    attest_cmd(&["keygen", "--out", &key.display().to_string()], &[])?;
    let key_file = d.join("harness.key").display().to_string();
    let bundle_s = bundle.display().to_string();
    for (i, req) in RUNS.iter().enumerate() {
        let f = d.join(format!("run{i}.json"));
        std::fs::write(&f, req)?;
        attest_cmd(
            &[
                "run", "--daemon", &url, "--key", &key_file, "--bundle", &bundle_s,
            ],
            &[f],
        )?;
    }
    let calls: Vec<PathBuf> = CALLS
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let f = d.join(format!("call{i}.json"));
            std::fs::write(&f, c).map(|_| f)
        })
        .collect::<std::io::Result<_>>()?;
    attest_cmd(
        &[
            "session", "--daemon", &url, "--key", &key_file, "--bundle", &bundle_s,
        ],
        &calls,
    )?;
    daemon.stop();
    std::fs::create_dir_all(learn.join("records"))?;
    std::fs::copy(&bundle, learn.join(records::BUNDLE))?;
    std::fs::copy(d.join("harness.pub"), learn.join(records::PUBLIC_KEY))?;
    eprintln!(
        "pages: new records in {} (the signing key was deleted)",
        learn.join("records").display()
    );
    Ok(())
}
