//! `keygen`, and reading the signing and public keys the other commands are given.
//!
//! The private key is PKCS#8 PEM (`openssl genpkey -algorithm ed25519` writes the same
//! form), mode 0600; the public key is SPKI PEM, mode 0644. Both are written through a
//! fresh temporary file in the target's own folder (created `O_EXCL | O_NOFOLLOW`, written,
//! synced), then moved into place: without `--force` by a hard link, which refuses any
//! existing name, symbolic links included; with `--force` by `rename`, which replaces the
//! name itself. So a symbolic link at the key path is replaced, never followed: the file it
//! pointed to is untouched, and no reader ever sees a half-written key.
//!
//! A signing key file that its group or others may read or write is refused (exit 2, naming
//! the file, its mode and `chmod 600`) unless the caller passes `--allow-shared-key`.
//! `PLIMSOLL_ATTEST_KEY` may hold the PEM itself or a path to it (the same rule). Nothing
//! here ever prints key material: only the key ID (hex SHA-256 of the public key's DER).

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::Args;
use plimsoll_attest::{PublicKey, SigningKey};

use crate::fail::Fail;

/// The variable that may carry the signing key (PEM text, or a path to it).
pub const KEY_VARIABLE: &str = "PLIMSOLL_ATTEST_KEY";

/// Arguments of `keygen`.
#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Write PREFIX.key (private, 0600) and PREFIX.pub (public).
    #[arg(long, value_name = "PREFIX")]
    out: PathBuf,
    /// Replace existing files (a symbolic link there is replaced, not followed) instead of
    /// refusing.
    #[arg(long)]
    force: bool,
    /// Print the key ID and paths as JSON.
    #[arg(long)]
    json: bool,
}

fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Writes `bytes` to `path` with `mode` through a temporary file in the same folder; never
/// writes through a symbolic link (see the module documentation).
fn write_key_file(path: &Path, bytes: &[u8], mode: u32, force: bool) -> Result<(), Fail> {
    let io = |e: std::io::Error| Fail::usage(format!("{}: {e}", path.display()));
    let name = path
        .file_name()
        .ok_or_else(|| Fail::usage(format!("{}: not a file name", path.display())))?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !force && std::fs::symlink_metadata(path).is_ok() {
        return Err(exists(path));
    }
    let (tmp, mut f) = temporary(dir, name).map_err(io)?;
    let written = f
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| f.write_all(bytes))
        .and_then(|()| f.sync_all());
    drop(f);
    let placed = written.and_then(|()| {
        if force {
            std::fs::rename(&tmp, path)
        } else {
            std::fs::hard_link(&tmp, path)
        }
    });
    if !force || placed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    match placed {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(exists(path)),
        Err(e) => return Err(io(e)),
    }
    // The new name survives a crash once the folder is synced.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn exists(path: &Path) -> Fail {
    Fail::usage(format!(
        "{} already exists; pass --force to replace it",
        path.display()
    ))
}

/// A new file `.NAME.tmp-PID-N` in `dir`, created exclusively with mode 0600, never through a
/// symbolic link.
fn temporary(dir: &Path, name: &std::ffi::OsStr) -> std::io::Result<(PathBuf, std::fs::File)> {
    let mut last = None;
    for n in 0..64u32 {
        let mut file = std::ffi::OsString::from(".");
        file.push(name);
        file.push(format!(".tmp-{}-{n}", std::process::id()));
        let tmp = dir.join(file);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no temporary name is free")))
}

/// `keygen`: a fresh key pair.
pub fn keygen(a: KeygenArgs) -> Result<u8, Fail> {
    let key = SigningKey::generate().map_err(|e| Fail::usage(e.to_string()))?;
    let (key_path, pub_path) = (with_suffix(&a.out, ".key"), with_suffix(&a.out, ".pub"));
    write_key_file(&key_path, key.to_pkcs8_pem().as_bytes(), 0o600, a.force)?;
    write_key_file(
        &pub_path,
        key.public().to_spki_pem().as_bytes(),
        0o644,
        a.force,
    )?;
    let id = key.key_id();
    if a.json {
        crate::fail::print(
            &serde_json::json!({
                "key": key_path, "public": pub_path, "key_id": id,
            })
            .to_string(),
        );
    } else {
        crate::fail::print(&format!(
            "wrote {} (keep it secret) and {}\nkey id {id}",
            key_path.display(),
            pub_path.display()
        ));
    }
    Ok(0)
}

/// The signing key from `--key FILE`, else from `PLIMSOLL_ATTEST_KEY`: PEM text (real
/// newlines, `\n` escapes as CI secret stores keep them, or spaces), the PEM body alone
/// (one base64 line), or a path to a PEM file. The variable's value is never echoed: it
/// may be the key. A key file its group or others may read or write is refused unless
/// `allow_shared` (`--allow-shared-key`).
pub fn signing_key(path: Option<&Path>, allow_shared: bool) -> Result<SigningKey, Fail> {
    let Some(p) = path else {
        return key_from_variable(allow_shared);
    };
    let text = read_private(p, "--key", allow_shared)?;
    SigningKey::from_pkcs8_pem(&text)
        .map_err(|e| Fail::usage(format!("--key {}: {e}", p.display())))
}

/// Reads a private key file, refusing one whose mode lets its group or others read or
/// write it (judged on the opened file, so a swap between check and read changes nothing).
fn read_private(path: &Path, what: &str, allow_shared: bool) -> Result<String, Fail> {
    use std::io::Read;
    let io = |e: std::io::Error| Fail::usage(format!("{what} {}: {e}", path.display()));
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mode = f.metadata().map_err(io)?.permissions().mode();
    if mode & 0o077 != 0 {
        if !allow_shared {
            return Err(Fail::usage(format!(
                "{what} {}: the signing key file has mode {:04o}, so its group or others may \
                 read or change it; run `chmod 600 {}` (or pass --allow-shared-key to use it \
                 anyway)",
                path.display(),
                mode & 0o7777,
                path.display()
            )));
        }
        tracing::warn!(
            key = %path.display(),
            mode = format_args!("{:04o}", mode & 0o7777),
            "using a signing key file its group or others may read or change (--allow-shared-key)"
        );
    }
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(io)?;
    Ok(text)
}

fn key_from_variable(allow_shared: bool) -> Result<SigningKey, Fail> {
    let value = match std::env::var(KEY_VARIABLE) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => {
            return Err(Fail::usage(format!(
                "no signing key: pass --key FILE or set {KEY_VARIABLE} (make one with `plimsoll-attest keygen --out PREFIX`)"
            )))
        }
    };
    let v = value.trim();
    if v.contains("-----BEGIN") {
        let pem = v.replace("\\n", "\n");
        return SigningKey::from_pkcs8_pem(&pem)
            .map_err(|e| Fail::usage(format!("{KEY_VARIABLE} (PEM text): {e}")));
    }
    if !v.contains('/') || !Path::new(v).exists() {
        // The PEM body alone, as some secret stores keep it.
        let pem = format!("-----BEGIN PRIVATE KEY-----\n{v}\n-----END PRIVATE KEY-----\n");
        if let Ok(k) = SigningKey::from_pkcs8_pem(&pem) {
            return Ok(k);
        }
    }
    let p = Path::new(v);
    if !p.exists() {
        return Err(Fail::usage(format!(
            "{KEY_VARIABLE} holds neither a PKCS#8 PEM key nor the path of one (its value is not shown)"
        )));
    }
    let text = read_private(p, KEY_VARIABLE, allow_shared)?;
    SigningKey::from_pkcs8_pem(&text)
        .map_err(|e| Fail::usage(format!("{KEY_VARIABLE} {}: {e}", p.display())))
}

/// The public key a bundle is verified against.
pub fn public_key(path: &Path) -> Result<PublicKey, Fail> {
    let text = read(path, "--pub")?;
    PublicKey::from_spki_pem(&text)
        .map_err(|e| Fail::usage(format!("--pub {}: {e}", path.display())))
}

fn read(path: &Path, flag: &str) -> Result<String, Fail> {
    std::fs::read_to_string(path)
        .map_err(|e| Fail::usage(format!("{flag} {}: {e}", path.display())))
}
