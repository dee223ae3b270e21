//! The signed records that `check.html` loads, and the blocks of `proof-of-what-ran.md`
//! made from them.
//!
//! `cargo xtask pages` runs five requests through a real `plimsolld` with
//! `plimsoll-attest run` and `plimsoll-attest session` into `records/runs.jsonl`, signed
//! with a key made for the occasion and thrown away (only `records/harness.pub` is kept).
//! A page opened from disk cannot fetch a file next to it, so `check/bundle.js` carries the
//! same lines and key as a script: `window.PLIMSOLL_BUNDLE = {"pub": …, "lines": […]}`.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use plimsoll_core::pb;
use prost::Message as _;

use crate::LearnError;

/// Where the bundle lives under `docs/learn/`.
pub const BUNDLE: &str = "records/runs.jsonl";
/// Where the key lives under `docs/learn/`.
pub const PUBLIC_KEY: &str = "records/harness.pub";
/// Where the script the page loads lives under `docs/learn/`.
pub const BUNDLE_JS: &str = "check/bundle.js";

/// `check/bundle.js` for the bundle text `jsonl` and the key `pub_pem`.
pub fn bundle_js(jsonl: &str, pub_pem: &str) -> String {
    let lines: Vec<&str> = jsonl.lines().collect();
    let data = serde_json::json!({ "pub": pub_pem, "lines": lines });
    let mut out = String::from(
        "// Made by `cargo xtask pages` from records/runs.jsonl and records/harness.pub; do not edit.\n\
         // The same bytes as those files: a page opened from disk may load a script, not fetch a file.\n\
         window.PLIMSOLL_BUNDLE = ",
    );
    out.push_str(&serde_json::to_string_pretty(&data).expect("JSON of strings"));
    out.push_str(";\n");
    out
}

/// One record of the bundle, as the page's table shows it.
#[derive(Debug, Clone)]
pub struct Row {
    /// The line number.
    pub line: usize,
    /// `run` or `session call`.
    pub kind: &'static str,
    /// The payload kind and language.
    pub what: String,
    /// The code or the steps, on one line.
    pub code: String,
    /// The program's stdout, on one line.
    pub stdout: String,
    /// The record digest.
    pub record_sha256: String,
}

fn one_line(s: &str) -> String {
    let s = s.trim_end().replace('\n', " ⏎ ");
    s.replace('|', "\\|")
}

/// The records (run and session-call lines) of the bundle text `jsonl`.
pub fn rows(jsonl: &str) -> Result<Vec<Row>, LearnError> {
    let mut out = Vec::new();
    for (i, line) in jsonl.lines().enumerate() {
        let bad = |what: String| LearnError::Bundle(format!("line {}: {what}", i + 1));
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
        let (Some(req), Some(resp)) = (v["request"].as_str(), v["response"].as_str()) else {
            continue;
        };
        let req = STANDARD
            .decode(req)
            .ok()
            .and_then(|b| pb::RunRequest::decode(b.as_slice()).ok())
            .ok_or_else(|| bad("the request is not a RunRequest".into()))?;
        let resp = STANDARD
            .decode(resp)
            .ok()
            .and_then(|b| pb::RunResponse::decode(b.as_slice()).ok())
            .ok_or_else(|| bad("the response is not a RunResponse".into()))?;
        let rec = resp.record.clone().ok_or_else(|| bad("no record".into()))?;
        use pb::run_request::Payload;
        use pb::run_response::Result as R;
        let (what, code) = match &req.payload {
            Some(Payload::Javascript(j)) => ("JavaScript".to_owned(), j.code.clone()),
            Some(Payload::Cell(c)) => (format!("{} cell", c.language), c.code.clone()),
            Some(Payload::Project(p)) => ("project".to_owned(), p.steps.join(" && ")),
            _ => ("other".to_owned(), String::new()),
        };
        let stdout = match &resp.result {
            Some(R::Javascript(j)) => String::from_utf8_lossy(&j.stdout).into_owned(),
            Some(R::Cell(c)) => String::from_utf8_lossy(&c.stdout).into_owned(),
            Some(R::Project(p)) => p
                .steps
                .iter()
                .map(|s| String::from_utf8_lossy(&s.stdout).into_owned())
                .collect(),
            _ => String::new(),
        };
        out.push(Row {
            line: i + 1,
            kind: if rec.session.is_empty() {
                "run"
            } else {
                "session call"
            },
            what,
            code: one_line(&code),
            stdout: one_line(&stdout),
            record_sha256: rec.record_sha256,
        });
    }
    Ok(out)
}

/// The Markdown table of the bundle's records.
pub fn table(jsonl: &str) -> Result<String, LearnError> {
    let mut s =
        String::from("| line | what | code | stdout | record digest |\n|---|---|---|---|---|\n");
    for r in rows(jsonl)? {
        let stdout = if r.stdout.is_empty() {
            "(none)".to_owned()
        } else {
            format!("`{}`", r.stdout)
        };
        s.push_str(&format!(
            "| {} | {} ({}) | `{}` | {} | `{}…` |\n",
            r.line,
            r.what,
            r.kind,
            r.code,
            stdout,
            &r.record_sha256[..16.min(r.record_sha256.len())]
        ));
    }
    Ok(s)
}

/// The page block showing a command and what it printed.
pub fn console_block(command: &str, output: &str) -> String {
    let mut s = format!("```console\n$ {command}\n{output}");
    if !output.ends_with('\n') {
        s.push('\n');
    }
    s.push_str("```\n");
    s
}
