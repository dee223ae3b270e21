//! `cargo xtask bench agentsandbox`: claim-to-result latency of the agent-sandbox provider
//! through the fake Kubernetes API server (`plimsoll_testkit::fake_cluster`), split into the
//! phases plimsolld pays for: claim wait (create the SandboxClaim, poll until Ready), TLS
//! connect (TCP, TLS 1.3 handshake, HTTP/2 channel) and run (the sandboxd call). Deleting
//! the claim is timed as well: plimsolld deletes it before it answers, so it is part of the
//! total.
//!
//! Pods are real `plimsoll-sandboxd-tls` + `plimsoll-sandboxd` pairs (release builds) on
//! loopback addresses; the fake keeps a warm pool and every measured run waits until it is
//! refilled, so the claim wait shows plimsolld's API round trips and polling, not the fake
//! controller's pod start. The baseline, measured in the same run, is the same payload sent
//! to a pod over an already-open TLS channel: what a run costs with no claim and no dial.
//!
//! With `--identity`, the same claim-to-result run is measured in two fake clusters side by
//! side, in alternating turns: today's channel (one shared certificate, token only) and
//! per-pod identity with mutual TLS (each pod's own certificate checked against the IP
//! dialed, plimsolld's client certificate required by every terminator). It prints the
//! ratio of their p50 totals (issue target: at most 1.1x).
//!
//! The provider code runs inside xtask (dev profile, dependencies at opt-level 1), the pods
//! are release builds. A measurement, never an assertion.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use plimsoll_agentsandbox::AgentSandboxProvider;
use plimsoll_core::pb;
use plimsoll_core::sandboxd_pb::{execute_request, ExecuteRequest};
use plimsoll_provider::{Provider, Work};
use plimsoll_testkit::fake_cluster::{FakeCluster, FakeClusterOptions};

use super::stats::{ms, quantile};
use super::Args;

const USAGE: &str = "\
usage: cargo xtask bench agentsandbox [--runs N] [--warmup N] [--payload js|shell] [--identity] [--no-build]
  --runs N        measured runs (default 50)
  --warmup N      unmeasured runs first (default 5)
  --payload P     js: `0` as JavaScript; shell: a project with the one step `true` (default shell)
  --identity      compare per-pod identity + mutual TLS with the shared certificate, interleaved
  --no-build      use target/release/plimsoll-sandboxd{,-tls} as they are";

struct Options {
    runs: usize,
    warmup: usize,
    js: bool,
    build: bool,
    identity: bool,
}

fn parse(args: &[&str]) -> anyhow::Result<Option<Options>> {
    let mut o = Options {
        runs: 50,
        warmup: 5,
        js: false,
        build: true,
        identity: false,
    };
    let mut a = Args::new(args, USAGE);
    while let Some(flag) = a.flag() {
        match flag {
            "--runs" => o.runs = a.parsed(flag)?,
            "--warmup" => o.warmup = a.parsed(flag)?,
            "--payload" => {
                o.js = match a.value(flag)? {
                    "js" => true,
                    "shell" => false,
                    other => bail!("--payload {other:?}: use js or shell"),
                }
            }
            "--no-build" => o.build = false,
            "--identity" => o.identity = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(a.unknown(other)),
        }
    }
    ensure!(o.runs > 0, "--runs must be at least 1");
    Ok(Some(o))
}

/// The p-th percentile (0..=100) of samples in milliseconds.
fn pct(samples: &[f64], p: f64) -> f64 {
    quantile(samples, p / 100.0)
}

fn work(js: bool) -> Work {
    if js {
        Work::Javascript(pb::JavaScriptRun {
            code: "0".into(),
            grant_profile: String::new(),
        })
    } else {
        Work::Project(pb::ProjectRun {
            steps: vec!["true".into()],
            ..Default::default()
        })
    }
}

/// Runs the benchmark and prints its table.
pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let Some(opts) = parse(args)? else {
        return Ok(());
    };
    if opts.build {
        crate::dist::build_release(&["plimsoll-sandboxd-bin", "plimsoll-sandboxd-tls"])?;
    }
    for b in ["plimsoll-sandboxd", "plimsoll-sandboxd-tls"] {
        crate::dist::release_bin(b)?;
    }
    let bin_dir = crate::dist::target_dir().join("release");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    if opts.identity {
        rt.block_on(compare_identity(opts, bin_dir))
    } else {
        rt.block_on(measure(opts, bin_dir))
    }
}

/// One channel mode: its fake cluster, its provider and the totals measured.
struct Mode {
    name: &'static str,
    cluster: FakeCluster,
    provider: AgentSandboxProvider,
    total: Vec<f64>,
    tls: Vec<f64>,
}

impl Mode {
    async fn start(name: &'static str, mut o: FakeClusterOptions) -> anyhow::Result<Mode> {
        o.warm = 2;
        let cluster = FakeCluster::start(o)
            .await
            .with_context(|| format!("starting the fake cluster ({name})"))?;
        let provider = AgentSandboxProvider::new(cluster.provider_config())?;
        provider
            .start()
            .await
            .with_context(|| format!("provider startup ({name})"))?;
        Ok(Mode {
            name,
            cluster,
            provider,
            total: vec![],
            tls: vec![],
        })
    }

    async fn one(&mut self, js: bool, keep: bool) -> anyhow::Result<()> {
        ensure!(
            self.cluster.wait_warm().await,
            "the fake warm pool did not refill ({})",
            self.name
        );
        let t = Instant::now();
        let (out, ph) = self
            .provider
            .run_timed(work(js), Duration::from_secs(30))
            .await;
        let elapsed = t.elapsed();
        out.map_err(|e| anyhow::anyhow!("{}: run failed: {e}", self.name))?;
        if keep {
            self.total.push(ms(elapsed));
            self.tls.push(ms(ph.tls_connect.context("no TLS connect")?));
        }
        Ok(())
    }
}

/// Today's channel against per-pod identity with mutual TLS, claim to result, turn about.
async fn compare_identity(opts: Options, bin_dir: PathBuf) -> anyhow::Result<()> {
    let mut shared = Mode::start("shared", FakeClusterOptions::conforming(bin_dir.clone())).await?;
    let mut per_pod = Mode::start("per-pod + mTLS", FakeClusterOptions::per_pod(bin_dir)).await?;
    for i in 0..opts.warmup + opts.runs {
        let keep = i >= opts.warmup;
        // Alternate which goes first, so neither always runs on a cooler machine.
        if i % 2 == 0 {
            shared.one(opts.js, keep).await?;
            per_pod.one(opts.js, keep).await?;
        } else {
            per_pod.one(opts.js, keep).await?;
            shared.one(opts.js, keep).await?;
        }
    }
    println!(
        "\nagentsandbox channel modes through the fake API server: {} runs each, interleaved ({} payload)",
        opts.runs,
        if opts.js { "javascript `0`" } else { "project `true`" },
    );
    println!(
        "{:<36} {:>8} {:>8} {:>8} {:>8} {:>14}",
        "claim-to-result (ms)", "p50", "p90", "min", "max", "TLS connect p50"
    );
    for m in [&shared, &per_pod] {
        println!(
            "{:<36} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>14.2}",
            m.name,
            pct(&m.total, 50.0),
            pct(&m.total, 90.0),
            pct(&m.total, 0.0),
            pct(&m.total, 100.0),
            pct(&m.tls, 50.0)
        );
    }
    let ratio = pct(&per_pod.total, 50.0) / pct(&shared.total, 50.0);
    println!(
        "per-pod + mTLS / shared (p50 claim-to-result, baseline: shared certificate, token only): {ratio:.3}x (target <= 1.1x: {})",
        if ratio <= 1.1 { "met" } else { "missed" }
    );
    for m in [shared, per_pod] {
        let n = m.cluster.counts();
        ensure!(
            n.created == n.deleted,
            "{}: a claim was left behind",
            m.name
        );
        m.cluster.shutdown().await;
    }
    Ok(())
}

async fn measure(opts: Options, bin_dir: PathBuf) -> anyhow::Result<()> {
    let mut o = FakeClusterOptions::conforming(bin_dir);
    o.warm = 2;
    let cluster = FakeCluster::start(o)
        .await
        .context("starting the fake cluster")?;
    let provider = AgentSandboxProvider::new(cluster.provider_config())?;
    let t = Instant::now();
    provider.start().await?;
    let startup = t.elapsed();
    let timeout = Duration::from_secs(30);

    let (mut wait, mut tls, mut run, mut del, mut total) = (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..opts.warmup + opts.runs {
        ensure!(
            cluster.wait_warm().await,
            "the fake warm pool did not refill"
        );
        let t = Instant::now();
        let (out, ph) = provider.run_timed(work(opts.js), timeout).await;
        let elapsed = t.elapsed();
        out.map_err(|e| anyhow::anyhow!("run {i} failed: {e}"))?;
        if i < opts.warmup {
            continue;
        }
        wait.push(ms(ph.claim_wait.context("no claim wait")?));
        tls.push(ms(ph.tls_connect.context("no TLS connect")?));
        run.push(ms(ph.run.context("no run")?));
        del.push(ms(ph.delete.context("no delete")?));
        total.push(ms(elapsed));
    }

    // Baseline: the same payload on an open TLS channel to one pod.
    let addr = cluster.standalone_pod().await?;
    let cfg = cluster.provider_config();
    let client_tls = plimsoll_tls::ClientTls::build(&cfg.client_spec())?;
    let token = plimsoll_sandboxd::Token::read_file(
        cfg.token_file
            .as_ref()
            .context("the fake cluster has a token file")?,
    )?;
    let client = plimsoll_sandboxd::SandboxdClient::connect_tls(&client_tls, addr, &token).await?;
    let payload = match work(opts.js) {
        Work::Javascript(j) => execute_request::Payload::Javascript(j),
        Work::Project(p) => execute_request::Payload::Project(p),
    };
    let mut base = vec![];
    for i in 0..opts.warmup + opts.runs {
        let req = ExecuteRequest {
            timeout_ms: 30_000,
            payload: Some(payload.clone()),
            ..Default::default()
        };
        let t = Instant::now();
        client.execute(req).await?;
        if i >= opts.warmup {
            base.push(ms(t.elapsed()));
        }
    }
    let counts = cluster.counts();
    cluster.shutdown().await;

    let row = |name: &str, v: &[f64]| {
        println!(
            "{name:<34} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
            pct(v, 50.0),
            pct(v, 90.0),
            pct(v, 0.0),
            pct(v, 100.0)
        );
    };
    println!(
        "\nagentsandbox through the fake API server: {} runs ({} payload), startup with smoke test {:.0} ms",
        opts.runs,
        if opts.js { "javascript `0`" } else { "project `true`" },
        ms(startup)
    );
    println!(
        "{:<34} {:>8} {:>8} {:>8} {:>8}",
        "phase (ms)", "p50", "p90", "min", "max"
    );
    row("claim wait (create + poll Ready)", &wait);
    row("TLS connect (TCP + TLS 1.3 + h2)", &tls);
    row("run (sandboxd call)", &run);
    row("delete claim", &del);
    row("claim-to-result, total", &total);
    row("baseline: run on an open channel", &base);
    let overhead = pct(&total, 50.0) - pct(&base, 50.0);
    println!(
        "plimsolld's own overhead per run (p50 total - p50 baseline): {overhead:.2} ms; total/baseline = {:.1}x",
        pct(&total, 50.0) / pct(&base, 50.0)
    );
    println!(
        "claims created {}, deleted {}, left {}; pods started {}",
        counts.created, counts.deleted, counts.live, counts.pods_started
    );
    ensure!(counts.created == counts.deleted, "a claim was left behind");
    Ok(())
}
