//! Grants on the bwrap provider: a JavaScript run inside a sandbox (loopback only) calls a
//! real loopback HTTP upstream on the host through its relay, a Unix socket bound into its
//! sandbox, and never sees the key; a concurrent run of another caller finds no relay
//! socket at all.

mod support;

use std::time::Duration;

use plimsoll_core::pb;
use plimsoll_provider::{Answer, Provider, Work};
use plimsoll_testkit::upstream::{Reply, Upstream};
use support::*;

const KEY: &str = "sk-live-5e1f0a9c27b84d63";

const CODE: &str = r#"
const grant = require(process.env.PLIMSOLL_GRANT_JS);
(async () => {
  const ok = await grant.get('/v1/items/42');
  const no = await grant.get('/v1/secrets');
  console.log('RESULT ' + JSON.stringify({ ok, no }));
  console.log('ENV ' + JSON.stringify(process.env));
  await new Promise((r) => setTimeout(r, 4000));
})().catch((e) => { console.error('FAILED ' + e.stack); process.exit(3); });
"#;

#[tokio::test]
async fn a_sandbox_calls_a_granted_route_through_its_socket_and_no_other_run_can() {
    let Some(_) = bwrap() else { return };
    let Upstream { addr, log } =
        Upstream::plain(|_| Reply::json(200, &br#"{"ok":true,"item":"answer-from-upstream"}"#[..]))
            .await;
    let (d, state) = state_dir();
    let grants = plimsoll_grants::Grants::from_bytes(
        format!(
            r#"{{"version":1,"profiles":{{"items":{{"base_url":"http://{addr}","routes":["GET /v1/items/{{id}}"],"allowed_callers":["tester"],"credential":{{"env":"API_KEY"}}}}}}}}"#
        )
        .as_bytes(),
        d.path(),
        &|n| (n == "API_KEY").then(|| KEY.to_owned()),
    )
    .unwrap();
    let grant = grants.grant("items", "tester").expect("the grant");
    let trace_of = grant.clone();
    let p = std::sync::Arc::new(started(config(&state)).await);
    assert!(p.facts().supports_grants);

    let granted = {
        let p = p.clone();
        tokio::spawn(async move {
            let work = Work::Javascript(pb::JavaScriptRun {
                code: CODE.into(),
                grant_profile: "items".into(),
            });
            p.run_granted(work, Duration::from_secs(30), grant).await
        })
    };
    // While the granted run holds its relay open, another run looks for any socket.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let other = as_project(
        p.run(
            project(&[
                "find /run /tmp /work /dev -type s 2>/dev/null; ls /run/plimsoll; echo done",
            ]),
            T,
        )
        .await
        .unwrap(),
    );
    assert!(
        !granted.is_finished(),
        "the granted run ended before the other one looked: the runs did not overlap"
    );
    let seen = stdout(&other, 0);
    assert!(
        !seen.contains("g.sock"),
        "another run sees a relay socket: {seen}"
    );
    assert!(seen.ends_with("done"), "{seen}");

    let Answer::Javascript(j) = granted.await.unwrap().unwrap() else {
        panic!("expected a javascript result");
    };
    let out = String::from_utf8_lossy(&j.stdout).into_owned();
    let err = String::from_utf8_lossy(&j.stderr).into_owned();
    assert_eq!(j.exit_code, 0, "stdout: {out}\nstderr: {err}");
    assert!(
        !out.contains(KEY) && !err.contains(KEY),
        "the key reached the run"
    );
    let line = |tag: &str| -> serde_json::Value {
        let l = out
            .lines()
            .find_map(|l| l.strip_prefix(tag))
            .unwrap_or_else(|| panic!("no {tag:?} line: {out}\n{err}"));
        serde_json::from_str(l).unwrap()
    };
    let env = line("ENV ");
    assert_eq!(
        env["PLIMSOLL_GRANT_SOCKET"], "/run/plimsoll/g.sock",
        "{env}"
    );
    let result = line("RESULT ");
    assert_eq!(result["ok"]["status"], 200, "{result}");
    assert_eq!(
        result["ok"]["body"]["item"], "answer-from-upstream",
        "{result}"
    );
    assert_eq!(result["no"]["status"], 403, "{result}");
    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].target, "/v1/items/42");
    assert_eq!(
        seen[0].headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(!format!("{:?}", trace_of.trace()).contains(KEY));
    p.shutdown().await;
}
