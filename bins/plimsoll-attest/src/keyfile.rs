//! `keygen`, and reading the signing and public keys the other commands are given.
//!
//! The private key is PKCS#8 PEM (`openssl genpkey -algorithm ed25519` writes the same
//! form), created with mode 0600 and never overwritten unless `--force`; the public key is
//! SPKI PEM. `PLIMSOLL_ATTEST_KEY` may hold the PEM itself or a path to it. Nothing here
//! ever prints key material: only the key ID (hex SHA-256 of the public key's DER).

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
    /// Replace existing files instead of refusing.
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

fn write_new(path: &Path, bytes: &[u8], mode: u32, force: bool) -> Result<(), Fail> {
    let mut opts = OpenOptions::new();
    opts.write(true).mode(mode);
    if force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = opts.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Fail::usage(format!(
                "{} already exists; pass --force to replace it",
                path.display()
            ))
        } else {
            Fail::usage(format!("{}: {e}", path.display()))
        }
    })?;
    // An existing file keeps its mode through truncation: set it.
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| f.write_all(bytes))
        .and_then(|()| f.sync_all())
        .map_err(|e| Fail::usage(format!("{}: {e}", path.display())))
}

/// `keygen`: a fresh key pair.
pub fn keygen(a: KeygenArgs) -> Result<u8, Fail> {
    let key = SigningKey::generate().map_err(|e| Fail::usage(e.to_string()))?;
    let (key_path, pub_path) = (with_suffix(&a.out, ".key"), with_suffix(&a.out, ".pub"));
    write_new(&key_path, key.to_pkcs8_pem().as_bytes(), 0o600, a.force)?;
    write_new(
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
/// may be the key.
pub fn signing_key(path: Option<&Path>) -> Result<SigningKey, Fail> {
    let Some(p) = path else {
        return key_from_variable();
    };
    if let Ok(meta) = std::fs::metadata(p) {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(key = %p.display(), "the signing key file is readable by others; chmod 600 it");
        }
    }
    let text = read(p, "--key")?;
    SigningKey::from_pkcs8_pem(&text)
        .map_err(|e| Fail::usage(format!("--key {}: {e}", p.display())))
}

fn key_from_variable() -> Result<SigningKey, Fail> {
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
    let text = read(p, KEY_VARIABLE)?;
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
