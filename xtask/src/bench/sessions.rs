//! `cargo xtask bench sessions`: a trivial call in an open session against a single run on
//! the same provider and daemon, in one run, plus the time to open a session and the memory
//! an idle session holds.
//!
//! It builds `plimsolld` in release mode and starts it as a child process with sessions on
//! (`SANDBOX_MAX_SESSIONS=64`), then, through the real client library (every answer's
//! record and chain link checked):
//!
//! - interleaves a session call and a single `Run` of the same payload (javascript `0`, and
//!   a project whose one step is `true`), and reports the median and p90 of each and the
//!   difference of the medians (the session call's target on the process provider: at most
//!   1 ms above the run);
//! - times `OpenSession` (each session closed right after, not timed);
//! - opens 16 sessions, starts a python and a javascript interpreter in each (one cell
//!   each), and reports the resident memory of plimsolld and every process below it, before
//!   and after, divided by 16: what one idle session with both interpreters holds.
//!
//! With `--provider docker` the same is measured on the Docker provider without a warm
//! pool (target: a session call at most 1/5 of a run), and idle memory adds the session
//! containers' memory as the engine counts it.
//!
//! A missed target is reported, never an error.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use plimsoll_client::{Client, ClientOptions, Session};
use plimsoll_core::pb::{self, session_run_request::Payload as S};

use super::process::Daemon;
use super::stats::{ms, quantile};
use super::{verdict, Args, MET_MISSED};

/// A process session call's median may exceed a process run's by at most this (ms).
const TARGET_PROCESS_ADDED_MS: f64 = 1.0;
/// A docker session call's median is at most this fraction of a no-pool docker run's.
const TARGET_DOCKER_RATIO: f64 = 0.2;
/// Sessions opened for the memory measurement.
const IDLE_SESSIONS: usize = 16;

const USAGE: &str = "\
usage: cargo xtask bench sessions [--provider process|docker] [--iterations N] [--warmup N] [--opens N] [--no-build]
  --provider P     process (default) or docker (the image from `cargo xtask images`; no
                   warm pool, so the baseline is a no-pool docker run)
  --iterations N   measured pairs (session call, run) per payload (default 200)
  --warmup N       unmeasured pairs first (default 20)
  --opens N        timed session opens (default 50)
  --no-build       use target/release/plimsolld as it is
  --plimsolld PATH use this plimsolld binary (implies --no-build)";

struct Options {
    iterations: usize,
    warmup: usize,
    opens: usize,
    build: bool,
    binary: Option<PathBuf>,
    help: bool,
    provider: String,
}

fn parse(args: &[&str]) -> anyhow::Result<Options> {
    let mut o = Options {
        iterations: 200,
        warmup: 20,
        opens: 50,
        build: true,
        binary: None,
        help: false,
        provider: "process".into(),
    };
    let mut a = Args::new(args, USAGE);
    while let Some(flag) = a.flag() {
        match flag {
            "--iterations" => o.iterations = a.parsed(flag)?,
            "--warmup" => o.warmup = a.parsed(flag)?,
            "--opens" => o.opens = a.parsed(flag)?,
            "--provider" => o.provider = a.value(flag)?.to_owned(),
            "--no-build" => o.build = false,
            "--plimsolld" => {
                o.binary = Some(PathBuf::from(a.value(flag)?));
                o.build = false;
            }
            "-h" | "--help" => o.help = true,
            other => return Err(a.unknown(other)),
        }
    }
    ensure!(o.iterations > 0, "--iterations must be at least 1");
    ensure!(o.opens > 0, "--opens must be at least 1");
    ensure!(
        o.provider == "process" || o.provider == "docker",
        "--provider must be process or docker"
    );
    Ok(o)
}

/// Runs the benchmark and prints its table.
pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts = parse(args)?;
    if opts.help {
        println!("{USAGE}");
        return Ok(());
    }
    let image = if opts.provider != "docker" {
        String::new()
    } else if opts.build {
        crate::images::build(&[])?
            .context("images built nothing")?
            .sandbox_id
    } else {
        crate::images::image_id("plimsoll/sandbox:latest")
            .context("plimsoll/sandbox:latest is missing; run `cargo xtask images`")?
    };
    if opts.build {
        crate::dist::build_release(&["plimsolld"])?;
    }
    let bin = match opts.binary.clone() {
        Some(b) => b,
        None => crate::dist::release_bin("plimsolld")?,
    };
    ensure!(
        bin.is_file(),
        "{} is missing; run without --no-build",
        bin.display()
    );
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    let callers = tmp.path().join("callers.json");
    let mut file = plimsoll_callers::CallersFile::default();
    let token = file.add("bench", &[])?;
    file.save(&callers)?;
    let mut env = vec![
        ("SANDBOX_MAX_SESSIONS", "64"),
        ("SANDBOX_MAX_SESSIONS_PER_CALLER", "64"),
        ("SANDBOX_MAX_CONCURRENT", "16"),
    ];
    if opts.provider == "docker" {
        env.extend([
            ("SANDBOX_DOCKER_IMAGE", image.as_str()),
            ("SANDBOX_DOCKER_POOL", "0"),
        ]);
    }
    let mut daemon = Daemon::spawn_env(
        &bin,
        &callers,
        &tmp.path().join("state"),
        &opts.provider,
        &env,
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let pid = daemon.child.id();
    let measured = rt.block_on(measure(&daemon, &token, &opts, pid));
    daemon.stop();
    print_table(&opts, &measured?);
    Ok(())
}

struct Measured {
    /// Per payload: (name, session call times, run times).
    pairs: Vec<(&'static str, Vec<f64>, Vec<f64>)>,
    opens: Vec<f64>,
    idle_before_kib: u64,
    idle_after_kib: u64,
}

fn open_req() -> pb::OpenSessionRequest {
    pb::OpenSessionRequest {
        protocol: plimsoll_core::PROTOCOL,
        ..Default::default()
    }
}

fn payloads() -> Vec<(&'static str, S)> {
    vec![
        (
            "javascript 0",
            S::Javascript(pb::JavaScriptRun {
                code: "0".into(),
                grant_profile: String::new(),
            }),
        ),
        (
            "project `true`",
            S::Project(pb::ProjectRun {
                steps: vec!["true".into()],
                ..Default::default()
            }),
        ),
    ]
}

fn as_run(p: &S) -> pb::RunRequest {
    pb::RunRequest {
        protocol: plimsoll_core::PROTOCOL,
        payload: Some(match p.clone() {
            S::Javascript(j) => pb::run_request::Payload::Javascript(j),
            S::Project(p) => pb::run_request::Payload::Project(p),
            S::Cell(c) => pb::run_request::Payload::Cell(c),
        }),
        ..Default::default()
    }
}

async fn session_call(c: &mut Client, s: &mut Session, p: &S) -> anyhow::Result<Duration> {
    let req = pb::SessionRunRequest {
        protocol: plimsoll_core::PROTOCOL,
        payload: Some(p.clone()),
        ..Default::default()
    };
    let t0 = Instant::now();
    let a = c.session_run(s, req).await.context("session call")?;
    let elapsed = t0.elapsed();
    ensure!(a.ended == 0, "the session ended: {}", a.end_detail);
    Ok(elapsed)
}

async fn single_run(c: &mut Client, p: &S) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    c.run(as_run(p)).await.context("run")?;
    Ok(t0.elapsed())
}

async fn measure(
    daemon: &Daemon,
    token: &str,
    opts: &Options,
    pid: u32,
) -> anyhow::Result<Measured> {
    let mut c = Client::connect(
        &format!("http://{}", daemon.addr),
        ClientOptions {
            token: Some(token.to_owned()),
            ca_file: None,
        },
    )
    .await?;
    let mut s = c.open_session(open_req()).await?;
    let mut pairs = Vec::new();
    for (name, p) in payloads() {
        for _ in 0..opts.warmup {
            session_call(&mut c, &mut s, &p).await?;
            single_run(&mut c, &p).await?;
        }
        let (mut in_session, mut runs) = (Vec::new(), Vec::new());
        for i in 0..opts.iterations {
            // Alternate which goes first, so neither always follows the other.
            if i % 2 == 0 {
                in_session.push(ms(session_call(&mut c, &mut s, &p).await?));
                runs.push(ms(single_run(&mut c, &p).await?));
            } else {
                runs.push(ms(single_run(&mut c, &p).await?));
                in_session.push(ms(session_call(&mut c, &mut s, &p).await?));
            }
        }
        pairs.push((name, in_session, runs));
    }
    c.close_session(&s).await?;

    let mut opens = Vec::new();
    for _ in 0..opts.opens {
        let t0 = Instant::now();
        let s = c.open_session(open_req()).await?;
        opens.push(ms(t0.elapsed()));
        c.close_session(&s).await?;
    }

    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle_before_kib = idle_kib(pid, opts);
    let mut idle = Vec::new();
    for _ in 0..IDLE_SESSIONS {
        let mut s = c.open_session(open_req()).await?;
        for (language, code) in [("python", "x = 1"), ("javascript", "var x = 1")] {
            let cell = S::Cell(pb::CellRun {
                language: language.into(),
                code: code.into(),
                files: Vec::new(),
            });
            session_call(&mut c, &mut s, &cell).await?;
        }
        idle.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle_after_kib = idle_kib(pid, opts);
    for s in &idle {
        c.close_session(s).await?;
    }
    Ok(Measured {
        pairs,
        opens,
        idle_before_kib,
        idle_after_kib,
    })
}

/// What idle sessions hold: on the process provider the resident memory of plimsolld and
/// every process below it; on docker that plus every running container's memory as the
/// engine counts it (`docker stats`), in KiB.
fn idle_kib(pid: u32, opts: &Options) -> u64 {
    if opts.provider != "docker" {
        return tree_rss_kib(pid);
    }
    let out = std::process::Command::new("docker")
        .args(["stats", "--no-stream", "--format", "{{.MemUsage}}"])
        .output();
    let text = out
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let containers: f64 = text
        .lines()
        .filter_map(|l| l.split('/').next())
        .map(|used| {
            let used = used.trim();
            let at = used
                .find(|c: char| c.is_ascii_alphabetic())
                .unwrap_or(used.len());
            let (n, unit) = used.split_at(at);
            let n: f64 = n.trim().parse().unwrap_or(0.0);
            n * match unit {
                "GiB" => 1024.0 * 1024.0,
                "MiB" => 1024.0,
                "KiB" => 1.0,
                _ => 1.0 / 1024.0,
            }
        })
        .sum();
    tree_rss_kib(pid) + containers as u64
}

/// The resident memory of `pid` and every process below it, in KiB.
fn tree_rss_kib(pid: u32) -> u64 {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let Some(ppid) = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_ascii_whitespace().nth(1))
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            parent_of.push((p, ppid));
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree.iter()
        .filter_map(|p| super::mem::status_kib(*p, "VmRSS"))
        .sum()
}

fn print_table(opts: &Options, m: &Measured) {
    println!(
        "sessions bench, {} provider: {} interleaved pairs per payload after {} warm-up pairs",
        opts.provider, opts.iterations, opts.warmup
    );
    let docker = opts.provider == "docker";
    println!();
    println!("| payload | session call median | p90 | single run median (baseline) | p90 | session − run | target | verdict |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, in_session, runs) in &m.pairs {
        let (sm, sp) = (quantile(in_session, 0.5), quantile(in_session, 0.9));
        let (rm, rp) = (quantile(runs, 0.5), quantile(runs, 0.9));
        let added = sm - rm;
        let (target, met) = if docker {
            (
                format!("≤ {TARGET_DOCKER_RATIO}x"),
                sm / rm <= TARGET_DOCKER_RATIO,
            )
        } else {
            (
                format!("≤ +{TARGET_PROCESS_ADDED_MS} ms"),
                added <= TARGET_PROCESS_ADDED_MS,
            )
        };
        println!(
            "| {name} | {sm:.2} ms | {sp:.2} ms | {rm:.2} ms | {rp:.2} ms | {added:+.2} ms ({:.2}x) | {target} | {} |",
            sm / rm,
            verdict(met, MET_MISSED)
        );
    }
    println!();
    println!(
        "session open: median {:.2} ms, p90 {:.2} ms ({} opens, each closed after)",
        quantile(&m.opens, 0.5),
        quantile(&m.opens, 0.9),
        m.opens.len()
    );
    let per = m.idle_after_kib.saturating_sub(m.idle_before_kib) as f64 / IDLE_SESSIONS as f64;
    println!(
        "idle session memory: {:.1} MiB each with a python and a javascript interpreter kept (plimsolld and its children: {:.1} MiB before, {:.1} MiB with {IDLE_SESSIONS} sessions open)",
        per / 1024.0,
        m.idle_before_kib as f64 / 1024.0,
        m.idle_after_kib as f64 / 1024.0
    );
}
