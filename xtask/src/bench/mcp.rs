//! `cargo xtask bench mcp`: a trivial `run_code` through `plimsoll-mcp --daemon` against the
//! same run sent to the same plimsolld without MCP, in one run, plus the MCP server's idle
//! resident memory.
//!
//! It builds `plimsoll-mcp`, `plimsoll` and `plimsolld` in release mode, starts plimsolld
//! as a child process (`SANDBOX_PROVIDER=process` unless `--provider quickjs`) with a
//! callers file, and one long-lived `plimsoll-mcp --daemon URL --token-file FILE` child on
//! pipes. After the MCP `initialize` handshake and `notifications/initialized` (once), it
//! interleaves, the order rotating each round so drift hits every side equally, three ways
//! of running the JavaScript snippet `console.log(1)` (a `JavaScriptRun`, byte for byte the
//! same request on every side; every answer's stdout is checked to be `1`):
//!
//! - a `tools/call` of `run_code` on the MCP server, timed from before its request line is
//!   written to after its response line is read;
//! - the strict baseline, the call plimsoll-mcp itself makes: `plimsoll_client::Client::run`
//!   on one persistent in-process connection, timed around the call (client check
//!   included, as plimsoll-mcp does it);
//! - the baseline: a `plimsoll run --addr URL --token-file FILE -e 'console.log(1)'`
//!   process per run, timed from spawn to exit (process start and connect included).
//!
//! Target: the MCP median at most 1.2× the strict baseline's (the verdict); the ratio to
//! `plimsoll run` is printed beside it. Then the MCP server's own `VmRSS` (it holds no
//! embedded daemon with `--daemon`), read after `initialize` and again after the timed
//! calls: target at most 20 MiB each. The embedded mode's idle `VmRSS` (no `--daemon`, the
//! process provider in its own process) is printed for information, with no target.
//!
//! A missed target is reported, never an error.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plimsoll_client::{Client, ClientOptions};
use plimsoll_core::pb;
use serde_json::{json, Value};

use super::process::Daemon;
use super::stats::{ms, quantile};
use super::{verdict, Args, MET_MISSED};

/// The MCP median may be at most this multiple of the in-process client's.
const TARGET_RATIO: f64 = 1.2;
/// The MCP server's idle resident memory with `--daemon`, at most (MiB).
const TARGET_IDLE_MIB: f64 = 20.0;
/// The snippet every side runs.
const CODE: &str = "console.log(1)";
/// The MCP revision the handshake asks for (the newest that still has `initialize`).
const MCP_PROTOCOL: &str = "2025-11-25";
/// How long memory is left to settle before `VmRSS` is read.
const SETTLE: Duration = Duration::from_millis(300);

const USAGE: &str = "\
usage: cargo xtask bench mcp [--runs N] [--warmup N] [--provider process|quickjs] [--no-embedded] [--no-build]
  --runs N         measured rounds, one run per side each (default 200)
  --warmup N       unmeasured rounds first (default 20)
  --provider P     plimsolld's provider: process (default; the snippet runs in node) or
                   quickjs (a cheaper run, so the MCP layer's share shows more)
  --no-embedded    skip the embedded mode's idle memory (printed for information only)
  --no-build       use target/release/{plimsoll-mcp,plimsoll,plimsolld} as they are";

struct Options {
    runs: usize,
    warmup: usize,
    provider: String,
    embedded: bool,
    build: bool,
    help: bool,
}

fn parse(args: &[&str]) -> anyhow::Result<Options> {
    let mut o = Options {
        runs: 200,
        warmup: 20,
        provider: "process".into(),
        embedded: true,
        build: true,
        help: false,
    };
    let mut a = Args::new(args, USAGE);
    while let Some(flag) = a.flag() {
        match flag {
            "--runs" => o.runs = a.parsed(flag)?,
            "--warmup" => o.warmup = a.parsed(flag)?,
            "--provider" => o.provider = a.value(flag)?.to_owned(),
            "--no-embedded" => o.embedded = false,
            "--no-build" => o.build = false,
            "-h" | "--help" => o.help = true,
            other => return Err(a.unknown(other)),
        }
    }
    ensure!(o.runs > 0, "--runs must be at least 1\n{USAGE}");
    ensure!(
        o.provider == "process" || o.provider == "quickjs",
        "--provider must be process or quickjs\n{USAGE}"
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
        crate::dist::build_release(&["plimsoll-mcp-bin", "plimsoll", "plimsolld"])?;
    }
    let bins = Bins {
        mcp: crate::dist::release_bin("plimsoll-mcp")?,
        cli: crate::dist::release_bin("plimsoll")?,
        daemon: crate::dist::release_bin("plimsolld")?,
    };
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    let callers = tmp.path().join("callers.json");
    let mut file = plimsoll_callers::CallersFile::default();
    let token = file.add("bench", &[])?;
    file.save(&callers)?;
    let token_file = tmp.path().join("token");
    write_private(&token_file, &token)?;
    let mut daemon = Daemon::spawn_env(
        &bins.daemon,
        &callers,
        &tmp.path().join("state"),
        &opts.provider,
        &[],
    )?;
    let url = format!("http://{}", daemon.addr);
    let measured = measure(&bins, &url, &token, &token_file, tmp.path(), &opts);
    daemon.stop();
    let measured = measured?;
    let embedded = if opts.embedded {
        Some(embedded_idle(&bins.mcp, tmp.path()))
    } else {
        None
    };
    print_table(&opts, &measured, embedded);
    Ok(())
}

struct Bins {
    mcp: PathBuf,
    cli: PathBuf,
    daemon: PathBuf,
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// A command with no `PLIMSOLL_*` or `SANDBOX_*` variable of this environment: only the
/// flags given configure it.
fn clean_command(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("PLIMSOLL_") || k.starts_with("SANDBOX_") {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.env_remove("RUST_LOG");
    cmd
}

/// One plimsoll-mcp child on stdio, its stderr in a file.
struct McpChild {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr_file: PathBuf,
    next_id: u64,
}

impl McpChild {
    /// Starts `bin` with `args` and does the handshake: `initialize`, then
    /// `notifications/initialized`.
    fn start(bin: &Path, args: &[&str], stderr_file: PathBuf) -> anyhow::Result<McpChild> {
        let err = std::fs::File::create(&stderr_file)
            .with_context(|| format!("creating {}", stderr_file.display()))?;
        let mut child = clean_command(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdin = child.stdin.take().context("plimsoll-mcp stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("plimsoll-mcp stdout")?);
        let mut m = McpChild {
            child,
            stdin: Some(stdin),
            stdout,
            stderr_file,
            next_id: 1,
        };
        eprintln!(
            "bench: plimsoll-mcp pid {} ({})",
            m.child.id(),
            if args.is_empty() {
                "embedded daemon".into()
            } else {
                args.join(" ")
            }
        );
        let (init, _) = m.request(
            "initialize",
            json!({
                "protocolVersion": MCP_PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "cargo-xtask-bench-mcp", "version": "0"},
            }),
        )?;
        ensure!(
            init.get("result")
                .and_then(|r| r.get("serverInfo"))
                .is_some(),
            "initialize answered no serverInfo: {init}"
        );
        m.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))?;
        Ok(m)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn send(&mut self, msg: &Value) -> anyhow::Result<()> {
        let mut line = msg.to_string();
        line.push('\n');
        self.write_line(&line)
    }

    fn write_line(&mut self, line: &str) -> anyhow::Result<()> {
        let stdin = self.stdin.as_mut().context("stdin already closed")?;
        stdin
            .write_all(line.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| self.fail(format!("writing to plimsoll-mcp: {e}")))
    }

    /// Sends one request and reads lines until its response: the response and the time
    /// from before the write to after the read (the line is made before the clock starts).
    fn request(&mut self, method: &str, params: Value) -> anyhow::Result<(Value, Duration)> {
        let id = self.next_id;
        self.next_id += 1;
        let mut line =
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string();
        line.push('\n');
        let mut buf = String::new();
        let t0 = Instant::now();
        self.write_line(&line)?;
        loop {
            buf.clear();
            let n = self
                .stdout
                .read_line(&mut buf)
                .map_err(|e| self.fail(format!("reading from plimsoll-mcp: {e}")))?;
            if n == 0 {
                return Err(self.fail("plimsoll-mcp closed stdout".into()));
            }
            // A message with an id is an answer; anything else (a notification, a request
            // of the server's) is skipped, the clock still running.
            let Ok(v) = serde_json::from_str::<Value>(&buf) else {
                return Err(self.fail(format!("not a JSON-RPC line on stdout: {buf:?}")));
            };
            if v.get("id").and_then(Value::as_u64) == Some(id) && v.get("method").is_none() {
                let elapsed = t0.elapsed();
                if let Some(e) = v.get("error") {
                    bail!("{method} failed: {e}");
                }
                return Ok((v, elapsed));
            }
        }
    }

    /// One timed `run_code` of [`CODE`]; its stdout must be `1`.
    fn run_code(&mut self) -> anyhow::Result<Duration> {
        let (v, elapsed) = self.request(
            "tools/call",
            json!({"name": "run_code", "arguments": {"language": "javascript", "code": CODE}}),
        )?;
        let result = v.get("result").context("tools/call answered no result")?;
        ensure!(
            result.get("isError").and_then(Value::as_bool) != Some(true),
            "run_code answered an error: {result}"
        );
        let stdout = result
            .get("structuredContent")
            .and_then(|s| s.get("stdout"))
            .and_then(Value::as_str);
        ensure!(
            stdout.map(str::trim) == Some("1"),
            "run_code's stdout is {stdout:?}, not 1: {result}"
        );
        Ok(elapsed)
    }

    /// An error carrying the end of the child's stderr.
    fn fail(&mut self, what: String) -> anyhow::Error {
        let status = self.child.try_wait().ok().flatten();
        let log = std::fs::read_to_string(&self.stderr_file).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        anyhow::anyhow!(
            "{what} (exited: {status:?})\n{}",
            if tail.is_empty() {
                "(nothing on its stderr)".into()
            } else {
                tail.join("\n")
            }
        )
    }

    /// Closes stdin (the server's normal end) and waits up to 10 s, then kills it.
    fn stop(&mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                if !st.success() {
                    eprintln!("bench: plimsoll-mcp exited {st} after stdin closed");
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("bench: plimsoll-mcp did not exit when stdin closed; killing it");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for McpChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.stop();
        }
    }
}

/// `VmRSS` of `pid` after [`SETTLE`], in KiB.
fn settled_rss_kib(pid: u32) -> anyhow::Result<u64> {
    std::thread::sleep(SETTLE);
    super::mem::status_kib(pid, "VmRSS").with_context(|| format!("/proc/{pid}/status: no VmRSS"))
}

/// The `Threads:` count of `pid`.
fn threads_of(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

/// The pids whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status"))
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("PPid:"))
                        .map(|v| v.trim() == pid.to_string())
                })
                .unwrap_or(false)
        })
        .collect()
}

struct Measured {
    mcp: Vec<f64>,
    client: Vec<f64>,
    cli: Vec<f64>,
    idle_init_kib: u64,
    idle_after_kib: u64,
    peak_kib: Option<u64>,
    threads: Option<u64>,
    children: usize,
}

fn javascript_request() -> pb::RunRequest {
    pb::RunRequest {
        protocol: plimsoll_core::PROTOCOL,
        payload: Some(pb::run_request::Payload::Javascript(pb::JavaScriptRun {
            code: CODE.into(),
            grant_profile: String::new(),
        })),
        ..Default::default()
    }
}

/// One in-process `Client::run`, timed around the call; its stdout must be `1`.
fn client_run(
    rt: &tokio::runtime::Runtime,
    c: &mut Client,
    req: &pb::RunRequest,
) -> anyhow::Result<Duration> {
    let req = req.clone();
    let t0 = Instant::now();
    let resp = rt.block_on(c.run(req)).context("Client::run")?;
    let elapsed = t0.elapsed();
    match resp.result {
        Some(pb::run_response::Result::Javascript(j)) => ensure!(
            String::from_utf8_lossy(&j.stdout).trim() == "1",
            "Client::run's stdout is {:?}, not 1",
            String::from_utf8_lossy(&j.stdout)
        ),
        other => bail!("Client::run answered {other:?}"),
    }
    Ok(elapsed)
}

/// One `plimsoll run --addr` process, timed from spawn to exit; its stdout must hold `1`.
fn cli_run(cli: &Path, url: &str, token_file: &Path) -> anyhow::Result<Duration> {
    let mut cmd = clean_command(cli);
    cmd.arg("run")
        .arg("--addr")
        .arg(url)
        .arg("--token-file")
        .arg(token_file)
        .arg("-e")
        .arg(CODE)
        .stdin(Stdio::null());
    let t0 = Instant::now();
    let out = cmd.output().context("running plimsoll run")?;
    let elapsed = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && stdout.contains("--- stdout ---\n1\n--- end of stdout ---"),
        "plimsoll run failed ({}):\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(elapsed)
}

fn measure(
    bins: &Bins,
    url: &str,
    token: &str,
    token_file: &Path,
    tmp: &Path,
    opts: &Options,
) -> anyhow::Result<Measured> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut client = rt.block_on(Client::connect(
        url,
        ClientOptions {
            token: Some(token.to_owned()),
            ca_file: None,
        },
    ))?;
    let token_arg = token_file.to_string_lossy().into_owned();
    let mut mcp = McpChild::start(
        &bins.mcp,
        &["--daemon", url, "--token-file", &token_arg],
        tmp.join("mcp-daemon.stderr"),
    )?;
    let pid = mcp.pid();
    let idle_init_kib = settled_rss_kib(pid)?;
    let req = javascript_request();

    eprintln!("bench: {} warm-up rounds", opts.warmup);
    for _ in 0..opts.warmup {
        mcp.run_code()?;
        client_run(&rt, &mut client, &req)?;
        cli_run(&bins.cli, url, token_file)?;
    }
    eprintln!("bench: {} measured rounds, interleaved", opts.runs);
    let (mut m, mut c, mut p) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..opts.runs {
        // Rotate which side goes first, so none always follows another.
        for side in 0..3 {
            match (i + side) % 3 {
                0 => m.push(ms(mcp.run_code()?)),
                1 => c.push(ms(client_run(&rt, &mut client, &req)?)),
                _ => p.push(ms(cli_run(&bins.cli, url, token_file)?)),
            }
        }
    }
    let idle_after_kib = settled_rss_kib(pid)?;
    let peak_kib = super::mem::vm_hwm(pid);
    let threads = threads_of(pid);
    let children = children_of(pid).len();
    mcp.stop();
    Ok(Measured {
        mcp: m,
        client: c,
        cli: p,
        idle_init_kib,
        idle_after_kib,
        peak_kib,
        threads,
        children,
    })
}

/// The embedded mode's idle memory.
struct EmbeddedIdle {
    /// `VmRSS` after `initialize`.
    init_kib: u64,
    /// `VmRSS` after a few `run_code` calls.
    after_kib: u64,
    /// The calls made before `after_kib`.
    calls: usize,
}

/// plimsoll-mcp without `--daemon` (the embedded process provider): `VmRSS` after
/// `initialize` and after a few calls. An error here is printed in the table's place.
fn embedded_idle(bin: &Path, tmp: &Path) -> anyhow::Result<EmbeddedIdle> {
    let calls = 5;
    let mut m = McpChild::start(bin, &[], tmp.join("mcp-embedded.stderr"))?;
    let init_kib = settled_rss_kib(m.pid())?;
    for _ in 0..calls {
        m.run_code()?;
    }
    let after_kib = settled_rss_kib(m.pid())?;
    m.stop();
    Ok(EmbeddedIdle {
        init_kib,
        after_kib,
        calls,
    })
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn print_table(opts: &Options, m: &Measured, embedded: Option<anyhow::Result<EmbeddedIdle>>) {
    let (mm, mp) = (quantile(&m.mcp, 0.5), quantile(&m.mcp, 0.9));
    let (cm, cp) = (quantile(&m.client, 0.5), quantile(&m.client, 0.9));
    let (pm, pp) = (quantile(&m.cli, 0.5), quantile(&m.cli, 0.9));
    println!();
    println!(
        "mcp bench: JavaScript `{CODE}` on plimsolld's {} provider, {} interleaved rounds (one run per side, order rotating) after {} warm-up rounds; one plimsoll-mcp --daemon child on stdio, initialized once",
        opts.provider, opts.runs, opts.warmup
    );
    println!();
    println!("| side | median | p90 |");
    println!("|---|---|---|");
    println!("| run_code through plimsoll-mcp --daemon (request line written → response line read) | {mm:.2} ms | {mp:.2} ms |");
    println!("| (b) in-process plimsoll_client::Client::run, one persistent connection (the call plimsoll-mcp makes) | {cm:.2} ms | {cp:.2} ms |");
    println!("| (a) `plimsoll run --addr URL --token-file F -e '{CODE}'`, a process per run (spawn → exit) | {pm:.2} ms | {pp:.2} ms |");
    println!();
    println!("| measure | plimsoll-mcp | baseline | ratio | target | verdict |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| run_code median vs (b) Client::run (strict; the verdict) | {mm:.2} ms | {cm:.2} ms | {:.2}x ({:+.2} ms) | ≤ {TARGET_RATIO}x | {} |",
        mm / cm,
        mm - cm,
        verdict(mm / cm <= TARGET_RATIO, MET_MISSED)
    );
    println!(
        "| run_code median vs (a) `plimsoll run --addr` per run (the issue's; printed) | {mm:.2} ms | {pm:.2} ms | {:.2}x ({:+.2} ms) | ≤ {TARGET_RATIO}x | no verdict ({}) |",
        mm / pm,
        mm - pm,
        if mm / pm <= TARGET_RATIO {
            "within it"
        } else {
            "outside it"
        }
    );
    for (when, kib) in [
        ("after initialize", m.idle_init_kib),
        ("after the timed calls", m.idle_after_kib),
    ] {
        println!(
            "| plimsoll-mcp --daemon idle VmRSS {when} | {:.1} MiB | — | — | ≤ {TARGET_IDLE_MIB} MiB | {} |",
            mib(kib),
            verdict(mib(kib) <= TARGET_IDLE_MIB, MET_MISSED)
        );
    }
    println!();
    println!(
        "plimsoll-mcp --daemon: peak VmHWM {}, {} threads, {} child processes",
        m.peak_kib
            .map_or("unknown".into(), |k| format!("{:.1} MiB", mib(k))),
        m.threads.map_or("unknown".into(), |t| t.to_string()),
        m.children
    );
    match embedded {
        None => {}
        Some(Ok(e)) => println!(
            "embedded mode (no --daemon, process provider in its own process), for information: idle VmRSS {:.1} MiB after initialize, {:.1} MiB after {} run_code calls",
            mib(e.init_kib),
            mib(e.after_kib),
            e.calls
        ),
        Some(Err(e)) => println!("embedded mode idle VmRSS: not measured: {e:#}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags() {
        let o = parse(&[
            "--runs",
            "5",
            "--warmup",
            "0",
            "--no-build",
            "--no-embedded",
        ])
        .unwrap();
        assert_eq!(
            (o.runs, o.warmup, o.build, o.embedded),
            (5, 0, false, false)
        );
        assert_eq!(o.provider, "process");
        assert!(parse(&["--runs", "0"]).is_err());
        assert!(parse(&["--provider", "docker"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }
}
