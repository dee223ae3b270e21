//! Grants end to end: real runs of node and python3 on the process provider through an
//! in-process plimsolld, calling a real local HTTP upstream (an in-test hyper server that
//! records what arrives) through the broker's relay.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use plimsoll_core::pb::sandbox_service_client::SandboxServiceClient;
use plimsoll_core::pb::{self, run_request::Payload, run_response::Result as R};
use plimsoll_core::{check::check_answer, not_dispatched_reason, Reason};
use plimsoll_daemon::RunningDaemon;
use plimsoll_testkit::daemon::{authed, js_request, Setup};
use plimsoll_testkit::upstream::{Log, Reply, Upstream};
use prost::Message;
use tonic::transport::Channel;

/// Every log line of this test binary, at every level, from every test.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf: Arc<Mutex<Vec<u8>>> = Default::default();
        let w = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || LogWriter(w.clone()))
            .try_init();
        buf
    })
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().lock().unwrap()).into_owned()
}

/// A local HTTP upstream that records each request and answers `{"ok":true,...}` (201).
async fn upstream() -> Upstream {
    Upstream::plain(|seen| Reply::json(201, format!(r#"{{"ok":true,"got":{}}}"#, seen.body.len())))
        .await
}

const KEY: &str = "sk-live-3c8e1f0a9b7d45e2";

struct Fixture {
    daemon: RunningDaemon,
    token: String,
    log: Log,
    _dir: Setup,
}

/// A daemon whose grants file holds `profiles` (a JSON object; `UPSTREAM` is replaced by the
/// upstream's address). The credential is in the daemon's environment as `API_KEY`.
async fn daemon(profiles: &str) -> Fixture {
    logs();
    let up = upstream().await;
    // "other" exists to be the caller a profile is granted to instead of "tester".
    let dir = Setup::new(&[("tester", &[]), ("other", &[])]);
    let grants = dir.path().join("grants.json");
    std::fs::write(
        &grants,
        format!(
            r#"{{"version":1,"profiles":{}}}"#,
            profiles.replace("UPSTREAM", &up.addr.to_string())
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("key.txt"), format!("{KEY}\n")).unwrap();
    let daemon = dir
        .start(&[
            ("PLIMSOLL_GRANTS_FILE", grants.to_str().unwrap()),
            // Two callers and grants on the process tier need the operator's statement that
            // every caller is trusted (bins/plimsolld/tests/process_grants.rs).
            ("PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS", "1"),
            ("API_KEY", KEY),
        ])
        .await;
    Fixture {
        daemon,
        token: dir.token(0).to_owned(),
        log: up.log,
        _dir: dir,
    }
}

async fn client(f: &Fixture) -> SandboxServiceClient<Channel> {
    plimsoll_testkit::daemon::client(&f.daemon).await
}

fn js(code: &str, profile: &str) -> pb::RunRequest {
    js_request(code, profile, 30_000)
}

async fn run_js(f: &Fixture, code: &str, profile: &str) -> (pb::RunResponse, String) {
    let req = js(code, profile);
    let resp = client(f)
        .await
        .run(authed(req.clone(), &f.token))
        .await
        .unwrap()
        .into_inner();
    check_answer(&req, &resp).unwrap();
    let Some(R::Javascript(j)) = &resp.result else {
        panic!("no javascript result")
    };
    assert_eq!(j.exit_code, 0, "{}", String::from_utf8_lossy(&j.stderr));
    let out = String::from_utf8_lossy(&j.stdout).into_owned();
    (resp, out)
}

const ITEMS: &str =
    r#""routes":["GET /v1/items/{id}","POST /v1/items"],"allowed_callers":["tester"]"#;

/// Calls each `[method, path]` with a raw request (no client library, so the target goes out
/// exactly as written) and prints one JSON line per call.
fn raw_calls_js(calls: &str) -> String {
    format!(
        r#"
const http = require('http');
const u = new URL(process.env.PLIMSOLL_GRANT_URL);
function raw(method, path, body) {{
  return new Promise((resolve, reject) => {{
    const r = http.request({{host: u.hostname, port: u.port, method, path, agent: false,
      headers: {{'x-plimsoll-grant-secret': process.env.PLIMSOLL_GRANT_SECRET}}}}, (res) => {{
      let b = ''; res.on('data', (c) => b += c);
      res.on('end', () => resolve({{status: res.statusCode, refused: res.headers['x-plimsoll-broker'] === 'refused', body: b}}));
    }});
    r.on('error', reject);
    if (body) r.write(body);
    r.end();
  }});
}}
(async () => {{
  for (const [m, p, b] of {calls}) {{
    const r = await raw(m, p, b);
    console.log(JSON.stringify([m, p, r.status, r.refused, r.body]));
  }}
}})().catch((e) => {{ console.error(e); process.exit(3); }});
"#
    )
}

fn statuses(out: &str) -> Vec<(String, u16, bool)> {
    out.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v[1].as_str().unwrap().to_owned(),
                v[2].as_u64().unwrap() as u16,
                v[3].as_bool().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn each_credential_placement_arrives_as_configured() {
    let f = daemon(&format!(
        r#"{{"bearer":{{"base_url":"http://UPSTREAM",{ITEMS},"credential":{{"env":"API_KEY"}}}},
            "header":{{"base_url":"http://UPSTREAM",{ITEMS},"credential":{{"env":"API_KEY","placement":"header","header":"X-Api-Key"}}}},
            "basic":{{"base_url":"http://UPSTREAM",{ITEMS},"credential":{{"file":"key.txt","placement":"basic","username":"robot"}}}}}}"#
    ))
    .await;
    let code = r#"
const grant = require(process.env.PLIMSOLL_GRANT_JS);
(async () => {
  const r = await grant.get('/v1/items/7');
  console.log(JSON.stringify([r.status, r.ok, r.body]));
})();
"#;
    for profile in ["bearer", "header", "basic"] {
        let (_, out) = run_js(&f, code, profile).await;
        assert_eq!(out.trim(), r#"[201,true,{"ok":true,"got":0}]"#, "{profile}");
    }
    let seen = f.log.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert!(seen
        .iter()
        .all(|s| s.method == "GET" && s.target == "/v1/items/7"));
    assert_eq!(seen[0].headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(seen[1].headers["x-api-key"], KEY);
    assert!(!seen[1].headers.contains_key("authorization"));
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("robot:{KEY}"));
    assert_eq!(seen[2].headers["authorization"], format!("Basic {basic}"));
    assert!(seen
        .iter()
        .all(|s| !s.headers.contains_key("x-plimsoll-grant-secret")));
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn calls_outside_the_grant_are_refused_and_never_reach_the_upstream() {
    let f = daemon(&format!(
        r#"{{"items":{{"base_url":"http://UPSTREAM",{ITEMS},"credential":{{"env":"API_KEY"}}}}}}"#
    ))
    .await;
    let calls = r#"[
      ["GET", "/v1/items/1"],
      ["GET", "/v1/admin/export"],
      ["DELETE", "/v1/items/1"],
      ["PUT", "/v1/items"],
      ["GET", "/v1/items/../admin"],
      ["GET", "/v1/items/..%2Fadmin"],
      ["GET", "/v1/items/%2e%2e"],
      ["GET", "/v1/items/a%2fb"],
      ["GET", "/v1//items/1"],
      ["GET", "/v1/items/1/extra"],
      ["GET", "/v1/items/1;admin"]
    ]"#;
    let (resp, out) = run_js(&f, &raw_calls_js(calls), "items").await;
    let got = statuses(&out);
    assert_eq!(got[0], ("/v1/items/1".to_owned(), 201, false));
    for (path, status, refused) in &got[1..] {
        assert_eq!((*status, *refused), (403, true), "{path}");
    }
    assert_eq!(got.len(), 11);
    let seen = f.log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].target, "/v1/items/1");
    // The audit line names templates and counts, never the raw paths that were tried.
    let logs = log_text();
    let line = logs
        .lines()
        .find(|l| l.contains("run answered") && l.contains("grant=items"))
        .expect("an audit line for the granted run");
    assert!(line.contains("GET /v1/items/{id} 201 x1"), "{line}");
    assert!(
        line.contains("refused DELETE /v1/items/{id} 403 method_not_granted x1"),
        "{line}"
    );
    assert!(
        line.contains("refused GET unmatched 403 traversal x1"),
        "{line}"
    );
    assert!(
        line.contains("refused GET unmatched 403 forbidden_escape x3"),
        "{line}"
    );
    assert!(
        !line.contains("admin") && !line.contains("extra") && !line.contains("%2"),
        "{line}"
    );
    assert!(!resp
        .encode_to_vec()
        .windows(KEY.len())
        .any(|w| w == KEY.as_bytes()));
    f.daemon.shutdown().await;
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn the_credential_never_reaches_the_sandbox_the_record_or_the_logs() {
    let f = daemon(&format!(
        r#"{{"items":{{"base_url":"http://UPSTREAM",{ITEMS},"credential":{{"env":"API_KEY"}}}}}}"#
    ))
    .await;
    // JavaScript: use the grant, then dump the environment and every readable file of the
    // run (working directory, the client directory) and of its own /proc entry.
    let code = r#"
const fs = require('fs'), path = require('path');
const grant = require(process.env.PLIMSOLL_GRANT_JS);
function walk(d, out) {
  for (const e of fs.readdirSync(d, { withFileTypes: true })) {
    const p = path.join(d, e.name);
    try { if (e.isDirectory()) walk(p, out); else out.push([p, fs.readFileSync(p, 'latin1')]); } catch (_) {}
  }
  return out;
}
(async () => {
  const r = await grant.post('/v1/items', { note: 'hello' });
  console.log('status', r.status);
  console.log(JSON.stringify(process.env));
  for (const dir of [process.cwd(), process.env.HOME, path.dirname(process.env.PLIMSOLL_GRANT_JS)]) {
    console.log(JSON.stringify(walk(dir, [])));
  }
  for (const p of ['/proc/self/environ', '/proc/self/cmdline']) {
    try { console.log(fs.readFileSync(p, 'latin1')); } catch (e) { console.log(p, e.code); }
  }
})();
"#;
    let (resp, out) = run_js(&f, code, "items").await;
    assert!(out.starts_with("status 201"), "{out}");
    assert!(
        out.contains("PLIMSOLL_GRANT_SECRET") && out.contains("plimsoll_grant.js"),
        "{out}"
    );
    assert!(
        !out.contains(KEY),
        "the credential reached the sandbox: {out}"
    );
    assert!(!contains(&resp.encode_to_vec(), KEY));

    // Python, in a project: the client is in the working directory.
    let req = pb::RunRequest {
        protocol: 5,
        timeout_ms: 30_000,
        payload: Some(Payload::Project(pb::ProjectRun {
            files: vec![pb::ProjectFile {
                path: "main.py".into(),
                content: "import os, plimsoll_grant\n\
                          r = plimsoll_grant.get('/v1/items/5')\n\
                          print('status', r.status, r.ok, r.body)\n\
                          print(dict(os.environ))\n"
                    .into(),
            }],
            steps: vec![
                "python3 main.py".into(),
                "cat * .* 2>/dev/null; ls -la".into(),
            ],
            artifacts: vec!["plimsoll_grant.py".into()],
            grant_profile: "items".into(),
        })),
        ..Default::default()
    };
    let resp = client(&f)
        .await
        .run(authed(req.clone(), &f.token))
        .await
        .unwrap()
        .into_inner();
    check_answer(&req, &resp).unwrap();
    let Some(R::Project(p)) = &resp.result else {
        panic!("no project result")
    };
    let first = String::from_utf8_lossy(&p.steps[0].stdout).into_owned();
    assert!(
        first.starts_with("status 201 True {'ok': True, 'got': 0}"),
        "{first} {}",
        String::from_utf8_lossy(&p.steps[0].stderr)
    );
    for s in &p.steps {
        assert!(!contains(&s.stdout, KEY) && !contains(&s.stderr, KEY));
    }
    assert!(!contains(&resp.encode_to_vec(), KEY));

    // The upstream did get it, so the checks above could have failed.
    let seen = f.log.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen
        .iter()
        .all(|s| s.headers["authorization"] == format!("Bearer {KEY}")));
    assert!(!log_text().contains(KEY), "the credential is in a log line");
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn grant_limits_are_enforced_in_a_run() {
    let f = daemon(
        r#"{"small":{"base_url":"http://UPSTREAM","routes":["POST /v1/items"],"allowed_callers":["tester"],
            "limits":{"calls_per_run":4,"request_bytes":16}}}"#,
    )
    .await;
    let calls = r#"[
      ["POST", "/v1/items", "{}"],
      ["POST", "/v1/items", "0123456789abcdefXYZ"],
      ["POST", "/v1/items", "{}"],
      ["POST", "/v1/items", "{}"],
      ["POST", "/v1/items", "{}"],
      ["POST", "/v1/items", "{}"]
    ]"#;
    let (_, out) = run_js(&f, &raw_calls_js(calls), "small").await;
    let got: Vec<u16> = statuses(&out).into_iter().map(|s| s.1).collect();
    assert_eq!(got, vec![201, 413, 201, 201, 429, 429]);
    assert!(out.contains("calls_per_run"));
    assert_eq!(f.log.lock().unwrap().len(), 3);
    // A new run gets a new budget.
    let (_, out) = run_js(
        &f,
        &raw_calls_js(r#"[["POST", "/v1/items", "{}"]]"#),
        "small",
    )
    .await;
    assert_eq!(statuses(&out)[0].1, 201);
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn unknown_and_forbidden_profiles_get_the_same_refusal_and_run_nothing() {
    let f = daemon(
        r#"{"theirs":{"base_url":"http://UPSTREAM","routes":["GET /v1/items/{id}"],"allowed_callers":["other"]}}"#,
    )
    .await;
    let marker = plimsoll_testkit::shared_folder(f._dir.path(), "open").join("marker");
    let code = format!(
        "require('fs').writeFileSync({:?}, 'ran')",
        marker.to_str().unwrap()
    );
    let mut c = client(&f).await;
    let forbidden = c
        .run(authed(js(&code, "theirs"), &f.token))
        .await
        .unwrap_err();
    let unknown = c
        .run(authed(js(&code, "nosuch"), &f.token))
        .await
        .unwrap_err();
    for e in [&forbidden, &unknown] {
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert_eq!(not_dispatched_reason(e), Some(Reason::Permission));
    }
    assert_eq!(
        forbidden.message().replace("theirs", "P"),
        unknown.message().replace("nosuch", "P")
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!marker.exists());
    // Without a grant the same code runs, so the marker could have appeared.
    run_js(&f, &code, "").await;
    assert!(marker.exists());
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn describe_states_grant_support() {
    let f = daemon(&format!(
        r#"{{"items":{{"base_url":"http://UPSTREAM",{ITEMS}}}}}"#
    ))
    .await;
    let d = client(&f)
        .await
        .describe(authed(pb::DescribeRequest {}, &f.token))
        .await
        .unwrap()
        .into_inner();
    assert!(d.supports_javascript_grants && d.supports_project_grants);
    f.daemon.shutdown().await;
    let f = daemon("{}").await;
    let d = client(&f)
        .await
        .describe(authed(pb::DescribeRequest {}, &f.token))
        .await
        .unwrap()
        .into_inner();
    assert!(!d.supports_javascript_grants && !d.supports_project_grants);
    f.daemon.shutdown().await;
}

/// A provider with a tier but no grant support.
struct NoGrants;

#[async_trait::async_trait]
impl plimsoll_daemon::provider::Provider for NoGrants {
    fn facts(&self) -> plimsoll_daemon::provider::Facts {
        plimsoll_daemon::provider::Facts {
            name: "nogrants".into(),
            tier: Some(plimsoll_core::Tier::Container),
            max_timeout_ms: 1000,
            ..Default::default()
        }
    }
    async fn start(&self) -> Result<(), plimsoll_daemon::provider::ProviderStartError> {
        Ok(())
    }
    async fn ready(&self) -> bool {
        true
    }
    async fn run(
        &self,
        _: plimsoll_daemon::provider::Work,
        _: Duration,
    ) -> Result<plimsoll_daemon::provider::Answer, plimsoll_daemon::provider::ProviderError> {
        panic!("a granted run must not reach a provider without grants")
    }
}

#[tokio::test]
async fn a_provider_without_grants_refuses_them_as_unsupported() {
    use plimsoll_core::pb::sandbox_service_server::SandboxService;
    let env = std::collections::BTreeMap::from([("K".to_owned(), KEY.to_owned())]);
    let grants = plimsoll_grants::Grants::from_bytes(
        br#"{"version":1,"profiles":{"p":{"base_url":"http://127.0.0.1:9","routes":[],"allowed_callers":["tester"],"credential":{"env":"K"}}}}"#,
        std::path::Path::new("."),
        &|n| env.get(n).cloned(),
    )
    .unwrap();
    let svc = plimsoll_daemon::service::Service::new(
        Arc::new(NoGrants),
        1,
        Duration::from_secs(1),
        Default::default(),
        Default::default(),
        Default::default(),
    )
    .with_grants(grants);
    let mut req = tonic::Request::new(js("1", "p"));
    req.extensions_mut()
        .insert(plimsoll_daemon::auth::Principal {
            id: "tester".into(),
        });
    let e = svc.run(req).await.unwrap_err();
    assert_eq!(
        not_dispatched_reason(&e),
        Some(Reason::Unsupported),
        "{e:?}"
    );
    // An unknown profile is still `permission` first: nothing about support leaks.
    let mut req = tonic::Request::new(js("1", "zzz"));
    req.extensions_mut()
        .insert(plimsoll_daemon::auth::Principal {
            id: "tester".into(),
        });
    let e = svc.run(req).await.unwrap_err();
    assert_eq!(not_dispatched_reason(&e), Some(Reason::Permission));
    let d = svc
        .describe(tonic::Request::new(pb::DescribeRequest {}).tap(|r| {
            r.extensions_mut().insert(plimsoll_daemon::auth::Principal {
                id: "tester".into(),
            });
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(!d.supports_javascript_grants);
}

trait Tap: Sized {
    fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }
}
impl<T> Tap for T {}
