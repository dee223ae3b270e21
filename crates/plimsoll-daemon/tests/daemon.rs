//! End-to-end tests through the real gRPC listener of an in-process daemon, with the
//! process provider running real node and sh programs.

use std::time::Duration;

use plimsoll_core::pb::sandbox_service_client::SandboxServiceClient;
use plimsoll_core::pb::{self, run_request::Payload, run_response::Result as R};
use plimsoll_core::{check::check_answer, not_dispatched_reason, Reason};
use plimsoll_daemon::env::MapEnv;
use plimsoll_daemon::{start, Config, RunningDaemon};
use plimsoll_testkit::daemon::{authed, js_request, Setup};
use tonic::transport::Channel;

struct Fixture {
    daemon: RunningDaemon,
    token: String,
    unscoped: String,
    _dir: Setup,
}

async fn daemon_with(extra: &[(&str, &str)]) -> Fixture {
    let dir = Setup::new(&[("tester", &[]), ("no-scope", &["other:scope"])]);
    let mut pairs = vec![("PLIMSOLL_METRICS_ADDR", "127.0.0.1:0")];
    pairs.extend_from_slice(extra);
    let daemon = dir.start(&pairs).await;
    Fixture {
        daemon,
        token: dir.token(0).to_owned(),
        unscoped: dir.token(1).to_owned(),
        _dir: dir,
    }
}

async fn client(f: &Fixture) -> SandboxServiceClient<Channel> {
    plimsoll_testkit::daemon::client(&f.daemon).await
}

fn js(code: &str) -> pb::RunRequest {
    js_request(code, "", 20_000)
}

#[tokio::test]
async fn javascript_runs_and_the_record_checks() {
    let f = daemon_with(&[]).await;
    let req = js("console.log(6*7)");
    let resp = client(&f)
        .await
        .run(authed(req.clone(), &f.token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.sandbox, "process");
    assert_eq!(resp.isolation, "process");
    let Some(R::Javascript(j)) = &resp.result else {
        panic!("no javascript result")
    };
    assert_eq!(j.stdout, b"42\n");
    assert_eq!(j.exit_code, 0);
    check_answer(&req, &resp).unwrap();
    let rec = resp.record.as_ref().unwrap();
    assert!(rec.ended_unix_ms >= rec.started_unix_ms);
    assert_eq!(rec.record_sha256.len(), 64);
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn project_runs_steps_and_returns_artifacts() {
    let f = daemon_with(&[]).await;
    let req = pb::RunRequest {
        protocol: 5,
        payload: Some(Payload::Project(pb::ProjectRun {
            files: vec![pb::ProjectFile {
                path: "lib/x.txt".into(),
                content: "hello".into(),
            }],
            steps: vec!["cat lib/x.txt > out.txt".into(), "echo done".into()],
            artifacts: vec!["out.txt".into()],
            grant_profile: String::new(),
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
    assert_eq!(p.outcome, pb::ProjectOutcome::Completed as i32);
    assert_eq!(p.steps.len(), 2);
    assert_eq!(p.steps[1].stdout, b"done\n");
    assert_eq!(p.artifacts[0].content, b"hello");
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn floor_above_the_tier_is_refused_and_runs_nothing() {
    let f = daemon_with(&[]).await;
    let marker = plimsoll_testkit::shared_folder(f._dir.path(), "open").join("marker");
    let code = format!(
        "require('fs').writeFileSync({:?}, 'ran')",
        marker.to_str().unwrap()
    );
    let mut req = js(&code);
    req.minimum_isolation = "vm".into();
    let err = client(&f)
        .await
        .run(authed(req, &f.token))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(not_dispatched_reason(&err), Some(Reason::Isolation));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker.exists(), "the refused run wrote its marker");
    // The same code without the floor does write it: the marker test can fail.
    let resp = client(&f)
        .await
        .run(authed(js(&code), &f.token))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(resp.result, Some(R::Javascript(ref j)) if j.exit_code == 0));
    assert!(marker.exists());
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn protocol_numbers_other_than_5_are_refused() {
    let f = daemon_with(&[]).await;
    let mut c = client(&f).await;
    for (p, code) in [
        (0, tonic::Code::InvalidArgument),
        (4, tonic::Code::Unimplemented),
        (6, tonic::Code::Unimplemented),
    ] {
        let mut req = js("console.log(1)");
        req.protocol = p;
        let err = c.run(authed(req, &f.token)).await.unwrap_err();
        assert_eq!(err.code(), code, "protocol {p}");
        assert_eq!(
            not_dispatched_reason(&err),
            Some(Reason::Protocol),
            "protocol {p}"
        );
        assert!(err.message().contains("protocol 5"), "{}", err.message());
    }
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn missing_wrong_and_unscoped_tokens_are_refused() {
    let f = daemon_with(&[]).await;
    let mut c = client(&f).await;
    let none = c
        .run(tonic::Request::new(js("console.log(1)")))
        .await
        .unwrap_err();
    assert_eq!(none.code(), tonic::Code::Unauthenticated);
    assert_eq!(not_dispatched_reason(&none), Some(Reason::Permission));
    let wrong = c
        .run(authed(js("console.log(1)"), &"0".repeat(64)))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
    assert_eq!(not_dispatched_reason(&wrong), Some(Reason::Permission));
    let unscoped = c
        .run(authed(js("console.log(1)"), &f.unscoped))
        .await
        .unwrap_err();
    assert_eq!(unscoped.code(), tonic::Code::PermissionDenied);
    assert_eq!(not_dispatched_reason(&unscoped), Some(Reason::Permission));
    let describe = c
        .describe(tonic::Request::new(pb::DescribeRequest {}))
        .await
        .unwrap_err();
    assert_eq!(not_dispatched_reason(&describe), Some(Reason::Permission));
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn bad_requests_are_refused_and_the_daemon_keeps_serving() {
    let f = daemon_with(&[]).await;
    let mut c = client(&f).await;
    let mut bad_floor = js("console.log(1)");
    bad_floor.minimum_isolation = "none".into();
    let mut no_payload = js("x");
    no_payload.payload = None;
    let escape = pb::RunRequest {
        protocol: 5,
        payload: Some(Payload::Project(pb::ProjectRun {
            files: vec![pb::ProjectFile {
                path: "../escape".into(),
                content: "x".into(),
            }],
            steps: vec!["true".into()],
            ..Default::default()
        })),
        ..Default::default()
    };
    let cell = pb::RunRequest {
        protocol: 5,
        payload: Some(Payload::Cell(Default::default())),
        ..Default::default()
    };
    let module = pb::RunRequest {
        protocol: 5,
        payload: Some(Payload::Module(Default::default())),
        ..Default::default()
    };
    let grant = pb::RunRequest {
        protocol: 5,
        payload: Some(Payload::Javascript(pb::JavaScriptRun {
            code: "1".into(),
            grant_profile: "github".into(),
        })),
        ..Default::default()
    };
    for (req, reason) in [
        (bad_floor, Reason::Request),
        (no_payload, Reason::Request),
        (escape, Reason::Request),
        (cell, Reason::Request),
        (module, Reason::Unsupported),
        (grant, Reason::Permission),
    ] {
        let err = c.run(authed(req.clone(), &f.token)).await.unwrap_err();
        assert_eq!(
            not_dispatched_reason(&err),
            Some(reason),
            "{req:?}: {err:?}"
        );
    }
    let ok = c
        .run(authed(js("console.log('still here')"), &f.token))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(ok.result, Some(R::Javascript(ref j)) if j.stdout == b"still here\n"));
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn over_capacity_is_refused() {
    let f = daemon_with(&[("SANDBOX_MAX_CONCURRENT", "1")]).await;
    let mut slow = client(&f).await;
    let token = f.token.clone();
    let first = tokio::spawn(async move {
        slow.run(authed(
            js("setTimeout(() => console.log('slow'), 1500)"),
            &token,
        ))
        .await
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let err = client(&f)
        .await
        .run(authed(js("console.log(1)"), &f.token))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(not_dispatched_reason(&err), Some(Reason::Capacity));
    let done = first.await.unwrap().unwrap().into_inner();
    assert!(matches!(done.result, Some(R::Javascript(ref j)) if j.stdout == b"slow\n"));
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn sessions_are_refused_as_unsupported_after_the_protocol_check() {
    let f = daemon_with(&[]).await;
    let mut c = client(&f).await;
    let err = c
        .open_session(authed(
            pb::OpenSessionRequest {
                protocol: 5,
                ..Default::default()
            },
            &f.token,
        ))
        .await
        .unwrap_err();
    assert_eq!(not_dispatched_reason(&err), Some(Reason::Unsupported));
    let err = c
        .open_session(authed(
            pb::OpenSessionRequest {
                protocol: 6,
                ..Default::default()
            },
            &f.token,
        ))
        .await
        .unwrap_err();
    assert_eq!(not_dispatched_reason(&err), Some(Reason::Protocol));
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn describe_states_protocol_provider_tier_and_languages() {
    let f = daemon_with(&[("SANDBOX_MEMORY_MB", "256")]).await;
    let d = client(&f)
        .await
        .describe(authed(pb::DescribeRequest {}, &f.token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (d.protocol, d.sandbox.as_str(), d.isolation.as_str()),
        (5, "process", "process")
    );
    let langs = &d.javascript_environment.as_ref().unwrap().languages;
    assert!(langs.iter().any(|l| l == "javascript"), "{langs:?}");
    assert!(d.supports_project);
    assert_eq!(d.resources.unwrap().memory_mb, 256);
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn disabled_provider_refuses_every_run() {
    let f = daemon_with(&[("SANDBOX_PROVIDER", "")]).await;
    let err = client(&f)
        .await
        .run(authed(js("console.log(1)"), &f.token))
        .await
        .unwrap_err();
    assert_eq!(not_dispatched_reason(&err), Some(Reason::Unsupported));
    let d = client(&f)
        .await
        .describe(authed(pb::DescribeRequest {}, &f.token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (d.sandbox.as_str(), d.isolation.as_str()),
        ("disabled", "none")
    );
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn health_ready_and_metrics_endpoints() {
    let f = daemon_with(&[]).await;
    let _ = client(&f)
        .await
        .run(authed(js("console.log(1)"), &f.token))
        .await
        .unwrap();
    let _ = client(&f)
        .await
        .run(tonic::Request::new(js("console.log(1)")))
        .await
        .unwrap_err();
    let m = f.daemon.metrics_addr().unwrap();
    let get = |path: &'static str| async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(m).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    };
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(get("/readyz").await.contains("ready"));
    let metrics = get("/metrics").await;
    assert!(metrics.contains("plimsoll_runs_total 1"), "{metrics}");
    assert!(
        metrics.contains("plimsoll_refused_total{reason=\"permission\"} 1"),
        "{metrics}"
    );
    f.daemon.shutdown().await;
}

#[tokio::test]
async fn startup_floor_and_hardened_mode_refuse_to_serve() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().to_str().unwrap();
    let env = |extra: &[(&'static str, &'static str)]| {
        let mut p = vec![
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_PROVIDER", "process"),
            ("PLIMSOLL_METRICS_ADDR", "off"),
            ("PLIMSOLL_ADDR", "127.0.0.1:0"),
            ("PLIMSOLL_STATE_DIR", state),
        ];
        p.extend_from_slice(extra);
        Config::from_env(&MapEnv::from_pairs(p))
    };
    let cfg = env(&[("SANDBOX_MIN_ISOLATION", "container")]).unwrap();
    let e = start(cfg)
        .await
        .err()
        .expect("a floor above process must refuse to start");
    assert!(e.to_string().contains("SANDBOX_MIN_ISOLATION"), "{e}");

    // Hardened mode refuses insecure mode outright, naming the variable.
    let e = env(&[("PLIMSOLL_HARDENED", "1")]).unwrap_err();
    assert_eq!(e.name, "PLIMSOLL_INSECURE");

    // With a callers file, hardened mode lists every missing safeguard at once.
    let callers = dir.path().join("callers.json");
    let mut file = plimsoll_callers::CallersFile::default();
    file.add("a", &[]).unwrap();
    file.save(&callers).unwrap();
    let cfg = Config::from_env(&MapEnv::from_pairs([
        ("PLIMSOLL_CLIENTS_FILE", callers.to_str().unwrap()),
        ("PLIMSOLL_HARDENED", "1"),
        ("SANDBOX_PROVIDER", "process"),
        ("PLIMSOLL_ADDR", "0.0.0.0:0"),
        ("SANDBOX_MEMORY_MB", "512"),
        ("PLIMSOLL_STATE_DIR", state),
    ]))
    .unwrap();
    let e = start(cfg)
        .await
        .err()
        .expect("hardened mode must refuse the process tier")
        .to_string();
    for needle in [
        "isolation is process",
        "PLIMSOLL_TLS_CERT",
        "SANDBOX_CPUS",
        "SANDBOX_PIDS",
        "SANDBOX_DISK_MB",
    ] {
        assert!(e.contains(needle), "missing {needle:?} in {e}");
    }
    assert!(!e.contains("SANDBOX_MEMORY_MB is not set"), "{e}");
}

#[test]
fn plaintext_tokens_on_a_network_address_warn_and_hardened_mode_refuses() {
    use plimsoll_daemon::server::{hardened_violations, plaintext_tokens_warning};
    let dir = tempfile::tempdir().unwrap();
    let callers = dir.path().join("callers.json");
    let mut file = plimsoll_callers::CallersFile::default();
    file.add("a", &[]).unwrap();
    file.save(&callers).unwrap();
    // Every other safeguard is in place, and the tier is one hardened mode accepts, so the
    // plaintext listener is the one thing at fault.
    let cfg = |extra: &[(&'static str, &'static str)]| {
        let mut p = vec![
            ("PLIMSOLL_CLIENTS_FILE", callers.to_str().unwrap()),
            ("PLIMSOLL_HARDENED", "1"),
            ("PLIMSOLL_METRICS_ADDR", "off"),
            ("SANDBOX_MEMORY_MB", "512"),
            ("SANDBOX_CPUS", "1"),
            ("SANDBOX_PIDS", "64"),
            ("SANDBOX_DISK_MB", "256"),
        ];
        p.extend_from_slice(extra);
        Config::from_env(&MapEnv::from_pairs(p)).unwrap()
    };
    let kernel = Some(plimsoll_core::Tier::Kernel);
    for addr in ["0.0.0.0:8746", "10.1.2.3:8746", "[::]:8746"] {
        let c = cfg(&[("PLIMSOLL_ADDR", addr)]);
        let w = plaintext_tokens_warning(&c).expect("plaintext tokens on a network address warn");
        for needle in [
            "PLIMSOLL_ADDR",
            "PLIMSOLL_TLS_CERT",
            "plaintext",
            "loopback",
        ] {
            assert!(w.contains(needle), "{needle:?} missing: {w}");
        }
        let v = hardened_violations(&c, kernel);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].contains("PLIMSOLL_ADDR") && v[0].contains("PLIMSOLL_TLS_CERT"),
            "{v:?}"
        );
    }
    // Loopback, or TLS on the listener: no warning, nothing missing.
    for extra in [
        &[("PLIMSOLL_ADDR", "127.0.0.1:8746")][..],
        &[("PLIMSOLL_ADDR", "[::1]:8746")][..],
        &[
            ("PLIMSOLL_ADDR", "0.0.0.0:8746"),
            ("PLIMSOLL_TLS_CERT", "/etc/plimsoll/tls.crt"),
            ("PLIMSOLL_TLS_KEY", "/etc/plimsoll/tls.key"),
        ][..],
    ] {
        let c = cfg(extra);
        assert_eq!(plaintext_tokens_warning(&c), None, "{extra:?}");
        assert!(hardened_violations(&c, kernel).is_empty(), "{extra:?}");
    }
}

#[tokio::test]
async fn shutdown_answers_the_run_in_flight_and_refuses_new_ones() {
    let f = daemon_with(&[]).await;
    let mut c = client(&f).await;
    let token = f.token.clone();
    let req = js("setTimeout(() => console.log('finished'), 1200)");
    let inflight = tokio::spawn(async move { c.run(authed(req, &token)).await });
    tokio::time::sleep(Duration::from_millis(400)).await;
    f.daemon.shutdown().await;
    let resp = inflight
        .await
        .unwrap()
        .expect("the run in flight is answered, not dropped")
        .into_inner();
    assert!(matches!(resp.result, Some(R::Javascript(ref j)) if j.stdout == b"finished\n"));
}
