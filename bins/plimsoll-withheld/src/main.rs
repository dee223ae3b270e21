//! plimsoll-withheld: the ship scan's command line (`scan-image`, `known-unreadable`, `add`).
//!
//! This file parses arguments (Go-style single-dash long flags such as `-set` included), calls
//! the `plimsoll-withheld` library and maps outcomes to exit codes. It must never print or log
//! matched bytes or a withheld value, and never write anything but the set and known files it
//! is told to write.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use plimsoll_withheld::{
    render_json, render_sarif, render_text, scan_archive, scan_engine_image, Docker, Entry,
    KnownImages, Limits, Mode, ScanReport, WithheldSet, MAX_RUN,
};

const AFTER_HELP: &str = "\
Exit codes:
  0  nothing refused
  1  a refuse-mode find, or an unreadable file not on its image's known list (audit-only sets too)
  2  usage error, or a bad set or known file
  3  the engine or an image could not be read
When several apply, the highest wins (2, then 3, then 1).

IMAGE is an engine image (name or content ID; DOCKER_HOST picks the engine), a `docker save`
archive file, or an OCI layout directory. Prefix `docker:` to force the engine, and
`docker-archive:` or `oci:` to force a path.

Single-dash long flags (-set, -known, -format, ...) work like their --long forms.";

/// The ship scan: finds withheld material in images before they ship.
#[derive(Debug, Parser)]
#[command(name = "plimsoll-withheld", version, after_help = AFTER_HELP)]
struct Cli {
    /// Log format: `text` or `json` [default: text on a terminal, json otherwise].
    #[arg(long, global = true, value_name = "FORMAT")]
    log_format: Option<plimsoll_log::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Scan images against a withheld set.
    #[command(after_help = AFTER_HELP)]
    ScanImage(ScanArgs),
    /// Write each image's list of unreadable files into the known file.
    #[command(after_help = AFTER_HELP)]
    KnownUnreadable(KnownArgs),
    /// Add an entry to a withheld set (created if missing) from a file or a value in a file.
    Add(AddArgs),
    /// Benchmark baseline: stream an engine image's export (or read `docker-archive:PATH`) and
    /// decompress its layers, no matching.
    #[command(hide = true)]
    StreamBaseline {
        /// Engine image, or `docker-archive:PATH` for a saved archive file.
        image: String,
    },
    /// Benchmark: the matcher's per-byte cost against a plain SHA-256 of the same bytes.
    #[command(hide = true)]
    MatchRate {
        /// The withheld set (JSON).
        #[arg(long = "set")]
        set: PathBuf,
        /// MiB of random bytes to match.
        #[arg(long = "mib", default_value_t = 256)]
        mib: usize,
    },
}

#[derive(Debug, Args)]
struct ScanArgs {
    /// The withheld set (JSON).
    #[arg(long, value_name = "FILE")]
    set: PathBuf,
    /// Known-unreadable lists (JSON); without it every unreadable file is unknown.
    #[arg(long, value_name = "FILE")]
    known: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Images to scan.
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<String>,
    /// Benchmark comparison only: match on the reading thread instead of a thread of its own.
    #[arg(long = "match-inline", hide = true)]
    match_inline: bool,
}

#[derive(Debug, Args)]
struct KnownArgs {
    /// The withheld set (JSON).
    #[arg(long, value_name = "FILE")]
    set: PathBuf,
    /// Known-unreadable file to update (created if missing); only the named images change.
    #[arg(long, value_name = "FILE")]
    known: PathBuf,
    /// Images whose lists to write.
    #[arg(required = true, value_name = "IMAGE")]
    images: Vec<String>,
}

#[derive(Debug, Args)]
struct AddArgs {
    /// The withheld set to add to (created if missing).
    #[arg(long, value_name = "FILE")]
    set: PathBuf,
    /// The new entry's id.
    #[arg(long)]
    id: String,
    /// What a find does.
    #[arg(long, value_enum)]
    mode: ModeArg,
    /// Match this whole file (by size and SHA-256).
    #[arg(
        long,
        value_name = "PATH",
        required_unless_present = "value_file",
        conflicts_with = "value_file"
    )]
    file: Option<PathBuf>,
    /// Match any run of bytes equal to the value in this file (16 to 65536 bytes; one
    /// trailing newline is dropped unless --keep-newline).
    #[arg(long, value_name = "PATH")]
    value_file: Option<PathBuf>,
    /// Keep a trailing newline of --value-file as part of the value.
    #[arg(long, requires = "value_file")]
    keep_newline: bool,
    /// Free text stored with the entry (never the value).
    #[arg(long)]
    note: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
    Sarif,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ModeArg {
    Refuse,
    Audit,
}

/// Rewrites Go-style single-dash long flags (`-set`, `-known=FILE`) to their `--long` forms.
fn normalise_args(args: Vec<String>) -> Vec<String> {
    plimsoll_log::flags::go_style_flags(&Cli::command(), args)
}

enum Target {
    Engine(String),
    Path(PathBuf),
}

fn target(arg: &str) -> Target {
    if let Some(name) = arg.strip_prefix("docker:") {
        return Target::Engine(name.to_owned());
    }
    for p in ["docker-archive:", "oci:"] {
        if let Some(path) = arg.strip_prefix(p) {
            return Target::Path(PathBuf::from(path));
        }
    }
    if Path::new(arg).exists() {
        Target::Path(PathBuf::from(arg))
    } else {
        Target::Engine(arg.to_owned())
    }
}

fn usage(what: impl std::fmt::Display) -> ExitCode {
    eprintln!("plimsoll-withheld: {what}");
    ExitCode::from(2)
}

/// Scans every IMAGE; returns the reports and the per-image errors.
async fn scan_all(
    images: &[String],
    set: &WithheldSet,
    known: &KnownImages,
    limits: Limits,
) -> (Vec<ScanReport>, Vec<(String, String)>) {
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    let mut docker: Option<Docker> = None;
    for arg in images {
        let res = match target(arg) {
            Target::Path(p) => {
                let (set, known, limits) = (set.clone(), known.clone(), limits.clone());
                tokio::task::spawn_blocking(move || scan_archive(&p, &set, &known, &limits))
                    .await
                    .unwrap_or_else(|e| {
                        Err(plimsoll_withheld::ScanError::Read(format!(
                            "scan thread: {e}"
                        )))
                    })
            }
            Target::Engine(name) => {
                if docker.is_none() {
                    match plimsoll_withheld::connect_docker().await {
                        Ok(d) => docker = Some(d),
                        Err(e) => {
                            errors.push((arg.clone(), e.to_string()));
                            continue;
                        }
                    }
                }
                let d = docker.as_ref().expect("connected");
                scan_engine_image(d, &name, set, known, &limits)
                    .await
                    .map(|r| vec![r])
            }
        };
        match res {
            Ok(rs) => {
                for r in &rs {
                    tracing::info!(
                        image = %r.image_id,
                        source = %r.source,
                        verdict = r.verdict().as_str(),
                        findings = r.findings.len(),
                        unreadable = r.unreadable.len(),
                        files = r.files,
                        "scanned"
                    );
                }
                reports.extend(rs);
            }
            Err(e) => {
                tracing::error!(image = %arg, error = %e, "could not scan");
                errors.push((arg.clone(), e.to_string()));
            }
        }
    }
    (reports, errors)
}

fn exit_for(reports: &[ScanReport], errors: &[(String, String)]) -> ExitCode {
    if !errors.is_empty() {
        ExitCode::from(3)
    } else if reports.iter().any(|r| r.verdict().refuses()) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

async fn scan_image(a: ScanArgs) -> ExitCode {
    let set = match WithheldSet::load(&a.set) {
        Ok(s) => s,
        Err(e) => return usage(format!("--set: {e}")),
    };
    let known = match &a.known {
        Some(p) => match KnownImages::load(p) {
            Ok(k) => k,
            Err(e) => return usage(format!("--known: {e}")),
        },
        None => KnownImages::empty(),
    };
    let limits = Limits {
        match_thread: !a.match_inline,
        ..Limits::default()
    };
    let (reports, errors) = scan_all(&a.images, &set, &known, limits).await;
    match a.format {
        Format::Text => {
            print!("{}", render_text(&reports));
            for (img, e) in &errors {
                eprintln!("plimsoll-withheld: {img}: {e}");
            }
        }
        Format::Json => {
            let mut v = render_json(&reports);
            v["errors"] = errors
                .iter()
                .map(|(i, e)| serde_json::json!({ "image": i, "error": e }))
                .collect();
            println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        }
        Format::Sarif => {
            let mut v = render_sarif(&reports);
            v["runs"][0]["invocations"] = serde_json::json!([{
                "executionSuccessful": errors.is_empty(),
                "toolExecutionNotifications": errors.iter().map(|(i, e)| serde_json::json!({
                    "level": "error",
                    "message": { "text": format!("{i}: {e}") },
                })).collect::<Vec<_>>(),
            }]);
            println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        }
    }
    exit_for(&reports, &errors)
}

async fn known_unreadable(a: KnownArgs) -> ExitCode {
    let set = match WithheldSet::load(&a.set) {
        Ok(s) => s,
        Err(e) => return usage(format!("--set: {e}")),
    };
    let mut known = match KnownImages::load_or_empty(&a.known) {
        Ok(k) => k,
        Err(e) => return usage(format!("--known: {e}")),
    };
    let (reports, errors) =
        scan_all(&a.images, &set, &KnownImages::empty(), Limits::default()).await;
    for r in &reports {
        let items = r.known_items();
        println!(
            "image {} ({}): {} unreadable files listed",
            r.image_id,
            r.source,
            items.len()
        );
        for i in &items {
            println!("  {} {} {} size {}", i.reason, i.layer, i.path, i.size);
        }
        if r.findings.iter().any(|f| f.mode == Mode::Refuse) {
            eprintln!(
                "plimsoll-withheld: note: image {} has refuse-mode finds; scan-image still exits 1",
                r.image_id
            );
        }
        known.set_image(&r.image_id, items);
    }
    for (img, e) in &errors {
        eprintln!("plimsoll-withheld: {img}: {e}");
    }
    if !reports.is_empty() {
        if let Err(e) = known.save(&a.known) {
            return usage(format!("--known: {e}"));
        }
    }
    if errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    }
}

fn add(a: AddArgs) -> ExitCode {
    let mut set = if a.set.exists() {
        match WithheldSet::load(&a.set) {
            Ok(s) => s,
            Err(e) => return usage(format!("--set: {e}")),
        }
    } else {
        WithheldSet::empty()
    };
    let mode = match a.mode {
        ModeArg::Refuse => Mode::Refuse,
        ModeArg::Audit => Mode::Audit,
    };
    let entry = if let Some(path) = &a.file {
        let f = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) => return usage(format!("--file {}: {e}", path.display())),
        };
        match Entry::whole_file(&a.id, mode, f) {
            Ok(e) => e,
            Err(e) => return usage(format!("--file {}: {e}", path.display())),
        }
    } else {
        let path = a.value_file.as_ref().expect("clap requires one source");
        let mut value = Vec::new();
        let read = std::fs::File::open(path)
            .and_then(|f| f.take(MAX_RUN as u64 + 3).read_to_end(&mut value));
        if let Err(e) = read {
            return usage(format!("--value-file {}: {e}", path.display()));
        }
        if !a.keep_newline {
            if value.ends_with(b"\r\n") {
                value.truncate(value.len() - 2);
            } else if value.ends_with(b"\n") {
                value.truncate(value.len() - 1);
            }
        }
        match Entry::run(&a.id, mode, &value) {
            Ok(e) => e,
            Err(e) => return usage(format!("--value-file: {e}")),
        }
    };
    let mut entry = entry;
    entry.note = a.note;
    let kind = match entry.matcher {
        plimsoll_withheld::Matcher::File { .. } => "whole file",
        plimsoll_withheld::Matcher::Run { .. } => "run",
    };
    if let Err(e) = set.add(entry) {
        return usage(format!("--id: {e}"));
    }
    if let Err(e) = set.save(&a.set) {
        return usage(format!("--set: {e}"));
    }
    println!(
        "added {} ({}, {kind}) to {}",
        a.id,
        mode.as_str(),
        a.set.display()
    );
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    // Before any thread: no descriptor this process inherited reaches a run (docs/plimsolld.md).
    plimsoll_log::fds::at_start("plimsoll-withheld");
    let args = normalise_args(std::env::args().collect());
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    plimsoll_log::init(cli.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("plimsoll-withheld: starting the runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match cli.command {
        Command::ScanImage(a) => rt.block_on(scan_image(a)),
        Command::KnownUnreadable(a) => rt.block_on(known_unreadable(a)),
        Command::Add(a) => add(a),
        Command::StreamBaseline { image } if image.starts_with("docker-archive:") => {
            let path = &image["docker-archive:".len()..];
            let read = std::fs::File::open(path)
                .and_then(|mut f| plimsoll_withheld::baseline_read(&mut f));
            match read {
                Ok(n) => {
                    println!("{n}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("plimsoll-withheld: {path}: {e}");
                    ExitCode::from(3)
                }
            }
        }
        Command::MatchRate { set, mib } => match_rate(&set, mib),
        Command::StreamBaseline { image } => rt.block_on(async {
            let docker = match plimsoll_withheld::connect_docker().await {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("plimsoll-withheld: {e}");
                    return ExitCode::from(3);
                }
            };
            match plimsoll_withheld::stream_baseline(&docker, &image).await {
                Ok(n) => {
                    println!("{n}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("plimsoll-withheld: {image}: {e}");
                    ExitCode::from(3)
                }
            }
        }),
    }
}

/// `match-rate`: prints one JSON line with both rates in MiB/s.
fn match_rate(set: &Path, mib: usize) -> ExitCode {
    let set = match WithheldSet::load(set) {
        Ok(s) => s,
        Err(e) => return usage(format!("--set: {e}")),
    };
    // Random bytes (xorshift; no matches expected), the worst case for nothing but speed.
    let mut data = vec![0u8; mib << 20];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for w in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
    }
    let (m, s) = plimsoll_withheld::match_and_hash_times(&set, &data, 3);
    let rate = |d: std::time::Duration| mib as f64 / d.as_secs_f64();
    println!(
        "{{\"mib\":{mib},\"match_mib_s\":{:.1},\"sha256_mib_s\":{:.1}}}",
        rate(m),
        rate(s)
    );
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn single_dash_long_flags_become_double_dash() {
        let out = normalise_args(v(&[
            "plimsoll-withheld",
            "scan-image",
            "-set",
            "w.json",
            "-known=k.json",
            "-format",
            "json",
            "-x",
            "img",
            "--",
            "-set",
        ]));
        assert_eq!(
            out,
            v(&[
                "plimsoll-withheld",
                "scan-image",
                "--set",
                "w.json",
                "--known=k.json",
                "--format",
                "json",
                "-x",
                "img",
                "--",
                "-set"
            ])
        );
        let cli = Cli::try_parse_from(normalise_args(v(&[
            "plimsoll-withheld",
            "known-unreadable",
            "-set",
            "w.json",
            "-known",
            "k.json",
            "img",
        ])))
        .unwrap();
        assert!(matches!(cli.command, Command::KnownUnreadable(_)));
    }

    #[test]
    fn targets_follow_prefixes_then_the_filesystem() {
        assert!(matches!(target("docker:/etc"), Target::Engine(n) if n == "/etc"));
        assert!(matches!(target("oci:x"), Target::Path(_)));
        assert!(matches!(target("/"), Target::Path(_)));
        assert!(matches!(target("no-such-image-xyz:1"), Target::Engine(_)));
    }
}
