//! plimsolld (the in-process daemon, its real gRPC listener) with `SANDBOX_PROVIDER=agentsandbox`
//! against the fake cluster: the tier read back from the template is stated in Describe,
//! in results and in records; a pod that fails the handshake is a marked refusal on the
//! wire; hardened mode needs the encrypted-pod-network statement, unless per-pod identity
//! and client certificates are both on.

use plimsoll_core::check::check_answer;
use plimsoll_core::pb;
use plimsoll_core::pb::run_response::Result as R;
use plimsoll_core::{not_dispatched_reason, Reason};
use plimsoll_daemon::{start, Config};
use plimsoll_testkit::daemon::{authed, client, config_from, js_request, Setup as Callers};
use plimsoll_testkit::fake_cluster::{self as fake, FakeCluster, FakeClusterOptions, Pki, PodMode};

struct Setup {
    cluster: FakeCluster,
    callers: Callers,
}

impl Setup {
    fn token(&self) -> &str {
        self.callers.token(0)
    }
}

async fn setup() -> Setup {
    setup_with(FakeClusterOptions::conforming(
        fake::sandboxd_binaries().unwrap(),
    ))
    .await
}

async fn setup_with(opts: FakeClusterOptions) -> Setup {
    let cluster = FakeCluster::start(opts).await.unwrap();
    Setup {
        cluster,
        callers: Callers::tester(),
    }
}

fn config(
    s: &Setup,
    extra: &[(&str, &str)],
) -> Result<Config, plimsoll_daemon::config::ConfigError> {
    let mut pairs = s.callers.pairs(&[]);
    pairs.extend(s.cluster.env_pairs());
    pairs.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut cfg = config_from(&pairs)?;
    // Test hook: the fake pods listen on another port than 9090.
    let plimsoll_daemon::ProviderConfig::AgentSandbox(a) = &mut cfg.provider else {
        panic!("not the agentsandbox provider: {:?}", cfg.provider)
    };
    a.sandboxd_port = s.cluster.pod_port();
    Ok(cfg)
}

fn js(code: &str) -> pb::RunRequest {
    js_request(code, "", 20_000)
}

#[tokio::test]
async fn plimsolld_states_the_read_back_tier_in_describe_results_and_records() {
    let s = setup().await;
    let daemon = start(config(&s, &[]).unwrap()).await.unwrap();
    let mut c = client(&daemon).await;
    let d = c
        .describe(authed(pb::DescribeRequest {}, s.token()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.sandbox, "agentsandbox");
    assert_eq!(d.isolation, "kernel");
    assert_eq!(d.protocol, 5);

    let req = js("console.log(6*7)");
    let resp = c
        .run(authed(req.clone(), s.token()))
        .await
        .unwrap()
        .into_inner();
    let Some(R::Javascript(j)) = &resp.result else {
        panic!("no javascript result")
    };
    assert_eq!(j.stdout, b"42\n");
    assert_eq!(resp.isolation, "kernel");
    assert_eq!(resp.sandbox, "agentsandbox");
    let rec = resp.record.as_ref().unwrap();
    assert_eq!(rec.isolation, "kernel");
    assert_eq!(rec.provider, "agentsandbox");
    check_answer(&req, &resp).unwrap();

    // A pod with another CA's certificate: marked not dispatched on the wire.
    s.cluster.set_mode(PodMode::ServeCert(Pki::generate(
        plimsoll_tls::DEFAULT_SERVER_NAME,
    )));
    let err = c.run(authed(js("1"), s.token())).await.unwrap_err();
    assert_eq!(
        not_dispatched_reason(&err),
        Some(Reason::Environment),
        "{err:?}"
    );
    assert!(
        err.message().contains("could not be confirmed"),
        "{}",
        err.message()
    );

    daemon.shutdown().await;
    let n = s.cluster.counts();
    assert_eq!((n.created, n.deleted, n.live), (3, 3, 0), "{n:?}");
    s.cluster.shutdown().await;
}

#[tokio::test]
async fn hardened_mode_without_the_encrypted_pod_network_statement_refuses_to_start() {
    let s = setup().await;
    let hardened = [
        ("PLIMSOLL_HARDENED", "1"),
        ("SANDBOX_MEMORY_MB", "1024"),
        ("SANDBOX_CPUS", "1"),
        ("SANDBOX_PIDS", "256"),
        ("SANDBOX_DISK_MB", "1024"),
    ];
    let e = start(config(&s, &hardened).unwrap())
        .await
        .err()
        .expect("hardened mode without the statement must not start");
    let msg = e.to_string();
    assert!(
        msg.contains("SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK"),
        "{msg}"
    );
    // It is the only missing safeguard here: gVisor gives kernel, the rest is set.
    assert_eq!(msg.matches("\n  - ").count(), 1, "{msg}");

    let mut with = hardened.to_vec();
    with.push(("SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK", "1"));
    let daemon = start(config(&s, &with).unwrap())
        .await
        .expect("hardened mode with the statement starts");
    daemon.shutdown().await;
    s.cluster.shutdown().await;
}

#[tokio::test]
async fn the_ca_file_is_required_by_plimsolld_configuration() {
    let s = setup().await;
    let e = config(&s, &[("SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE", "")]).unwrap_err();
    assert_eq!(e.name, "SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE");
    assert!(e.message.contains("required"), "{e}");
    s.cluster.shutdown().await;
}

const HARDENED: [(&str, &str); 5] = [
    ("PLIMSOLL_HARDENED", "1"),
    ("SANDBOX_MEMORY_MB", "1024"),
    ("SANDBOX_CPUS", "1"),
    ("SANDBOX_PIDS", "256"),
    ("SANDBOX_DISK_MB", "1024"),
];

#[tokio::test]
async fn hardened_mode_starts_without_the_statement_only_with_per_pod_identity_and_client_certificates(
) {
    let s = setup_with(FakeClusterOptions::per_pod(
        fake::sandboxd_binaries().unwrap(),
    ))
    .await;
    let pairs = s.cluster.env_pairs();
    assert!(pairs
        .iter()
        .any(|(k, v)| k == "SANDBOX_AGENTSANDBOX_POD_IDENTITY" && v == "ip"));
    assert!(pairs
        .iter()
        .any(|(k, _)| k == "SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE"));

    // Both on, no statement: the daemon starts (smoke test over mutual TLS included) and
    // serves.
    let daemon = start(config(&s, &HARDENED).unwrap())
        .await
        .expect("hardened mode with per-pod identity and client certificates starts");
    let mut c = client(&daemon).await;
    let resp = c
        .run(authed(js("console.log(1+1)"), s.token()))
        .await
        .unwrap()
        .into_inner();
    let Some(R::Javascript(j)) = &resp.result else {
        panic!("no javascript result")
    };
    assert_eq!(j.stdout, b"2\n");
    daemon.shutdown().await;

    // Per-pod identity without client certificates: hardened mode names the missing
    // client certificate, not the statement.
    let no_client = [
        ("SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE", ""),
        ("SANDBOX_AGENTSANDBOX_CLIENT_KEY_FILE", ""),
    ];
    let mut extra = HARDENED.to_vec();
    extra.extend(no_client);
    let cfg = config(&s, &extra).unwrap();
    let v = plimsoll_daemon::server::hardened_violations(&cfg, Some(plimsoll_core::Tier::Kernel));
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE"),
        "{v:?}"
    );
    assert!(
        !v[0].contains("SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK"),
        "{v:?}"
    );

    // Client certificates with one shared certificate: the statement is still required.
    let mut extra = HARDENED.to_vec();
    extra.push(("SANDBOX_AGENTSANDBOX_POD_IDENTITY", "shared"));
    let cfg = config(&s, &extra).unwrap();
    let v = plimsoll_daemon::server::hardened_violations(&cfg, Some(plimsoll_core::Tier::Kernel));
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].contains("SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK"),
        "{v:?}"
    );
    s.cluster.shutdown().await;
}
