//! examples/agent-memory: agent-style JavaScript stores a memory and recalls it through a
//! plimsoll grant, while two calls outside the grant are refused; the API key never reaches
//! the sandbox.
//!
//! Everything is local and real: a fake memory API (hyper) on a loopback port that demands
//! `Authorization: Bearer <key>`, `plimsoll-specgen` building the grant from the API's
//! OpenAPI document (`openapi.yaml` beside this crate), an embedded plimsolld (process
//! provider) holding the key, a gRPC client running `agent.js`, and the broker's trace
//! read from plimsolld's audit log. It needs no account and no network beyond loopback.
//!
//! Usage: `cargo run -p plimsoll-example-agent-memory [-- --json] [-- --specgen PATH]`.
//! Exit 0 when every check held, 1 otherwise (naming the failed checks).

mod api;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use plimsoll_client::{pb, Client, ClientOptions};
use prost::Message as _;

/// The agent's code, run inside the sandbox.
const AGENT_JS: &str = include_str!("../agent.js");
/// The memory API's OpenAPI document.
const OPENAPI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml");
/// The grant profile's name.
const PROFILE: &str = "agent-memory";
/// The caller id the example's token belongs to.
const CALLER: &str = "agent";
/// The trace the run must leave: route templates only.
const EXPECTED_TRACE: &str = "POST /v1/memories 201 x1; GET /v1/memories/{memoryId} 200 x1; \
     refused DELETE /v1/memories/{memoryId} 403 method_not_granted x1; \
     refused GET unmatched 403 not_granted x1";

const USAGE: &str = "\
usage: plimsoll-example-agent-memory [--json] [--specgen PATH]

  --json          also print the report as one JSON line at the end
  --specgen PATH  the plimsoll-specgen binary to run (default: the one beside this program,
                  else the same library, plimsoll-openapi, in process)";

struct Args {
    json: bool,
    specgen: Option<PathBuf>,
}

fn parse_args() -> anyhow::Result<Option<Args>> {
    let mut args = Args {
        json: false,
        specgen: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => args.json = true,
            "--specgen" => {
                args.specgen = Some(it.next().context("--specgen needs a path")?.into());
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    Ok(Some(args))
}

/// plimsolld's log lines (JSON), kept in memory so the example can read the audit line and
/// check that the key is in none of them.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }
}

fn random_hex(n: usize) -> String {
    use rand::RngCore;
    let mut b = vec![0u8; n];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

/// How the grant was built.
enum SpecgenUsed {
    Binary(PathBuf),
    Library,
}

/// Builds the grants file with plimsoll-specgen: the binary when one is found, otherwise
/// the same reader in process with the same options.
fn build_grant(
    specgen: Option<&Path>,
    port: u16,
    key_file: &Path,
    out: &Path,
) -> anyhow::Result<SpecgenUsed> {
    let port_var = format!("port={port}");
    let args: Vec<&str> = vec![
        OPENAPI,
        "--name",
        PROFILE,
        "--operation-id",
        "storeMemory",
        "--operation-id",
        "recallMemory",
        "--server-var",
        &port_var,
        "--credential-file",
        key_file.to_str().context("temporary path is not UTF-8")?,
        "--allowed-caller",
        CALLER,
        "-o",
        out.to_str().context("temporary path is not UTF-8")?,
    ];
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("plimsoll-specgen")))
        .filter(|p| p.is_file());
    if let Some(bin) = specgen.map(Path::to_owned).or(beside) {
        let o = std::process::Command::new(&bin)
            .args(&args)
            .output()
            .with_context(|| format!("running {}", bin.display()))?;
        if !o.status.success() {
            bail!(
                "{} failed ({}): {}",
                bin.display(),
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        return Ok(SpecgenUsed::Binary(bin));
    }
    // In process: what plimsoll-specgen does with these flags.
    let doc = std::fs::read(OPENAPI).with_context(|| format!("reading {OPENAPI}"))?;
    let opts = plimsoll_openapi::Options {
        server_vars: [("port".to_owned(), port.to_string())].into(),
        operation_ids: vec!["storeMemory".into(), "recallMemory".into()],
        ..Default::default()
    };
    let x = plimsoll_openapi::read(&doc, &opts).context("reading openapi.yaml")?;
    let file = serde_json::json!({
        "version": plimsoll_grants::FORMAT_VERSION,
        "profiles": { PROFILE: {
            "base_url": x.origin,
            "routes": x.route_strings(),
            "description": format!("generated by plimsoll-specgen from {} v{}", x.title, x.version),
            "credential": { "file": key_file },
            "allowed_callers": [CALLER],
        }},
    });
    std::fs::write(out, serde_json::to_string_pretty(&file)? + "\n")?;
    Ok(SpecgenUsed::Library)
}

/// One line the agent printed about a call.
#[derive(Debug, Clone)]
struct Step {
    step: String,
    method: String,
    path: String,
    status: u64,
    refused: bool,
    body: serde_json::Value,
}

fn parse_steps(stdout: &str) -> (Vec<Step>, Option<serde_json::Value>) {
    let mut steps = Vec::new();
    let mut inventory = None;
    for line in stdout.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["step"] == "inventory" {
            inventory = Some(v);
            continue;
        }
        steps.push(Step {
            step: v["step"].as_str().unwrap_or("").to_owned(),
            method: v["method"].as_str().unwrap_or("").to_owned(),
            path: v["path"].as_str().unwrap_or("").to_owned(),
            status: v["status"].as_u64().unwrap_or(0),
            refused: v["refused"].as_bool().unwrap_or(false),
            body: v["body"].clone(),
        });
    }
    (steps, inventory)
}

/// The `grant_trace` field of plimsolld's audit line for the granted run.
fn trace_from_logs(logs: &str) -> Option<String> {
    logs.lines().find_map(|l| {
        let v: serde_json::Value = serde_json::from_str(l).ok()?;
        let f = &v["fields"];
        (f["message"] == "run answered" && f["grant"] == PROFILE)
            .then(|| f["grant_trace"].as_str().map(str::to_owned))
            .flatten()
    })
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn short(v: &serde_json::Value) -> String {
    let s = v.to_string();
    if s.len() > 90 {
        format!("{}…", &s[..90])
    } else {
        s
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Some(args) = parse_args()? else {
        return Ok(());
    };
    let logs = Logs::default();
    let sink = logs.clone();
    tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .with_writer(move || sink.clone())
        .init();

    // The API key: random per run, in a file only plimsolld reads.
    let key = format!("mem-sk-{}", random_hex(16));
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let key_file = dir.path().join("memory.key");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key_file)
            .context("writing the key file")?;
        writeln!(f, "{key}")?;
    }

    // 1. The memory API, on loopback, demanding the key.
    let api = api::FakeApi::start(key.clone())
        .await
        .context("starting the fake memory API")?;
    println!(
        "memory API:  http://{} (fake, loopback; every call needs Authorization: Bearer <key>)",
        api.addr()
    );

    // 2. The grant, from the API's OpenAPI document.
    let grants_file = dir.path().join("grants.json");
    let used = build_grant(
        args.specgen.as_deref(),
        api.addr().port(),
        &key_file,
        &grants_file,
    )?;
    let grants_text = std::fs::read_to_string(&grants_file)?;
    let parsed = plimsoll_grants::GrantsFile::parse(grants_text.as_bytes())
        .context("the generated grants file does not load")?;
    let profile = parsed
        .profiles
        .get(PROFILE)
        .context("the generated grants file has no agent-memory profile")?;
    let routes: Vec<String> = profile
        .routes
        .routes()
        .iter()
        .map(ToString::to_string)
        .collect();
    match &used {
        SpecgenUsed::Binary(b) => println!(
            "grant:       {} openapi.yaml --operation-id storeMemory --operation-id recallMemory --server-var port={} ...",
            b.display(),
            api.addr().port()
        ),
        SpecgenUsed::Library => println!(
            "grant:       plimsoll-specgen's reader (plimsoll-openapi, in process; build plimsoll-specgen to run the binary) on openapi.yaml, operations storeMemory and recallMemory"
        ),
    }
    println!(
        "             profile {PROFILE:?}: base_url {}, routes {}",
        profile.origin,
        routes.join(", ")
    );

    // 3. plimsolld, embedded, process provider, holding the key.
    let callers = dir.path().join("callers.json");
    let mut cf = plimsoll_callers::CallersFile::default();
    let token = cf.add(CALLER, &[]).context("adding the caller")?;
    cf.save(&callers).context("writing the callers file")?;
    let state = dir.path().join("state");
    let cfg = plimsoll_daemon::Config::from_env(&plimsoll_daemon::env::MapEnv::from_pairs([
        ("PLIMSOLL_ADDR", "127.0.0.1:0"),
        ("PLIMSOLL_METRICS_ADDR", "off"),
        ("PLIMSOLL_CLIENTS_FILE", callers.to_str().context("path")?),
        ("PLIMSOLL_STATE_DIR", state.to_str().context("path")?),
        (
            "PLIMSOLL_GRANTS_FILE",
            grants_file.to_str().context("path")?,
        ),
        ("SANDBOX_PROVIDER", "process"),
    ]))
    .map_err(|e| anyhow::anyhow!("plimsolld configuration: {e}"))?;
    let daemon = plimsoll_daemon::start(cfg)
        .await
        .map_err(|e| anyhow::anyhow!("starting plimsolld: {e}"))?;
    // plimsolld read the key at startup; the process tier has no wall, so the file goes
    // before any agent code runs.
    std::fs::remove_file(&key_file)?;
    println!(
        "plimsolld:   embedded on {} (provider process); it read the key file at startup, which is now deleted",
        daemon.rpc_addr()
    );

    // 4. The agent's code, through a real gRPC client that checks the run record.
    let mut client = Client::connect(
        &format!("http://{}", daemon.rpc_addr()),
        ClientOptions {
            token: Some(token),
            ca_file: None,
        },
    )
    .await?;
    let req = pb::RunRequest {
        protocol: 5,
        timeout_ms: 30_000,
        payload: Some(pb::run_request::Payload::Javascript(pb::JavaScriptRun {
            code: AGENT_JS.into(),
            grant_profile: PROFILE.into(),
        })),
        ..Default::default()
    };
    let resp = client.run(req).await.context("running agent.js")?;
    daemon.shutdown().await;
    let Some(pb::run_response::Result::Javascript(js)) = &resp.result else {
        bail!("the daemon answered without a javascript result");
    };
    let stdout = String::from_utf8_lossy(&js.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&js.stderr).into_owned();
    let (steps, inventory) = parse_steps(&stdout);
    let record = resp.record.clone().unwrap_or_default();

    println!(
        "\n--- agent.js in the sandbox (exit code {}) ---",
        js.exit_code
    );
    for s in &steps {
        println!(
            "{:<7} {:<6} {:<32} -> {} {}{}",
            s.step,
            s.method,
            s.path,
            s.status,
            if s.refused {
                "refused by the broker "
            } else {
                ""
            },
            short(&s.body)
        );
    }
    if !stderr.trim().is_empty() {
        println!("stderr: {}", stderr.trim());
    }
    let env_names: Vec<String> = inventory
        .as_ref()
        .and_then(|v| v["env_names"].as_array())
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    println!("sandbox environment: {}", env_names.join(" "));

    let trace = trace_from_logs(&logs.text()).unwrap_or_default();
    println!("\n--- the broker's trace (route templates only) ---\n{trace}");

    let seen = api.seen();
    println!("\n--- what reached the memory API ---");
    for s in &seen {
        println!(
            "{:<6} {:<32} key attached by the broker: {}",
            s.method, s.target, s.had_key
        );
    }

    // 5. The checks.
    let mut failed: Vec<String> = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failed.push(what);
        }
    };
    let step = |name: &str| steps.iter().find(|s| s.step == name);
    let stored = step("store");
    let id = stored
        .and_then(|s| s.body["id"].as_str())
        .unwrap_or("")
        .to_owned();
    check(
        js.exit_code == 0,
        format!("agent.js exited {}", js.exit_code),
    );
    check(
        stored.is_some_and(|s| s.status == 201 && !id.is_empty()),
        "store: POST /v1/memories did not answer 201 with an id".into(),
    );
    check(
        step("recall").is_some_and(|s| {
            s.status == 200 && s.body["text"] == "The user wants answers in metric units."
        }),
        "recall: GET /v1/memories/{id} did not give the stored text back".into(),
    );
    for (name, reason) in [("forget", "method_not_granted"), ("export", "not_granted")] {
        check(
            step(name).is_some_and(|s| s.status == 403 && s.refused && s.body["error"] == reason),
            format!("{name}: not refused by the broker with {reason}"),
        );
    }
    check(
        trace == EXPECTED_TRACE,
        format!("the trace is {trace:?}, expected {EXPECTED_TRACE:?}"),
    );
    check(
        !id.is_empty() && !trace.contains(&id) && !trace.contains("metric"),
        "the trace holds a raw path or a body".into(),
    );
    check(
        seen.len() == 2 && seen.iter().all(|s| s.had_key),
        format!(
            "the memory API got {} calls (expected the 2 granted ones, each with the key)",
            seen.len()
        ),
    );
    check(
        env_names.iter().any(|n| n == "PLIMSOLL_GRANT_SECRET"),
        "the sandbox had no PLIMSOLL_GRANT_SECRET (did the grant reach the run?)".into(),
    );
    let places: [(&str, bool); 6] = [
        ("the sandbox's output", contains(&js.stdout, &key)),
        ("the sandbox's errors", contains(&js.stderr, &key)),
        (
            "the sandbox's environment and files",
            inventory
                .as_ref()
                .is_some_and(|v| v["dump"].as_str().is_some_and(|d| d.contains(&key))),
        ),
        (
            "the answer and its run record",
            contains(&resp.encode_to_vec(), &key),
        ),
        ("plimsolld's logs", logs.text().contains(&key)),
        ("the grants file", grants_text.contains(&key)),
    ];
    check(
        inventory.is_some(),
        "the sandbox printed no inventory".into(),
    );
    let found: Vec<&str> = places.iter().filter(|p| p.1).map(|p| p.0).collect();
    check(found.is_empty(), format!("the key was found in: {found:?}"));

    println!("\n--- where the key is ---");
    println!(
        "memory API: received it on {} of {} calls (attached by the broker)",
        seen.iter().filter(|s| s.had_key).count(),
        seen.len()
    );
    for (place, hit) in &places {
        println!("{place}: {}", if *hit { "FOUND" } else { "absent" });
    }
    println!(
        "\nrecord: {} (provider {}, isolation {})",
        record.record_sha256, record.provider, record.isolation
    );

    if args.json {
        let report = serde_json::json!({
            "specgen": match &used { SpecgenUsed::Binary(_) => "binary", SpecgenUsed::Library => "library" },
            "routes": routes,
            "steps": steps.iter().map(|s| serde_json::json!({
                "step": s.step, "method": s.method, "path": s.path, "status": s.status,
                "refused": s.refused, "body": s.body,
            })).collect::<Vec<_>>(),
            "trace": trace,
            "upstream": seen.iter().map(|s| serde_json::json!({
                "method": s.method, "target": s.target, "had_key": s.had_key,
            })).collect::<Vec<_>>(),
            "sandbox_env_names": env_names,
            "key_found_in": found,
            "record_sha256": record.record_sha256,
            "failed": failed,
        });
        println!("{report}");
    }
    if !failed.is_empty() {
        bail!(
            "{} check(s) failed:\n- {}",
            failed.len(),
            failed.join("\n- ")
        );
    }
    println!("every check held: the agent stored and recalled through the grant, two calls outside it were refused, and the key stayed outside the sandbox");
    Ok(())
}
