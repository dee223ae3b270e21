//! `verify` and `replay`.
//!
//! `verify` checks the bundle (links, signatures, every stored exchange re-checked like the
//! live client check, session rules), then the expectations (`--expect FILE`,
//! `--expect-count N`: the runs that should be there), then the witness file's tokens
//! against their pinned roots, offline. The first failure is reported with its line.
//!
//! `replay` verifies first, then re-sends every single run and compares the new result
//! digest with the signed one: meaningful only for deterministic workloads. Session calls
//! are not replayed (a kept interpreter's state cannot be re-created call by call); the
//! output says how many were skipped.

use std::path::PathBuf;

use clap::Args;
use plimsoll_attest::bundle::{verify_bundle, verify_expected, Expect, Summary};
use plimsoll_attest::PublicKey;
use plimsoll_timestamp::{HashAlg, Imprint};
use serde_json::{json, Value};

use crate::fail::{Fail, INVALID};
use crate::{keyfile, record, witness, DaemonArgs};

/// Arguments of `verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The harness's public key (SPKI PEM).
    #[arg(long = "pub", value_name = "FILE")]
    public: PathBuf,
    /// The request digests the bundle must hold, one a line (first word; the rest ignored).
    #[arg(long, value_name = "FILE", conflicts_with = "expect_count")]
    expect: Option<PathBuf>,
    /// The number of runs and calls the bundle must hold.
    #[arg(long, value_name = "N")]
    expect_count: Option<u64>,
    /// The witness file [default: <bundle>.witnesses.jsonl, when it exists].
    #[arg(long, value_name = "FILE")]
    witnesses: Option<PathBuf>,
    /// PEM roots for witnesses from authorities other than digicert and freetsa.
    #[arg(long, value_name = "PEM")]
    tsa_root: Option<PathBuf>,
    /// Print the outcome as one JSON object.
    #[arg(long)]
    json: bool,
    /// The bundle.
    #[arg(value_name = "BUNDLE")]
    bundle: PathBuf,
}

/// Arguments of `replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    daemon: DaemonArgs,
    /// The harness's public key (SPKI PEM).
    #[arg(long = "pub", value_name = "FILE")]
    public: PathBuf,
    /// Print the outcome as one JSON object.
    #[arg(long)]
    json: bool,
    /// The bundle.
    #[arg(value_name = "BUNDLE")]
    bundle: PathBuf,
}

fn checked(bundle: &std::path::Path, key: &PublicKey) -> Result<Summary, Fail> {
    let bytes =
        std::fs::read(bundle).map_err(|e| Fail::usage(format!("{}: {e}", bundle.display())))?;
    verify_bundle(&bytes, key).map_err(|e| {
        match signer(&bytes) {
            // A wrong public key looks like a forged line 1: say which key signed it.
            Some(id) if e.line() == Some(1) && id != key.key_id() => Fail::invalid(format!(
                "invalid for this key: line 1 is signed by key {id}, --pub is key {} (give the public key of the harness that wrote it)",
                key.key_id()
            )),
            _ => Fail::invalid(format!("invalid: {e}")),
        }
    })
}

/// The key ID the first line's link names, if it names one.
fn signer(bytes: &[u8]) -> Option<String> {
    let first = bytes.split(|&b| b == b'\n').next()?;
    let v: Value = serde_json::from_slice(first).ok()?;
    let id = v["link"]["signatures"][0]["keyid"].as_str()?;
    (!id.is_empty()).then(|| id.to_owned())
}

/// What one witness says, once checked.
struct Witnessed {
    line: u64,
    gen_time: String,
    tsa: String,
    authority: String,
    expired_since: bool,
}

fn check_witnesses(a: &VerifyArgs, summary: &Summary) -> Result<Vec<Witnessed>, Fail> {
    let path = a
        .witnesses
        .clone()
        .unwrap_or_else(|| witness::default_path(&a.bundle));
    let kept = match witness::read(&path)? {
        Some(k) => k,
        None if a.witnesses.is_some() => {
            return Err(Fail::usage(format!(
                "--witnesses {}: no such file",
                path.display()
            )))
        }
        None => return Ok(Vec::new()),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut out = Vec::new();
    for (i, k) in kept.iter().enumerate() {
        let at = |why: String| {
            Fail::invalid(format!(
                "invalid: witness {} (file {} line {}): {why}",
                k.line,
                path.display(),
                i + 1
            ))
        };
        let Some(cp) = summary.checkpoints.iter().find(|c| c.index == k.line) else {
            return Err(at(format!(
                "line {} of the bundle is not a checkpoint",
                k.line
            )));
        };
        if cp.line_sha256 != k.line_sha256 {
            return Err(at(format!(
                "the bundle's line {} has SHA-256 {}, the token witnesses {}",
                k.line, cp.line_sha256, k.line_sha256
            )));
        }
        let roots = witness::roots(&k.authority, a.tsa_root.as_deref())?;
        let token = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &k.token)
            .map_err(|e| at(format!("the token is not base64: {e}")))?;
        let digest = hex::decode(&cp.line_sha256).map_err(|e| at(e.to_string()))?;
        let imprint = Imprint {
            algorithm: HashAlg::Sha256,
            digest,
        };
        let w = plimsoll_timestamp::verify_token(&token, &imprint, None, &roots, &[])
            .map_err(|e| at(e.to_string()))?;
        out.push(Witnessed {
            line: k.line,
            expired_since: w.signer_expired_at(now),
            gen_time: w.gen_time,
            tsa: w.tsa,
            authority: k.authority.clone(),
        });
    }
    Ok(out)
}

/// `verify`.
pub fn verify(a: VerifyArgs) -> Result<u8, Fail> {
    let key = keyfile::public_key(&a.public)?;
    let summary = checked(&a.bundle, &key)?;
    let expect = match (&a.expect, a.expect_count) {
        (Some(p), _) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| Fail::usage(format!("--expect {}: {e}", p.display())))?;
            Some(
                Expect::parse_digests(&text)
                    .map_err(|e| Fail::usage(format!("--expect {}: {e}", p.display())))?,
            )
        }
        (None, Some(n)) => Some(Expect::Count(n)),
        (None, None) => None,
    };
    if let Some(e) = &expect {
        verify_expected(&summary, e).map_err(|e| Fail::invalid(format!("invalid: {e}")))?;
    }
    let witnessed = check_witnesses(&a, &summary)?;
    if a.json {
        let w: Vec<Value> = witnessed
            .iter()
            .map(|w| {
                json!({"line": w.line, "gen_time": w.gen_time, "tsa": w.tsa,
                       "authority": w.authority, "signer_expired_since": w.expired_since})
            })
            .collect();
        crate::fail::print(
            &json!({
                "valid": true, "key_id": key.key_id(), "lines": summary.lines,
                "runs": summary.runs, "sessions": summary.sessions,
                "session_calls": summary.session_calls,
                "checkpoints": summary.checkpoints.len(),
                "expectation": expect.is_some(), "witnesses": w,
                "request_sha256": summary.request_digests,
            })
            .to_string(),
        );
    } else {
        let mut text = format!(
            "valid: {} lines, {} runs, {} sessions ({} calls), {} checkpoints, signed by key {}",
            summary.lines,
            summary.runs,
            summary.sessions,
            summary.session_calls,
            summary.checkpoints.len(),
            key.key_id()
        );
        if expect.is_some() {
            text.push_str("\nexpected runs: all present, none extra");
        }
        for w in &witnessed {
            text.push_str(&format!(
                "\nwitnessed: lines 1-{} existed by {} ({}, {}){}",
                w.line,
                w.gen_time,
                w.authority,
                w.tsa,
                if w.expired_since {
                    "; the authority's certificate has expired since, which does not change the token"
                } else {
                    ""
                }
            ));
        }
        crate::fail::print(&text);
    }
    Ok(0)
}

/// `replay`.
pub async fn replay(a: ReplayArgs) -> Result<u8, Fail> {
    let key = keyfile::public_key(&a.public)?;
    let summary = checked(&a.bundle, &key)?;
    let mut client = record::connect(&a.daemon).await?;
    let mut results = Vec::new();
    let mut differ = 0usize;
    for single in &summary.single_runs {
        let (same, detail) = match client.run(single.request.clone()).await {
            Ok(resp) => {
                let got = resp.record.map(|r| r.result_sha256).unwrap_or_default();
                (got == single.result_sha256, got)
            }
            Err(e) => (false, format!("error: {e}")),
        };
        if !same {
            differ += 1;
        }
        results.push((single.line, same, detail));
    }
    let skipped = summary.session_calls;
    if a.json {
        let r: Vec<Value> = results
            .iter()
            .map(|(l, s, d)| json!({"line": l, "same": s, "result_sha256": d}))
            .collect();
        crate::fail::print(
            &json!({"replayed": results.len(), "differ": differ,
                    "session_calls_skipped": skipped, "runs": r})
            .to_string(),
        );
    } else {
        let mut text = String::new();
        for (l, s, d) in &results {
            text.push_str(&if *s {
                format!("line {l}: same result\n")
            } else {
                format!("line {l}: DIFFERENT ({d})\n")
            });
        }
        text.push_str(&format!(
            "replayed {} single runs, {differ} differ; {skipped} session calls not replayed",
            results.len()
        ));
        crate::fail::print(&text);
    }
    Ok(if differ == 0 { 0 } else { INVALID })
}
