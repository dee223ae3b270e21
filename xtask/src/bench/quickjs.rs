//! `cargo xtask bench quickjs`: the quickjs provider against `node -e` spawned directly and
//! against the process provider, in one run.
//!
//! It builds `plimsolld` in release mode and starts it twice as separate processes on
//! loopback (`SANDBOX_PROVIDER=quickjs`, then `process`), each with a fresh callers file, and
//! measures with authenticated gRPC calls whose answers pass the client check:
//!
//! - the median latency of the trivial snippet `0` through plimsolld on quickjs, against
//!   `node -e 0` spawned directly (the runner's clean environment, output piped) and against
//!   the same snippet through plimsolld on the process provider; iterations interleaved,
//!   every side timed from before the call or spawn to the end of the answer or exit;
//! - quickjs runs per second at concurrency 8;
//! - a worker's peak resident memory (`VmHWM`), read while a worker runs an endless loop until
//!   its deadline, and plimsolld's own idle RSS.
//!
//! Target: quickjs faster than both baselines (ratio below 1). A missed target is reported,
//! never an error.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plimsoll_core::pb::run_request::Payload;
use plimsoll_core::pb::sandbox_service_client::SandboxServiceClient;
use plimsoll_core::pb::{self};
use tonic::transport::{Channel, Endpoint};

use super::process::{ms, quantile, through, verdict, Daemon};
use super::Args;

const USAGE: &str = "\
usage: cargo xtask bench quickjs [--iterations N] [--warmup N] [--seconds S] [--concurrency C] [--no-build]
  --iterations N   measured sequential runs per side (default 100)
  --warmup N       unmeasured runs first (default 10)
  --seconds S      duration of the throughput phase (default 5)
  --concurrency C  concurrent callers in the throughput phase (default 8)
  --no-build       use target/release/plimsolld as it is";

struct Options {
    iterations: usize,
    warmup: usize,
    seconds: f64,
    concurrency: usize,
    build: bool,
}

fn parse(args: &[&str]) -> anyhow::Result<Option<Options>> {
    let mut o = Options {
        iterations: 100,
        warmup: 10,
        seconds: 5.0,
        concurrency: 8,
        build: true,
    };
    let mut a = Args::new(args, USAGE);
    while let Some(flag) = a.flag() {
        match flag {
            "--iterations" => o.iterations = a.parsed(flag)?,
            "--warmup" => o.warmup = a.parsed(flag)?,
            "--seconds" => o.seconds = a.parsed(flag)?,
            "--concurrency" => o.concurrency = a.parsed(flag)?,
            "--no-build" => o.build = false,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(a.unknown(other)),
        }
    }
    ensure!(
        o.iterations > 0 && o.concurrency > 0,
        "counts must be positive"
    );
    ensure!(
        o.seconds.is_finite() && o.seconds > 0.0,
        "--seconds must be positive"
    );
    Ok(Some(o))
}

fn snippet(code: &str, timeout_ms: i32) -> pb::RunRequest {
    pb::RunRequest {
        protocol: plimsoll_core::PROTOCOL,
        timeout_ms,
        payload: Some(Payload::Javascript(pb::JavaScriptRun {
            code: code.into(),
            grant_profile: String::new(),
        })),
        ..Default::default()
    }
}

/// A daemon of `provider` with its own callers file; returns it and the token.
fn daemon(
    bin: &std::path::Path,
    dir: &std::path::Path,
    provider: &str,
) -> anyhow::Result<(Daemon, String)> {
    let callers = dir.join(format!("{provider}-callers.json"));
    let mut file = plimsoll_callers::CallersFile::default();
    let token = file.add("bench", &[])?;
    file.save(&callers)?;
    let d = Daemon::spawn_with(
        bin,
        &callers,
        &dir.join(format!("{provider}-state")),
        provider,
    )?;
    Ok((d, token))
}

async fn client(d: &Daemon) -> anyhow::Result<SandboxServiceClient<Channel>> {
    let channel = Endpoint::from_shared(format!("http://{}", d.addr))?
        .tcp_nodelay(true)
        .connect()
        .await
        .context("connecting to plimsolld")?;
    Ok(SandboxServiceClient::new(channel))
}

/// `node -e 0` as the runner starts programs: clean environment, output piped.
async fn node_direct(dir: &std::path::Path) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    let out = tokio::process::Command::new("node")
        .args(["-e", "0"])
        .current_dir(dir)
        .env_clear()
        .env("PATH", plimsoll_runner::FIXED_PATH)
        .env("HOME", dir)
        .env("LANG", "C.UTF-8")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("spawning node")?;
    let t = t0.elapsed();
    ensure!(out.status.success(), "node -e 0 failed: {}", out.status);
    Ok(t)
}

/// Peak RSS of a quickjs worker, read from `/proc` while it spins until its deadline.
async fn worker_peak_kib(
    qjs: &Daemon,
    c: &mut SandboxServiceClient<Channel>,
    token: &str,
) -> anyhow::Result<u64> {
    let req = snippet("for (;;) {}", 1500);
    let parent = qjs.child.id().to_string();
    let mut call = tonic::Request::new(req);
    call.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    let mut c2 = c.clone();
    let run = tokio::spawn(async move { c2.run(call).await });
    let mut peak = 0u64;
    while !run.is_finished() {
        for e in std::fs::read_dir("/proc")?.flatten() {
            let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
                continue;
            };
            let ppid = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))
                .map(str::trim);
            if ppid != Some(parent.as_str()) {
                continue;
            }
            if let Some(h) = super::mem::field_kib(&status, "VmHWM") {
                peak = peak.max(h);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resp = run.await?.context("the endless loop's run")?.into_inner();
    match resp.result {
        Some(pb::run_response::Result::Javascript(j)) => {
            ensure!(j.timed_out, "the loop did not time out")
        }
        other => bail!("unexpected answer {other:?}"),
    }
    ensure!(peak > 0, "no worker was seen");
    Ok(peak)
}

/// Runs the benchmark and prints its table.
pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let Some(o) = parse(args)? else {
        return Ok(());
    };
    if o.build {
        crate::dist::build_release(&["plimsolld"])?;
    }
    let bin: PathBuf = crate::dist::release_bin("plimsolld")?;
    let tmp = tempfile::tempdir()?;
    let direct_dir = tmp.path().join("direct");
    std::fs::create_dir(&direct_dir)?;
    let (mut qjs, qtoken) = daemon(&bin, tmp.path(), "quickjs")?;
    let (mut prc, ptoken) = daemon(&bin, tmp.path(), "process")?;
    std::thread::sleep(Duration::from_millis(300));
    let idle_kib = qjs.status_kib("VmRSS")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async {
        let mut qc = client(&qjs).await?;
        let mut pc = client(&prc).await?;
        let req = snippet("0", 0);
        for _ in 0..o.warmup {
            through(&mut qc, &qtoken, &req).await?;
            through(&mut pc, &ptoken, &req).await?;
            node_direct(&direct_dir).await?;
        }
        let (mut q, mut p, mut n) = (Vec::new(), Vec::new(), Vec::new());
        eprintln!("bench: {} interleaved iterations", o.iterations);
        for _ in 0..o.iterations {
            q.push(ms(through(&mut qc, &qtoken, &req).await?));
            n.push(ms(node_direct(&direct_dir).await?));
            p.push(ms(through(&mut pc, &ptoken, &req).await?));
        }
        eprintln!(
            "bench: throughput at concurrency {} for {} s",
            o.concurrency, o.seconds
        );
        let (runs, secs) = super::process::runs_for(
            &qc,
            &qtoken,
            &req,
            o.concurrency,
            Duration::from_secs_f64(o.seconds),
        )
        .await?;
        let per_s = runs as f64 / secs;
        let peak = worker_peak_kib(&qjs, &mut qc, &qtoken).await?;
        anyhow::Ok((q, n, p, per_s, peak))
    });
    qjs.stop();
    prc.stop();
    let (q, n, p, per_s, peak) = result?;
    let (mq, mn, mp) = (quantile(&q, 0.5), quantile(&n, 0.5), quantile(&p, 0.5));
    println!();
    println!(
        "quickjs provider: snippet `0`, {} measured runs per side after {} warm-up, interleaved; loopback gRPC with a bearer token, client check on every answer",
        o.iterations, o.warmup
    );
    println!("| measure | quickjs | baseline | ratio | target |");
    println!("|---|---|---|---|---|");
    println!(
        "| median latency vs `node -e 0` spawned directly | {mq:.2} ms | {mn:.2} ms | {:.2}x | < 1.0x, {} |",
        mq / mn,
        verdict(mq < mn)
    );
    println!(
        "| median latency vs the process provider (node) | {mq:.2} ms | {mp:.2} ms | {:.2}x | < 1.0x, {} |",
        mq / mp,
        verdict(mq < mp)
    );
    println!(
        "| p90 latency | {:.2} ms | node {:.2} ms, process {:.2} ms | - | - |",
        quantile(&q, 0.9),
        quantile(&n, 0.9),
        quantile(&p, 0.9)
    );
    println!(
        "| runs per second at concurrency {} | {per_s:.0}/s | - | - | - |",
        o.concurrency
    );
    println!(
        "| worker peak RSS (endless loop to its deadline) | {:.1} MiB | - | - | - |",
        peak as f64 / 1024.0
    );
    println!(
        "| plimsolld idle RSS (quickjs) | {:.1} MiB | - | - | - |",
        idle_kib as f64 / 1024.0
    );
    Ok(())
}
