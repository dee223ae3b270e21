//! The pod's doors hold against an attacker (issue 35), on real terminator + sandboxd
//! processes started with small limits (`--max-connections`, `--header-timeout-ms`,
//! `--idle-timeout-ms`): a TLS connection that completed its handshake but never calls, or
//! makes one call without a token and then only pings, is closed (sandboxd's deadlines end
//! the terminator's copy); sandboxd's own TCP port, reachable from inside the pod, closes
//! idle, slow and ping-only connections beyond its cap; a valid client still gets through.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use plimsoll_sandboxd::SandboxdClient;
use plimsoll_testkit::doors::{
    attack, one_call_then_pings, still_open_after, until_closed, Attack, PREFACE,
};
use tokio::task::JoinSet;

const EXECUTE: &str = "/plimsoll.sandboxd.v1.Sandboxd/Execute";

/// Far above every timeout set here: waiting for a condition, never a speed claim.
const CEILING: Duration = Duration::from_secs(30);

fn pod() -> (Ca, Pod) {
    let ca = Ca::new("ca");
    let pod = Pod::start_with(
        &ca.leaf(&[SERVER_NAME]),
        PodOpts {
            args: vec![
                "--max-connections=4".into(),
                "--header-timeout-ms=1000".into(),
                "--idle-timeout-ms=1500".into(),
            ],
            ..Default::default()
        },
    );
    (ca, pod)
}

fn connector(ca: &Ca) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from(
            ca.cert.der().to_vec(),
        ))
        .unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

async fn tls(
    ca: &Ca,
    addr: std::net::SocketAddr,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from(SERVER_NAME).unwrap();
    connector(ca)
        .connect(name, tcp)
        .await
        .expect("a TLS handshake")
}

async fn valid_call(ca: &Ca, pod: &Pod) {
    let tls = plimsoll_tls::ClientTls::from_ca_file(ca_file(pod.work.path(), &[ca]), SERVER_NAME)
        .unwrap();
    tokio::time::timeout(CEILING, async {
        let c = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .expect("a valid client connects");
        c.health().await.expect("a valid client is answered");
    })
    .await
    .expect("the valid client is answered within the ceiling");
}

#[test]
fn tls_connections_that_never_call_or_only_ping_are_closed_through_the_terminator() {
    let (ca, pod) = pod();
    runtime().block_on(async {
        // A finished handshake, then silence.
        let silent = tls(&ca, pod.addr).await;
        // A finished handshake, one call without a token, then only pings.
        let pinging = tls(&ca, pod.addr).await;
        let pinging =
            tokio::spawn(async move { one_call_then_pings(pinging, SERVER_NAME, EXECUTE).await });
        // A finished handshake, the HTTP/2 preface, then only pings (no call at all).
        let mut preface_only = tls(&ca, pod.addr).await;
        let preface_only = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            preface_only.write_all(PREFACE).await.unwrap();
            preface_only
                .write_all(&plimsoll_testkit::doors::SETTINGS)
                .await
                .unwrap();
            let (r, mut w) = tokio::io::split(preface_only);
            let pings = tokio::spawn(async move {
                while w.write_all(&plimsoll_testkit::doors::PING).await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
            until_closed(r).await;
            pings.abort();
        });
        valid_call(&ca, &pod).await;
        tokio::time::timeout(CEILING, until_closed(silent))
            .await
            .expect("a TLS connection that never calls is closed");
        tokio::time::timeout(CEILING, pinging)
            .await
            .expect("a connection kept busy with pings after one refused call is closed")
            .unwrap();
        tokio::time::timeout(CEILING, preface_only)
            .await
            .expect("a connection that sends only pings is closed")
            .unwrap();
    });
}

#[test]
fn sandboxds_own_port_closes_idle_slow_and_ping_only_connections_beyond_its_cap() {
    let (ca, pod) = pod();
    runtime().block_on(async {
        let mut set = JoinSet::new();
        for _ in 0..8 {
            attack(&mut set, pod.upstream, Attack::Idle).await;
        }
        for _ in 0..2 {
            attack(&mut set, pod.upstream, Attack::Slow(PREFACE)).await;
        }
        attack(&mut set, pod.upstream, Attack::Pings).await;
        valid_call(&ca, &pod).await;
        assert_eq!(
            still_open_after(set, CEILING).await,
            0,
            "every idle, slow and ping-only connection to sandboxd's port is closed"
        );
    });
}
