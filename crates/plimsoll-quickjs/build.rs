//! Records which QuickJS source this crate is built from, for the environment identity that
//! every record states: the version of the `rquickjs-sys` package (which carries the
//! QuickJS-ng C sources and compiles them with `cc`) and the SHA-256 of that package's source
//! archive as `Cargo.lock` pins it. Outside a workspace with a lock file the digest is
//! `unknown`, and the identity says so.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let lock = manifest.join("../../Cargo.lock");
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(&lock).unwrap_or_default();
    let (version, checksum) = sys_package(&text).unwrap_or(("unknown".into(), "unknown".into()));
    println!("cargo:rustc-env=PLIMSOLL_QUICKJS_SYS_VERSION={version}");
    println!("cargo:rustc-env=PLIMSOLL_QUICKJS_SYS_SHA256={checksum}");
}

/// The `[[package]]` entry named `rquickjs-sys`: its version and checksum.
fn sys_package(lock: &str) -> Option<(String, String)> {
    for block in lock.split("[[package]]") {
        let field = |name: &str| {
            block.lines().find_map(|l| {
                let v = l.strip_prefix(name)?.trim_start().strip_prefix('=')?;
                Some(v.trim().trim_matches('"').to_owned())
            })
        };
        if field("name").as_deref() == Some("rquickjs-sys") {
            return Some((field("version")?, field("checksum")?));
        }
    }
    None
}
