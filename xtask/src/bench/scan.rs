//! `cargo xtask bench scan`: the ship scan on a generated image of at least 1 GiB.
//!
//! It generates incompressible (from /dev/urandom) and compressible (text) files, plants
//! withheld values in a few (one inside a gzip file), builds a `docker save` archive by hand
//! (no registry, no pulls) and a second one of the same image with gzip layers, `docker
//! load`s the first, and measures in one run three like-for-like cases, each from one source:
//! the engine's export (`scan-image IMAGE`), the saved archive file and the gzip-layer archive
//! file (`scan-image docker-archive:PATH`). Each case takes its baseline from the same source:
//! `plimsoll-withheld stream-baseline` streams it, decompresses its layers and reads every tar
//! entry, without matching. Each case times the scan two ways: with matching on its own thread
//! (what ships; the ratio to the baseline has the target of at most 1.3x) and inline on the
//! reading thread (`-match-inline`, hidden), so the page shows what the thread saves; both
//! must find the same values. Peak RSS is the child's VmHWM sampled from /proc every 10 ms
//! (target at most 64 MiB). Then:
//! - the matcher's per-byte cost in memory against a plain SHA-256 of the same bytes
//!   (`plimsoll-withheld match-rate`, hidden);
//! - as peer figures, `detect-secrets scan --all-files` and `ripsecrets` on the same files,
//!   extracted (they hunt for secret-looking strings; plimsoll matches exact withheld values).
//!
//! Rounds take baseline, threaded scan and inline scan in turns after a warm-up export, and
//! the best of each is kept. Everything it creates (files, archives, image) is removed at the
//! end unless `--keep`.
//!
//! Then the hostile inputs (no engine needed; `--hostile-only` runs just these): `docker save`
//! archives built here whose layer holds one hostile file each, scanned as
//! `scan-image docker-archive:PATH`, each with its peak RSS (sampled, and the child's maximum
//! RSS from GNU time where installed) against the 64 MiB bound and
//! against the baseline of a benign archive of the same shape (16 MiB of random bytes):
//! - `nested-windows`: 16 MiB of random bytes inside six nested streams, zstd (`--long=24`, a
//!   16 MiB window), xz (`-6`, an 8 MiB dictionary), zstd, xz, zstd, zstd, each window
//!   filled (80 MiB of windows if all were open at once);
//! - `zstd-bomb`: 4 GiB of zeros in zstd;
//! - `zip-bomb-nested`: a zip of 16 zips of 16 zips ... of 4 MiB of zeros (five levels,
//!   256 GiB decoded), every level alone below the ratio limit;
//! - `gzip-deep`: a text file inside 16 nested gzip streams (deeper than the depth limit).
//!
//! A hostile scan that runs longer than 120 s is killed and reported as not ending (bad input
//! must end within bounded time).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};

const USAGE: &str = "\
usage: cargo xtask bench scan [--size-mib N] [--rounds N] [--no-build] [--keep]
  --size-mib N   bytes of files in the image, in MiB (default 1100, at least 1024)
  --rounds N     baseline/scan pairs after the warm-up (default 2)
  --no-build     use target/release/plimsoll-withheld as it is
  --keep         keep the generated files, archive and image
  --no-peer      skip the detect-secrets and ripsecrets peer figures (minutes per GiB)
  --hostile-only only the hostile inputs (no engine, no 1 GiB image)
  --bin PATH     scan with this plimsoll-withheld binary (implies --no-build)";

const CANARY_A: &[u8] = b"bench-canary-A-3b1f9e77c2"; // 25 bytes, in a random file
const CANARY_B: &[u8] = b"bench-canary-B-value-0123456789abcdefXYZ"; // 40, in text and .gz
const CANARY_C: &[u8] = b"bench-canary-C-never-planted-0000000000000000000000000000000000000000000000000000000000000000000000"; // 100

struct Options {
    size_mib: u64,
    rounds: u32,
    build: bool,
    keep: bool,
    peer: bool,
    hostile_only: bool,
    bin: Option<PathBuf>,
}

fn parse(args: &[&str]) -> anyhow::Result<Options> {
    let mut o = Options {
        size_mib: 1100,
        rounds: 2,
        build: true,
        keep: false,
        peer: true,
        hostile_only: false,
        bin: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "--size-mib" => o.size_mib = it.next().context(USAGE)?.parse().context(USAGE)?,
            "--rounds" => o.rounds = it.next().context(USAGE)?.parse().context(USAGE)?,
            "--no-build" => o.build = false,
            "--keep" => o.keep = true,
            "--no-peer" => o.peer = false,
            "--hostile-only" => o.hostile_only = true,
            "--bin" => {
                o.bin = Some(PathBuf::from(it.next().context(USAGE)?));
                o.build = false;
            }
            _ => bail!("unknown argument {a:?}\n{USAGE}"),
        }
    }
    ensure!(
        o.size_mib >= 1024,
        "--size-mib must be at least 1024\n{USAGE}"
    );
    ensure!(o.rounds >= 1, "--rounds must be at least 1");
    Ok(o)
}

fn sh(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn sha256_file(p: &Path) -> anyhow::Result<String> {
    let out = sh(Command::new("sha256sum").arg(p))?;
    Ok(out
        .split_whitespace()
        .next()
        .context("sha256sum output")?
        .to_owned())
}

fn sha256_bytes(dir: &Path, b: &[u8]) -> anyhow::Result<String> {
    let p = dir.join(".sha-input");
    std::fs::write(&p, b)?;
    let h = sha256_file(&p);
    std::fs::remove_file(&p)?;
    h
}

/// A ustar header for a regular file with a short name.
fn tar_header(name: &str, size: u64) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// Appends `name` with the content of `src` to a tar being written.
fn tar_append(out: &mut impl Write, name: &str, src: &Path) -> anyhow::Result<u64> {
    let size = std::fs::metadata(src)?.len();
    out.write_all(&tar_header(name, size))?;
    let n = std::io::copy(&mut File::open(src)?, out)?;
    ensure!(n == size, "{} changed while archiving", src.display());
    let pad = (512 - size % 512) % 512;
    out.write_all(&vec![0u8; pad as usize])?;
    Ok(size)
}

fn text_block(seed: u64, len: usize) -> Vec<u8> {
    let words = [
        "config",
        "server",
        "timeout",
        "retries",
        "region",
        "bucket",
        "replica",
        "shard",
        "window",
        "budget",
        "latency",
        "token_ttl",
    ];
    let mut out = Vec::with_capacity(len + 128);
    let mut x = seed | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = words[(x % words.len() as u64) as usize];
        let line = format!(
            "{w}_{:06} = {} # entry {}\n",
            x % 1_000_000,
            (x >> 20) % 100_000,
            x % 977
        );
        out.extend_from_slice(line.as_bytes());
    }
    out.truncate(len);
    out
}

struct Generated {
    files_dir: PathBuf,
    archive: PathBuf,
    /// The same image with gzip-compressed layer blobs (not loaded into the engine).
    archive_gz: PathBuf,
    set: PathBuf,
    tag: String,
    bytes: u64,
}

/// Generates the files, two layer tars (written straight into the archive), the config and
/// manifest, and the withheld set.
fn generate(work: &Path, size_mib: u64, bin: &Path) -> anyhow::Result<Generated> {
    let files_dir = work.join("files");
    std::fs::create_dir_all(&files_dir)?;
    let total = size_mib << 20;
    let mut urandom = File::open("/dev/urandom").context("/dev/urandom")?;
    let mut names: Vec<String> = Vec::new();
    let mut written = 0u64;
    let mut i = 0u64;
    let mut buf = vec![0u8; 8 << 20];
    eprintln!("bench: generating {size_mib} MiB of files");
    while written < total {
        let (name, content): (String, Vec<u8>) = if i.is_multiple_of(2) {
            urandom.read_exact(&mut buf)?;
            if i == 10 {
                buf[3_000_001..3_000_001 + CANARY_A.len()].copy_from_slice(CANARY_A);
            }
            (format!("r{i:05}.bin"), buf.clone())
        } else {
            let mut t = text_block(i, 4 << 20);
            if i == 11 {
                t[1_000_000..1_000_000 + CANARY_B.len()].copy_from_slice(CANARY_B);
            }
            (format!("t{i:05}.txt"), t)
        };
        std::fs::write(files_dir.join(&name), &content)?;
        written += content.len() as u64;
        names.push(name);
        i += 1;
    }
    // A few compressed copies of text files (nested decoding), one holding canary B.
    for n in ["t00011.txt", "t00013.txt", "t00015.txt", "t00017.txt"] {
        sh(Command::new("gzip")
            .args(["-k", "-6", "-f"])
            .arg(files_dir.join(n)))?;
        let gz = format!("{n}.gz");
        written += std::fs::metadata(files_dir.join(&gz))?.len();
        names.push(gz);
    }

    // The withheld set, built with the CLI as a release pipeline would.
    let set = work.join("withheld.json");
    for (id, v) in [
        ("canary-a", CANARY_A),
        ("canary-b", CANARY_B),
        ("canary-c", CANARY_C),
    ] {
        let vf = work.join(format!("{id}.value"));
        std::fs::write(&vf, v)?;
        sh(Command::new(bin)
            .args(["add", "-set"])
            .arg(&set)
            .args(["-id", id, "-mode", "refuse", "-value-file"])
            .arg(&vf))?;
        std::fs::remove_file(&vf)?;
    }
    sh(Command::new(bin)
        .args(["add", "-set"])
        .arg(&set)
        .args(["-id", "answer-file", "-mode", "audit", "-file"])
        .arg(files_dir.join("t00013.txt")))?;

    // Two layers, half the files each, then the docker save archive.
    eprintln!("bench: building the image archive");
    let half = names.len() / 2;
    let mut layer_paths = Vec::new();
    for (n, part) in [&names[..half], &names[half..]].iter().enumerate() {
        let lp = work.join(format!("layer{n}.tar"));
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&lp)?);
        for name in part.iter() {
            tar_append(&mut w, &format!("data/{name}"), &files_dir.join(name))?;
        }
        w.write_all(&[0u8; 1024])?;
        w.flush()?;
        layer_paths.push(lp);
    }
    let diff_ids: Vec<String> = layer_paths
        .iter()
        .map(|p| sha256_file(p).map(|h| format!("sha256:{h}")))
        .collect::<anyhow::Result<_>>()?;
    let tag = format!("plimsoll-bench-scan:{}", std::process::id());
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": { "Labels": { "io.plimsoll.bench": tag } },
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    }))?;
    let archive = write_save(work, "image.tar", &layer_paths, &diff_ids, &config, &tag)?;
    // The same image with gzip layers (as a registry serves them), for the saved-archive
    // comparison where decompression and matching both cost CPU.
    eprintln!("bench: gzip -1 of the layers");
    let mut gz_paths = Vec::new();
    for lp in &layer_paths {
        let gz = lp.with_extension("tar.gz");
        let out = File::create(&gz)?;
        let st = Command::new("gzip")
            .args(["-1", "-c"])
            .arg(lp)
            .stdout(out)
            .status()?;
        ensure!(st.success(), "gzip of {} failed", lp.display());
        gz_paths.push(gz);
    }
    let archive_gz = write_save(work, "image-gz.tar", &gz_paths, &diff_ids, &config, &tag)?;
    for gz in &gz_paths {
        std::fs::remove_file(gz)?;
    }
    for lp in &layer_paths {
        std::fs::remove_file(lp)?;
    }
    Ok(Generated {
        files_dir,
        archive,
        archive_gz,
        set,
        tag,
        bytes: written,
    })
}

/// Writes a `docker save` archive named `name` holding `layers` (blobs as they are) and the
/// config, tagged `tag`.
fn write_save(
    work: &Path,
    name: &str,
    layers: &[PathBuf],
    diff_ids: &[String],
    config: &[u8],
    tag: &str,
) -> anyhow::Result<PathBuf> {
    let config_hex = sha256_bytes(work, config)?;
    let archive = work.join(name);
    let mut w = BufWriter::with_capacity(1 << 20, File::create(&archive)?);
    let mut names = Vec::new();
    for (lp, d) in layers.iter().zip(diff_ids) {
        let member = format!("{}/layer.tar", &d["sha256:".len()..]);
        tar_append(&mut w, &member, lp)?;
        names.push(member);
    }
    let cfg = work.join("config.json");
    std::fs::write(&cfg, config)?;
    tar_append(&mut w, &format!("{config_hex}.json"), &cfg)?;
    let manifest = work.join("manifest.json");
    std::fs::write(
        &manifest,
        serde_json::to_vec(&serde_json::json!([{
            "Config": format!("{config_hex}.json"), "RepoTags": [tag], "Layers": names,
        }]))?,
    )?;
    tar_append(&mut w, "manifest.json", &manifest)?;
    w.write_all(&[0u8; 1024])?;
    w.flush()?;
    Ok(archive)
}

struct Measure {
    wall: Duration,
    peak_kib: u64,
    code: i32,
    stdout: String,
}

/// Runs a command, timing it and sampling its peak RSS until it exits.
fn measure(cmd: &mut Command) -> anyhow::Result<Measure> {
    measure_within(cmd, None)
}

/// [`measure`], killing the command once it has run for `limit` (its exit code is then -1).
fn measure_within(cmd: &mut Command, limit: Option<Duration>) -> anyhow::Result<Measure> {
    let out_path = std::env::temp_dir().join(format!("bench-scan-out-{}", std::process::id()));
    let start = Instant::now();
    let mut child = cmd
        .stdout(File::create(&out_path)?)
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let sampled = super::mem::wait_sampling(&mut child, start, Duration::from_millis(10), limit)?;
    let peak_kib = sampled.peak_kib.unwrap_or(0);
    let stdout = match sampled.status {
        Some(_) => std::fs::read_to_string(&out_path).unwrap_or_default(),
        None => String::new(),
    };
    let _ = std::fs::remove_file(&out_path);
    Ok(Measure {
        wall: sampled.wall,
        peak_kib,
        code: sampled.status.and_then(|st| st.code()).unwrap_or(-1),
        stdout,
    })
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let o = parse(args)?;
    if o.build {
        crate::dist::build_release(&["plimsoll-withheld-bin"])?;
    }
    let bin = match &o.bin {
        Some(b) => b.clone(),
        None => crate::dist::release_bin("plimsoll-withheld")?,
    };
    if o.hostile_only {
        return hostile(&bin, o.keep);
    }
    sh(Command::new("docker").args(["version", "--format", "{{.Server.Version}}"]))
        .context("bench scan needs a Docker engine")?;

    let work = tempfile::Builder::new().prefix("bench-scan-").tempdir()?;
    let g = generate(work.path(), o.size_mib, &bin)?;
    let archive_size = std::fs::metadata(&g.archive)?.len();
    eprintln!("bench: docker load ({} MiB archive)", archive_size >> 20);
    sh(Command::new("docker").arg("load").arg("-i").arg(&g.archive))?;
    let result = measure_all(&o, &bin, &g, archive_size).and_then(|()| hostile(&bin, o.keep));
    if !o.keep {
        let _ = Command::new("docker").args(["rmi", "-f", &g.tag]).output();
    } else {
        eprintln!("bench: kept {} and image {}", work.path().display(), g.tag);
        let _ = work.keep();
    }
    result
}

/// One like-for-like comparison: the baseline and both ways of scanning, from one source.
struct Case {
    name: &'static str,
    baseline: Measure,
    threaded: Measure,
    inline: Measure,
}

/// Measures `target` (an engine image or `docker-archive:PATH`) in turns, best of `rounds`.
fn case(
    o: &Options,
    bin: &Path,
    set: &Path,
    name: &'static str,
    target: &str,
) -> anyhow::Result<Case> {
    let baseline = || measure(Command::new(bin).args(["stream-baseline", target]));
    let scan = |inline: bool| {
        let mut cmd = Command::new(bin);
        cmd.args(["scan-image", "-set"])
            .arg(set)
            .args(["-format", "json"]);
        if inline {
            cmd.arg("-match-inline");
        }
        measure(cmd.arg(target))
    };
    let (mut bs, mut ts, mut is) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..o.rounds {
        eprintln!("bench: {name}, round {} of {}", r + 1, o.rounds);
        bs.push(baseline()?);
        ts.push(scan(false)?);
        is.push(scan(true)?);
    }
    let pick = |v: Vec<Measure>| v.into_iter().min_by_key(|m| m.wall).expect("a round");
    let c = Case {
        name,
        baseline: pick(bs),
        threaded: pick(ts),
        inline: pick(is),
    };
    ensure!(
        c.baseline.code == 0,
        "{name}: stream-baseline failed (exit {})",
        c.baseline.code
    );
    for (how, m) in [("threaded", &c.threaded), ("inline", &c.inline)] {
        ensure!(
            m.code == 1,
            "{name}: the {how} scan should refuse (planted canaries), exit {}",
            m.code
        );
    }
    ensure!(
        finding_ids(&c.threaded)? == finding_ids(&c.inline)?,
        "{name}: the threaded and inline scans found different things"
    );
    Ok(c)
}

/// The entry IDs of a JSON scan report's findings, in order.
fn finding_ids(m: &Measure) -> anyhow::Result<Vec<String>> {
    let report: serde_json::Value = serde_json::from_str(&m.stdout).context("scan JSON")?;
    Ok(report["images"][0]["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["entry_id"].as_str().map(str::to_owned))
        .collect())
}

fn measure_all(o: &Options, bin: &Path, g: &Generated, archive_size: u64) -> anyhow::Result<()> {
    eprintln!("bench: warm-up export");
    let warm = measure(Command::new(bin).args(["stream-baseline", &g.tag]))?;
    ensure!(
        warm.code == 0,
        "stream-baseline failed (exit {})",
        warm.code
    );
    let plain = format!("docker-archive:{}", g.archive.display());
    let gz = format!("docker-archive:{}", g.archive_gz.display());
    let cases = [
        case(o, bin, &g.set, "engine export", &g.tag)?,
        case(o, bin, &g.set, "saved archive", &plain)?,
        case(o, bin, &g.set, "saved archive, gzip layers", &gz)?,
    ];
    let ids = finding_ids(&cases[0].threaded)?;
    ensure!(
        ids.iter().any(|i| i == "canary-a")
            && ids.iter().any(|i| i == "canary-b")
            && ids.iter().any(|i| i == "answer-file"),
        "the scan missed a planted value: {ids:?}"
    );
    eprintln!("bench: matcher against SHA-256, in memory");
    let rates = sh(Command::new(bin)
        .args(["match-rate", "-set"])
        .arg(&g.set)
        .args(["-mib", "512"]))?;
    let rates: serde_json::Value = serde_json::from_str(rates.trim()).context("match-rate")?;
    let peers = if o.peer {
        eprintln!("bench: detect-secrets on the extracted files");
        let ds = detect_secrets(&g.files_dir);
        eprintln!("bench: ripsecrets on the extracted files");
        let rs = ripsecrets(&g.files_dir);
        vec![ds, rs]
    } else {
        vec![
            Err(anyhow::anyhow!("skipped (--no-peer)")),
            Err(anyhow::anyhow!("skipped (--no-peer)")),
        ]
    };

    println!(
        "ship scan benchmark: {} MiB of files ({} MiB export; gzip layers {} MiB), {} rounds, best of each; MiB/s of the export's size",
        g.bytes >> 20,
        archive_size >> 20,
        std::fs::metadata(&g.archive_gz)?.len() >> 20,
        o.rounds
    );
    println!(
        "{:<62} {:>8} {:>8} {:>12}",
        "", "seconds", "MiB/s", "peak RSS MiB"
    );
    let row = |name: &str, m: &Measure| {
        println!(
            "{:<62} {:>8.2} {:>8.0} {:>12.1}",
            name,
            m.wall.as_secs_f64(),
            mib_s(archive_size, m.wall),
            m.peak_kib as f64 / 1024.0
        );
    };
    for c in &cases {
        row(
            &format!("{}: baseline (decompress, no match)", c.name),
            &c.baseline,
        );
        row(
            &format!("{}: scan-image, matching thread", c.name),
            &c.threaded,
        );
        row(
            &format!("{}: scan-image, inline (-match-inline)", c.name),
            &c.inline,
        );
    }
    let peer_names = [
        "detect-secrets scan --all-files (extracted files)",
        "ripsecrets (extracted files)",
    ];
    for (name, m) in peer_names.iter().zip(&peers) {
        match m {
            Ok(m) if m.code == -1 => println!(
                "{name:<62} killed after {} s unfinished: under {:.1} MiB/s",
                PEER_LIMIT.as_secs(),
                mib_s(archive_size, PEER_LIMIT)
            ),
            Ok(m) => row(name, m),
            Err(e) => println!("{name:<62} not measured: {e}"),
        }
    }
    println!(
        "what each does: scan-image decodes every layer, archive and compressed file and matches \
         the exact withheld values (runs of bytes and whole files, by digest); detect-secrets and \
         ripsecrets read the extracted files as they lie and hunt for strings that look like \
         secrets (patterns, entropy), which neither needs nor uses the withheld values"
    );
    let secs = |m: &Measure| m.wall.as_secs_f64();
    for c in &cases {
        let ratio = secs(&c.threaded) / secs(&c.baseline);
        println!(
            "{}: scan/baseline {ratio:.2}x (target <= 1.3x): {}; inline {:.2}x; the matching thread saves {:.0}%",
            c.name,
            if ratio <= 1.3 { "met" } else { "NOT met" },
            secs(&c.inline) / secs(&c.baseline),
            100.0 * (1.0 - secs(&c.threaded) / secs(&c.inline))
        );
    }
    let (m_rate, s_rate) = (
        rates["match_mib_s"].as_f64().unwrap_or(0.0),
        rates["sha256_mib_s"].as_f64().unwrap_or(0.0),
    );
    println!(
        "matcher per byte, in memory on 512 MiB of random bytes with this set: {m_rate:.0} MiB/s \
         against a plain SHA-256 of the same bytes {s_rate:.0} MiB/s ({:.2}x SHA-256's time)",
        s_rate / m_rate.max(1e-9)
    );
    let peak_kib = cases
        .iter()
        .flat_map(|c| [c.threaded.peak_kib, c.inline.peak_kib])
        .max()
        .unwrap_or(0);
    let peak_mib = peak_kib as f64 / 1024.0;
    println!(
        "scan peak RSS, every scan above: {peak_mib:.1} MiB (target <= 64 MiB): {}",
        if peak_mib <= 64.0 { "met" } else { "NOT met" }
    );
    println!(
        "findings in the engine scan: {} ({})",
        ids.len(),
        ids.join(", ")
    );
    Ok(())
}

/// A `docker save` archive whose one layer holds `files` (name in the layer, source file).
fn save_archive(work: &Path, label: &str, files: &[(&str, PathBuf)]) -> anyhow::Result<PathBuf> {
    let lp = work.join(format!("{label}.layer.tar"));
    {
        let mut w = BufWriter::with_capacity(1 << 20, File::create(&lp)?);
        for (name, src) in files {
            tar_append(&mut w, name, src)?;
        }
        w.write_all(&[0u8; 1024])?;
        w.flush()?;
    }
    let diff = format!("sha256:{}", sha256_file(&lp)?);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": { "Labels": { "io.plimsoll.bench": label } },
        "rootfs": { "type": "layers", "diff_ids": [diff] },
    }))?;
    let tag = format!("plimsoll-bench-hostile:{label}");
    let archive = write_save(
        work,
        &format!("{label}.tar"),
        std::slice::from_ref(&lp),
        &[diff],
        &config,
        &tag,
    )?;
    std::fs::remove_file(&lp)?;
    Ok(archive)
}

/// Runs `sh -c SCRIPT` with `$1`.. as `args` (the generators pipe through zstd, xz, python3).
fn shell(script: &str, args: &[&Path]) -> anyhow::Result<()> {
    let mut c = Command::new("sh");
    c.arg("-c").arg(script).arg("sh").args(args);
    sh(&mut c).map(|_| ())
}

const ZIP_BOMB: &str = "
import io, sys, zipfile
def z(members):
    b = io.BytesIO()
    with zipfile.ZipFile(b, 'w', zipfile.ZIP_DEFLATED) as f:
        for n, d in members:
            f.writestr(n, d)
    return b.getvalue()
level = z([('zeros', bytes(4 << 20))])
for _ in range(4):
    level = z([('l%d.zip' % i, level) for i in range(16)])
open(sys.argv[1], 'wb').write(level)
";

/// Generates the hostile inputs and the benign baseline, scans each, prints the table.
fn hostile(bin: &Path, keep: bool) -> anyhow::Result<()> {
    let work = tempfile::Builder::new()
        .prefix("bench-hostile-")
        .tempdir()?;
    let w = work.path();
    eprintln!("bench: generating hostile inputs in {}", w.display());
    let set = w.join("withheld.json");
    let vf = w.join("v");
    std::fs::write(&vf, CANARY_C)?;
    sh(Command::new(bin)
        .args(["add", "-set"])
        .arg(&set)
        .args(["-id", "never-planted", "-mode", "refuse", "-value-file"])
        .arg(&vf))?;
    let random = w.join("random.bin");
    shell("head -c 16777216 /dev/urandom > \"$1\"", &[&random])?;
    let benign = save_archive(w, "benign", &[("data/random.bin", random.clone())])?;

    let mut inputs: Vec<(&str, PathBuf)> = Vec::new();
    // Six nested decoders, each window filled by 16 MiB of random bytes.
    let mut cur = random.clone();
    for (i, xz) in [false, true, false, true, false, false]
        .into_iter()
        .enumerate()
    {
        let next = w.join(format!("nested.{i}"));
        if xz {
            shell("cat \"$1\" | xz -q -6 -T1 -c > \"$2\"", &[&cur, &next])?;
        } else {
            shell(
                "cat \"$1\" | zstd -q -1 --long=24 -c > \"$2\"",
                &[&cur, &next],
            )?;
        }
        if cur != random {
            std::fs::remove_file(&cur)?;
        }
        cur = next;
    }
    inputs.push((
        "nested-windows",
        save_archive(w, "nested-windows", &[("data/nested.bin", cur)])?,
    ));
    let bomb = w.join("zeros.zst");
    shell(
        "head -c 4294967296 /dev/zero | zstd -q -1 -c > \"$1\"",
        &[&bomb],
    )?;
    inputs.push((
        "zstd-bomb",
        save_archive(w, "zstd-bomb", &[("data/zeros.zst", bomb)])?,
    ));
    let zb = w.join("42.zip");
    sh(Command::new("python3").args(["-c", ZIP_BOMB]).arg(&zb))?;
    inputs.push((
        "zip-bomb-nested",
        save_archive(w, "zip-bomb-nested", &[("data/42.zip", zb)])?,
    ));
    let mut deep = w.join("deep.0");
    std::fs::write(&deep, text_block(7, 1 << 20))?;
    for i in 1..=16 {
        let next = w.join(format!("deep.{i}"));
        shell("gzip -c \"$1\" > \"$2\"", &[&deep, &next])?;
        std::fs::remove_file(&deep)?;
        deep = next;
    }
    inputs.push((
        "gzip-deep",
        save_archive(w, "gzip-deep", &[("data/deep.gz", deep)])?,
    ));

    // Sampling VmHWM every 10 ms can miss a peak in a scan's last milliseconds; where GNU time
    // is installed, the child's own maximum RSS (from wait4) is taken as well.
    let gnu_time = Path::new("/usr/bin/time");
    let rss_file = w.join("maxrss");
    let scan = |archive: &Path| -> anyhow::Result<Measure> {
        let mut cmd = if gnu_time.is_file() {
            let mut c = Command::new(gnu_time);
            c.args(["-f", "%M", "-o"]).arg(&rss_file).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        cmd.args(["scan-image", "-set"])
            .arg(&set)
            .args(["-format", "json"])
            .arg(format!("docker-archive:{}", archive.display()));
        let mut m = measure_within(&mut cmd, Some(Duration::from_secs(120)))?;
        if let Ok(t) = std::fs::read_to_string(&rss_file) {
            if let Some(k) = t.lines().last().and_then(|l| l.trim().parse::<u64>().ok()) {
                m.peak_kib = m.peak_kib.max(k);
            }
            std::fs::remove_file(&rss_file)?;
        }
        Ok(m)
    };
    let base = scan(&benign)?;
    ensure!(
        base.code == 0,
        "the benign archive should pass, exit {}",
        base.code
    );
    println!("ship scan on hostile inputs: peak RSS against the 64 MiB bound; baseline: the same");
    println!("scan of a benign archive of 16 MiB of random bytes (one layer, one file)");
    println!(
        "{:<18} {:>10} {:>9} {:>13} {:>9} {:>6}  unreadable reasons",
        "input", "archive KiB", "seconds", "peak RSS MiB", "x base", "exit"
    );
    let row = |name: &str, archive: &Path, m: &Measure| -> anyhow::Result<bool> {
        let report: serde_json::Value =
            serde_json::from_str(&m.stdout).unwrap_or(serde_json::Value::Null);
        let mut reasons: Vec<String> = report["images"][0]["unreadable"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|u| u["reason"].as_str().map(str::to_owned))
            .collect();
        reasons.sort();
        reasons.dedup();
        let peak = m.peak_kib as f64 / 1024.0;
        let (rss, ratio) = if m.code == -1 {
            // Killed under GNU time, which then reports nothing: the peak is not known.
            reasons = vec!["KILLED: did not end within 120 s".into()];
            ("n/a".to_owned(), "n/a".to_owned())
        } else {
            (
                format!("{peak:.1}"),
                format!("{:.2}", m.peak_kib as f64 / base.peak_kib.max(1) as f64),
            )
        };
        println!(
            "{:<18} {:>10} {:>9.2} {:>13} {:>9} {:>6}  {}",
            name,
            std::fs::metadata(archive)?.len() >> 10,
            m.wall.as_secs_f64(),
            rss,
            ratio,
            m.code,
            reasons.join(" ")
        );
        Ok(peak <= 64.0 && m.code != -1)
    };
    row("benign (baseline)", &benign, &base)?;
    let mut all = true;
    for (name, archive) in &inputs {
        eprintln!("bench: scanning {name}");
        let m = scan(archive)?;
        all &= row(name, archive, &m)?;
    }
    println!(
        "hostile scans ended within 120 s with peak RSS within 64 MiB: {}",
        if all { "met" } else { "NOT met" }
    );
    if keep {
        eprintln!("bench: kept {}", w.display());
        let _ = work.keep();
    }
    Ok(())
}

/// The longest a peer scanner may run; one still running then is killed and reported so.
const PEER_LIMIT: Duration = Duration::from_secs(600);

/// `ripsecrets` (a Rust secret scanner; `cargo install ripsecrets`) over the extracted files;
/// it exits 1 when it found something.
fn ripsecrets(files: &Path) -> anyhow::Result<Measure> {
    peer(
        "ripsecrets",
        &["."],
        "cargo install ripsecrets",
        &[0, 1],
        files,
    )
}

fn detect_secrets(files: &Path) -> anyhow::Result<Measure> {
    peer(
        "detect-secrets",
        &["scan", "--all-files"],
        "pip install detect-secrets",
        &[0],
        files,
    )
}

/// Runs the peer scanner `bin ARGS` in `files`, killed after [`PEER_LIMIT`] (exit code -1);
/// any exit code but those in `ok` is a failure.
fn peer(
    bin: &str,
    args: &[&str],
    install: &str,
    ok: &[i32],
    files: &Path,
) -> anyhow::Result<Measure> {
    let probe = Command::new(bin).arg("--version").output();
    ensure!(
        probe.map(|o| o.status.success()).unwrap_or(false),
        "{bin} is not installed ({install})"
    );
    let m = measure_within(
        Command::new(bin).args(args).current_dir(files),
        Some(PEER_LIMIT),
    )?;
    ensure!(
        m.code == -1 || ok.contains(&m.code),
        "{bin} exited {}",
        m.code
    );
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_checksum_and_size_fields() {
        let h = tar_header("data/x", 1234);
        assert_eq!(&h[124..136], b"00000002322\0");
        let stored = std::str::from_utf8(&h[148..154]).unwrap();
        let mut c = h;
        c[148..156].copy_from_slice(b"        ");
        let sum: u32 = c.iter().map(|&b| u32::from(b)).sum();
        assert_eq!(u32::from_str_radix(stored, 8).unwrap(), sum);
    }

    #[test]
    fn options_need_a_gibibyte() {
        assert!(parse(&["--size-mib", "100"]).is_err());
        assert_eq!(parse(&[]).unwrap().size_mib, 1100);
    }
}
