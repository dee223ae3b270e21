//! Grants on the Docker provider against the real engine and the real sandbox image: a
//! JavaScript run inside a container (no network) calls a real loopback HTTP upstream on
//! the host through the run's relay, a Unix socket mounted into the container.
//!
//! Without an engine or the image this skips with a message, unless
//! `PLIMSOLL_REQUIRE_DOCKER=1` (CI), when it fails.

use std::time::Duration;

use plimsoll_core::pb;
use plimsoll_docker::{DockerConfig, DockerProvider};
use plimsoll_provider::{Answer, Provider, Work};
use plimsoll_testkit::upstream::{Reply, Upstream};

mod support;
use support::IMAGE;
const KEY: &str = "sk-live-9d2c4b7e1a0f3865";

/// A loopback HTTP upstream that records each request and answers `{"ok":true}` (200).
async fn upstream() -> Upstream {
    Upstream::plain(|_| Reply::json(200, &br#"{"ok":true,"item":"answer-from-upstream"}"#[..]))
        .await
}

const CODE: &str = r#"
const grant = require(process.env.PLIMSOLL_GRANT_JS);
(async () => {
  const ok = await grant.get('/v1/items/42');
  const no = await grant.get('/v1/secrets');
  console.log('RESULT ' + JSON.stringify({ ok, no }));
  console.log('ENV ' + JSON.stringify(process.env));
})().catch((e) => { console.error('FAILED ' + e.stack); process.exit(3); });
"#;

#[tokio::test]
async fn a_container_calls_a_granted_route_through_its_unix_socket_and_never_sees_the_key() {
    if support::engine().await.is_none() {
        return;
    }
    let Upstream { addr, log } = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let grants = plimsoll_grants::Grants::from_bytes(
        format!(
            r#"{{"version":1,"profiles":{{"items":{{"base_url":"http://{addr}","routes":["GET /v1/items/{{id}}"],"allowed_callers":["tester"],"credential":{{"env":"API_KEY"}}}}}}}}"#
        )
        .as_bytes(),
        dir.path(),
        &|n| (n == "API_KEY").then(|| KEY.to_owned()),
    )
    .unwrap();
    let grant = grants.grant("items", "tester").expect("the grant");
    let trace_of = grant.clone();

    let mut c = DockerConfig::new(IMAGE, dir.path().join("docker"));
    c.default_timeout = Duration::from_secs(30);
    c.runtime = support::runtime();
    let p = DockerProvider::new(c).unwrap();
    p.start().await.unwrap();
    assert!(
        p.facts().supports_grants,
        "the docker provider must offer grants"
    );

    let work = Work::Javascript(pb::JavaScriptRun {
        code: CODE.into(),
        grant_profile: "items".into(),
    });
    let answer = p
        .run_granted(work, Duration::from_secs(30), grant)
        .await
        .unwrap();
    let Answer::Javascript(j) = answer else {
        panic!("expected a javascript result, got {answer:?}");
    };
    let out = String::from_utf8_lossy(&j.stdout).into_owned();
    let err = String::from_utf8_lossy(&j.stderr).into_owned();
    assert_eq!(
        j.exit_code, 0,
        "the run failed\nstdout: {out}\nstderr: {err}"
    );

    // The credential is nowhere the run could see or print it.
    assert!(
        !out.contains(KEY),
        "the credential reached the run's stdout: {out}"
    );
    assert!(
        !err.contains(KEY),
        "the credential reached the run's stderr: {err}"
    );
    let line = |tag: &str| -> serde_json::Value {
        let l = out
            .lines()
            .find_map(|l| l.strip_prefix(tag))
            .unwrap_or_else(|| panic!("no {tag:?} line in stdout: {out}\nstderr: {err}"));
        serde_json::from_str(l).unwrap()
    };
    let env = line("ENV ");
    let env = env.as_object().expect("process.env as an object");
    assert!(
        env.values()
            .all(|v| !v.as_str().unwrap_or("").contains(KEY)),
        "the credential is in the container's environment: {env:?}"
    );
    assert_eq!(
        env.get("PLIMSOLL_GRANT_SOCKET").and_then(|v| v.as_str()),
        Some("/run/plimsoll/g.sock"),
        "the run must get the container's socket path: {env:?}"
    );
    assert_eq!(
        env.get("PLIMSOLL_GRANT_JS").and_then(|v| v.as_str()),
        Some("/run/plimsoll/plimsoll_grant.js")
    );
    assert_eq!(
        env.get("PLIMSOLL_GRANT_PROFILE").and_then(|v| v.as_str()),
        Some("items")
    );
    assert!(env.contains_key("PLIMSOLL_GRANT_SECRET"), "{env:?}");

    // The granted route answered with the upstream's body.
    let result = line("RESULT ");
    assert_eq!(result["ok"]["status"], 200, "{result}");
    assert_eq!(
        result["ok"]["body"]["item"], "answer-from-upstream",
        "{result}"
    );
    // The ungranted route was refused by the broker.
    assert_eq!(result["no"]["status"], 403, "{result}");
    assert_eq!(result["no"]["refused"], true, "{result}");

    // The upstream saw exactly the granted call, carrying the credential.
    let seen = log.lock().unwrap().clone();
    assert_eq!(
        seen.len(),
        1,
        "the upstream should see only the granted call: {seen:?}"
    );
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].target, "/v1/items/42");
    assert_eq!(
        seen[0].headers.get("authorization").map(String::as_str),
        Some(format!("Bearer {KEY}").as_str()),
        "{:?}",
        seen[0].headers
    );
    assert!(
        seen.iter().all(|s| !s.target.contains("secrets")),
        "the ungranted route reached the upstream: {seen:?}"
    );
    let trace = format!("{:?}", trace_of.trace());
    assert!(
        !trace.contains(KEY),
        "the credential is in the trace: {trace}"
    );

    p.shutdown().await;
}
