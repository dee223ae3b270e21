//! `plimsoll record digest`: recomputes the three run-record digests from a request and a
//! response kept as proto3 JSON, so auditors in other languages can compare their own
//! encoders against this one. It uses the same encoder as the daemon and the client.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use plimsoll_core::digest::{record_digest, request_digest, result_digest};
use plimsoll_core::pb;
use serde::de::DeserializeOwned;

use crate::fail::Fail;

/// Arguments of `plimsoll record digest`.
#[derive(Debug, Args)]
pub struct DigestArgs {
    /// The RunRequest as sent, in proto3 JSON.
    #[arg(long, value_name = "REQ.json")]
    request: PathBuf,
    /// The RunResponse as received (with its record), in proto3 JSON.
    #[arg(long, value_name = "RESP.json")]
    response: PathBuf,
    /// Print JSON: each digest's computed and recorded value and whether they match.
    #[arg(long)]
    json: bool,
}

fn read_json<T: DeserializeOwned>(flag: &str, path: &Path) -> Result<T, Fail> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Fail::usage(format!("{flag} {}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        Fail::usage(format!(
            "{flag} {}: not a proto3 JSON message of the expected type: {e}",
            path.display()
        ))
    })
}

/// One recomputed digest beside what the record states.
#[derive(serde::Serialize)]
struct Line {
    computed: String,
    recorded: String,
    matches: bool,
}

/// `record digest`: exit 0 when all three match, 1 otherwise.
pub fn digest(a: DigestArgs) -> Result<u8, Fail> {
    let req: pb::RunRequest = read_json("--request", &a.request)?;
    let resp: pb::RunResponse = read_json("--response", &a.response)?;
    let rec = resp.record.clone().unwrap_or_default();
    let line = |computed: String, recorded: &str| Line {
        matches: resp.record.is_some() && computed == recorded,
        recorded: recorded.to_owned(),
        computed,
    };
    let lines = [
        (
            "request_sha256",
            line(request_digest(&req), &rec.request_sha256),
        ),
        (
            "result_sha256",
            line(result_digest(&resp), &rec.result_sha256),
        ),
        (
            "record_sha256",
            line(record_digest(&rec), &rec.record_sha256),
        ),
    ];
    let all = lines.iter().all(|(_, l)| l.matches);

    let mut out = std::io::stdout().lock();
    let written = if a.json {
        let mut obj = serde_json::Map::new();
        for (name, l) in &lines {
            obj.insert(
                (*name).to_owned(),
                serde_json::to_value(l).expect("plain strings and bools"),
            );
        }
        obj.insert("record_present".into(), resp.record.is_some().into());
        obj.insert("all_match".into(), all.into());
        writeln!(out, "{}", serde_json::Value::Object(obj))
    } else {
        let mut r = Ok(());
        if resp.record.is_none() {
            r = writeln!(out, "the response carries no record");
        }
        for (name, l) in &lines {
            r = r.and_then(|()| {
                if l.matches {
                    writeln!(out, "{name:<15} {} match", l.computed)
                } else {
                    writeln!(
                        out,
                        "{name:<15} {} MISMATCH (the record says {:?})",
                        l.computed, l.recorded
                    )
                }
            });
        }
        r
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| Fail::usage(format!("stdout: {e}")))?;
    Ok(if all { 0 } else { 1 })
}
