//! `cargo xtask bench grants`: the grant machinery's two figures, in one run.
//!
//! - **plimsoll-specgen** on a generated OpenAPI 3.1 JSON document of GitHub's size (over
//!   10 MB, about 1000 paths, thousands of `$ref`s into schemas, parameters and responses,
//!   and path items by `$ref`): wall time and peak RSS of the release binary, writing a whole
//!   profile with every operation. Peak RSS comes from `/usr/bin/time -v` (the kernel's
//!   maximum RSS of that one process) when present, else from VmHWM sampled in /proc.
//! - **the broker**: the latency one call adds, against calling the same loopback upstream
//!   directly, as a ratio of medians. Direct and brokered calls alternate, so a busy machine
//!   slows both alike. Measured twice: on one kept-alive connection, and with a new
//!   connection per call (what the in-sandbox clients do).
//!
//! The broker runs inside this program, so its figures depend on how xtask was built:
//! `cargo xtask bench grants` is a debug build and says so; `cargo run --release -p xtask --
//! bench grants` measures an optimised broker. Everything is on loopback and in a temporary
//! directory.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use plimsoll_testkit::upstream::{Reply, Upstream};

use super::stats::{ms, quantile_of, us};

const USAGE: &str = "\
usage: cargo xtask bench grants [--paths N] [--runs N] [--calls N] [--no-build]
  --paths N    paths in the generated document (default 1000)
  --runs N     specgen runs (default 5)
  --calls N    calls per variant and per side, after 200 warm-up calls (default 3000)
  --no-build   use target/release/plimsoll-specgen as it is";

struct Options {
    paths: usize,
    runs: usize,
    calls: usize,
    build: bool,
}

fn parse(args: &[&str]) -> anyhow::Result<Options> {
    let mut o = Options {
        paths: 1000,
        runs: 5,
        calls: 3000,
        build: true,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut num = || -> anyhow::Result<usize> {
            it.next()
                .context(USAGE)?
                .parse()
                .with_context(|| format!("{a} needs a number\n{USAGE}"))
        };
        match *a {
            "--paths" => o.paths = num()?,
            "--runs" => o.runs = num()?,
            "--calls" => o.calls = num()?,
            "--no-build" => o.build = false,
            _ => bail!("unknown argument {a:?}\n{USAGE}"),
        }
    }
    ensure!(
        o.paths >= 1 && o.runs >= 1 && o.calls >= 10,
        "--paths, --runs must be at least 1 and --calls at least 10"
    );
    ensure!(
        o.calls <= 40_000,
        "--calls is at most 40000 (the grant's call budget)"
    );
    Ok(o)
}

/// Runs the benchmark and prints its figures.
pub fn run(args: &[&str]) -> anyhow::Result<()> {
    let opts = parse(args)?;
    if opts.build {
        crate::dist::build_release(&["plimsoll-specgen"])?;
    }
    let bin = crate::dist::release_bin("plimsoll-specgen")?;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "machine: {cpus} CPUs, load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );

    let tmp = tempfile::tempdir().context("creating a temporary directory")?;
    specgen_figures(&bin, tmp.path(), &opts)?;
    broker_figures(&opts)
}

// ---------------------------------------------------------------------------------------
// specgen

/// A small deterministic generator (no dependency, same document every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const WORDS: &[&str] = &[
    "repository",
    "pull",
    "request",
    "review",
    "comment",
    "issue",
    "label",
    "milestone",
    "branch",
    "protection",
    "commit",
    "status",
    "check",
    "run",
    "suite",
    "workflow",
    "artifact",
    "deployment",
    "environment",
    "secret",
    "variable",
    "team",
    "member",
    "organization",
    "installation",
    "token",
    "webhook",
    "delivery",
    "release",
    "asset",
    "package",
    "version",
    "codespace",
    "project",
    "card",
    "column",
    "gist",
    "reaction",
];

fn words(r: &mut Lcg, n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[r.below(WORDS.len())]);
    }
    s
}

/// Facts about the generated document.
struct Doc {
    bytes: usize,
    paths: usize,
    operations: usize,
    schemas: usize,
    refs: usize,
    path_item_refs: usize,
}

/// Writes an OpenAPI 3.1 JSON document shaped like GitHub's REST description: `paths`
/// paths under a server with a base path, 1 to 4 operations each with tags, parameters,
/// request bodies and responses by `$ref`, inline examples, and a large `components`.
fn generate(path: &Path, paths: usize) -> anyhow::Result<Doc> {
    use serde_json::{json, Map, Value};
    let mut r = Lcg(0x5eed_1234);
    let mut refs = 0usize;
    let schemas_n = paths * 9 / 10;
    let mut schemas = Map::new();
    for i in 0..schemas_n {
        let mut props = Map::new();
        for p in 0..40 {
            let v = if p % 5 == 4 {
                refs += 1;
                json!({"$ref": format!("#/components/schemas/s{}", r.below(schemas_n))})
            } else {
                let ty = ["string", "integer", "boolean"][p % 3];
                json!({
                    "type": ty,
                    "description": words(&mut r, 22),
                    "example": words(&mut r, 4),
                })
            };
            props.insert(format!("{}_{p}", WORDS[r.below(WORDS.len())]), v);
        }
        schemas.insert(
            format!("s{i}"),
            json!({
                "title": words(&mut r, 3),
                "description": words(&mut r, 30),
                "type": "object",
                "properties": props,
                "required": ["id", "node_id", "url"],
            }),
        );
    }
    let mut parameters = Map::new();
    for name in ["owner", "repo", "org", "per-page", "page", "since", "id"] {
        let place = if ["per-page", "page", "since"].contains(&name) {
            "query"
        } else {
            "path"
        };
        parameters.insert(
            name.into(),
            json!({"name": name, "in": place,
                   "required": true, "description": words(&mut r, 20), "schema": {"type": "string"}}),
        );
    }
    let mut path_items = Map::new();
    let mut paths_map = Map::new();
    let mut operations = 0usize;
    let mut path_item_refs = 0usize;
    let methods = ["get", "post", "patch", "delete", "put"];
    for i in 0..paths {
        let group = ["repos", "orgs", "users", "teams", "apps", "gists"][i % 6];
        let res = WORDS[i % WORDS.len()];
        let path = match i % 4 {
            0 => format!("/{group}/{{owner}}/{{repo}}/{res}s-{i}"),
            1 => format!("/{group}/{{owner}}/{{repo}}/{res}s-{i}/{{id}}"),
            2 => format!(
                "/{group}/{{org}}/{res}s-{i}/{{id}}/{}",
                WORDS[r.below(WORDS.len())]
            ),
            _ => format!("/{group}/{res}s-{i}"),
        };
        let mut item = Map::new();
        let n_ops = 1 + usize::from(r.below(10) < 4) + usize::from(r.below(10) < 1);
        for m in methods.iter().take(n_ops) {
            operations += 1;
            let s = r.below(schemas_n);
            refs += 5;
            let mut example = Map::new();
            for k in 0..40 {
                example.insert(format!("field_{k}"), Value::String(words(&mut r, 4)));
            }
            let mut op = json!({
                "operationId": format!("{res}s/{m}-{i}"),
                "tags": [res],
                "summary": words(&mut r, 6),
                "description": words(&mut r, 50),
                "parameters": [
                    {"$ref": "#/components/parameters/owner"},
                    {"$ref": "#/components/parameters/repo"},
                    {"$ref": "#/components/parameters/per-page"},
                ],
                "responses": {
                    "200": {"description": "Response", "content": {"application/json": {
                        "schema": {"$ref": format!("#/components/schemas/s{s}")},
                        "examples": {"default": {"value": example}},
                    }}},
                    "404": {"$ref": "#/components/responses/not_found"},
                },
                "x-github": {"githubCloudOnly": false, "enabledForGitHubApps": true,
                             "category": res, "subcategory": words(&mut r, 1)},
            });
            if *m != "get" && *m != "delete" {
                refs += 1;
                op["requestBody"] = json!({"content": {"application/json": {"schema":
                    {"$ref": format!("#/components/schemas/s{}", r.below(schemas_n))}}}});
            }
            item.insert((*m).into(), op);
        }
        if i % 20 == 7 {
            // This path's item lives in components.pathItems, reached by $ref.
            let name = format!("item{i}");
            path_items.insert(name.clone(), Value::Object(item));
            paths_map.insert(
                path,
                json!({"$ref": format!("#/components/pathItems/{name}")}),
            );
            path_item_refs += 1;
            refs += 1;
        } else {
            paths_map.insert(path, Value::Object(item));
        }
    }
    let doc = json!({
        "openapi": "3.1.0",
        "info": {"title": "Generated GitHub-sized API", "version": "1.1.4",
                 "description": words(&mut r, 200)},
        "servers": [{"url": "https://api.example.com/{version}",
                     "variables": {"version": {"default": "v3"}}}],
        "tags": WORDS.iter().map(|w| json!({"name": w, "description": w})).collect::<Vec<_>>(),
        "paths": paths_map,
        "components": {
            "schemas": schemas,
            "parameters": parameters,
            "responses": {"not_found": {"description": "Resource not found"}},
            "pathItems": path_items,
        },
    });
    let text = serde_json::to_vec(&doc)?;
    std::fs::write(path, &text)?;
    Ok(Doc {
        bytes: text.len(),
        paths,
        operations,
        schemas: schemas_n,
        refs,
        path_item_refs,
    })
}

struct Measured {
    wall: Duration,
    peak_kib: Option<u64>,
    stderr: String,
}

/// Runs `bin args`, under `/usr/bin/time -v` when it exists.
fn measure(bin: &Path, args: &[&str]) -> anyhow::Result<Measured> {
    let time = Path::new("/usr/bin/time");
    if time.is_file() {
        let start = Instant::now();
        let out = Command::new(time)
            .arg("-v")
            .arg(bin)
            .args(args)
            .stdout(Stdio::null())
            .output()
            .context("running /usr/bin/time")?;
        let wall = start.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        ensure!(
            out.status.success(),
            "plimsoll-specgen failed ({}): {stderr}",
            out.status
        );
        let peak = stderr.lines().find_map(|l| {
            l.trim()
                .strip_prefix("Maximum resident set size (kbytes):")
                .and_then(|v| v.trim().parse().ok())
        });
        return Ok(Measured {
            wall,
            peak_kib: peak,
            stderr,
        });
    }
    let start = Instant::now();
    let mut child = Command::new(bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting plimsoll-specgen")?;
    let sampled = super::mem::wait_sampling(&mut child, start, Duration::from_millis(2), None)?;
    let (status, peak, wall) = (
        sampled
            .status
            .context("plimsoll-specgen was not waited for")?,
        sampled.peak_kib,
        sampled.wall,
    );
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        e.read_to_string(&mut stderr)?;
    }
    ensure!(
        status.success(),
        "plimsoll-specgen failed ({status}): {stderr}"
    );
    Ok(Measured {
        wall,
        peak_kib: peak,
        stderr,
    })
}

fn specgen_figures(bin: &Path, dir: &Path, opts: &Options) -> anyhow::Result<()> {
    let doc_path = dir.join("generated-openapi.json");
    let t = Instant::now();
    let doc = generate(&doc_path, opts.paths)?;
    eprintln!("bench: generated the document in {:.2?}", t.elapsed());
    let out = dir.join("grants.json");
    let doc_s = doc_path.to_str().context("temporary path is not UTF-8")?;
    let out_s = out.to_str().context("temporary path is not UTF-8")?;
    let args = [
        doc_s,
        "--credential-env",
        "GITHUB_TOKEN",
        "--allowed-caller",
        "bench",
        "-o",
        out_s,
    ];
    // One unmeasured run: the document into the page cache.
    measure(bin, &args)?;
    let mut runs = Vec::new();
    for _ in 0..opts.runs {
        runs.push(measure(bin, &args)?);
    }
    let grants = std::fs::read(&out)?;
    let file: serde_json::Value = serde_json::from_slice(&grants)?;
    let routes = file["profiles"]
        .as_object()
        .and_then(|p| p.values().next())
        .and_then(|p| p["routes"].as_array())
        .map_or(0, Vec::len);
    ensure!(
        routes == doc.operations,
        "specgen wrote {routes} routes for {} operations: {}",
        doc.operations,
        runs[0].stderr.lines().last().unwrap_or("")
    );
    let mut walls: Vec<Duration> = runs.iter().map(|m| m.wall).collect();
    walls.sort();
    let peak = runs.iter().filter_map(|m| m.peak_kib).max();
    let how = if Path::new("/usr/bin/time").is_file() {
        "/usr/bin/time -v"
    } else {
        "VmHWM sampled every 2 ms"
    };
    let mut s = String::new();
    writeln!(
        s,
        "\nplimsoll-specgen on a generated GitHub-sized OpenAPI document"
    )?;
    writeln!(
        s,
        "  document:   {:.1} MB JSON (OpenAPI 3.1), {} paths, {} operations, {} schemas, {} $refs ({} path items by $ref)",
        doc.bytes as f64 / 1e6,
        doc.paths,
        doc.operations,
        doc.schemas,
        doc.refs,
        doc.path_item_refs
    )?;
    writeln!(
        s,
        "  output:     a whole profile, {routes} routes (base path /v3), {} bytes",
        grants.len()
    )?;
    writeln!(
        s,
        "  wall time:  median {:.0} ms, min {:.0} ms, max {:.0} ms ({} runs after one warm-up)",
        ms(walls[walls.len() / 2]),
        ms(walls[0]),
        ms(walls[walls.len() - 1]),
        walls.len()
    )?;
    match peak {
        Some(k) => writeln!(
            s,
            "  peak RSS:   {:.1} MiB (largest of the runs, {how})",
            k as f64 / 1024.0
        )?,
        None => writeln!(s, "  peak RSS:   not measured ({how} gave nothing)")?,
    }
    print!("{s}");
    std::io::stdout().flush()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// broker

const BODY: &str = r#"{"id":42,"name":"item","tags":["a","b","c"],"note":"a small JSON answer of about 100 bytes"}"#;

/// A loopback upstream answering every request with `BODY`.
async fn upstream() -> anyhow::Result<SocketAddr> {
    Ok(Upstream::plain(|_| Reply::json(200, BODY)).await.addr)
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect(addr: SocketAddr) -> anyhow::Result<Sender> {
    let s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s)).await?;
    tokio::spawn(conn);
    Ok(send)
}

async fn call(send: &mut Sender, path: &str, secret: Option<&str>) -> anyhow::Result<Duration> {
    let mut b = hyper::Request::get(path).header("host", "127.0.0.1");
    if let Some(s) = secret {
        b = b.header(plimsoll_grants::SECRET_HEADER, s);
    }
    let req = b.body(Empty::new())?;
    let t = Instant::now();
    send.ready().await?;
    let resp = send.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    let d = t.elapsed();
    ensure!(
        status == 200 && body.len() == BODY.len(),
        "a benchmark call answered {status} with {} bytes",
        body.len()
    );
    Ok(d)
}

/// One timed call on a new connection (connect included).
async fn call_fresh(
    addr: SocketAddr,
    path: &str,
    secret: Option<&str>,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut send = connect(addr).await?;
    call(&mut send, path, secret).await?;
    Ok(t.elapsed())
}

struct Pair {
    direct: Vec<Duration>,
    broker: Vec<Duration>,
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    quantile_of(v, p)
}

fn broker_figures(opts: &Options) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let up = upstream().await?;
        let grants_json = format!(
            r#"{{"version":1,"profiles":{{"bench":{{"base_url":"http://{up}",
                "routes":["GET /v1/items/{{id}}","POST /v1/items"],"allowed_callers":["bench"],
                "credential":{{"env":"BENCH_API_KEY"}},"limits":{{"calls_per_run":100000}}}}}}}}"#
        );
        let grants = plimsoll_grants::Grants::from_bytes(
            grants_json.as_bytes(),
            Path::new("."),
            &|n| (n == "BENCH_API_KEY").then(|| "bench-credential-0123456789".to_owned()),
        )?;
        let grant = grants
            .grant("bench", "bench")
            .context("the bench profile is not granted")?;
        let relay = grant.open_loopback().await?;
        let relay_addr = match relay.endpoint() {
            plimsoll_grants::Endpoint::Tcp(a) => *a,
            other => bail!("unexpected relay endpoint {other:?}"),
        };
        let secret = relay.secret().to_owned();
        let path = "/v1/items/42";
        let warm = 200;

        // Kept-alive: one connection to each side, calls alternate.
        let mut d = connect(up).await?;
        let mut b = connect(relay_addr).await?;
        let mut keep = Pair {
            direct: Vec::new(),
            broker: Vec::new(),
        };
        for i in 0..warm + opts.calls {
            let x = call(&mut d, path, None).await?;
            let y = call(&mut b, path, Some(&secret)).await?;
            if i >= warm {
                keep.direct.push(x);
                keep.broker.push(y);
            }
        }
        // A new connection per call, as plimsoll_grant.js and plimsoll_grant.py do.
        let mut fresh = Pair {
            direct: Vec::new(),
            broker: Vec::new(),
        };
        for i in 0..warm + opts.calls {
            let x = call_fresh(up, path, None).await?;
            let y = call_fresh(relay_addr, path, Some(&secret)).await?;
            if i >= warm {
                fresh.direct.push(x);
                fresh.broker.push(y);
            }
        }
        let trace = grant.trace();
        relay.close().await;
        ensure!(
            trace.refused == 0 && trace.forwarded == 2 * (warm + opts.calls) as u64,
            "the broker's trace does not match the calls: {}",
            trace.summary()
        );

        println!(
            "\nbroker latency per call: GET {path} against a loopback upstream, {} calls per side after {warm} warm-up, direct and brokered alternating",
            opts.calls
        );
        for (name, mut p) in [
            ("kept-alive connection", keep),
            ("new connection per call (the in-sandbox clients)", fresh),
        ] {
            let (dm, bm) = (pct(&mut p.direct, 0.5), pct(&mut p.broker, 0.5));
            let (d9, b9) = (pct(&mut p.direct, 0.9), pct(&mut p.broker, 0.9));
            println!("  {name}:");
            println!(
                "    median: direct {:.0} µs, through the broker {:.0} µs -> ratio {:.2}x, added {:.0} µs",
                us(dm),
                us(bm),
                bm.as_secs_f64() / dm.as_secs_f64(),
                us(bm.saturating_sub(dm))
            );
            println!(
                "    p90:    direct {:.0} µs, through the broker {:.0} µs -> ratio {:.2}x",
                us(d9),
                us(b9),
                b9.as_secs_f64() / d9.as_secs_f64()
            );
        }
        if cfg!(debug_assertions) {
            println!("  note: this xtask is a debug build (the broker's own code unoptimised, hyper and tokio at opt-level 1); `cargo run --release -p xtask -- bench grants` measures an optimised broker");
        } else {
            println!("  build: release (optimised broker)");
        }
        println!("  (the broker's own hop to the upstream is kept alive in both cases; the trace counted {} forwarded calls, 0 refused)", trace.forwarded);
        Ok(())
    })
}
