//! `cargo xtask bench process`: measures plimsolld with the process provider against
//! spawning the same trivial program directly, in one run.
//!
//! It builds `plimsolld` in release mode, starts it as a separate process (so its memory can
//! be read from `/proc/<pid>/status`) on a loopback port with a fresh callers file, and
//! measures, with authenticated gRPC calls:
//!
//! - the median latency of a trivial run through plimsolld against the same program spawned
//!   directly with `tokio::process` (`sh -c true` against a project with the one step `true`;
//!   `node -` fed `0` against a javascript payload `0`), iterations interleaved;
//! - runs per second at concurrency 8 (project steps `true`);
//! - plimsolld's idle RSS (`VmRSS` before any load) and peak RSS (`VmHWM` after the load).
//!
//! A missed target is reported, never an error: this is a measurement. It fails only when
//! the daemon cannot be built or started, or a run through it does not succeed.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plimsoll_core::check::check_answer;
use plimsoll_core::pb::run_request::Payload;
use plimsoll_core::pb::run_response::Result as RunResult;
use plimsoll_core::pb::sandbox_service_client::SandboxServiceClient;
use plimsoll_core::pb::{self};
use tonic::transport::{Channel, Endpoint};

pub(crate) use super::stats::{ms, quantile};
use super::Args;

/// Added median latency over a direct spawn, at most (ms).
const TARGET_ADDED_MS: f64 = 1.0;
/// Trivial runs per second at concurrency 8, at least.
const TARGET_RUNS_PER_S: f64 = 1000.0;
/// The daemon's log filter here: the audit lines, and the per-phase lines of the daemon
/// and the runner (debug level).
const PHASE_LOG: &str = "info,plimsoll_daemon::phases=debug,plimsoll_runner::phases=debug";
/// plimsolld's idle resident memory, at most (MiB).
const TARGET_IDLE_RSS_MIB: f64 = 30.0;

const USAGE: &str = "\
usage: cargo xtask bench process [--iterations N] [--warmup N] [--seconds S] [--concurrency C] [--no-build]
  --iterations N   measured sequential runs per latency pair (default 200)
  --warmup N       unmeasured runs first (default 20)
  --seconds S      duration of the throughput phase (default 5)
  --concurrency C  concurrent callers in the throughput phase (default 8)
  --no-build       use target/release/plimsolld as it is
  --plimsolld PATH use this plimsolld binary (implies --no-build)";

struct Options {
    iterations: usize,
    warmup: usize,
    seconds: f64,
    concurrency: usize,
    build: bool,
    binary: Option<PathBuf>,
    help: bool,
}

fn parse(args: &[&str]) -> anyhow::Result<Options> {
    let mut o = Options {
        help: false,
        iterations: 200,
        warmup: 20,
        seconds: 5.0,
        concurrency: 8,
        build: true,
        binary: None,
    };
    let mut a = Args::new(args, USAGE);
    while let Some(flag) = a.flag() {
        match flag {
            "--iterations" => o.iterations = a.parsed(flag)?,
            "--warmup" => o.warmup = a.parsed(flag)?,
            "--seconds" => o.seconds = a.parsed(flag)?,
            "--concurrency" => o.concurrency = a.parsed(flag)?,
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
    ensure!(o.concurrency > 0, "--concurrency must be at least 1");
    ensure!(
        o.seconds.is_finite() && o.seconds > 0.0,
        "--seconds must be positive"
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

    let mut daemon = Daemon::spawn(&bin, &callers, &tmp.path().join("state"))?;
    // Let startup settle (the language probes' memory is returned) before reading.
    std::thread::sleep(Duration::from_millis(500));
    let idle_rss = daemon.status_kib("VmRSS")?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let direct_dir = tmp.path().join("direct");
    std::fs::create_dir(&direct_dir)?;
    let measured = rt.block_on(measure(&daemon, &token, &direct_dir, &opts));
    let peak_rss = daemon.status_kib("VmHWM");
    daemon.stop();
    let m = measured?;
    print_table(&opts, &m, idle_rss, peak_rss?);
    Ok(())
}

/// plimsolld running as a child process.
pub(crate) struct Daemon {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    log_tail: Arc<Mutex<VecDeque<String>>>,
    answered: Arc<Mutex<Vec<f64>>>,
    /// The "run phases" lines (daemon's and runner's), as logged.
    phases: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Daemon {
    fn spawn(bin: &Path, callers: &Path, state: &Path) -> anyhow::Result<Daemon> {
        Daemon::spawn_env(bin, callers, state, "process", &[("RUST_LOG", PHASE_LOG)])
    }

    /// plimsolld with `SANDBOX_PROVIDER=provider`, serving the callers file.
    pub(crate) fn spawn_with(
        bin: &Path,
        callers: &Path,
        state: &Path,
        provider: &str,
    ) -> anyhow::Result<Daemon> {
        Daemon::spawn_env(bin, callers, state, provider, &[])
    }

    /// [`Daemon::spawn_with`] with `extra` variables set after the defaults.
    pub(crate) fn spawn_env(
        bin: &Path,
        callers: &Path,
        state: &Path,
        provider: &str,
        extra: &[(&str, &str)],
    ) -> anyhow::Result<Daemon> {
        let mut cmd = Command::new(bin);
        cmd.arg("--log-format").arg("json");
        // Only the variables set here configure the daemon.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("PLIMSOLL_") || k.starts_with("SANDBOX_") {
                cmd.env_remove(k.as_ref());
            }
        }
        cmd.env("SANDBOX_PROVIDER", provider)
            .env("PLIMSOLL_ADDR", "127.0.0.1:0")
            .env("PLIMSOLL_METRICS_ADDR", "off")
            .env("PLIMSOLL_CLIENTS_FILE", callers)
            .env("PLIMSOLL_STATE_DIR", state)
            .env("SANDBOX_MAX_CONCURRENT", "16")
            .env("RUST_LOG", "info")
            .envs(extra.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = child.stderr.take().context("plimsolld stderr")?;
        let log_tail = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = mpsc::channel();
        let tail = log_tail.clone();
        let answered = Arc::new(Mutex::new(Vec::new()));
        let answered_w = answered.clone();
        let phases = Arc::new(Mutex::new(Vec::new()));
        let phases_w = phases.clone();
        // Reads every log line (the daemon must never block on a full pipe), keeps the
        // last few for error messages, and reports the address of the "serving" line.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.is_some() {
                    if let Some(addr) = serving_addr(&line) {
                        let _ = tx.take().map(|t| t.send(addr));
                    }
                }
                if let Some(ms) = answered_ms(&line) {
                    answered_w
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(ms);
                }
                if let Some(v) = phase_line(&line) {
                    phases_w.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                }
                let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                if t.len() == 20 {
                    t.pop_front();
                }
                t.push_back(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(a) => break a,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // stderr closed without "serving": the daemon exited.
                    let _ = child.wait();
                    std::thread::sleep(Duration::from_millis(50));
                    bail!("plimsolld exited before serving:\n{}", tail_text(&log_tail));
                }
            }
            if let Some(status) = child.try_wait()? {
                std::thread::sleep(Duration::from_millis(50));
                bail!(
                    "plimsolld exited ({status}) before serving:\n{}",
                    tail_text(&log_tail)
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "plimsolld did not log \"serving\" within 60 s:\n{}",
                    tail_text(&log_tail)
                );
            }
        };
        eprintln!("bench: plimsolld pid {} serving on {addr}", child.id());
        Ok(Daemon {
            child,
            addr,
            log_tail,
            answered,
            phases,
        })
    }

    /// The "run phases" lines logged since the last call.
    fn take_phases(&self) -> Vec<serde_json::Value> {
        std::mem::take(&mut *self.phases.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The audit durations logged since the last call.
    fn take_answered(&self) -> Vec<f64> {
        std::mem::take(&mut *self.answered.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A `kB` line of `/proc/<pid>/status`, in KiB.
    pub(crate) fn status_kib(&self, field: &str) -> anyhow::Result<u64> {
        let pid = self.child.id();
        super::mem::status_kib(pid, field)
            .with_context(|| format!("/proc/{pid}/status has no {field} line"))
    }

    /// SIGTERM, then SIGKILL if it has not drained within 10 s.
    pub(crate) fn stop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "bench: plimsolld did not stop on SIGTERM; killing it\n{}",
            tail_text(&self.log_tail)
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

fn tail_text(t: &Mutex<VecDeque<String>>) -> String {
    let t = t.lock().unwrap_or_else(|e| e.into_inner());
    t.iter().cloned().collect::<Vec<_>>().join("\n")
}

/// The `addr` of plimsolld's JSON "serving" line.
fn serving_addr(line: &str) -> Option<SocketAddr> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v.get("message")?.as_str()? != "serving" {
        return None;
    }
    v.get("addr")?.as_str()?.parse().ok()
}

/// The `duration_ms` of an audit "run answered" line.
fn answered_ms(line: &str) -> Option<f64> {
    if !line.contains("run answered") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v.get("message")?.as_str()? != "run answered" {
        return None;
    }
    v.get("duration_ms")?.as_f64()
}

/// A "run phases" line (see `plimsoll_runner::PHASES_TARGET` and the daemon's service).
fn phase_line(line: &str) -> Option<serde_json::Value> {
    if !line.contains("run phases") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    (v.get("message")?.as_str()? == "run phases").then_some(v)
}

/// The median of field `key` over the phase lines of `target`.
fn phase_median(lines: &[serde_json::Value], target: &str, key: &str) -> Option<f64> {
    let v: Vec<f64> = lines
        .iter()
        .filter(|l| l.get("target").and_then(|t| t.as_str()) == Some(target))
        .filter_map(|l| l.get(key)?.as_f64())
        .collect();
    (!v.is_empty()).then(|| quantile(&v, 0.5))
}

/// [`phase_median`] of a field in microseconds, in ms.
fn phase_ms(lines: &[serde_json::Value], target: &str, key: &str) -> Option<f64> {
    phase_median(lines, target, key).map(|us| us / 1000.0)
}

/// One trivial program, run directly and through plimsolld.
pub(crate) struct Pair {
    pub(crate) name: &'static str,
    pub(crate) program: &'static str,
    pub(crate) args: &'static [&'static str],
    pub(crate) stdin: Option<&'static [u8]>,
    pub(crate) request: pb::RunRequest,
}

pub(crate) fn pairs() -> Vec<Pair> {
    vec![
        Pair {
            name: "sh -c true",
            program: "sh",
            args: &["-c", "true"],
            stdin: None,
            request: project_true(),
        },
        Pair {
            name: "node - <<< 0",
            program: "node",
            args: &["-"],
            stdin: Some(b"0"),
            request: pb::RunRequest {
                protocol: plimsoll_core::PROTOCOL,
                payload: Some(Payload::Javascript(pb::JavaScriptRun {
                    code: "0".into(),
                    grant_profile: String::new(),
                })),
                ..Default::default()
            },
        },
    ]
}

fn project_true() -> pb::RunRequest {
    pb::RunRequest {
        protocol: plimsoll_core::PROTOCOL,
        payload: Some(Payload::Project(pb::ProjectRun {
            steps: vec!["true".into()],
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Spawns the program directly and waits for it, as the runner starts it: piped output,
/// in `dir`, with the runner's fixed clean environment (an inherited one can change the
/// program: `NODE_EXTRA_CA_CERTS` alone makes node start ~200 ms slower).
pub(crate) async fn direct(p: &Pair, dir: &Path) -> anyhow::Result<Duration> {
    use tokio::io::AsyncWriteExt;
    let t0 = Instant::now();
    let mut child = tokio::process::Command::new(p.program)
        .args(p.args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", plimsoll_runner::FIXED_PATH)
        .env("HOME", dir)
        .env("TMPDIR", dir)
        .env("LANG", "C.UTF-8")
        .stdin(if p.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {}", p.program))?;
    if let (Some(mut w), Some(data)) = (child.stdin.take(), p.stdin) {
        w.write_all(data).await?;
        w.shutdown().await?;
    }
    let out = child.wait_with_output().await?;
    let elapsed = t0.elapsed();
    ensure!(out.status.success(), "{} failed: {}", p.name, out.status);
    Ok(elapsed)
}

/// `concurrency` callers sending `req` back to back, each on a clone of `client`, for
/// `span`: the runs answered and the seconds that took.
pub(crate) async fn runs_for(
    client: &SandboxServiceClient<Channel>,
    token: &str,
    req: &pb::RunRequest,
    concurrency: usize,
    span: Duration,
) -> anyhow::Result<(u64, f64)> {
    let req = Arc::new(req.clone());
    let t0 = Instant::now();
    let end = t0 + span;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let mut c = client.clone();
        let token = token.to_owned();
        let req = req.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                through(&mut c, &token, &req).await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut runs = 0;
    for t in tasks {
        runs += t.await??;
    }
    Ok((runs, t0.elapsed().as_secs_f64()))
}

/// One authenticated Run; the answer must pass the client check and exit 0.
pub(crate) async fn through(
    client: &mut SandboxServiceClient<Channel>,
    token: &str,
    req: &pb::RunRequest,
) -> anyhow::Result<Duration> {
    let mut call = tonic::Request::new(req.clone());
    call.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    let t0 = Instant::now();
    let resp = client.run(call).await?.into_inner();
    let elapsed = t0.elapsed();
    check_answer(req, &resp).context("client check")?;
    let ok = match &resp.result {
        Some(RunResult::Javascript(j)) => j.exit_code == 0,
        Some(RunResult::Project(p)) => {
            p.outcome == pb::ProjectOutcome::Completed as i32
                && p.steps.iter().all(|s| s.exit_code == 0)
        }
        _ => false,
    };
    ensure!(ok, "the run did not succeed: {:?}", resp.result);
    Ok(elapsed)
}

struct PairResult {
    name: &'static str,
    direct: Vec<f64>,
    daemon: Vec<f64>,
    /// `duration_ms` of the daemon's audit lines: admission to answer, in whole ms.
    server: Vec<f64>,
    /// The measured runs' "run phases" lines.
    phases: Vec<serde_json::Value>,
}

struct Measured {
    pairs: Vec<PairResult>,
    runs_per_s: f64,
    runs: u64,
    direct_runs_per_s: f64,
    elapsed_s: f64,
}

async fn measure(
    daemon: &Daemon,
    token: &str,
    dir: &Path,
    o: &Options,
) -> anyhow::Result<Measured> {
    let addr = daemon.addr;
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await
        .context("connecting to plimsolld")?;
    let mut client = SandboxServiceClient::new(channel);

    let mut results = Vec::new();
    for p in pairs() {
        eprintln!(
            "bench: {} ({} warm-up + {} measured, interleaved)",
            p.name, o.warmup, o.iterations
        );
        let mut r = PairResult {
            name: p.name,
            direct: Vec::with_capacity(o.iterations),
            daemon: Vec::with_capacity(o.iterations),
            server: Vec::new(),
            phases: Vec::new(),
        };
        for i in 0..o.warmup + o.iterations {
            if i == o.warmup {
                daemon.take_answered();
                daemon.take_phases();
            }
            let d = direct(&p, dir).await?;
            let t = through(&mut client, token, &p.request).await?;
            if i >= o.warmup {
                r.direct.push(ms(d));
                r.daemon.push(ms(t));
            }
        }
        // The daemon logs asynchronously; let the last audit lines arrive.
        tokio::time::sleep(Duration::from_millis(200)).await;
        r.server = daemon.take_answered();
        r.phases = daemon.take_phases();
        results.push(r);
    }

    eprintln!(
        "bench: throughput, {} callers for {} s",
        o.concurrency, o.seconds
    );
    let span = Duration::from_secs_f64(o.seconds);
    let (runs, elapsed_s) = runs_for(&client, token, &project_true(), o.concurrency, span).await?;

    // The same load spawned directly, for scale.
    let d0 = Instant::now();
    let dend = d0 + span;
    let mut direct_runs = 0u64;
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..o.concurrency {
        let dir = dir.to_path_buf();
        set.spawn(async move {
            let p = &pairs()[0];
            let mut n = 0u64;
            while Instant::now() < dend {
                direct(p, &dir).await?;
                n += 1;
            }
            anyhow::Ok(n)
        });
    }
    while let Some(n) = set.join_next().await {
        direct_runs += n??;
    }
    let direct_runs_per_s = direct_runs as f64 / d0.elapsed().as_secs_f64();

    Ok(Measured {
        pairs: results,
        runs_per_s: runs as f64 / elapsed_s,
        runs,
        direct_runs_per_s,
        elapsed_s,
    })
}

/// Where a run's time goes, per phase: medians of the daemon's and the runner's
/// "run phases" lines, and what is left outside the daemon (the client's median minus the
/// daemon's own): gRPC framing, HTTP/2 and loopback both ways.
fn print_phases(m: &Measured) {
    const D: &str = "plimsoll_daemon::phases";
    const R: &str = "plimsoll_runner::phases";
    let rows: [(&str, &str, &str); 8] = [
        (
            "daemon: checks (validate, floor, admission)",
            D,
            "checks_us",
        ),
        ("runner: working directory created", R, "setup_us"),
        ("runner: programs, spawn to end of output", R, "programs_us"),
        ("runner: /proc sweeps (all of the run's)", R, "sweep_us"),
        ("runner: working directory removed", R, "remove_us"),
        ("daemon: provider call, in all", D, "provider_us"),
        ("daemon: digests, record, audit line", D, "answer_us"),
        ("daemon: admission to answer, in all", D, "total_us"),
    ];
    println!();
    print!("{:<48}", "phase (median ms)");
    for p in &m.pairs {
        print!(" {:>14}", p.name);
    }
    println!();
    for (label, target, key) in rows {
        print!("{label:<48}");
        for p in &m.pairs {
            match phase_ms(&p.phases, target, key) {
                Some(v) => print!(" {v:>11.3} ms"),
                None => print!(" {:>14}", "-"),
            }
        }
        println!();
    }
    print!("{:<48}", "sweeps per run");
    for p in &m.pairs {
        match phase_median(&p.phases, R, "sweeps") {
            Some(v) => print!(" {v:>14.0}"),
            None => print!(" {:>14}", "-"),
        }
    }
    println!();
    print!("{:<48}", "outside the daemon (gRPC, HTTP/2, loopback)");
    for p in &m.pairs {
        match phase_ms(&p.phases, D, "total_us") {
            Some(d) => print!(" {:>11.3} ms", quantile(&p.daemon, 0.5) - d),
            None => print!(" {:>14}", "-"),
        }
    }
    println!();
    print!("{:<48}", "direct spawn, for scale");
    for p in &m.pairs {
        print!(" {:>11.3} ms", quantile(&p.direct, 0.5));
    }
    println!();
}

pub(crate) fn verdict(ok: bool) -> &'static str {
    super::verdict(ok, super::PASS_MISS)
}

fn print_table(o: &Options, m: &Measured, idle_kib: u64, peak_kib: u64) {
    println!();
    println!(
        "plimsolld, process provider, loopback gRPC with a bearer token; {} measured runs per row after {} warm-up, interleaved with the direct spawn",
        o.iterations, o.warmup
    );
    println!();
    println!(
        "{:<14} {:>12} {:>14} {:>12} {:>12} {:>12} {:>12} {:>8}",
        "program",
        "direct p50",
        "plimsolld p50",
        "added p50",
        "in-daemon p50",
        "direct p90",
        "plimsolld p90",
        "ratio"
    );
    for p in &m.pairs {
        let (d50, t50) = (quantile(&p.direct, 0.5), quantile(&p.daemon, 0.5));
        let server = if p.server.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.0} ms", quantile(&p.server, 0.5))
        };
        println!(
            "{:<14} {:>9.2} ms {:>11.2} ms {:>9.2} ms {:>12} {:>9.2} ms {:>9.2} ms {:>7.2}x",
            p.name,
            d50,
            t50,
            t50 - d50,
            server,
            quantile(&p.direct, 0.9),
            quantile(&p.daemon, 0.9),
            t50 / d50
        );
    }
    println!("(in-daemon: the audit line's duration_ms, admission to answer, whole ms; direct spawns use the runner's clean environment)");
    print_phases(m);
    println!();
    println!("{:<46} {:>14} {:>12}  result", "measure", "value", "target");
    for p in &m.pairs {
        let added = quantile(&p.daemon, 0.5) - quantile(&p.direct, 0.5);
        println!(
            "{:<46} {:>11.2} ms {:>12}  {}",
            format!("added median latency ({})", p.name),
            added,
            format!("<= {TARGET_ADDED_MS} ms"),
            verdict(added <= TARGET_ADDED_MS)
        );
    }
    println!(
        "{:<46} {:>14.1} {:>12}  {}",
        format!(
            "runs/s at concurrency {} ({} runs in {:.1} s)",
            o.concurrency, m.runs, m.elapsed_s
        ),
        m.runs_per_s,
        format!(">= {TARGET_RUNS_PER_S}"),
        verdict(m.runs_per_s >= TARGET_RUNS_PER_S)
    );
    println!(
        "{:<46} {:>14.1} {:>12}  info",
        format!("direct sh -c true/s at concurrency {}", o.concurrency),
        m.direct_runs_per_s,
        "-"
    );
    let idle = idle_kib as f64 / 1024.0;
    println!(
        "{:<46} {:>10.1} MiB {:>12}  {}",
        "plimsolld idle RSS (VmRSS before load)",
        idle,
        format!("<= {TARGET_IDLE_RSS_MIB} MiB"),
        verdict(idle <= TARGET_IDLE_RSS_MIB)
    );
    println!(
        "{:<46} {:>10.1} MiB {:>12}  info",
        "plimsolld peak RSS (VmHWM after load)",
        peak_kib as f64 / 1024.0,
        "-"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_line() {
        let line = r#"{"timestamp":"x","level":"INFO","addr":"127.0.0.1:4242","message":"serving","target":"plimsoll_daemon::server"}"#;
        assert_eq!(serving_addr(line), Some("127.0.0.1:4242".parse().unwrap()));
        assert_eq!(
            serving_addr(r#"{"message":"other","addr":"127.0.0.1:1"}"#),
            None
        );
        assert_eq!(serving_addr("not json"), None);
    }

    #[test]
    fn options() {
        let o = parse(&["--iterations", "5", "--no-build"]).unwrap();
        assert_eq!((o.iterations, o.warmup, o.build), (5, 20, false));
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["--iterations", "0"]).is_err());
    }
}
