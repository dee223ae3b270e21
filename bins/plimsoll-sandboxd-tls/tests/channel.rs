//! The pod channel end to end: plimsolld's client → plimsoll-sandboxd-tls → plimsoll-sandboxd,
//! as real processes, with certificates made here.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use plimsoll_core::sandboxd_pb::{execute_request, execute_response, ExecuteRequest};
use plimsoll_core::{pb, Reason};
use plimsoll_sandboxd::{CallError, ConnectFailure, SandboxdClient};
use plimsoll_tls::{ClientTls, ConnectError};
use rustls_pki_types::ServerName;

fn client_tls(dir: &std::path::Path, cas: &[&Ca]) -> ClientTls {
    ClientTls::from_ca_file(ca_file(dir, cas), SERVER_NAME).unwrap()
}

fn echo_project(text: &str) -> ExecuteRequest {
    ExecuteRequest {
        timeout_ms: 30_000,
        payload: Some(execute_request::Payload::Project(pb::ProjectRun {
            steps: vec![format!("echo {text}")],
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A rustls client config trusting `ca`, with the given versions and ALPN.
fn raw_client(
    ca: &Ca,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: Vec<Vec<u8>>,
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls_pki_types::CertificateDer::from(
            ca.cert.der().to_vec(),
        ))
        .unwrap();
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = alpn;
    Arc::new(cfg)
}

/// Runs a blocking rustls handshake; returns the connection and the socket, or the error.
fn raw_handshake(
    cfg: Arc<rustls::ClientConfig>,
    addr: std::net::SocketAddr,
) -> Result<(rustls::ClientConnection, TcpStream), rustls::Error> {
    let mut sock = TcpStream::connect(addr).unwrap();
    sock.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut conn =
        rustls::ClientConnection::new(cfg, ServerName::try_from(SERVER_NAME).unwrap()).unwrap();
    while conn.is_handshaking() {
        match conn.complete_io(&mut sock) {
            Ok(_) => {}
            Err(e) => {
                let inner = e
                    .get_ref()
                    .and_then(|i| i.downcast_ref::<rustls::Error>())
                    .cloned();
                return Err(inner.unwrap_or(rustls::Error::General(e.to_string())));
            }
        }
    }
    Ok((conn, sock))
}

/// The DER of the certificate a fresh handshake gets.
fn served_cert(ca: &Ca, addr: std::net::SocketAddr) -> Vec<u8> {
    let (conn, _s) = raw_handshake(
        raw_client(ca, &[&rustls::version::TLS13], vec![b"h2".to_vec()]),
        addr,
    )
    .unwrap();
    conn.peer_certificates().unwrap()[0].to_vec()
}

/// Reads whatever plaintext the server sends until it closes the connection; panics if it
/// never does.
fn plaintext_until_closed(conn: &mut rustls::ClientConnection, sock: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    loop {
        while conn.wants_write() {
            if conn.write_tls(sock).is_err() {
                return got;
            }
        }
        match conn.read_tls(sock) {
            Ok(0) => return got,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("the server never closed the connection")
            }
            Err(_) => return got,
        }
        if conn.process_new_packets().is_err() {
            return got;
        }
        let mut buf = [0u8; 4096];
        loop {
            match conn.reader().read(&mut buf) {
                Ok(0) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(_) => break,
            }
        }
    }
}

/// After the server closes: reading gives EOF or an error, never data.
fn assert_closed_without_data(sock: &mut TcpStream) {
    sock.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut buf = [0u8; 64];
    match sock.read(&mut buf) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("server sent {n} bytes: {:?}", &buf[..n]),
    }
}

#[test]
fn end_to_end_execute_through_the_terminator() {
    let ca = Ca::new("ca-a");
    let pod = Pod::start(&ca.leaf(&[SERVER_NAME]));
    let tls = client_tls(pod.work.path(), &[&ca]);
    runtime().block_on(async {
        let c = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .unwrap();
        let health = c.health().await.unwrap();
        assert!(health.languages.iter().any(|l| l == "shell"), "{health:?}");
        let out = c.execute(echo_project("through-the-wall")).await.unwrap();
        let Some(execute_response::Result::Project(p)) = out.result else {
            panic!("{out:?}")
        };
        assert_eq!(p.steps.len(), 1, "{p:?}");
        assert_eq!(p.steps[0].stdout, b"through-the-wall\n");
        assert_eq!(p.steps[0].exit_code, 0);
    });
    pod.expect_sandboxd_calls(2);
}

#[test]
fn pod_certificate_from_another_ca_is_refused_and_sandboxd_receives_nothing() {
    let trusted = Ca::new("trusted");
    let other = Ca::new("other");
    let pod = Pod::start(&other.leaf(&[SERVER_NAME]));
    let tls = client_tls(pod.work.path(), &[&trusted]);
    runtime().block_on(async {
        let err = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .unwrap_err();
        assert_eq!(err.not_dispatched(), Some(Reason::Environment));
        let text = err.to_string();
        assert!(
            matches!(
                err,
                CallError::Connect(ConnectFailure::Tls(ConnectError::Handshake { .. }))
            ),
            "{text}"
        );
        assert!(
            text.contains(&tls.ca_file().display().to_string()),
            "{text}"
        );
        assert!(text.contains(SERVER_NAME), "{text}");
        assert!(text.contains("unknown_ca"), "{text}");
        let status = err.to_status();
        assert_eq!(
            plimsoll_core::not_dispatched_reason(&status),
            Some(Reason::Environment)
        );
    });
    pod.proc.wait_line("refused 127.0.0.1:");
    assert_eq!(pod.sandboxd_calls(), 0, "sandboxd received a call");
    // Control: the same pod answers a client that trusts its CA, and that call is counted.
    let good = client_tls(pod.work.path(), &[&other]);
    runtime().block_on(async {
        let c = SandboxdClient::connect_tls(&good, pod.addr, &token())
            .await
            .unwrap();
        c.health().await.unwrap();
    });
    pod.expect_sandboxd_calls(1);
}

#[test]
fn certificate_for_another_name_is_refused() {
    let ca = Ca::new("ca");
    let pod = Pod::start(&ca.leaf(&["someone-else.plimsoll.invalid"]));
    let tls = client_tls(pod.work.path(), &[&ca]);
    runtime().block_on(async {
        let err = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .unwrap_err();
        assert_eq!(err.not_dispatched(), Some(Reason::Environment));
        let text = err.to_string();
        assert!(text.contains("NotValidForName"), "{text}");
        assert!(text.contains("alert sent: bad_certificate"), "{text}");
        assert!(text.contains(SERVER_NAME), "{text}");
    });
    assert_eq!(pod.sandboxd_calls(), 0);
}

#[test]
fn plaintext_clients_are_refused() {
    let ca = Ca::new("ca");
    let pod = Pod::start(&ca.leaf(&[SERVER_NAME]));
    // A gRPC client without TLS.
    runtime().block_on(async {
        match SandboxdClient::connect_plain(pod.addr, &token()).await {
            Err(e) => assert!(e.not_dispatched().is_some(), "{e}"),
            Ok(c) => {
                let e = c.health().await.unwrap_err();
                assert!(matches!(e, CallError::MayHaveRun(_)), "{e}");
            }
        }
    });
    pod.proc.wait_line("plaintext HTTP/2");
    // An HTTP/1 request.
    let mut s = TcpStream::connect(pod.addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_closed_without_data(&mut s);
    pod.proc.wait_line("plaintext HTTP/1");
    assert_eq!(pod.sandboxd_calls(), 0);
}

/// A pod, after a raw handshake offering `versions` and `alpn` failed with `alert`.
fn handshake_refused(
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[u8],
    alert: rustls::AlertDescription,
) -> (Ca, Pod) {
    let ca = Ca::new("ca");
    let pod = Pod::start(&ca.leaf(&[SERVER_NAME]));
    let err = raw_handshake(raw_client(&ca, versions, vec![alpn.to_vec()]), pod.addr)
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err, rustls::Error::AlertReceived(alert));
    (ca, pod)
}

#[test]
fn tls12_only_client_is_refused() {
    let (_ca, pod) = handshake_refused(
        &[&rustls::version::TLS12],
        b"h2",
        rustls::AlertDescription::ProtocolVersion,
    );
    pod.proc.wait_line("does not offer TLS 1.3");
    assert_eq!(pod.sandboxd_calls(), 0);
}

#[test]
fn clients_without_alpn_h2_are_refused() {
    // Offering ALPN, but not h2: rustls refuses during the handshake.
    let (ca, pod) = handshake_refused(
        &[&rustls::version::TLS13],
        b"http/1.1",
        rustls::AlertDescription::NoApplicationProtocol,
    );
    // Offering no ALPN at all: the handshake completes, then the terminator closes without
    // forwarding a byte.
    let (mut conn, mut sock) = raw_handshake(
        raw_client(&ca, &[&rustls::version::TLS13], vec![]),
        pod.addr,
    )
    .unwrap();
    conn.writer()
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .unwrap();
    let got = plaintext_until_closed(&mut conn, &mut sock);
    assert!(got.is_empty(), "received {got:?}");
    pod.proc.wait_line("negotiated no ALPN protocol");
    assert_eq!(pod.sandboxd_calls(), 0);
}

#[test]
fn a_ca_file_with_old_and_new_ca_accepts_both_pods() {
    let old = Ca::new("old");
    let new = Ca::new("new");
    let pod_old = Pod::start(&old.leaf(&[SERVER_NAME]));
    let pod_new = Pod::start(&new.leaf(&[SERVER_NAME]));
    let tls = client_tls(pod_old.work.path(), &[&old, &new]);
    assert_eq!(tls.ca_count(), 2);
    runtime().block_on(async {
        for pod in [&pod_old, &pod_new] {
            let c = SandboxdClient::connect_tls(&tls, pod.addr, &token())
                .await
                .unwrap();
            c.health().await.unwrap();
        }
    });
    pod_old.expect_sandboxd_calls(1);
    pod_new.expect_sandboxd_calls(1);
}

#[test]
fn kubelet_rotation_keeps_open_connections_and_new_handshakes_see_the_new_certificate() {
    let ca = Ca::new("ca");
    let first = ca.leaf(&[SERVER_NAME]);
    let second = ca.leaf(&[SERVER_NAME]);
    let pod = Pod::start(&first);
    let tls = client_tls(pod.work.path(), &[&ca]);
    let rt = runtime();
    let open = rt.block_on(async {
        let c = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .unwrap();
        c.health().await.unwrap();
        c
    });
    assert_eq!(served_cert(&ca, pod.addr), first.der);

    kubelet_write(&pod.cert_dir, &second.cert_pem, &second.key_pem);
    let deadline = Instant::now() + PATIENCE;
    while served_cert(&ca, pod.addr) != second.der {
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    pod.proc.wait_line("reloaded certificate");
    // The connection opened before the rotation still carries calls, without reconnecting.
    rt.block_on(async {
        let out = open.execute(echo_project("still-open")).await.unwrap();
        let Some(execute_response::Result::Project(p)) = out.result else {
            panic!("{out:?}")
        };
        assert_eq!(p.steps[0].stdout, b"still-open\n");
    });
    assert_eq!(open.dials(), 1, "the open connection was replaced");
}

#[test]
fn a_broken_rotated_pair_keeps_the_old_one() {
    let ca = Ca::new("ca");
    let first = ca.leaf(&[SERVER_NAME]);
    let other = ca.leaf(&[SERVER_NAME]);
    let pod = Pod::start(&first);
    // The new certificate with a key that is not its own.
    kubelet_write(&pod.cert_dir, &other.cert_pem, &first.key_pem);
    let line = pod.proc.wait_line("rotated certificate pair refused");
    assert!(line.contains("does not match"), "{line}");
    assert!(
        !line.contains("PRIVATE KEY"),
        "key material in the log: {line}"
    );
    assert_eq!(served_cert(&ca, pod.addr), first.der);
    // Unparsable key: still the old pair.
    kubelet_write(&pod.cert_dir, &other.cert_pem, "not a key\n");
    let deadline = Instant::now() + PATIENCE;
    while pod.proc.count("rotated certificate pair refused") < 2 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(served_cert(&ca, pod.addr), first.der);
    let tls = client_tls(pod.work.path(), &[&ca]);
    runtime().block_on(async {
        let c = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .unwrap();
        c.health().await.unwrap();
    });
}

#[test]
fn an_expired_or_not_yet_valid_rotated_pair_keeps_the_old_one() {
    let ca = Ca::new("ca");
    let first = ca.leaf(&[SERVER_NAME]);
    let pod = Pod::start(&first);
    let expired = ca.leaf_valid(&[SERVER_NAME], 2000, 2001);
    let future = ca.leaf_valid(&[SERVER_NAME], 3999, 4000);
    let no_key_material = |line: &str, leaf: &Leaf| {
        for chunk in leaf.key_pem.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!line.contains(chunk), "key material in the log: {line}");
        }
        assert!(!line.contains("PRIVATE KEY"), "{line}");
    };

    kubelet_write(&pod.cert_dir, &expired.cert_pem, &expired.key_pem);
    let line = pod.proc.wait_line("rotated certificate pair refused");
    assert!(line.contains("has expired"), "{line}");
    no_key_material(&line, &expired);
    assert_eq!(served_cert(&ca, pod.addr), first.der);

    kubelet_write(&pod.cert_dir, &future.cert_pem, &future.key_pem);
    let deadline = Instant::now() + PATIENCE;
    while pod.proc.count("rotated certificate pair refused") < 2 {
        assert!(
            Instant::now() < deadline,
            "the future pair was never refused"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let line = pod
        .proc
        .log()
        .into_iter()
        .find(|l| l.contains("not valid yet"))
        .expect("the refusal says why");
    no_key_material(&line, &future);
    assert_eq!(served_cert(&ca, pod.addr), first.der);
    assert_eq!(pod.proc.count("reloaded certificate"), 0);

    // The old pair still carries calls.
    let tls = client_tls(pod.work.path(), &[&ca]);
    runtime().block_on(async {
        let c = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .unwrap();
        c.health().await.unwrap();
    });
}

#[test]
fn wrong_sandboxd_flags_are_refused() {
    let cases: [(&[&str], &str); 5] = [
        (&["--grpc-port=9091"], "--listen-host"),
        (
            &[
                "--listen-host=127.0.0.1",
                "--grpc-port=9091",
                "--terminator-socket=/tmp/mine/s.sock",
            ],
            "--terminator-socket",
        ),
        (
            &["--listen-host=0.0.0.0", "--grpc-port=9091"],
            "--listen-host",
        ),
        (
            &["--listen-host=127.0.0.1", "--grpc-port=9999"],
            "--grpc-port",
        ),
        (&["--listen-host=127.0.0.1"], "--grpc-port"),
    ];
    let marker = tempfile::tempdir().unwrap();
    let fake = marker.path().join("fake-sandboxd");
    let touched = marker.path().join("started");
    std::fs::write(&fake, format!("#!/bin/sh\ntouch {}\n", touched.display())).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for (args, flag) in cases {
        let out = Command::new(terminator_bin())
            .args(args)
            .env("PLIMSOLL_SANDBOXD_BIN", &fake)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag), "{args:?}: {err}");
    }
    assert!(
        !touched.exists(),
        "sandboxd was started despite wrong flags"
    );
}

#[test]
fn the_terminator_exits_with_sandboxds_status_when_it_dies() {
    let ca = Ca::new("ca");
    let mut pod = Pod::start(&ca.leaf(&[SERVER_NAME]));
    let pid = pod.sandboxd_pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let st = pod.proc.wait_exit();
    assert_eq!(st.code(), Some(128 + 9));

    // A sandboxd that exits on its own before accepting: its code is the terminator's.
    let dir = tempfile::tempdir().unwrap();
    let leaf = ca.leaf(&[SERVER_NAME]);
    kubelet_write(dir.path(), &leaf.cert_pem, &leaf.key_pem);
    let fake = dir.path().join("fake-sandboxd");
    std::fs::write(&fake, "#!/bin/sh\nexit 3\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = Command::new(terminator_bin())
        .args(["--listen-host=127.0.0.1", "--grpc-port=9091"])
        .env("PLIMSOLL_SANDBOXD_BIN", &fake)
        .env("PLIMSOLL_SANDBOXD_TLS_DIR", dir.path())
        .env("PLIMSOLL_SANDBOXD_TLS_LISTEN", "127.0.0.1:0")
        .env(
            "PLIMSOLL_SANDBOXD_TLS_UPSTREAM",
            format!("127.0.0.1:{}", free_port()),
        )
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigterm_drains_and_stops_sandboxd() {
    let ca = Ca::new("ca");
    let mut pod = Pod::start(&ca.leaf(&[SERVER_NAME]));
    let pid = pod.sandboxd_pid();
    let tls = client_tls(pod.work.path(), &[&ca]);
    let rt = runtime();
    let open = rt.block_on(async {
        let c = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .unwrap();
        c.health().await.unwrap();
        c
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pod.proc.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = pod.proc.wait_exit();
    assert_eq!(st.code(), Some(0), "{:?}", pod.proc.log());
    pod.proc.wait_line("stopped: sandboxd ended");
    // sandboxd is gone (the terminator reaped it, so not even a zombie remains).
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    drop(open);
}

#[test]
fn wrong_token_through_the_terminator_is_refused_marked_permission() {
    let ca = Ca::new("ca");
    let pod = Pod::start(&ca.leaf(&[SERVER_NAME]));
    let tls = client_tls(pod.work.path(), &[&ca]);
    runtime().block_on(async {
        let bad = plimsoll_sandboxd::Token::new("wrong-token-0123456789").unwrap();
        let c = SandboxdClient::connect_tls(&tls, pod.addr, &bad)
            .await
            .unwrap();
        let e = c.execute(echo_project("must-not-run")).await.unwrap_err();
        assert_eq!(e.not_dispatched(), Some(Reason::Permission), "{e}");
        let CallError::Refused(r) = &e else {
            panic!("{e}")
        };
        assert_eq!(r.code, tonic::Code::Unauthenticated);
    });
    pod.proc.wait_line("sandboxd call received and refused");
    assert_eq!(pod.proc.count("executed project payload"), 0);
}

#[test]
fn a_client_that_never_finishes_the_handshake_does_not_hold_the_slot() {
    let ca = Ca::new("ca");
    let pod = Pod::start_with(
        &ca.leaf(&[SERVER_NAME]),
        PodOpts {
            env: vec![
                ("PLIMSOLL_SANDBOXD_TLS_MAX_CONNECTIONS", "1".into()),
                ("PLIMSOLL_SANDBOXD_TLS_MAX_HANDSHAKES", "1".into()),
                ("PLIMSOLL_SANDBOXD_TLS_HANDSHAKE_TIMEOUT_MS", "300".into()),
            ],
            ..Default::default()
        },
    );
    // Occupies the only handshake slot: a TLS record header, then silence.
    let mut slow = TcpStream::connect(pod.addr).unwrap();
    slow.write_all(&[0x16, 0x03, 0x01]).unwrap();
    let tls = client_tls(pod.work.path(), &[&ca]).with_timeout(PATIENCE);
    runtime().block_on(async {
        let c = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .unwrap();
        c.health().await.unwrap();
    });
    pod.proc.wait_line("TLS handshake not completed within");
    assert_closed_without_data(&mut slow);
}

#[test]
fn stalled_handshakes_up_to_their_bound_do_not_stop_a_real_client() {
    // Five stalled clients against one established slot and six handshake slots. The
    // handshake bound is far past the test's length, so no stalled client is dropped: the
    // real client gets in only because handshakes and established connections are counted
    // apart (with one shared count, the first stalled client would hold the only slot).
    const HANDSHAKES: usize = 6;
    let ca = Ca::new("ca");
    let pod = Pod::start_with(
        &ca.leaf(&[SERVER_NAME]),
        PodOpts {
            env: vec![
                ("PLIMSOLL_SANDBOXD_TLS_MAX_CONNECTIONS", "1".into()),
                (
                    "PLIMSOLL_SANDBOXD_TLS_MAX_HANDSHAKES",
                    HANDSHAKES.to_string(),
                ),
                (
                    "PLIMSOLL_SANDBOXD_TLS_HANDSHAKE_TIMEOUT_MS",
                    "3600000".into(),
                ),
            ],
            ..Default::default()
        },
    );
    // Each stalled client sends a TLS record header, then silence. They connect first, so
    // they are ahead of the real client in the accept queue.
    let mut stalled: Vec<TcpStream> = (0..HANDSHAKES - 1)
        .map(|_| {
            let mut s = TcpStream::connect(pod.addr).unwrap();
            s.write_all(&[0x16, 0x03, 0x01]).unwrap();
            s
        })
        .collect();
    let tls = client_tls(pod.work.path(), &[&ca]).with_timeout(PATIENCE);
    runtime().block_on(async {
        let c = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .expect("a real client completes the handshake past the stalled ones");
        let health = c.health().await.unwrap();
        assert!(health.languages.iter().any(|l| l == "shell"), "{health:?}");
    });
    pod.expect_sandboxd_calls(1);
    // No stalled client was dropped to make room, and none was forwarded.
    assert_eq!(pod.proc.count("TLS handshake not completed"), 0);
    for s in &mut stalled {
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 16];
        match s.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("a stalled client was closed or answered: {other:?}"),
        }
    }
    drop(stalled);
}

#[test]
fn an_idle_connection_is_closed() {
    let ca = Ca::new("ca");
    let pod = Pod::start_with(
        &ca.leaf(&[SERVER_NAME]),
        PodOpts {
            env: vec![("PLIMSOLL_SANDBOXD_TLS_IDLE_TIMEOUT_MS", "300".into())],
            ..Default::default()
        },
    );
    let (mut conn, mut sock) = raw_handshake(
        raw_client(&ca, &[&rustls::version::TLS13], vec![b"h2".to_vec()]),
        pod.addr,
    )
    .unwrap();
    // Say nothing; the terminator closes the connection. sandboxd's own HTTP/2 server
    // preface (SETTINGS frames) may arrive first; nothing else may.
    let got = plaintext_until_closed(&mut conn, &mut sock);
    let mut rest = &got[..];
    while !rest.is_empty() {
        assert!(rest.len() >= 9, "a partial frame: {got:?}");
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        assert_eq!(rest[3], 4, "not a SETTINGS frame: {got:?}");
        rest = &rest[(9 + len).min(rest.len())..];
    }
    pod.proc.wait_line("idle for");
}

/// Whether `pid` is still a live process (absent, or a zombie waiting to be reaped, is not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

#[test]
fn sandboxd_dies_with_a_killed_terminator() {
    let ca = Ca::new("ca");
    let mut pod = Pod::start(&ca.leaf(&[SERVER_NAME]));
    let pid = pod.sandboxd_pid();
    let line = pod.proc.wait_line("forwarding TLS 1.3");
    let upstream = parse_addr_after(&line, "to sandboxd at ");
    assert!(
        TcpStream::connect(upstream).is_ok(),
        "sandboxd listens on {upstream}"
    );
    // SIGKILL: the terminator runs none of its shutdown paths.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pod.proc.child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    pod.proc.wait_exit();
    // The kernel's parent-death signal is delivered as the terminator exits; allow a margin
    // for a loaded machine (this is a bound on a wait, not a timing assertion).
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !alive(pid),
        "sandboxd (pid {pid}) outlived its killed terminator"
    );
    assert!(
        TcpStream::connect(upstream).is_err(),
        "sandboxd's port {upstream} still accepts after the terminator was killed"
    );
}

#[test]
fn an_unusable_client_ca_file_is_a_configuration_error_before_sandboxd_starts() {
    let ca = Ca::new("ca-a");
    let leaf = ca.leaf(&[SERVER_NAME]);
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    std::fs::write(tls.join("tls.crt"), &leaf.cert_pem).unwrap();
    std::fs::write(tls.join("tls.key"), &leaf.key_pem).unwrap();
    let fake = dir.path().join("fake-sandboxd");
    let touched = dir.path().join("started");
    std::fs::write(&fake, format!("#!/bin/sh\ntouch {}\n", touched.display())).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let key_only = dir.path().join("key-only.pem");
    std::fs::write(&key_only, &leaf.key_pem).unwrap();
    let good = dir.path().join("client-ca.pem");
    std::fs::write(&good, Ca::new("client CA").pem()).unwrap();
    std::fs::write(tls.join("ca.crt"), ca.pem()).unwrap();
    for (file, says) in [
        (dir.path().join("missing.pem"), "missing.pem"),
        (key_only, "PRIVATE KEY"),
        // A blank value never silently turns client certificates off.
        (std::path::PathBuf::from(" "), "set but empty"),
        (
            std::path::PathBuf::from("client-ca.pem"),
            "not an absolute path",
        ),
        // The pods' own CA would let every pod in as a client.
        (tls.join("ca.crt"), "own certificate directory"),
        // A good file, but sandboxd's flags have no --run-as.
        (good, "--run-as"),
    ] {
        let out = Command::new(terminator_bin())
            .args(["--listen-host=127.0.0.1", "--grpc-port=9091"])
            .env("PLIMSOLL_SANDBOXD_BIN", &fake)
            .env("PLIMSOLL_SANDBOXD_TLS_DIR", &tls)
            .env("PLIMSOLL_SANDBOXD_CLIENT_CA", &file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", file.display());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("PLIMSOLL_SANDBOXD_CLIENT_CA") && err.contains(says),
            "{err}"
        );
    }
    assert!(
        !touched.exists(),
        "sandboxd was started despite the CA file"
    );
}
