//! Per-pod identity and mutual TLS on the fake cluster with real terminators and sandboxds:
//! each pod serves its own certificate carrying its loopback address (written as
//! cert-manager's CSI driver writes it), every terminator requires plimsolld's client
//! certificate, and the provider checks the address it dialed. Misbehaving pods (a
//! redirect to another pod, another pod's certificate, a certificate without the IP) are
//! refused before anything is sent, which the pods' sandboxd call counts prove.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use plimsoll_agentsandbox::{AgentSandboxConfig, AgentSandboxProvider};
use plimsoll_core::{pb, Reason};
use plimsoll_provider::{Answer, Provider, ProviderError, Work};
use plimsoll_sandboxd::{SandboxdClient, Token};
use plimsoll_testkit::ca::Ca;
use plimsoll_testkit::fake_cluster::{self as fake, FakeCluster, FakeClusterOptions, PodMode};
use plimsoll_tls::{ClientPair, ClientSpec, ClientTls, PodIdentity};

fn bins() -> PathBuf {
    fake::sandboxd_binaries().expect("build the sandboxd binaries")
}

/// Per-pod pods need root: sandboxd's `--terminator-socket` needs `--run-as`, which needs
/// root. Elsewhere these tests say so and pass without running.
fn root_or_skip(test: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    // /proc/self belongs to the process's effective user.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root {
        println!("SKIPPED: {test} needs root (sandboxd's --run-as, as in the shipped template)");
    }
    root
}

async fn per_pod_cluster() -> FakeCluster {
    FakeCluster::start(FakeClusterOptions::per_pod(bins()))
        .await
        .expect("start the fake cluster")
}

async fn started(cfg: AgentSandboxConfig) -> AgentSandboxProvider {
    let p = AgentSandboxProvider::new(cfg).expect("provider");
    p.start().await.expect("startup checks and smoke test");
    p
}

fn echo(text: &str) -> Work {
    Work::Project(pb::ProjectRun {
        steps: vec![format!("echo {text}")],
        ..Default::default()
    })
}

const T: Duration = Duration::from_secs(20);

/// Runs `echo text`, expecting an answer.
async fn answers(p: &AgentSandboxProvider, text: &str) {
    let (out, _) = p.run_timed(echo(text), T).await;
    assert!(matches!(out, Ok(Answer::Project(_))), "{out:?}");
}

/// Runs `echo`, expecting a refusal marked `environment`; returns its message.
async fn refused(p: &AgentSandboxProvider) -> String {
    let (out, phases) = p.run_timed(echo("never"), T).await;
    match out {
        Err(ProviderError::Refused(r)) => {
            assert_eq!(r.reason, Reason::Environment, "{}", r.message);
            assert!(phases.deleted, "the claim was not deleted");
            r.message
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn per_pod_identity_accepts_the_right_pod_and_refuses_a_redirect_with_nothing_sent() {
    if !root_or_skip(
        "per_pod_identity_accepts_the_right_pod_and_refuses_a_redirect_with_nothing_sent",
    ) {
        return;
    }
    let c = per_pod_cluster().await;
    let cfg = c.provider_config();
    assert_eq!(cfg.pod_identity, PodIdentity::Ip);
    assert!(cfg.client_cert.is_some());
    let p = started(cfg).await;

    let (out, phases) = p.run_timed(echo("right-pod"), T).await;
    let Ok(Answer::Project(r)) = out else {
        panic!("{out:?}")
    };
    assert_eq!(r.steps[0].stdout, b"right-pod\n");
    assert!(phases.pod.is_some());

    // The claim's status names an address where another pod of the deployment answers
    // (same CA, its own correct certificate for its own address).
    c.set_mode(PodMode::Redirect);
    let before = c.sandboxd_calls();
    let (out, phases) = p.run_timed(echo("redirected"), T).await;
    let Err(ProviderError::Refused(r)) = out else {
        panic!("a redirect to another pod must be refused: {out:?}")
    };
    assert_eq!(r.reason, Reason::Environment, "{}", r.message);
    let dialed = phases.pod.expect("an address was dialed").ip().to_string();
    let m = &r.message;
    assert!(m.contains("could not be confirmed"), "{m}");
    assert!(
        m.contains(&format!("does not carry IP address {dialed}")),
        "the message names the IP dialed: {m}"
    );
    assert!(
        m.contains("it carries IpAddress(") && !m.contains(&format!("IpAddress({dialed})")),
        "the message names what the certificate carried: {m}"
    );
    assert_eq!(
        c.sandboxd_calls(),
        before,
        "a redirected pod received a call"
    );

    // Back to normal pods: accepted again.
    c.set_mode(PodMode::Serve);
    answers(&p, "again").await;
    let n = c.counts();
    assert_eq!((n.created, n.deleted, n.live), (4, 4, 0), "{n:?}");
    c.shutdown().await;
}

#[tokio::test]
async fn a_certificate_without_the_ip_or_for_another_pod_is_refused() {
    if !root_or_skip("a_certificate_without_the_ip_or_for_another_pod_is_refused") {
        return;
    }
    let c = per_pod_cluster().await;
    let p = started(c.provider_config()).await;

    c.set_mode(PodMode::CertWithoutIp);
    let before = c.sandboxd_calls();
    let m = refused(&p).await;
    assert!(m.contains("does not carry IP address 127."), "{m}");
    assert!(
        m.contains(&format!(
            "it carries DnsName(\"{}\")",
            plimsoll_tls::DEFAULT_SERVER_NAME
        )),
        "{m}"
    );
    assert_eq!(c.sandboxd_calls(), before);

    c.set_mode(PodMode::OtherPodCert);
    let m = refused(&p).await;
    assert!(m.contains("it carries IpAddress(127."), "{m}");
    assert_eq!(c.sandboxd_calls(), before);

    // Control: a provider in shared mode accepts the name-only certificate (it chains and
    // carries the name): it is the IP check that refused it above.
    c.set_mode(PodMode::CertWithoutIp);
    // (The read-back wants a Secret volume in shared mode; the pods are the same.)
    let mut t = fake::per_pod_template();
    t["spec"]["podTemplate"]["spec"]["volumes"][0] = serde_json::json!({
        "name": "sandboxd-tls",
        "secret": {"secretName": "plimsoll-sandboxd-tls", "defaultMode": 256}});
    c.set_template(t);
    let mut shared = c.provider_config();
    shared.pod_identity = PodIdentity::Shared;
    let p2 = started(shared).await;
    answers(&p2, "by-name").await;
    c.shutdown().await;
}

fn client(c: &FakeCluster, pair: Option<ClientPair>) -> ClientTls {
    let cfg = c.provider_config();
    ClientTls::build(&ClientSpec {
        client_cert: pair,
        ..cfg.client_spec()
    })
    .unwrap()
}

fn token(c: &FakeCluster) -> Token {
    Token::read_file(&c.token_file()).unwrap()
}

/// The DER of the certificate a fresh handshake with `addr` gets.
async fn served_cert(tls: &ClientTls, addr: std::net::SocketAddr) -> Vec<u8> {
    let s = tls.connect(addr).await.expect("handshake");
    s.connection().peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test]
async fn a_renewed_per_pod_certificate_keeps_open_connections_and_serves_the_next_one() {
    if !root_or_skip("a_renewed_per_pod_certificate_keeps_open_connections_and_serves_the_next_one")
    {
        return;
    }
    let c = per_pod_cluster().await;
    let addr = c.standalone_pod().await.unwrap();
    let tls = client(&c, c.client_pair());
    let open = SandboxdClient::connect_tls(&tls, addr, &token(&c))
        .await
        .unwrap();
    open.health().await.unwrap();
    let old = served_cert(&tls, addr).await;

    let rotated = c.rotate_pod_certs();
    let new = rotated
        .iter()
        .find(|(a, _)| *a == addr)
        .map(|(_, der)| der.clone())
        .expect("the standalone pod was renewed");
    assert_ne!(old, new);
    let deadline = Instant::now() + Duration::from_secs(30);
    while served_cert(&tls, addr).await != new {
        assert!(Instant::now() < deadline, "the renewal was never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The connection opened before the renewal still works, without a new dial.
    open.health().await.unwrap();
    assert_eq!(
        open.dials(),
        1,
        "the open connection was dropped and redialed"
    );
    // And a new channel verifies the new certificate against the same address.
    let next = SandboxdClient::connect_tls(&tls, addr, &token(&c))
        .await
        .unwrap();
    next.health().await.unwrap();
    c.shutdown().await;
}

#[tokio::test]
async fn without_plimsollds_client_certificate_no_byte_reaches_sandboxd() {
    if !root_or_skip("without_plimsollds_client_certificate_no_byte_reaches_sandboxd") {
        return;
    }
    let c = per_pod_cluster().await;
    let addr = c.standalone_pod().await.unwrap();
    let before = c.sandboxd_calls();

    // No client certificate at all (plimsolld configured without one): the call fails.
    // Such a client does not wait for the terminator's verdict, so it cannot tell that
    // nothing was forwarded; the pod's count shows it.
    let bare = client(&c, None);
    let res = match SandboxdClient::connect_tls(&bare, addr, &token(&c)).await {
        Ok(cl) => cl.health().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(res.is_err(), "a client without a certificate got an answer");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.pod_logs().contains("client presented no certificate") {
        assert!(
            Instant::now() < deadline,
            "the terminator did not log the refusal: {}",
            c.pod_logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A client certificate from another CA.
    let other = Ca::unique("not the pods' client CA");
    let leaf = other.client_leaf("plimsolld.plimsoll.invalid");
    let dir = c.scratch();
    let pair = ClientPair {
        cert_file: dir.join("foreign-client.crt"),
        key_file: dir.join("foreign-client.key"),
    };
    std::fs::write(&pair.cert_file, &leaf.cert_pem).unwrap();
    std::fs::write(&pair.key_file, &leaf.key_pem).unwrap();
    let foreign = client(&c, Some(pair));
    // With a certificate, the client waits for the terminator's verdict: refused before
    // anything was sent, marked, naming the certificate and the client CA.
    let err = SandboxdClient::connect_tls(&foreign, addr, &token(&c))
        .await
        .expect_err("a certificate from another CA must be refused");
    assert_eq!(err.not_dispatched(), Some(Reason::Environment), "{err}");
    let m = err.to_string();
    assert!(
        m.contains("did not accept plimsolld's client certificate")
            && m.contains("PLIMSOLL_SANDBOXD_CLIENT_CA"),
        "{m}"
    );
    // Give the terminator time to forward anything it would have forwarded.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        c.sandboxd_calls(),
        before,
        "sandboxd received a call from a client without the right certificate"
    );

    // Control: plimsolld's own certificate gets through, and the call is counted.
    let good = client(&c, c.client_pair());
    let cl = SandboxdClient::connect_tls(&good, addr, &token(&c))
        .await
        .unwrap();
    cl.health().await.unwrap();
    assert_eq!(c.sandboxd_calls(), before + 1);
    c.shutdown().await;
}

#[tokio::test]
async fn with_client_certificates_no_token_is_needed_and_the_code_cannot_reach_sandboxds_socket() {
    if !root_or_skip(
        "with_client_certificates_no_token_is_needed_and_the_code_cannot_reach_sandboxds_socket",
    ) {
        return;
    }
    let c = per_pod_cluster().await;
    let mut cfg = c.provider_config();
    cfg.token_file = None;
    let p = started(cfg).await;
    // The probe runs as the run's own user (when the tests run as root, as in CI): it
    // looks for the terminators' private socket directories and tries to enter each.
    let probe = format!(
        "for d in {}/*/tmp/plimsoll-tls-*; do [ -d \"$d\" ] || continue; \
         if ls \"$d\" >/dev/null 2>&1; then echo OPEN; else echo closed; fi; done; echo end",
        c.pods_dir().display()
    );
    let (out, _) = p
        .run_timed(
            Work::Project(pb::ProjectRun {
                steps: vec![probe],
                ..Default::default()
            }),
            T,
        )
        .await;
    let Ok(Answer::Project(r)) = out else {
        panic!("a run without a token over mutual TLS: {out:?}")
    };
    let text = String::from_utf8_lossy(&r.steps[0].stdout).into_owned();
    assert!(text.ends_with("end\n"), "{text}");
    if fake::run_user().is_some() {
        assert!(
            text.contains("closed"),
            "no socket directory was found: {text}"
        );
        assert!(
            !text.contains("OPEN"),
            "the code entered sandboxd's socket directory: {text}"
        );
    }
    c.shutdown().await;
}

/// A process killed when the test ends, even by a failed assertion.
struct Impostor(std::process::Child);

impl Drop for Impostor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A pod's `/tmp` is an emptyDir, writable by everyone without the sticky bit, so the code
/// can rename the terminator's private socket directory and put a socket of its own at the
/// same path. The terminator then refuses to forward (the peer is not sandboxd's user):
/// the impostor gets a connection but not one byte, and plimsolld's call fails unanswered.
#[tokio::test]
async fn a_socket_put_in_sandboxds_place_by_another_user_gets_nothing() {
    if !root_or_skip("a_socket_put_in_sandboxds_place_by_another_user_gets_nothing") {
        return;
    }
    let python = std::path::Path::new("/usr/bin/python3");
    if !python.exists() {
        println!("SKIPPED: /usr/bin/python3 is needed for the impostor");
        return;
    }
    let c = per_pod_cluster().await;
    let addr = c.standalone_pod().await.unwrap();
    let good = client(&c, c.client_pair());
    let before = SandboxdClient::connect_tls(&good, addr, &token(&c))
        .await
        .unwrap();
    before.health().await.unwrap();

    // Every pod's socket directory is replaced by one of uid 65534 holding its listener.
    let mut impostors = Vec::new();
    let mut marks = Vec::new();
    for pod in std::fs::read_dir(c.pods_dir()).unwrap().flatten() {
        for d in std::fs::read_dir(pod.path().join("tmp")).unwrap().flatten() {
            let dir = d.path();
            if !dir
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("plimsoll-tls-")
            {
                continue;
            }
            std::fs::rename(&dir, dir.with_extension("moved")).unwrap();
            std::fs::create_dir(&dir).unwrap();
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
            let mark = pod.path().join("tmp").join("impostor-bytes");
            let script = format!(
                "import socket,os\ns=socket.socket(socket.AF_UNIX)\ns.bind({sock:?})\nos.chmod({sock:?},0o777)\ns.listen(8)\n\
                 open({ready:?},'w').close()\nwhile True:\n  c,_=s.accept()\n  n=0\n  c.settimeout(2)\n  \
                 try:\n    while True:\n      b=c.recv(4096)\n      if not b: break\n      n+=len(b)\n  except Exception: pass\n  \
                 open({mark:?},'a').write(str(n)+'\\n')\n",
                sock = dir.join("sandboxd.sock").display().to_string(),
                ready = dir.join("ready").display().to_string(),
                mark = mark.display().to_string(),
            );
            let child = std::process::Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(python)
                .args(["-c", &script])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            impostors.push(Impostor(child));
            marks.push((dir.join("ready"), mark));
        }
    }
    assert!(!marks.is_empty(), "no socket directory was found");
    let deadline = Instant::now() + Duration::from_secs(20);
    for (ready, _) in &marks {
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the impostor never listened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let err = SandboxdClient::connect_tls(&good, addr, &token(&c))
        .await
        .expect_err("a replaced socket must not answer");
    assert_eq!(err.not_dispatched(), Some(Reason::Environment), "{err}");
    assert!(err.to_string().contains("then closed"), "{err}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c
        .pod_logs()
        .contains("something replaced sandboxd's socket")
    {
        assert!(Instant::now() < deadline, "no log line: {}", c.pod_logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The impostor was connected to (the terminator checks its peer after connecting), but
    // not one byte reached it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    drop(impostors);
    let got: Vec<String> = marks
        .iter()
        .filter_map(|(_, m)| std::fs::read_to_string(m).ok())
        .collect();
    assert!(!got.is_empty(), "the impostor was never connected to");
    assert!(
        got.iter().all(|g| g.lines().all(|n| n == "0")),
        "bytes reached the impostor: {got:?}"
    );
    c.shutdown().await;
}

/// plimsolld's client certificate is re-read when its files change: a renewed pair from the
/// same client CA keeps runs going, and a pair from another CA is then what is presented
/// (the pods refuse it), which shows the files were really read again.
#[tokio::test]
async fn plimsollds_client_certificate_is_reloaded_when_its_files_change() {
    if !root_or_skip("plimsollds_client_certificate_is_reloaded_when_its_files_change") {
        return;
    }
    let c = per_pod_cluster().await;
    let p = started(c.provider_config()).await;
    c.renew_client_pair().expect("client certificates are on");
    answers(&p, "renewed").await;

    // A key and certificate of another CA, written as one more renewal (same files).
    let other = Ca::unique("not the pods' client CA").client_leaf("plimsolld.plimsoll.invalid");
    c.install_client_pair(&other).unwrap();
    let m = refused(&p).await;
    assert!(
        m.contains("did not accept plimsolld's client certificate"),
        "{m}"
    );

    // Back to a good pair: accepted again, without a restart.
    c.renew_client_pair().unwrap();
    answers(&p, "good-again").await;
    c.shutdown().await;
}
