//! `cargo xtask bench bwrap`: the bwrap provider's added latency over a direct spawn,
//! against the process provider and the Docker provider's warm pool, in one run; and its
//! runs per second at concurrency 8.
//!
//! It builds `plimsolld` and `plimsoll-sandboxd` in release mode, copies both into a folder
//! under `/tmp` (the bwrap provider finds sandboxd beside plimsolld, and the sandboxes' user
//! must reach it), builds the sandbox image (`cargo xtask images`, cached), then
//! starts four plimsolld processes: the process provider, the bwrap provider with its warm
//! pool (`SANDBOX_BWRAP_POOL`, default 2), the bwrap provider without a pool, and the Docker
//! provider with its warm pool (`SANDBOX_DOCKER_POOL`, default 2). Each iteration runs, in
//! turn, `sh -c true` spawned directly (the baseline) and a project with the one step `true`
//! through each daemon, every one timed by the caller from the start of the call until the
//! exit is known; then it pauses `--gap-ms` so both warm pools have refilled (a drained pool
//! measures cold starts, which the no-pool row already shows).
//!
//! Targets: the bwrap pool's added latency within 10 ms of the process provider's, and the
//! bwrap pool faster than the Docker pool. Without a Docker engine or the image the Docker
//! row is reported as not measured and its target as missed. A missed target is reported,
//! never an error.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use plimsoll_core::pb::sandbox_service_client::SandboxServiceClient;
use tonic::transport::{Channel, Endpoint};

use super::process::{direct, pairs, through, Daemon};
use super::stats::{median, ms};
use super::Args;

/// The bwrap pool's added latency may exceed the process provider's by at most this (ms).
const TARGET_OVER_PROCESS_MS: f64 = 10.0;

const USAGE: &str = "\
usage: cargo xtask bench bwrap [--iterations N] [--gap-ms MS] [--seconds S] [--concurrency C] [--pool P] [--no-docker] [--no-build]
  --iterations N   measured runs per row, interleaved (default 40)
  --gap-ms MS      pause after each iteration so the warm pools refill (default 1500)
  --seconds S      duration of the throughput phase (default 5)
  --concurrency C  concurrent callers in the throughput phase (default 8)
  --pool P         SANDBOX_BWRAP_POOL and SANDBOX_DOCKER_POOL of the pooled daemons (default 2)
  --no-docker      leave the Docker row out (its target is then reported as not measured)
  --no-build       use target/release/plimsolld, plimsoll-sandboxd and plimsoll/sandbox:latest as they are";

struct Options {
    iterations: usize,
    gap: Duration,
    seconds: f64,
    concurrency: usize,
    pool: usize,
    docker: bool,
    build: bool,
}

fn parse(args: &[&str]) -> Result<Option<Options>> {
    let mut o = Options {
        iterations: 40,
        gap: Duration::from_millis(1500),
        seconds: 5.0,
        concurrency: 8,
        pool: 2,
        docker: true,
        build: true,
    };
    let mut a = Args::new(args, USAGE);
    while let Some(flag) = a.flag() {
        match flag {
            "--iterations" => o.iterations = a.parsed(flag)?,
            "--gap-ms" => o.gap = Duration::from_millis(a.parsed(flag)?),
            "--seconds" => o.seconds = a.parsed(flag)?,
            "--concurrency" => o.concurrency = a.parsed(flag)?,
            "--pool" => o.pool = a.parsed(flag)?,
            "--no-docker" => o.docker = false,
            "--no-build" => o.build = false,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(a.unknown(other)),
        }
    }
    ensure!(o.iterations > 0, "--iterations must be at least 1");
    ensure!(o.concurrency > 0, "--concurrency must be at least 1");
    ensure!(o.pool > 0, "--pool must be at least 1");
    ensure!(
        o.seconds.is_finite() && o.seconds > 0.0,
        "--seconds must be positive"
    );
    Ok(Some(o))
}

/// One measured row: a daemon (or the direct spawn when `None`) and its timings.
struct Row {
    name: &'static str,
    daemon: Option<Daemon>,
    times: Vec<f64>,
}

pub fn run(args: &[&str]) -> Result<()> {
    let Some(o) = parse(args)? else {
        return Ok(());
    };
    let image = if !o.docker {
        None
    } else if o.build {
        match crate::images::build(&[]) {
            Ok(Some(b)) => Some(b.sandbox_id),
            Ok(None) => None,
            Err(e) => {
                eprintln!("bench: no sandbox image, the Docker row is not measured: {e:#}");
                None
            }
        }
    } else {
        crate::images::image_id("plimsoll/sandbox:latest")
    };
    if o.build {
        crate::dist::build_release(&["plimsolld", "plimsoll-sandboxd-bin"])?;
    }
    // The sandboxes run as nobody when this runs as root: every directory above their run
    // directories and above sandboxd must let them through, so both binaries are copied
    // into a folder under /tmp (the bwrap provider finds sandboxd beside plimsolld).
    // A short name: the Docker daemon's per-run socket paths below it must fit in 107 bytes.
    let tmp = tempfile::Builder::new()
        .prefix("pb")
        .tempdir_in("/tmp")
        .context("creating a folder under /tmp")?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o711))?;
    let bin_dir = tmp.path().join("bin");
    std::fs::create_dir(&bin_dir)?;
    std::fs::set_permissions(&bin_dir, std::fs::Permissions::from_mode(0o755))?;
    for name in ["plimsolld", "plimsoll-sandboxd"] {
        std::fs::copy(crate::dist::release_bin(name)?, bin_dir.join(name))
            .with_context(|| format!("copying {name}"))?;
    }
    let bin = bin_dir.join("plimsolld");
    let callers = tmp.path().join("callers.json");
    let mut file = plimsoll_callers::CallersFile::default();
    let token = file.add("bench", &[])?;
    file.save(&callers)?;
    let state = |n: &str| tmp.path().join(n);
    let pool = o.pool.to_string();

    let mut rows = vec![
        Row {
            name: "sh -c true, spawned directly (baseline)",
            daemon: None,
            times: Vec::new(),
        },
        Row {
            name: "process provider",
            daemon: Some(Daemon::spawn_with(&bin, &callers, &state("p"), "process")?),
            times: Vec::new(),
        },
        Row {
            name: "bwrap provider, warm pool",
            daemon: Some(Daemon::spawn_env(
                &bin,
                &callers,
                &state("b"),
                "bwrap",
                &[("SANDBOX_BWRAP_POOL", &pool)],
            )?),
            times: Vec::new(),
        },
        Row {
            name: "bwrap provider, no pool",
            daemon: Some(Daemon::spawn_env(
                &bin,
                &callers,
                &state("b0"),
                "bwrap",
                &[("SANDBOX_BWRAP_POOL", "0")],
            )?),
            times: Vec::new(),
        },
    ];
    if let Some(image) = &image {
        match Daemon::spawn_env(
            &bin,
            &callers,
            &state("d"),
            "docker",
            &[
                ("SANDBOX_DOCKER_IMAGE", image),
                ("SANDBOX_DOCKER_POOL", &pool),
            ],
        ) {
            Ok(d) => rows.push(Row {
                name: "docker provider, warm pool",
                daemon: Some(d),
                times: Vec::new(),
            }),
            Err(e) => eprintln!("bench: the Docker row is not measured: {e:#}"),
        }
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let direct_dir = tmp.path().join("direct");
    std::fs::create_dir(&direct_dir)?;
    let throughput = rt.block_on(measure(&mut rows, &token, &direct_dir, &o))?;
    print(&o, &rows, &throughput);
    for r in &mut rows {
        if let Some(d) = &mut r.daemon {
            d.stop();
        }
    }
    Ok(())
}

async fn connect(d: &Daemon) -> Result<SandboxServiceClient<Channel>> {
    let channel = Endpoint::from_shared(format!("http://{}", d.addr))?
        .tcp_nodelay(true)
        .connect()
        .await
        .context("connecting to plimsolld")?;
    Ok(SandboxServiceClient::new(channel))
}

/// Runs per second at concurrency C, for the process and the pooled bwrap daemon.
struct Throughput {
    process: f64,
    bwrap: f64,
}

async fn measure(rows: &mut [Row], token: &str, dir: &Path, o: &Options) -> Result<Throughput> {
    let sh = pairs()
        .into_iter()
        .next()
        .context("the process bench's pairs")?;
    let mut clients = Vec::new();
    for r in rows.iter() {
        clients.push(match &r.daemon {
            Some(d) => Some(connect(d).await?),
            None => None,
        });
    }
    // Let the warm pools fill before the first run.
    tokio::time::sleep(o.gap).await;
    let warmup = 2;
    eprintln!(
        "bench: {} rows, {warmup} warm-up + {} measured iterations, {:?} apart",
        rows.len(),
        o.iterations,
        o.gap
    );
    for i in 0..warmup + o.iterations {
        for (r, c) in rows.iter_mut().zip(clients.iter_mut()) {
            let took = match c {
                None => direct(&sh, dir).await?,
                Some(c) => through(c, token, &sh.request)
                    .await
                    .with_context(|| r.name)?,
            };
            if i >= warmup {
                r.times.push(ms(took));
            }
        }
        tokio::time::sleep(o.gap).await;
    }
    let process = runs_per_s(rows, "process provider", token, &sh.request, o).await?;
    let bwrap = runs_per_s(rows, "bwrap provider, warm pool", token, &sh.request, o).await?;
    Ok(Throughput { process, bwrap })
}

/// Runs per second of the row `name`'s daemon with `o.concurrency` callers for `o.seconds`.
async fn runs_per_s(
    rows: &[Row],
    name: &str,
    token: &str,
    req: &plimsoll_core::pb::RunRequest,
    o: &Options,
) -> Result<f64> {
    let d = rows
        .iter()
        .find(|r| r.name == name)
        .and_then(|r| r.daemon.as_ref())
        .context("the row's daemon")?;
    eprintln!(
        "bench: {name}: concurrency {} for {} s",
        o.concurrency, o.seconds
    );
    let client = connect(d).await?;
    let (runs, secs) = super::process::runs_for(
        &client,
        token,
        req,
        o.concurrency,
        Duration::from_secs_f64(o.seconds),
    )
    .await?;
    Ok(runs as f64 / secs)
}

fn print(o: &Options, rows: &[Row], t: &Throughput) {
    let base = median(&rows[0].times);
    let added = |name: &str| {
        rows.iter()
            .find(|r| r.name == name)
            .map(|r| median(&r.times) - base)
    };
    println!();
    println!(
        "bench bwrap: project step `true`, {} measured runs per row, interleaved, {:?} apart; medians, timed by the caller:",
        o.iterations, o.gap
    );
    for r in rows {
        let m = median(&r.times);
        if r.daemon.is_none() {
            println!("  {:<44} {m:8.2} ms", r.name);
        } else {
            println!(
                "  {:<44} {m:8.2} ms   (+{:.2} ms over the direct spawn)",
                r.name,
                m - base
            );
        }
    }
    let process = added("process provider").unwrap_or(f64::NAN);
    let pooled = added("bwrap provider, warm pool").unwrap_or(f64::NAN);
    println!();
    let ok = pooled - process <= TARGET_OVER_PROCESS_MS;
    println!(
        "  target: bwrap (pool) added latency within {TARGET_OVER_PROCESS_MS} ms of the process provider's: +{pooled:.2} ms vs +{process:.2} ms ({:+.2} ms) {}",
        pooled - process,
        super::verdict(ok, super::MET_MISSED)
    );
    match added("docker provider, warm pool") {
        Some(docker) => {
            let ok = pooled < docker;
            println!(
                "  target: bwrap (pool) faster than the Docker pool: {:.2} ms vs {:.2} ms ({:.2}x) {}",
                pooled + base,
                docker + base,
                (docker + base) / (pooled + base),
                super::verdict(ok, super::MET_MISSED)
            );
        }
        None => println!(
            "  target: bwrap (pool) faster than the Docker pool: NOT MEASURED (no Docker row) {}",
            super::verdict(false, super::MET_MISSED)
        ),
    }
    println!(
        "  runs per second at concurrency {} ({} s): bwrap (pool {}) {:.1}/s; process provider {:.1}/s (baseline, {:.2}x)",
        o.concurrency,
        o.seconds,
        o.pool,
        t.bwrap,
        t.process,
        t.bwrap / t.process
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let o = parse(&[
            "--iterations",
            "3",
            "--gap-ms",
            "10",
            "--no-docker",
            "--pool",
            "4",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (o.iterations, o.gap, o.docker, o.pool),
            (3, Duration::from_millis(10), false, 4)
        );
        assert!(parse(&["--pool", "0"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
    }
}
