//! `witness`: an RFC 3161 time-stamp for the bundle's last checkpoint, and the witness file
//! that keeps the tokens beside the bundle.
//!
//! The imprint is the checkpoint's line digest (SHA-256 of the stored line), so the token
//! says that the whole bundle up to and including that line existed at the token's time:
//! every earlier line is bound into it through the links. The request carries that digest
//! and a random nonce and nothing else.
//!
//! Tokens are kept in `<bundle>.witnesses.jsonl` (one JSON object a line: `line`,
//! `line_sha256`, `authority`, `gen_time`, `nonce`, `token` as standard base64 DER), not in
//! the bundle itself: a bundle stays byte-for-byte what the Go tools write and read, and the
//! token cannot be inside the line it time-stamps. `verify` reads the witness file when it
//! is there.

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::fail::{Fail, CONNECT};

/// Arguments of `witness`.
#[derive(Debug, Args)]
pub struct WitnessArgs {
    /// `digicert`, `freetsa`, or the URL of another RFC 3161 authority (then --tsa-root).
    #[arg(long, value_name = "NAME|URL")]
    tsa: String,
    /// The bundle whose last line (a checkpoint) is time-stamped.
    #[arg(long, value_name = "FILE")]
    bundle: PathBuf,
    /// PEM root certificate(s) the authority's token must chain to; required for a URL,
    /// refused for `digicert` and `freetsa`, whose roots are pinned in this binary.
    #[arg(long, value_name = "PEM")]
    tsa_root: Option<PathBuf>,
    /// Give up on the authority after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=600))]
    timeout: u64,
    /// Where the token is kept [default: <bundle>.witnesses.jsonl].
    #[arg(long, value_name = "FILE")]
    witnesses: Option<PathBuf>,
    /// Print the outcome as one JSON object.
    #[arg(long)]
    json: bool,
}

/// One kept token.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kept {
    /// The checkpoint's 1-based line number.
    pub line: u64,
    /// The checkpoint line's SHA-256 (the token's imprint).
    pub line_sha256: String,
    /// `digicert`, `freetsa` or the authority's URL.
    pub authority: String,
    /// The token's time, as the authority states it.
    pub gen_time: String,
    /// The nonce sent (hex), for the record; a stored token cannot be re-checked against it.
    pub nonce: String,
    /// The time-stamp token (CMS ContentInfo, DER), standard base64.
    pub token: String,
}

/// The default witness file of `bundle`.
pub fn default_path(bundle: &Path) -> PathBuf {
    let mut s = bundle.as_os_str().to_owned();
    s.push(".witnesses.jsonl");
    PathBuf::from(s)
}

/// The pinned (or given) roots for `authority`, as DER.
pub fn roots(authority: &str, tsa_root: Option<&Path>) -> Result<Vec<Vec<u8>>, Fail> {
    match (plimsoll_timestamp::public(authority), tsa_root) {
        (Some(_), Some(_)) => Err(Fail::usage(format!(
            "--tsa-root: the {authority} root is pinned in this binary and cannot be replaced"
        ))),
        (Some(a), None) => plimsoll_timestamp::certificates_from_pem(a.root_pem)
            .map_err(|e| Fail::usage(format!("the pinned {authority} root: {e}"))),
        (None, Some(p)) => {
            let pem = std::fs::read_to_string(p)
                .map_err(|e| Fail::usage(format!("--tsa-root {}: {e}", p.display())))?;
            plimsoll_timestamp::certificates_from_pem(&pem)
                .map_err(|e| Fail::usage(format!("--tsa-root {}: {e}", p.display())))
        }
        (None, None) => Err(Fail::usage(format!(
            "authority {authority:?} is not digicert or freetsa: pass --tsa-root PEM with the root its tokens chain to"
        ))),
    }
}

/// The last line of `bytes` if it is a checkpoint: its number and SHA-256.
fn last_checkpoint(bytes: &[u8]) -> Result<(u64, [u8; 32]), String> {
    if !bytes.ends_with(b"\n") {
        return Err("it does not end with a whole line".into());
    }
    let body = &bytes[..bytes.len() - 1];
    let lines = body.split(|&b| b == b'\n').count() as u64;
    let last = body.rsplit(|&b| b == b'\n').next().unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_slice(last).map_err(|e| format!("its last line is not JSON: {e}"))?;
    let only_link = v
        .as_object()
        .is_some_and(|o| o.len() == 1 && o.contains_key("link"));
    if !only_link {
        return Err(format!(
            "its last line ({lines}) is not a checkpoint; run `plimsoll-attest run` (which ends with one) first"
        ));
    }
    let d = ring::digest::digest(&ring::digest::SHA256, last);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    Ok((lines, out))
}

/// `witness`.
pub async fn witness(a: WitnessArgs) -> Result<u8, Fail> {
    let url = match plimsoll_timestamp::public(&a.tsa) {
        Some(auth) => auth.url.to_owned(),
        None if a.tsa.starts_with("http://") || a.tsa.starts_with("https://") => a.tsa.clone(),
        None => {
            return Err(Fail::usage(format!(
                "--tsa {:?}: give digicert, freetsa or an http(s):// URL",
                a.tsa
            )))
        }
    };
    let roots = roots(&a.tsa, a.tsa_root.as_deref())?;
    let bytes = std::fs::read(&a.bundle)
        .map_err(|e| Fail::usage(format!("--bundle {}: {e}", a.bundle.display())))?;
    let (line, digest) = last_checkpoint(&bytes)
        .map_err(|e| Fail::usage(format!("--bundle {}: {e}", a.bundle.display())))?;
    let req = plimsoll_timestamp::TimeStampRequest::sha256(digest);
    let answer = plimsoll_timestamp::send(&url, &req, Duration::from_secs(a.timeout))
        .await
        .map_err(|e| Fail {
            code: CONNECT,
            message: format!("no time-stamp reply from {url}: {e}"),
        })?;
    let (token, w) = plimsoll_timestamp::verify_response(&answer, &req, &roots, &[])
        .map_err(|e| Fail::invalid(format!("the answer of {url} failed its check: {e}")))?;
    let kept = Kept {
        line,
        line_sha256: hex::encode(digest),
        authority: a.tsa.clone(),
        gen_time: w.gen_time.clone(),
        nonce: hex::encode(req.nonce()),
        token: base64::engine::general_purpose::STANDARD.encode(&token),
    };
    let path = a
        .witnesses
        .clone()
        .unwrap_or_else(|| default_path(&a.bundle));
    append(&path, &kept).map_err(|e| Fail::usage(format!("{}: {e}", path.display())))?;
    if a.json {
        crate::fail::print(
            &serde_json::json!({
                "line": line, "line_sha256": kept.line_sha256, "authority": kept.authority,
                "gen_time": w.gen_time, "tsa": w.tsa, "serial": w.serial_hex,
                "policy": w.policy, "witnesses": path,
            })
            .to_string(),
        );
    } else {
        crate::fail::print(&format!(
            "witnessed checkpoint line {line} ({}) at {} by {} ({}); kept in {}",
            kept.line_sha256,
            w.gen_time,
            w.tsa,
            a.tsa,
            path.display()
        ));
    }
    Ok(0)
}

fn append(path: &Path, kept: &Kept) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(kept).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(&line)?;
    f.sync_all()
}

/// Reads a witness file; `None` when there is none.
pub fn read(path: &Path) -> Result<Option<Vec<Kept>>, Fail> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Fail::usage(format!("{}: {e}", path.display()))),
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| {
                Fail::invalid(format!(
                    "witness file {} line {}: {e}",
                    path.display(),
                    i + 1
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}
