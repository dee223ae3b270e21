//! `cargo xtask bench docker`: run latency of plimsolld with the Docker provider, with and
//! without the warm pool, against `docker run IMAGE true` through the Docker CLI with the
//! same image, all in one run. Both sides are timed from the start of the call until the
//! program's exit is known; both remove their container after the clock stops (plimsolld in
//! the background, the CLI baseline with `docker rm` after its timing).
//!
//! It makes sure the sandbox image is built (`cargo xtask images`, cached), builds plimsolld
//! in release mode, and starts it twice as a separate process: once with
//! `SANDBOX_DOCKER_POOL` and once without. Each measured run is a project with the one step
//! `true`, timed by the caller around the gRPC call. Runs against the pool are spaced so the
//! pool has refilled (a pool drained by back-to-back runs measures cold starts, which the
//! no-pool figure already shows).
//!
//! Neither side's clock includes the removal: that is the like-for-like pair the verdicts
//! use. `docker run --rm` (whose CLI waits for the removal) is timed as well, interleaved
//! with the plain `docker run`, and printed beside it for scale.
//!
//! Targets: with the pool at least 10× faster than `docker run`; without it at most 1.0×
//! `docker run`. A missed target is reported, never an error.
//!
//! `--runtime runsc` measures the same three rows under gVisor (`docker run --runtime runsc`,
//! plimsolld with `SANDBOX_DOCKER_RUNTIME=runsc`) right after the runc rows, in the same
//! run and timed the same way, and prints both tables and the runsc/runc ratio per row.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use plimsoll_core::pb::run_request::Payload;
use plimsoll_core::pb::run_response::Result as RunResult;
use plimsoll_core::pb::sandbox_service_client::SandboxServiceClient;
use plimsoll_core::pb::{self};
use tonic::transport::Channel;

use super::stats::{median, ms, quantile};
use super::Args;

/// Pool at least this many times faster than `docker run`.
const TARGET_POOL_SPEEDUP: f64 = 10.0;
/// No pool at most this many times `docker run`.
const TARGET_COLD_RATIO: f64 = 1.0;

const USAGE: &str = "\
usage: cargo xtask bench docker [--iterations N] [--pool P] [--gap-ms MS] [--runtime runsc] [--no-build]
  --iterations N  measured runs of each kind (default 20)
  --pool P        SANDBOX_DOCKER_POOL of the pooled daemon (default 2)
  --gap-ms MS     pause between pooled runs so the pool refills (default 1500)
  --runtime R     also measure every row under runtime R (runsc), against runc in the same run
  --no-build      use target/release/plimsolld and plimsoll/sandbox:latest as they are";

struct Options {
    iterations: usize,
    pool: usize,
    gap: Duration,
    build: bool,
    runtime: Option<String>,
}

fn parse(args: &[&str]) -> Result<Option<Options>> {
    let mut o = Options {
        iterations: 20,
        pool: 2,
        gap: Duration::from_millis(1500),
        build: true,
        runtime: None,
    };
    let mut a = Args::new(args, USAGE);
    while let Some(flag) = a.flag() {
        match flag {
            "--iterations" => o.iterations = a.parsed(flag)?,
            "--pool" => o.pool = a.parsed(flag)?,
            "--gap-ms" => o.gap = Duration::from_millis(a.parsed(flag)?),
            "--no-build" => o.build = false,
            "--runtime" => match a.value(flag)? {
                "runc" => o.runtime = None,
                "runsc" => o.runtime = Some("runsc".into()),
                other => bail!("--runtime {other:?}: use runsc (runc is always measured)"),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(a.unknown(other)),
        }
    }
    ensure!(o.iterations >= 3, "--iterations must be at least 3");
    ensure!(o.pool >= 1, "--pool must be at least 1");
    Ok(Some(o))
}

/// `cargo xtask bench docker …`.
pub fn run(args: &[&str]) -> Result<()> {
    let Some(opts) = parse(args)? else {
        return Ok(());
    };
    let image = if opts.build {
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
    let bin = crate::dist::release_bin("plimsolld")?;
    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;

    let runc = measure_runtime(&rt, &opts, &bin, &image, "runc", tmp.path())?;
    let runsc = match &opts.runtime {
        Some(r) => Some(measure_runtime(&rt, &opts, &bin, &image, r, tmp.path())?),
        None => None,
    };
    println!();
    println!(
        "bench docker: image {image}, {} runs each (project step `true`), medians:",
        opts.iterations
    );
    runc.print(opts.pool);
    if let Some(g) = &runsc {
        g.print(opts.pool);
        println!(
            "  {}/runc, per row (same run, same timing; baseline: runc):",
            g.runtime
        );
        for (name, a, b) in [
            (
                "docker run IMAGE true (CLI, removed after timing)",
                &runc.cli,
                &g.cli,
            ),
            ("plimsolld, no pool", &runc.cold, &g.cold),
            ("plimsolld, warm pool", &runc.pooled, &g.pooled),
        ] {
            println!(
                "    {name:<36} {:6.2}x   ({:.1} ms vs {:.1} ms)",
                median(b) / median(a),
                median(b),
                median(a)
            );
        }
    }
    Ok(())
}

/// The three rows, for one runtime.
struct Rows {
    runtime: String,
    cli: Vec<f64>,
    /// `docker run --rm`: the CLI waits for the removal (not the verdicts' baseline).
    cli_rm: Vec<f64>,
    cold: Vec<f64>,
    pooled: Vec<f64>,
}

impl Rows {
    fn print(&self, pool: usize) {
        let (m_cli, m_cold, m_pool) = (median(&self.cli), median(&self.cold), median(&self.pooled));
        let speedup = m_cli / m_pool;
        let cold_ratio = m_cold / m_cli;
        println!("  runtime {}:", self.runtime);
        println!(
            "  docker run IMAGE true (CLI; rm after) {m_cli:8.1} ms   (p90 {:.1})",
            quantile(&self.cli, 0.9)
        );
        println!(
            "  docker run --rm IMAGE true (info)     {:8.1} ms   (p90 {:.1})",
            median(&self.cli_rm),
            quantile(&self.cli_rm, 0.9)
        );
        println!(
            "  plimsolld, no pool                    {m_cold:8.1} ms   (p90 {:.1})",
            quantile(&self.cold, 0.9)
        );
        println!(
            "  plimsolld, warm pool of {pool}             {m_pool:8.1} ms   (p90 {:.1})",
            quantile(&self.pooled, 0.9)
        );
        println!(
            "  pool speed-up over docker run: {speedup:.1}x (target >= {TARGET_POOL_SPEEDUP}x) {}",
            verdict(speedup >= TARGET_POOL_SPEEDUP)
        );
        println!(
            "  no pool vs docker run: {cold_ratio:.2}x (target <= {TARGET_COLD_RATIO}x) {}",
            verdict(cold_ratio <= TARGET_COLD_RATIO)
        );
    }
}

/// `docker run --runtime R IMAGE true` through the CLI (removed after its timing), then
/// plimsolld without and with the pool, all under runtime `runtime`.
fn measure_runtime(
    rt: &tokio::runtime::Runtime,
    opts: &Options,
    bin: &Path,
    image: &str,
    runtime: &str,
    tmp: &Path,
) -> Result<Rows> {
    eprintln!(
        "bench: docker run --runtime {runtime} {image} true ×{} (removed after timing)",
        opts.iterations + 2
    );
    let mut cli = Vec::new();
    let mut cli_rm = Vec::new();
    for i in 0..opts.iterations + 2 {
        // For scale: the CLI with --rm waits for the removal.
        let t0 = Instant::now();
        let st = Command::new("docker")
            .args([
                "run",
                "--rm",
                "--runtime",
                runtime,
                "--network",
                "none",
                image,
                "true",
            ])
            .stdout(Stdio::null())
            .status()
            .context("running docker run --rm")?;
        ensure!(st.success(), "docker run --rm {image} true failed: {st}");
        if i >= 2 {
            cli_rm.push(ms(t0.elapsed()));
        }
        // Timed like a run through plimsolld: from the start until the program's exit is
        // known. plimsolld removes its used containers in the background, so the CLI's
        // container is removed after the clock stops too (not with --rm, which would make
        // the CLI wait for the removal inside the measurement).
        let cidfile = tmp.join(format!("{runtime}-cli-{i}.cid"));
        let t0 = Instant::now();
        let st = Command::new("docker")
            .args(["run", "--cidfile"])
            .arg(&cidfile)
            .args(["--runtime", runtime, "--network", "none", image, "true"])
            .stdout(Stdio::null())
            .status()
            .context("running docker run")?;
        let elapsed = t0.elapsed();
        if let Ok(id) = std::fs::read_to_string(&cidfile) {
            let _ = Command::new("docker")
                .args(["rm", "-f", id.trim()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        ensure!(
            st.success(),
            "docker run --runtime {runtime} {image} true failed: {st}"
        );
        if i >= 2 {
            cli.push(ms(elapsed));
        }
    }
    let cold = {
        let mut d = Daemon::spawn(bin, image, runtime, 0, &tmp.join(format!("{runtime}-cold")))?;
        let r = rt.block_on(measure(d.addr, opts.iterations, Duration::ZERO));
        d.stop();
        r?
    };
    let pooled = {
        let mut d = Daemon::spawn(
            bin,
            image,
            runtime,
            opts.pool,
            &tmp.join(format!("{runtime}-pool")),
        )?;
        // Let the pool fill before the first run.
        std::thread::sleep(opts.gap * opts.pool as u32);
        let r = rt.block_on(measure(d.addr, opts.iterations, opts.gap));
        d.stop();
        r?
    };
    Ok(Rows {
        runtime: runtime.to_owned(),
        cli,
        cli_rm,
        cold,
        pooled,
    })
}

fn verdict(ok: bool) -> &'static str {
    super::verdict(ok, super::MET_MISSED)
}

fn project_true() -> pb::RunRequest {
    pb::RunRequest {
        protocol: 5,
        timeout_ms: 30_000,
        payload: Some(Payload::Project(pb::ProjectRun {
            files: vec![],
            steps: vec!["true".into()],
            artifacts: vec![],
            grant_profile: String::new(),
        })),
        ..Default::default()
    }
}

async fn measure(addr: SocketAddr, n: usize, gap: Duration) -> Result<Vec<f64>> {
    let mut client: SandboxServiceClient<Channel> =
        SandboxServiceClient::connect(format!("http://{addr}")).await?;
    let mut out = Vec::new();
    // Two unmeasured runs first.
    for i in 0..n + 2 {
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        let req = project_true();
        let t0 = Instant::now();
        let resp = client.run(req.clone()).await?.into_inner();
        let took = ms(t0.elapsed());
        plimsoll_core::check::check_answer(&req, &resp)?;
        let Some(RunResult::Project(p)) = resp.result else {
            bail!("no project result");
        };
        ensure!(
            p.outcome == pb::ProjectOutcome::Completed as i32,
            "the run did not complete: {p:?}"
        );
        if i >= 2 {
            out.push(took);
        }
    }
    Ok(out)
}

/// plimsolld with the Docker provider, as a child process.
struct Daemon {
    child: Child,
    addr: SocketAddr,
}

impl Daemon {
    fn spawn(bin: &Path, image: &str, runtime: &str, pool: usize, state: &Path) -> Result<Daemon> {
        let mut cmd = Command::new(bin);
        cmd.arg("--log-format").arg("json");
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("PLIMSOLL_") || k.starts_with("SANDBOX_") {
                cmd.env_remove(k.as_ref());
            }
        }
        cmd.env("SANDBOX_PROVIDER", "docker")
            .env("SANDBOX_DOCKER_IMAGE", image)
            .env("SANDBOX_DOCKER_POOL", pool.to_string())
            .env("SANDBOX_DOCKER_RUNTIME", runtime)
            .env("PLIMSOLL_INSECURE", "1")
            .env("PLIMSOLL_ADDR", "127.0.0.1:0")
            .env("PLIMSOLL_METRICS_ADDR", "off")
            .env("PLIMSOLL_STATE_DIR", state)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = child.stderr.take().context("plimsolld stderr")?;
        let (tx, rx) = mpsc::channel::<std::result::Result<SocketAddr, String>>();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            let mut tail = Vec::new();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = serving_addr(&line) {
                    if let Some(t) = tx.take() {
                        let _ = t.send(Ok(addr));
                    }
                }
                if tx.is_some() {
                    tail.push(line);
                }
            }
            if let Some(t) = tx.take() {
                let _ = t.send(Err(tail.join("\n")));
            }
        });
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(Ok(addr)) => {
                eprintln!("bench: plimsolld ({runtime}, pool {pool}) serving on {addr}");
                Ok(Daemon { child, addr })
            }
            Ok(Err(log)) => {
                let _ = child.wait();
                bail!("plimsolld exited before serving:\n{log}")
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("plimsolld did not serve within 120 s")
            }
        }
    }

    /// SIGTERM, then SIGKILL after 20 s.
    fn stop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
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

fn serving_addr(line: &str) -> Option<SocketAddr> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v.get("message")?.as_str()? != "serving" {
        return None;
    }
    v.get("addr")?.as_str()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let args = |a: &[&'static str]| a.to_vec();
        let o = parse(&args(&["--iterations", "5", "--pool", "3", "--no-build"]))
            .unwrap()
            .unwrap();
        assert_eq!((o.iterations, o.pool, o.build), (5, 3, false));
        assert_eq!(o.runtime, None);
        let o = parse(&args(&["--runtime", "runsc"])).unwrap().unwrap();
        assert_eq!(o.runtime.as_deref(), Some("runsc"));
        assert!(parse(&args(&["--runtime", "kata"])).is_err());
        assert!(parse(&args(&["--iterations", "1"])).is_err());
        assert!(parse(&args(&["--help"])).unwrap().is_none());
    }
}
