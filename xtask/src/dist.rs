//! `cargo xtask dist`: static builds of the binaries that are copied into sandbox images
//! (plimsoll-sandboxd-tls and plimsoll-sandboxd), into `target/dist/`, each checked with
//! `ldd` to be "not a dynamic executable".
//!
//! glibc with `-C target-feature=+crt-static` on an explicit `--target`, so RUSTFLAGS reach
//! only the target's crates and never build scripts or proc macros. No musl toolchain is
//! needed; nothing these binaries do needs NSS (they never resolve names).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The target the static binaries are built for.
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// (cargo package, binary name) of each binary built.
pub const BINARIES: [(&str, &str); 2] = [
    ("plimsoll-sandboxd-tls", "plimsoll-sandboxd-tls"),
    ("plimsoll-sandboxd-bin", "plimsoll-sandboxd"),
];

/// The workspace root (xtask's parent directory).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

/// The target directory cargo uses (honours CARGO_TARGET_DIR).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// `cargo`, as the one that runs xtask.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `cargo build --release -p <each package>` in the workspace, for a benchmark.
pub fn build_release(packages: &[&str]) -> Result<()> {
    let mut cmd = cargo();
    cmd.current_dir(workspace_root())
        .args(["build", "--release"]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    eprintln!("bench: cargo build --release -p {}", packages.join(" -p "));
    let st = cmd.status().context("running cargo build")?;
    if !st.success() {
        bail!("cargo build --release -p {} failed", packages.join(" -p "));
    }
    Ok(())
}

/// The release build of binary `name`, which must exist.
pub fn release_bin(name: &str) -> Result<PathBuf> {
    let bin = target_dir().join("release").join(name);
    if !bin.is_file() {
        bail!("{} is missing; run without --no-build", bin.display());
    }
    Ok(bin)
}

/// One static binary in `target/dist/`.
#[derive(Debug, Clone)]
pub struct Built {
    /// Its path.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
}

/// Builds both binaries statically, copies them to `target/dist/` and checks them.
pub fn build() -> Result<Vec<Built>> {
    let root = workspace_root();
    let mut cmd = cargo();
    cmd.current_dir(&root)
        .args(["build", "--release", "--target", TARGET]);
    for (pkg, _) in BINARIES {
        cmd.args(["-p", pkg]);
    }
    let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
    if !flags.is_empty() {
        flags.push(' ');
    }
    // crt-static alone makes a static PIE, which ldd calls "statically linked"; with the
    // static relocation model it is a plain static executable: "not a dynamic executable".
    flags.push_str("-C target-feature=+crt-static -C relocation-model=static");
    cmd.env("RUSTFLAGS", flags);
    eprintln!("xtask dist: cargo build --release --target {TARGET} (crt-static)");
    let st = cmd.status().context("running cargo")?;
    if !st.success() {
        bail!("cargo build failed ({st})");
    }
    let out_dir = target_dir().join(TARGET).join("release");
    let dist = target_dir().join("dist");
    std::fs::create_dir_all(&dist).with_context(|| format!("creating {}", dist.display()))?;
    let mut built = Vec::new();
    for (_, name) in BINARIES {
        let from = out_dir.join(name);
        let to = dist.join(name);
        std::fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        check_static(&to)?;
        let size = std::fs::metadata(&to)?.len();
        built.push(Built { path: to, size });
    }
    Ok(built)
}

/// Fails unless `ldd` says the file is not a dynamic executable.
pub fn check_static(path: &Path) -> Result<()> {
    let out = Command::new("ldd")
        .arg(path)
        .output()
        .context("running ldd (is it installed?)")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !text.contains("not a dynamic executable") {
        bail!(
            "{} is dynamically linked; ldd says:\n{text}",
            path.display()
        );
    }
    Ok(())
}

/// `cargo xtask dist`.
pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("dist takes no arguments (got {a:?})");
    }
    let built = build()?;
    println!("static binaries (ldd: not a dynamic executable):");
    for b in &built {
        println!(
            "  {:<48} {:>10} bytes ({:.1} MiB)",
            b.path.display(),
            b.size,
            b.size as f64 / (1024.0 * 1024.0)
        );
    }
    Ok(())
}
