//! The agent-sandbox provider against the fake Kubernetes API server (real HTTP and JSON)
//! whose fake controller starts a REAL `plimsoll-sandboxd-tls` + `plimsoll-sandboxd` pair
//! per claim, on its own 127.x.y.z address, with certificates made here (rcgen).
//!
//! The binaries are built by `fake::sandboxd_binaries()` (`cargo build -p …` into this
//! test's own target directory), because `CARGO_BIN_EXE_*` only names binaries of the same
//! package.

use std::path::PathBuf;
use std::time::Duration;

use plimsoll_agentsandbox::{AgentSandboxConfig, AgentSandboxProvider};
use plimsoll_core::pb;
use plimsoll_core::{Reason, Tier};
use plimsoll_provider::{Answer, Provider, ProviderError, Work};
use plimsoll_testkit::fake_cluster::{self as fake, FakeCluster, FakeClusterOptions, Pki, PodMode};
use serde_json::json;

fn bins() -> PathBuf {
    fake::sandboxd_binaries().expect("build the sandboxd binaries")
}

async fn cluster_with(warm: usize) -> FakeCluster {
    let mut o = FakeClusterOptions::conforming(bins());
    o.warm = warm;
    FakeCluster::start(o).await.expect("start the fake cluster")
}

async fn started(_c: &FakeCluster, cfg: AgentSandboxConfig) -> AgentSandboxProvider {
    let p = AgentSandboxProvider::new(cfg).expect("provider");
    p.start().await.expect("startup checks and smoke test");
    p
}

fn js(code: &str) -> Work {
    Work::Javascript(pb::JavaScriptRun {
        code: code.into(),
        grant_profile: String::new(),
    })
}

fn steps(s: &[&str]) -> Work {
    Work::Project(pb::ProjectRun {
        steps: s.iter().map(|x| x.to_string()).collect(),
        ..Default::default()
    })
}

const T: Duration = Duration::from_secs(20);

#[tokio::test]
async fn happy_path_runs_through_tls_and_deletes_every_claim() {
    let c = cluster_with(1).await;
    let p = started(&c, c.provider_config()).await;
    let facts = p.facts();
    assert_eq!(facts.name, "agentsandbox");
    assert_eq!(
        facts.tier,
        Some(Tier::Kernel),
        "runtimeClassName gvisor is kernel"
    );
    assert!(
        facts.languages.iter().any(|l| l == "javascript"),
        "{:?}",
        facts.languages
    );
    assert!(
        facts.environment.contains("@sha256:"),
        "{}",
        facts.environment
    );
    assert!(p.ready().await);

    let (out, phases) = p.run_timed(js("console.log(6*7)"), T).await;
    let Ok(Answer::Javascript(r)) = out else {
        panic!("{out:?}")
    };
    assert_eq!(r.stdout, b"42\n");
    assert_eq!(r.exit_code, 0);
    assert!(phases.claim_wait.is_some() && phases.tls_connect.is_some() && phases.run.is_some());
    assert!(phases.deleted);
    assert_eq!(phases.pod.unwrap().port(), c.pod_port());

    let Ok(Answer::Project(r)) = p.run(steps(&["echo one", "echo two"]), T).await else {
        panic!("project failed")
    };
    assert_eq!(r.steps.len(), 2);
    assert_eq!(r.steps[1].stdout, b"two\n");

    let n = c.counts();
    assert_eq!(n.created, 3, "smoke test + two runs");
    assert_eq!(n.deleted, 3);
    assert_eq!(n.live, 0);
    // plimsolld reads no Secret and no Pod: the verbs in k8s/rbac.yaml are all it needs.
    for r in c.requests() {
        assert!(!r.contains("/secrets") && !r.contains("/pods"), "{r}");
    }
    c.shutdown().await;
}

#[tokio::test]
async fn each_kind_of_template_drift_refuses_startup_with_its_name() {
    let c = cluster_with(0).await;
    let base = fake::conforming_template();
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "[command]",
            Box::new(|t| {
                t["spec"]["podTemplate"]["spec"]["containers"][0]["command"] =
                    json!(["/usr/local/bin/plimsoll-sandboxd"])
            }),
        ),
        (
            "[listen-host]",
            Box::new(|t| {
                t["spec"]["podTemplate"]["spec"]["containers"][0]["args"][0] =
                    json!("--listen-host=0.0.0.0")
            }),
        ),
        (
            "[grpc-port]",
            Box::new(|t| {
                t["spec"]["podTemplate"]["spec"]["containers"][0]["args"][1] =
                    json!("--grpc-port=9090")
            }),
        ),
        (
            "[secret-mount]",
            Box::new(|t| {
                t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] =
                    json!("/etc/tls")
            }),
        ),
        (
            "[read-only]",
            Box::new(|t| {
                t["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] =
                    json!(false)
            }),
        ),
        (
            "[default-mode]",
            Box::new(|t| {
                t["spec"]["podTemplate"]["spec"]["volumes"][0]["secret"]["defaultMode"] = json!(420)
            }),
        ),
        (
            "[run-as]",
            Box::new(|t| {
                t["spec"]["podTemplate"]["spec"]["securityContext"] = json!({"fsGroup": 65532})
            }),
        ),
        (
            "[secret-volume]",
            Box::new(|t| {
                t["spec"]["podTemplate"]["spec"]["volumes"][0] =
                    json!({"name": "sandboxd-tls", "emptyDir": {}})
            }),
        ),
    ];
    for (name, edit) in cases {
        let mut t = base.clone();
        edit(&mut t);
        c.set_template(t);
        let p = AgentSandboxProvider::new(c.provider_config()).unwrap();
        let e = p.start().await.expect_err(name).to_string();
        assert!(e.contains(name), "{name}: {e}");
        assert!(e.contains("plimsoll-sandboxes/plimsoll-sandboxd"), "{e}");
    }
    // All at once: every difference is listed.
    let mut t = base.clone();
    t["spec"]["podTemplate"]["spec"]["containers"][0]["args"] = json!(["--token-file=/t"]);
    t["spec"]["podTemplate"]["spec"]["volumes"][0]["secret"]["defaultMode"] = json!(420);
    c.set_template(t);
    let p = AgentSandboxProvider::new(c.provider_config()).unwrap();
    let e = p.start().await.unwrap_err().to_string();
    for name in ["[listen-host]", "[grpc-port]", "[default-mode]", "[run-as]"] {
        assert!(e.contains(name), "{name} missing from: {e}");
    }
    assert!(e.contains("4 place(s)"), "{e}");
    // The read-back refuses before any pod is claimed.
    assert_eq!(c.counts().created, 0);
    c.shutdown().await;
}

#[tokio::test]
async fn a_network_policy_that_also_allows_another_port_refuses_startup() {
    let c = cluster_with(0).await;
    let mut np = fake::conforming_policy();
    np["spec"]["ingress"][0]["ports"] =
        json!([{"protocol": "TCP", "port": 9090}, {"protocol": "TCP", "port": 8080}]);
    c.set_policies(vec![np]);
    let p = AgentSandboxProvider::new(c.provider_config()).unwrap();
    let e = p.start().await.unwrap_err().to_string();
    assert!(e.contains("[network-policy]") && e.contains("8080"), "{e}");
    // No policy at all: every port is open, refused too.
    c.set_policies(vec![]);
    let p = AgentSandboxProvider::new(c.provider_config()).unwrap();
    let e = p.start().await.unwrap_err().to_string();
    assert!(
        e.contains("[network-policy]") && e.contains("no NetworkPolicy"),
        "{e}"
    );
    assert_eq!(c.counts().created, 0);
    c.shutdown().await;
}

#[tokio::test]
async fn a_wrong_ca_file_or_name_stops_startup_with_both_in_the_message() {
    let c = cluster_with(1).await;
    let other = Pki::generate(plimsoll_tls::DEFAULT_SERVER_NAME);
    let wrong_ca = c.scratch().join("wrong-ca.pem");
    std::fs::write(&wrong_ca, &other.ca_pem).unwrap();
    let mut cfg = c.provider_config();
    cfg.ca_file = wrong_ca.clone();
    let p = AgentSandboxProvider::new(cfg).unwrap();
    let e = p.start().await.unwrap_err().to_string();
    assert!(e.contains(&wrong_ca.display().to_string()), "{e}");
    assert!(e.contains("sandboxd.plimsoll.invalid"), "{e}");
    assert!(e.contains("UnknownIssuer"), "{e}");
    assert!(p.facts().tier.is_none(), "a failed start states no tier");

    let mut cfg = c.provider_config();
    cfg.server_name = "other.plimsoll.invalid".into();
    let p = AgentSandboxProvider::new(cfg).unwrap();
    let e = p.start().await.unwrap_err().to_string();
    assert!(e.contains("other.plimsoll.invalid"), "{e}");
    assert!(e.contains(&c.ca_file().display().to_string()), "{e}");
    assert!(e.contains("NotValidForName"), "{e}");

    // A CA file that is not a CA file is refused before anything touches the cluster.
    let junk = c.scratch().join("junk.pem");
    std::fs::write(&junk, "not pem").unwrap();
    let mut cfg = c.provider_config();
    cfg.ca_file = junk;
    let e = AgentSandboxProvider::new(cfg).unwrap_err().to_string();
    assert!(e.contains("SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE"), "{e}");

    let n = c.counts();
    assert_eq!((n.created, n.deleted, n.live), (2, 2, 0), "{n:?}");
    c.shutdown().await;
}

#[tokio::test]
async fn a_pod_with_a_certificate_from_another_ca_gets_nothing_and_the_run_is_not_dispatched() {
    let c = cluster_with(1).await;
    let p = started(&c, c.provider_config()).await;
    c.set_mode(PodMode::ServeCert(Pki::generate(
        plimsoll_tls::DEFAULT_SERVER_NAME,
    )));
    let marker = c.scratch().join("ran");
    let code = format!(
        "require('fs').writeFileSync({:?}, 'ran')",
        marker.display().to_string()
    );
    let err = p.run(js(&code), T).await.unwrap_err();
    let ProviderError::Refused(r) = err else {
        panic!("not a refusal: {err:?}")
    };
    assert_eq!(r.reason, Reason::Environment);
    assert!(r.message.contains("UnknownIssuer"), "{}", r.message);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker.exists(), "the pod received and ran the code");
    // The same code through a pod with the right certificate does write it.
    c.set_mode(PodMode::Serve);
    p.run(js(&code), T).await.unwrap();
    assert!(marker.exists());
    let n = c.counts();
    assert_eq!((n.created, n.deleted, n.live), (3, 3, 0), "{n:?}");
    c.shutdown().await;
}

#[tokio::test]
async fn a_claim_that_never_becomes_ready_is_refused_as_capacity() {
    let c = cluster_with(1).await;
    let mut cfg = c.provider_config();
    cfg.claim_timeout = Duration::from_millis(1500);
    let p = started(&c, cfg).await;
    c.set_mode(PodMode::NeverReady);
    let (out, phases) = p.run_timed(js("1"), T).await;
    let Err(ProviderError::Refused(r)) = out else {
        panic!("{out:?}")
    };
    assert_eq!(r.reason, Reason::Capacity);
    assert!(r.message.contains("SandboxNotReady"), "{}", r.message);
    assert!(phases.tls_connect.is_none(), "nothing was dialed");
    assert!(phases.deleted);
    let n = c.counts();
    assert_eq!((n.created, n.deleted, n.live), (2, 2, 0), "{n:?}");
    c.shutdown().await;
}

#[tokio::test]
async fn a_pod_that_dies_mid_run_is_an_error_without_the_mark() {
    let c = cluster_with(1).await;
    let p = std::sync::Arc::new(started(&c, c.provider_config()).await);
    let marker = c.scratch().join("started");
    let step = format!("touch {} && sleep 5", marker.display());
    let run = {
        let p = p.clone();
        tokio::spawn(async move { p.run(steps(&[&step]), T).await })
    };
    let mut waited = 0;
    while !marker.exists() {
        assert!(waited < 600, "the step never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    assert_eq!(c.kill_claimed_pods(), 1);
    let err = run.await.unwrap().unwrap_err();
    assert!(
        matches!(err, ProviderError::Failed(_)),
        "a run that started must not be reported as not dispatched: {err:?}"
    );
    let n = c.counts();
    assert_eq!((n.created, n.deleted, n.live), (2, 2, 0), "{n:?}");
    c.shutdown().await;
}

#[tokio::test]
async fn the_ca_file_is_reloaded_when_it_changes() {
    // The CA change without downtime: a file with both CAs accepts pods from either.
    let c = cluster_with(1).await;
    let ca = c.scratch().join("ca.pem");
    std::fs::write(&ca, std::fs::read(c.ca_file()).unwrap()).unwrap();
    let mut cfg = c.provider_config();
    cfg.ca_file = ca.clone();
    let p = started(&c, cfg).await;
    let next = Pki::generate(plimsoll_tls::DEFAULT_SERVER_NAME);
    c.set_mode(PodMode::ServeCert(next.clone()));
    let e = p.run(js("1"), T).await.unwrap_err();
    assert!(matches!(e, ProviderError::Refused(_)), "{e:?}");
    let both = format!(
        "{}{}",
        std::fs::read_to_string(c.ca_file()).unwrap(),
        next.ca_pem
    );
    std::fs::write(&ca, both).unwrap();
    p.run(js("1"), T)
        .await
        .expect("the new CA is trusted after the file changed");
    c.set_mode(PodMode::Serve);
    p.run(js("1"), T)
        .await
        .expect("the old CA is still trusted");
    c.shutdown().await;
}

#[tokio::test]
async fn code_in_a_run_cannot_read_the_key_the_token_or_the_terminators_memory() {
    if fake::run_user().is_none() {
        eprintln!("skipped: the pods run the code as another user only when the tests are root");
        return;
    }
    let c = cluster_with(1).await;
    let p = started(&c, c.provider_config()).await;
    // The run's working directory is <pod>/root/run-…; the pod's key is <pod>/tls/tls.key and
    // the cluster's token file (the Secret sandboxd reads) is four levels up. sandboxd is the
    // run's parent, and the terminator is sandboxd's.
    let probe = r#"
sd=$PPID
term=$(awk '/^PPid:/ {print $2}' /proc/$sd/status)
echo "uid $(id -u) sandboxd $sd terminator $term"
for f in ../../tls/tls.key ../../../../token /proc/$sd/environ /proc/$term/environ; do
  if head -c 64 "$f" >/dev/null 2>&1; then echo "READ $f"; else echo "denied $f"; fi
done
for pid in $sd $term; do
  if (exec 3</proc/$pid/mem) 2>/dev/null; then echo "OPENED /proc/$pid/mem"; else echo "denied /proc/$pid/mem"; fi
done
"#;
    let Ok(Answer::Project(r)) = p.run(steps(&[probe]), T).await else {
        panic!("the probe did not run")
    };
    let out = String::from_utf8_lossy(&r.steps[0].stdout).into_owned();
    eprintln!("{out}");
    assert!(
        out.starts_with("uid 6"),
        "the code ran as sandboxd's user: {out}"
    );
    assert_eq!(out.matches("denied").count(), 6, "{out}");
    for leak in ["READ", "OPENED", "BEGIN", fake::TOKEN] {
        assert!(!out.contains(leak), "{leak}: {out}");
    }
    c.shutdown().await;
}

#[tokio::test]
async fn a_network_policy_that_lets_sandboxes_reach_each_other_refuses_startup() {
    let c = cluster_with(0).await;
    // The sandbox pods admitted as peers: code in one sandbox could call another's sandboxd.
    let mut np = fake::conforming_policy();
    np["spec"]["ingress"][0]["from"]
        .as_array_mut()
        .unwrap()
        .push(json!({"podSelector": {"matchLabels": {"app.kubernetes.io/name": "plimsoll-sandboxd"}}}));
    // And egress opened.
    let mut open = fake::conforming_policy();
    open["spec"]["egress"] = json!([{}]);
    for (what, policy, needle) in [
        ("peer", np, "admits the sandbox pods themselves"),
        ("egress", open, "egress rule 1 allows traffic out"),
    ] {
        c.set_policies(vec![policy]);
        let p = AgentSandboxProvider::new(c.provider_config()).unwrap();
        let e = p.start().await.unwrap_err().to_string();
        assert!(
            e.contains("[network-policy]") && e.contains(needle),
            "{what}: {e}"
        );
    }
    assert_eq!(c.counts().created, 0);
    c.shutdown().await;
}
