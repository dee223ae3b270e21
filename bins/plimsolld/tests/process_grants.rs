//! Grants on the process provider with more than one caller (issue 10, finding 2), through the
//! real `plimsolld` binary, real callers and real node runs.
//!
//! The process tier has no wall: every run is a child of plimsolld under its user, so one run
//! can read another run's `PLIMSOLL_GRANT_URL` and `PLIMSOLL_GRANT_SECRET` from
//! `/proc/<pid>/environ` and use its grant. plimsolld therefore refuses to start with grant
//! profiles, the process provider and more than one caller, unless the operator states
//! `PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS=1`; the second test shows what that statement
//! accepts (docs/grants.md, "The process tier and several callers"). As root each run has a
//! host user of its own, so that test asserts the other run finds nothing.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};

use plimsoll_client::{Client, ClientError, ClientOptions};
use plimsoll_core::pb::{self, run_request::Payload, run_response::Result as R};
use plimsoll_core::Reason;

use plimsoll_testkit::plimsolld::Plimsolld;

const BIN: &str = env!("CARGO_BIN_EXE_plimsolld");

const KEY: &str = "sk-live-9d41c07e2b8a5f36";
const TRUST: &str = "PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS";

/// What the upstream saw: the request line and the `authorization` header.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// A loopback HTTP upstream that records each request and answers `201 {"item":42}`.
fn upstream() -> (String, Seen) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let seen: Seen = Default::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && s.read(&mut b).is_ok_and(|n| n == 1) {
                head.push(b[0]);
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let line = head.lines().next().unwrap_or("").to_owned();
            let auth = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("authorization")
                        .then(|| v.trim().to_owned())
                })
                .unwrap_or_default();
            log.lock().unwrap().push((line, auth));
            let body = r#"{"item":42}"#;
            let _ = write!(
                s,
                "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (addr, seen)
}

/// A callers file holding `ids` (their tokens returned in order) and a grants file whose one
/// profile, `profile`, is granted to `alice` only.
fn files(dir: &Path, ids: &[&str], upstream: &str, profile: &str) -> Vec<String> {
    let mut file = plimsoll_callers::CallersFile::default();
    let tokens = ids.iter().map(|id| file.add(id, &[]).unwrap()).collect();
    file.save(&dir.join("callers.json")).unwrap();
    std::fs::write(
        dir.join("grants.json"),
        format!(
            r#"{{"version":1,"profiles":{{"{profile}":{{"base_url":"http://{upstream}",
                "routes":["GET /v1/items/{{id}}"],"credential":{{"env":"API_KEY"}},"allowed_callers":["alice"]}}}}}}"#
        ),
    )
    .unwrap();
    tokens
}

/// plimsolld on the process provider, with the grant's credential in its environment.
fn spawn(dir: &Path, vars: &[(&str, &str)]) -> Plimsolld {
    let mut all = vec![("API_KEY", KEY)];
    all.extend_from_slice(vars);
    Plimsolld::spawn(BIN, dir, &all)
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).to_str().unwrap().to_owned()
}

#[test]
fn grants_on_the_process_provider_with_two_callers_are_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (up, seen) = upstream();
    files(d, &["alice", "bob"], &up, "items");
    let (callers, grants) = (path(d, "callers.json"), path(d, "grants.json"));
    let base = [
        ("PLIMSOLL_CLIENTS_FILE", callers.as_str()),
        ("PLIMSOLL_GRANTS_FILE", grants.as_str()),
    ];

    // Two callers, a grant, the process provider, no statement: exit 2 before anything
    // listens, one line naming the grants file, the callers file and the statement.
    let mut p = spawn(d, &base);
    let serving = p.serving();
    assert!(serving.is_none(), "plimsolld served:\n{}", p.log());
    let status = p.wait();
    assert_eq!(status.code(), Some(2), "{}", p.log());
    let log = p.log();
    for needed in [
        "PLIMSOLL_GRANTS_FILE:",
        "SANDBOX_PROVIDER=process",
        "2 callers in PLIMSOLL_CLIENTS_FILE",
        callers.as_str(),
        "PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS=1",
    ] {
        assert!(log.contains(needed), "{needed:?} is not in: {log}");
    }

    // The statement does not get past hardened mode, which refuses the process tier.
    let mut p = spawn(
        d,
        &[base[0], base[1], (TRUST, "1"), ("PLIMSOLL_HARDENED", "1")],
    );
    assert!(p.serving().is_none(), "plimsolld served:\n{}", p.log());
    assert_eq!(p.wait().code(), Some(2), "{}", p.log());
    assert!(
        p.log()
            .contains("isolation is process; hardened mode needs kernel or vm"),
        "{}",
        p.log()
    );

    // With one caller there is no other caller's run to fear: it serves.
    let one = tempfile::tempdir().unwrap();
    files(one.path(), &["alice"], &up, "items");
    let (callers, grants) = (
        path(one.path(), "callers.json"),
        path(one.path(), "grants.json"),
    );
    let mut p = spawn(
        one.path(),
        &[
            ("PLIMSOLL_CLIENTS_FILE", callers.as_str()),
            ("PLIMSOLL_GRANTS_FILE", grants.as_str()),
        ],
    );
    let url = p.serving().unwrap_or_else(|| panic!("{}", p.log()));
    // A second caller added to the file and a SIGHUP: the reload is refused for the same
    // reason (docs/plimsolld.md, "Reloading callers"), the table in use stays, and the new
    // caller is not served.
    let mut file = plimsoll_callers::CallersFile::load(Path::new(&callers)).unwrap();
    let bob = file.add("bob", &[]).unwrap();
    file.save(Path::new(&callers)).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(p.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let line = p
        .next_message_within(
            "callers file not reloaded; the table in use stays",
            std::time::Duration::from_secs(30),
        )
        .unwrap_or_else(|| panic!("no refusal of the reload:\n{}", p.log()));
    let why = line["error"].as_str().unwrap_or_default();
    assert!(
        why.contains("names 2 callers") && why.contains(TRUST),
        "{line}"
    );
    let refused = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut c = Client::connect(
                &url,
                ClientOptions {
                    token: Some(bob),
                    ca_file: None,
                },
            )
            .await
            .unwrap();
            c.describe().await.is_err()
        });
    assert!(refused, "the caller the refused reload named was served");
    assert_eq!(p.stop().code(), Some(0), "{}", p.log());
    assert!(seen.lock().unwrap().is_empty());
}

fn js(code: String, profile: &str) -> pb::RunRequest {
    pb::RunRequest {
        protocol: 5,
        timeout_ms: 120_000,
        payload: Some(Payload::Javascript(pb::JavaScriptRun {
            code,
            grant_profile: profile.into(),
        })),
        ..Default::default()
    }
}

fn stdout(r: &pb::RunResponse) -> String {
    let Some(R::Javascript(j)) = &r.result else {
        panic!("no javascript result: {r:?}")
    };
    assert_eq!(j.exit_code, 0, "{}", String::from_utf8_lossy(&j.stderr));
    String::from_utf8_lossy(&j.stdout).into_owned()
}

/// What `PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS=1` accepts: while alice's granted run is
/// alive, bob, who may not use the grant himself, runs code that finds alice's relay secret
/// in `/proc/<pid>/environ` and calls the granted route with alice's credential attached.
#[test]
fn with_the_trust_statement_a_second_callers_run_can_use_the_first_callers_grant() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (up, seen) = upstream();
    // A profile name of this test alone, so bob's code finds this alice's run and no other.
    let profile = format!("alice-items-{}", std::process::id());
    let tokens = files(d, &["alice", "bob"], &up, &profile);
    let (callers, grants) = (path(d, "callers.json"), path(d, "grants.json"));
    let mut p = spawn(
        d,
        &[
            ("PLIMSOLL_CLIENTS_FILE", callers.as_str()),
            ("PLIMSOLL_GRANTS_FILE", grants.as_str()),
            (TRUST, "1"),
        ],
    );
    let addr = p.serving().unwrap_or_else(|| panic!("{}", p.log()));
    assert!(
        p.seen.iter().any(|v| v["message"]
            .as_str()
            .is_some_and(|m| m.contains(TRUST) && m.contains("any caller's run can use"))),
        "no startup warning about the statement:\n{}",
        p.log()
    );

    // A folder alice's run may write (as root, each run has a user of its own).
    let open = plimsoll_testkit::shared_folder(d, "open");
    let (ready, release) = (open.join("alice-ready"), open.join("release"));
    let alice_code = format!(
        "const fs = require('fs');\n\
         fs.writeFileSync({ready:?}, 'ready');\n\
         const t = setInterval(() => {{ if (fs.existsSync({release:?})) {{ clearInterval(t); console.log('alice done'); }} }}, 10);\n",
    );
    let bob_code = format!(
        r#"
const fs = require('fs'), http = require('http');
let found = null;
for (const pid of fs.readdirSync('/proc')) {{
  if (!/^\d+$/.test(pid)) continue;
  let env;
  try {{ env = fs.readFileSync('/proc/' + pid + '/environ', 'latin1'); }} catch (_) {{ continue; }}
  const vars = {{}};
  for (const kv of env.split('\0')) {{ const i = kv.indexOf('='); if (i > 0) vars[kv.slice(0, i)] = kv.slice(i + 1); }}
  if (vars.PLIMSOLL_GRANT_PROFILE === {profile:?} && vars.PLIMSOLL_GRANT_SECRET) {{ found = vars; break; }}
}}
if (!found) {{ console.log(JSON.stringify({{ found: false }})); process.exit(0); }}
const u = new URL(found.PLIMSOLL_GRANT_URL);
http.get({{ host: u.hostname, port: u.port, path: '/v1/items/42',
  headers: {{ 'x-plimsoll-grant-secret': found.PLIMSOLL_GRANT_SECRET }} }}, (res) => {{
  let b = ''; res.on('data', (c) => b += c);
  res.on('end', () => console.log(JSON.stringify({{ found: true, status: res.statusCode, body: b }})));
}});
"#
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (alice_out, bob_own, bob_out) = rt.block_on(async {
        let connect = |token: &str| {
            let opts = ClientOptions {
                token: Some(token.to_owned()),
                ca_file: None,
            };
            let addr = addr.clone();
            async move { Client::connect(&addr, opts).await.unwrap() }
        };
        let (mut alice, mut bob) = (connect(&tokens[0]).await, connect(&tokens[1]).await);
        let alice_run = tokio::spawn(async move { alice.run(js(alice_code, &profile)).await });
        // Alice's run is alive once it wrote its file (or it ended: then say how).
        while !ready.exists() {
            if alice_run.is_finished() {
                panic!("alice's run ended early: {:?}", alice_run.await);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // Bob may not use alice's grant by asking for it...
        let own = bob
            .run(js(
                "1".into(),
                &format!("alice-items-{}", std::process::id()),
            ))
            .await;
        // ...but his run can take it from hers.
        let out = bob.run(js(bob_code, "")).await.unwrap();
        std::fs::write(&release, "go").unwrap();
        (alice_run.await.unwrap().unwrap(), own, out)
    });
    assert!(
        matches!(
            bob_own,
            Err(ClientError::Refused {
                reason: Reason::Permission,
                ..
            })
        ),
        "{bob_own:?}"
    );
    assert_eq!(stdout(&alice_out).trim(), "alice done");
    let bob_said = stdout(&bob_out);
    if nix::unistd::geteuid().is_root() {
        // As root each run has a user of its own: bob's run cannot read the environment
        // of alice's, so the statement's risk does not come true here.
        assert_eq!(bob_said.trim(), r#"{"found":false}"#, "{}", p.log());
        assert!(seen.lock().unwrap().is_empty());
        assert_eq!(p.stop().code(), Some(0), "{}", p.log());
        return;
    }
    assert_eq!(
        bob_said.trim(),
        r#"{"found":true,"status":201,"body":"{\"item\":42}"}"#,
        "{}",
        p.log()
    );
    // The upstream got bob's call with alice's credential attached by the broker.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(
            "GET /v1/items/42 HTTP/1.1".to_owned(),
            format!("Bearer {KEY}")
        )]
    );
    assert_eq!(p.stop().code(), Some(0), "{}", p.log());
}
