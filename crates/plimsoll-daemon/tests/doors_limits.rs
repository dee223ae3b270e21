//! The RPC and metrics listeners' limits (issue 35), on real loopback sockets against an
//! in-process daemon with a small connection cap and small timeouts set through
//! `PLIMSOLL_MAX_CONNECTIONS`, `PLIMSOLL_HEADER_TIMEOUT_MS` and `PLIMSOLL_IDLE_TIMEOUT_MS`:
//! more idle connections than the cap, slow ones sending a byte at a time, and HTTP/2
//! connections kept busy with pings alone (before and after an unauthenticated request) are
//! all closed, and a caller with a valid token is still answered.

use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::pb;
use plimsoll_testkit::daemon::{authed, Setup};
use plimsoll_testkit::doors::{
    attack, one_call_then_pings, still_open_after, until_closed, Attack, PREFACE, TLS_HELLO_START,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// Far above every timeout the tests set: waiting for a condition, never a speed claim.
const CEILING: Duration = Duration::from_secs(30);

const DESCRIBE: &str = "/plimsoll.v1.SandboxService/Describe";

const LIMITS: [(&str, &str); 3] = [
    ("PLIMSOLL_MAX_CONNECTIONS", "8"),
    ("PLIMSOLL_HEADER_TIMEOUT_MS", "1000"),
    ("PLIMSOLL_IDLE_TIMEOUT_MS", "1500"),
];

async fn describe_with_token(ch: tonic::transport::Channel, token: &str) {
    let mut c = pb::sandbox_service_client::SandboxServiceClient::new(ch);
    let d = c
        .describe(authed(pb::DescribeRequest {}, token))
        .await
        .expect("the valid caller is answered");
    assert_eq!(d.into_inner().protocol, 5);
}

/// Waits (bounded by [`CEILING`]) until every attacking connection was closed.
async fn all_closed(set: JoinSet<()>) {
    assert_eq!(
        still_open_after(set, CEILING).await,
        0,
        "every idle, slow and ping-only connection is closed by the daemon"
    );
}

#[tokio::test]
async fn idle_slow_and_ping_only_connections_are_closed_and_a_valid_caller_is_answered() {
    let s = Setup::tester();
    let mut extra = LIMITS.to_vec();
    extra.push(("PLIMSOLL_METRICS_ADDR", "127.0.0.1:0"));
    let daemon = s.start(&extra).await;
    let addr = daemon.rpc_addr();

    // More idle connections than the cap, slow ones, ping-only ones.
    let mut set = JoinSet::new();
    for _ in 0..12 {
        attack(&mut set, addr, Attack::Idle).await;
    }
    for _ in 0..3 {
        attack(&mut set, addr, Attack::Slow(PREFACE)).await;
    }
    for _ in 0..2 {
        attack(&mut set, addr, Attack::Pings).await;
    }
    // A connection that made one (unauthenticated) call, then only pings.
    let after_call = tokio::spawn({
        let io = TcpStream::connect(addr).await.unwrap();
        let authority = addr.to_string();
        async move { one_call_then_pings(io, &authority, DESCRIBE).await }
    });

    // The valid caller gets through (a slot frees when the header timeout closes one).
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(CEILING);
    tokio::time::timeout(CEILING, async {
        let ch = ch.connect().await.expect("connect");
        describe_with_token(ch, s.token(0)).await;
    })
    .await
    .expect("the valid caller is answered within the ceiling");

    all_closed(set).await;
    tokio::time::timeout(CEILING, after_call)
        .await
        .expect("a connection kept busy with pings after one call is closed by the idle timeout")
        .unwrap();

    // The metrics listener: an idle connection and a slow one are closed, /healthz answers,
    // and a kept-alive connection is closed once idle.
    let m = daemon.metrics_addr().expect("the metrics listener is on");
    let mut set = JoinSet::new();
    attack(&mut set, m, Attack::Idle).await;
    attack(&mut set, m, Attack::Slow(b"GET /healthz HTTP/1.1\r\n")).await;
    let mut kept = TcpStream::connect(m).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let answered = tokio::time::timeout(CEILING, async {
        let mut buf = [0u8; 1024];
        loop {
            let n = kept.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before answering");
            got.extend_from_slice(&buf[..n]);
            if got.ends_with(b"ok\n") {
                return;
            }
        }
    })
    .await;
    assert!(answered.is_ok(), "/healthz answers: {got:?}");
    tokio::time::timeout(CEILING, until_closed(kept))
        .await
        .expect("a kept-alive metrics connection is closed once idle");
    all_closed(set).await;
    daemon.shutdown().await;
}

fn tls_client(ca: &plimsoll_testkit::ca::Ca) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from(
            ca.cert.der().to_vec(),
        ))
        .unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

#[tokio::test]
async fn the_tls_listener_closes_unfinished_handshakes_and_ping_only_connections() {
    let s = Setup::tester();
    let ca = plimsoll_testkit::ca::Ca::unique("doors limits CA");
    let leaf = ca.leaf(&["localhost"]);
    let (cert, key) = (s.path().join("tls.crt"), s.path().join("tls.key"));
    std::fs::write(&cert, &leaf.cert_pem).unwrap();
    std::fs::write(&key, &leaf.key_pem).unwrap();
    let mut extra = LIMITS.to_vec();
    extra.push(("PLIMSOLL_TLS_CERT", cert.to_str().unwrap()));
    extra.push(("PLIMSOLL_TLS_KEY", key.to_str().unwrap()));
    let daemon = s.start(&extra).await;
    let addr = daemon.rpc_addr();

    let mut set = JoinSet::new();
    for _ in 0..12 {
        attack(&mut set, addr, Attack::Idle).await;
    }
    // The first bytes of a TLS ClientHello record, one at a time: a handshake that never
    // completes.
    for _ in 0..3 {
        attack(&mut set, addr, Attack::Slow(TLS_HELLO_START)).await;
    }
    // A finished handshake, one unauthenticated call, then only pings.
    let connector = tls_client(&ca);
    let after_call = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        let tls = connector.connect(name, tcp).await.expect("a TLS handshake");
        one_call_then_pings(tls, "localhost", DESCRIBE).await
    });

    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    let ep = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(CEILING);
    tokio::time::timeout(CEILING, async {
        let ch = ep.connect().await.expect("a TLS connection");
        describe_with_token(ch, s.token(0)).await;
    })
    .await
    .expect("the valid TLS caller is answered within the ceiling");

    all_closed(set).await;
    tokio::time::timeout(CEILING, after_call)
        .await
        .expect(
            "a TLS connection kept busy with pings after one call is closed by the idle timeout",
        )
        .unwrap();
    daemon.shutdown().await;
}
