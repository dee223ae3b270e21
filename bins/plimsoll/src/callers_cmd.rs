//! `plimsoll callers add|list|revoke`: edits of the callers file. A new token is printed
//! once on stdout and never written anywhere; the file holds only its fingerprint.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use plimsoll_callers::{CallersError, CallersFile};

use crate::fail::Fail;

const RESTART_NOTE: &str =
    "daemons read the callers file at startup: restart every plimsolld that uses it for this change to take effect";

/// Arguments of `plimsoll callers add`.
#[derive(Debug, Args)]
pub struct AddArgs {
    /// The callers file (created with mode 0600 when absent).
    #[arg(long, value_name = "FILE")]
    file: PathBuf,
    /// The new caller's id.
    #[arg(long, value_name = "ID")]
    id: String,
    /// A scope to grant (repeatable; default code:run).
    #[arg(long = "scope", value_name = "SCOPE")]
    scopes: Vec<String>,
}

/// Arguments of `plimsoll callers list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The callers file.
    #[arg(long, value_name = "FILE")]
    file: PathBuf,
    /// Print JSON: `[{"id": ..., "scopes": [...]}]`.
    #[arg(long)]
    json: bool,
}

/// Arguments of `plimsoll callers revoke`.
#[derive(Debug, Args)]
pub struct RevokeArgs {
    /// The callers file.
    #[arg(long, value_name = "FILE")]
    file: PathBuf,
    /// The caller to remove.
    #[arg(long, value_name = "ID")]
    id: String,
}

fn usage(file: &Path, e: CallersError) -> Fail {
    // Errors about the file's contents or I/O already name it; the rest (an unknown or
    // existing id) get the file added.
    let msg = e.to_string();
    if msg.contains(&file.display().to_string()) {
        Fail::usage(msg)
    } else {
        Fail::usage(format!("--file {}: {msg}", file.display()))
    }
}

/// `callers add`: loads (or starts) the file, adds the caller, saves, prints the token.
pub fn add(a: AddArgs) -> Result<u8, Fail> {
    let mut file = match CallersFile::load(&a.file) {
        Ok(f) => f,
        Err(CallersError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            CallersFile::default()
        }
        Err(e) => return Err(usage(&a.file, e)),
    };
    let token = file.add(&a.id, &a.scopes).map_err(|e| usage(&a.file, e))?;
    file.save(&a.file).map_err(|e| usage(&a.file, e))?;
    tracing::info!(caller = %a.id, file = %a.file.display(), "caller added");
    let mut out = std::io::stdout().lock();
    writeln!(out, "{token}")
        .and_then(|()| out.flush())
        .map_err(|e| {
            Fail::usage(format!(
                "caller {:?} was added to {} but its token could not be printed ({e}); revoke it and add it again",
                a.id,
                a.file.display()
            ))
        })?;
    eprintln!(
        "plimsoll: added caller {:?} to {}; the token above is shown only this once. {RESTART_NOTE}",
        a.id,
        a.file.display()
    );
    Ok(0)
}

/// `callers list`: ids and scopes, never fingerprints.
pub fn list(a: ListArgs) -> Result<u8, Fail> {
    let file = CallersFile::load(&a.file).map_err(|e| usage(&a.file, e))?;
    let mut out = std::io::stdout().lock();
    let written = if a.json {
        let items: Vec<serde_json::Value> = file
            .clients
            .iter()
            .map(|c| serde_json::json!({ "id": c.id, "scopes": c.scopes }))
            .collect();
        writeln!(out, "{}", serde_json::Value::Array(items))
    } else {
        file.clients
            .iter()
            .try_for_each(|c| writeln!(out, "{}\t{}", c.id, c.scopes.join(",")))
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| Fail::usage(format!("stdout: {e}")))?;
    Ok(0)
}

/// `callers revoke`: removes the caller and saves.
pub fn revoke(a: RevokeArgs) -> Result<u8, Fail> {
    let mut file = CallersFile::load(&a.file).map_err(|e| usage(&a.file, e))?;
    file.revoke(&a.id).map_err(|e| usage(&a.file, e))?;
    file.save(&a.file).map_err(|e| usage(&a.file, e))?;
    tracing::info!(caller = %a.id, file = %a.file.display(), "caller revoked");
    eprintln!(
        "plimsoll: revoked caller {:?} in {}. {RESTART_NOTE}",
        a.id,
        a.file.display()
    );
    Ok(0)
}
