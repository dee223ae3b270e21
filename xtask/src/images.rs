//! `cargo xtask images`: builds the Docker provider's sandbox image on a machine that cannot
//! pull from any registry.
//!
//! 1. A base root filesystem made with `debootstrap --variant=minbase` (Debian bookworm with
//!    `sh`, `python3` and `nodejs`), trimmed of documentation and package caches, and loaded
//!    with `docker import` as `plimsoll/sandbox-base:<recipe hash>`.
//! 2. A static `plimsoll-sandboxd`, from `cargo xtask dist`.
//! 3. `docker/sandbox.Dockerfile` FROM that base with sandboxd copied in, tagged
//!    `plimsoll/sandbox:<hash of base ID, Dockerfile and sandboxd>` and `plimsoll/sandbox:latest`.
//!
//! Each tag is a content hash of its inputs, so a second run finds both images and only
//! rebuilds what changed (cargo's own no-op build, then nothing). `--rebuild` ignores the
//! cache. Older `plimsoll/sandbox*` tags are removed once the new ones exist.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};

const SUITE: &str = "bookworm";
const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";
const INCLUDE: &str = "python3,nodejs";
/// Bump when the trimming below changes, so the base is rebuilt.
const TRIM_VERSION: &str = "trim-v1";
const BASE_REPO: &str = "plimsoll/sandbox-base";
const SANDBOX_REPO: &str = "plimsoll/sandbox";
/// Paths (relative to the root filesystem) whose contents are removed from the base.
const TRIM: &[&str] = &[
    "var/cache/apt",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "var/log",
];

const USAGE: &str = "\
usage: cargo xtask images [--rebuild] [--mirror URL]
  Builds plimsoll/sandbox:latest (and a content-hash tag) without any registry.
  --rebuild     ignore cached images
  --mirror URL  Debian mirror for debootstrap (default http://deb.debian.org/debian)
Needs: a reachable Docker engine, root, and debootstrap (apt-get install debootstrap).";

/// What `images` built or found.
#[derive(Debug, Clone)]
pub struct Built {
    /// The sandbox image's content ID.
    pub sandbox_id: String,
    /// Its content-hash tag.
    pub sandbox_tag: String,
}

use crate::dist::{target_dir, workspace_root as root};

fn sha256_hex(b: &[u8]) -> String {
    plimsoll_core::digest::sha256_hex(b)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The content ID of a local image, or `None` when the engine has no such image.
pub fn image_id(reference: &str) -> Option<String> {
    output(Command::new("docker").args(["image", "inspect", "--format", "{{.Id}}", reference]))
        .ok()
        .filter(|s| s.starts_with("sha256:"))
}

fn image_size_mb(reference: &str) -> f64 {
    output(Command::new("docker").args(["image", "inspect", "--format", "{{.Size}}", reference]))
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .map_or(0.0, |b| b / 1_000_000.0)
}

fn remove_stale(repo: &str, keep: &[&str]) {
    let Ok(list) = output(Command::new("docker").args([
        "image",
        "ls",
        repo,
        "--format",
        "{{.Repository}}:{{.Tag}}",
    ])) else {
        return;
    };
    for r in list.lines() {
        if !keep.contains(&r) && !r.ends_with(":<none>") {
            // An image a container still uses stays; that is fine.
            let _ = output(Command::new("docker").args(["image", "rm", r]));
        }
    }
}

fn ensure_base(mirror: &str, rebuild: bool) -> Result<String> {
    let recipe = format!(
        "debootstrap --variant=minbase --include={INCLUDE} {SUITE} {mirror}\n{TRIM_VERSION}: {TRIM:?}\n"
    );
    let tag = format!("{BASE_REPO}:{}", &sha256_hex(recipe.as_bytes())[..16]);
    if !rebuild {
        if let Some(id) = image_id(&tag) {
            println!("images: base {tag} is cached ({id})");
            return Ok(tag);
        }
    }
    if Command::new("debootstrap")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        bail!("debootstrap is not installed; `apt-get install debootstrap` (the base root filesystem is made with it)");
    }
    let t0 = Instant::now();
    let work = target_dir().join("plimsoll-images");
    std::fs::create_dir_all(&work)?;
    let rootfs = work.join(format!("rootfs-{}", &tag[tag.len() - 16..]));
    if rootfs.exists() {
        // A debootstrap that was interrupted may have left /proc or /sys mounted inside.
        unmount_below(&rootfs)?;
        std::fs::remove_dir_all(&rootfs)
            .with_context(|| format!("cannot clear {}", rootfs.display()))?;
    }
    println!(
        "images: debootstrap {SUITE} (minbase + {INCLUDE}) from {mirror} into {}",
        rootfs.display()
    );
    run(Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--include={INCLUDE}"), SUITE])
        .arg(&rootfs)
        .arg(mirror))?;
    for t in TRIM {
        let p = rootfs.join(t);
        if let Ok(rd) = std::fs::read_dir(&p) {
            for e in rd.flatten() {
                let path = e.path();
                let _ = if path.is_dir() && !path.is_symlink() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
            }
        }
    }
    // Prove the three programs the image promises are there before importing it.
    for prog in ["bin/sh", "usr/bin/python3", "usr/bin/node"] {
        if std::fs::symlink_metadata(rootfs.join(prog)).is_err() {
            bail!(
                "debootstrap finished but {prog} is missing from {}",
                rootfs.display()
            );
        }
    }
    println!("images: docker import as {tag}");
    unmount_below(&rootfs)?;
    let mut tar = Command::new("tar")
        .args(["--numeric-owner", "--one-file-system", "-C"])
        .arg(&rootfs)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run tar")?;
    let tar_out = tar.stdout.take().context("tar has no stdout")?;
    let import = Command::new("docker")
        .args([
            "import",
            "--change",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--message",
            &format!(
                "plimsoll sandbox base: {}",
                recipe.lines().next().unwrap_or("")
            ),
            "-",
            &tag,
        ])
        .stdin(Stdio::from(tar_out))
        .stdout(Stdio::null())
        .status()
        .context("cannot run docker import")?;
    let tar_status = tar.wait()?;
    if !tar_status.success() || !import.success() {
        bail!("tar ({tar_status}) | docker import ({import}) failed");
    }
    std::fs::remove_dir_all(&rootfs).ok();
    println!(
        "images: base {tag} built in {:.0} s, {:.0} MB",
        t0.elapsed().as_secs_f64(),
        image_size_mb(&tag)
    );
    Ok(tag)
}

/// Mount points strictly below `dir` (deepest first), from `/proc/self/mounts`.
fn mounts_below(dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut found: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        // The kernel writes a space in a path as \040.
        .map(|m| m.replace("\\040", " "))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.len()));
    found
}

/// Unmounts whatever debootstrap left mounted below `dir`, so removing or archiving it
/// never reaches into the host's /proc or /sys.
fn unmount_below(dir: &Path) -> Result<()> {
    for m in mounts_below(dir) {
        let _ = Command::new("umount").arg("-l").arg(&m).status();
    }
    let left = mounts_below(dir);
    if !left.is_empty() {
        bail!(
            "cannot unmount {left:?} below {}; unmount them by hand",
            dir.display()
        );
    }
    Ok(())
}

/// plimsoll-sandboxd for the image: the static build of `cargo xtask dist` (glibc
/// `crt-static`, so it runs on any base).
fn build_sandboxd() -> Result<PathBuf> {
    let t0 = Instant::now();
    let built = crate::dist::build()?;
    let bin = built
        .into_iter()
        .map(|b| b.path)
        .find(|p| p.file_name().is_some_and(|n| n == "plimsoll-sandboxd"))
        .context("cargo xtask dist built no plimsoll-sandboxd")?;
    println!(
        "images: static sandboxd ready in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(bin)
}

fn buildx_available() -> bool {
    Command::new("docker")
        .args(["buildx", "version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn ensure_sandbox(base_tag: &str, bin: &Path, rebuild: bool) -> Result<Built> {
    let base_id = image_id(base_tag).with_context(|| format!("{base_tag} vanished"))?;
    let dockerfile = root().join("docker/sandbox.Dockerfile");
    let df = std::fs::read(&dockerfile)
        .with_context(|| format!("cannot read {}", dockerfile.display()))?;
    let sandboxd = std::fs::read(bin)?;
    let mut inputs = Vec::new();
    inputs.extend_from_slice(base_id.as_bytes());
    inputs.push(0);
    inputs.extend_from_slice(sha256_hex(&df).as_bytes());
    inputs.push(0);
    inputs.extend_from_slice(sha256_hex(&sandboxd).as_bytes());
    let tag = format!("{SANDBOX_REPO}:{}", &sha256_hex(&inputs)[..16]);
    let latest = format!("{SANDBOX_REPO}:latest");
    if !rebuild {
        if let Some(id) = image_id(&tag) {
            run(Command::new("docker").args(["tag", &tag, &latest]))?;
            println!("images: sandbox {tag} is cached ({id})");
            return Ok(Built {
                sandbox_id: id,
                sandbox_tag: tag,
            });
        }
    }
    let t0 = Instant::now();
    let context = target_dir().join("plimsoll-images").join("context");
    if context.exists() {
        std::fs::remove_dir_all(&context)?;
    }
    std::fs::create_dir_all(&context)?;
    std::fs::write(context.join("plimsoll-sandboxd"), &sandboxd)?;
    let mut cmd = Command::new("docker");
    if !buildx_available() {
        // No buildx plugin: the classic builder reads FROM a local image without a registry.
        cmd.env("DOCKER_BUILDKIT", "0");
    }
    run(cmd
        .args(["build", "--quiet", "--pull=false", "--build-arg"])
        .arg(format!("BASE={base_tag}"))
        .arg("-f")
        .arg(&dockerfile)
        .args(["-t", &tag, "-t", &latest])
        .arg(&context)
        .stdout(Stdio::null()))?;
    let id = image_id(&tag).with_context(|| format!("docker build made no {tag}"))?;
    println!(
        "images: sandbox {tag} built in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(Built {
        sandbox_id: id,
        sandbox_tag: tag,
    })
}

/// Builds (or finds) the images; `None` when only the usage was asked for.
pub fn build(args: &[String]) -> Result<Option<Built>> {
    let mut rebuild = false;
    let mut mirror = DEFAULT_MIRROR.to_owned();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rebuild" => rebuild = true,
            "--mirror" => mirror = it.next().context("--mirror needs a URL")?.to_string(),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let t0 = Instant::now();
    output(Command::new("docker").args(["version", "--format", "{{.Server.Version}}"])).context(
        "the Docker engine is not reachable (is dockerd running? is DOCKER_HOST right?)",
    )?;
    let base = ensure_base(&mirror, rebuild)?;
    let bin = build_sandboxd()?;
    let built = ensure_sandbox(&base, &bin, rebuild)?;
    let latest = format!("{SANDBOX_REPO}:latest");
    remove_stale(SANDBOX_REPO, &[&built.sandbox_tag, &latest]);
    remove_stale(BASE_REPO, &[&base]);
    println!(
        "images: done in {:.1} s: {} = {} ({:.0} MB); base {} ({:.0} MB)",
        t0.elapsed().as_secs_f64(),
        built.sandbox_tag,
        built.sandbox_id,
        image_size_mb(&built.sandbox_tag),
        base,
        image_size_mb(&base),
    );
    println!("SANDBOX_DOCKER_IMAGE={}", built.sandbox_id);
    Ok(Some(built))
}

/// `cargo xtask images …`.
pub fn run_task(args: &[String]) -> Result<()> {
    build(args).map(|_| ())
}
