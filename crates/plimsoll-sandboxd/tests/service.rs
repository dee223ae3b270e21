//! The sandboxd service over real sockets (TCP and Unix) with the real runner: the token
//! check, one payload at a time, Health, and the client's error sorting.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plimsoll_core::sandboxd_pb::sandboxd_client::SandboxdClient as RawClient;
use plimsoll_core::sandboxd_pb::{
    execute_request, execute_response, EnvVar, ExecuteRequest, HealthRequest,
};
use plimsoll_core::{not_dispatched_reason, pb, Reason};
use plimsoll_runner::{Limits, Runner, RunnerConfig};
use plimsoll_sandboxd::{
    serve_tcp, serve_unix, Auth, CallCounts, CallError, SandboxdClient, SandboxdService, Token,
    TokenFile,
};

const OLD: &str = "old-token-0123456789abcdef";
const NEW: &str = "new-token-0123456789abcdef";

struct Served {
    addr: SocketAddr,
    counts: Arc<CallCounts>,
    token_file: PathBuf,
    tokens: Arc<TokenFile>,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn runner(dir: &Path) -> Arc<Runner> {
    Arc::new(
        Runner::new(RunnerConfig {
            root_dir: dir.join("runs"),
            limits: Limits::default(),
            default_timeout: Duration::from_secs(30),
        })
        .unwrap(),
    )
}

async fn serve() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{OLD}\n")).unwrap();
    let tokens = TokenFile::open(&token_file).unwrap();
    let svc = SandboxdService::with_languages(runner(dir.path()), vec!["shell".into()]);
    let counts = svc.counts();
    let route = svc.into_server(Auth::Tokens(tokens.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve_tcp(
        listener,
        route,
        plimsoll_sandboxd::DEFAULT_LIMITS,
        async {
            let _ = rx.await;
        },
    ));
    Served {
        addr,
        counts,
        token_file,
        tokens,
        _dir: dir,
        stop: Some(tx),
    }
}

fn project(steps: &[&str]) -> ExecuteRequest {
    ExecuteRequest {
        timeout_ms: 30_000,
        payload: Some(execute_request::Payload::Project(pb::ProjectRun {
            steps: steps.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn stdout_of(r: plimsoll_core::sandboxd_pb::ExecuteResponse) -> Vec<u8> {
    match r.result {
        Some(execute_response::Result::Project(p)) => p.steps[0].stdout.clone(),
        Some(execute_response::Result::Javascript(j)) => j.stdout,
        Some(execute_response::Result::Cell(c)) => c.stdout,
        None => panic!("no result"),
    }
}

#[tokio::test]
async fn missing_and_wrong_tokens_are_refused_marked_permission_before_anything_runs() {
    let s = serve().await;
    let marker = s._dir.path().join("ran");
    let req = project(&[&format!("touch {}", marker.display())]);

    // No authorization header at all.
    let mut raw = RawClient::connect(format!("http://{}", s.addr))
        .await
        .unwrap();
    let status = raw.execute(req.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert_eq!(not_dispatched_reason(&status), Some(Reason::Permission));
    let status = raw.health(HealthRequest {}).await.unwrap_err();
    assert_eq!(not_dispatched_reason(&status), Some(Reason::Permission));

    // A header with another scheme.
    let mut req_basic = tonic::Request::new(req.clone());
    req_basic
        .metadata_mut()
        .insert("authorization", format!("Basic {OLD}").parse().unwrap());
    let status = raw.execute(req_basic).await.unwrap_err();
    assert_eq!(not_dispatched_reason(&status), Some(Reason::Permission));

    // A wrong token, through the client plimsolld uses.
    let wrong = Token::new("wrong-token-0123456789abcdef").unwrap();
    let c = SandboxdClient::connect_plain(s.addr, &wrong).await.unwrap();
    let e = c.execute(req.clone()).await.unwrap_err();
    assert_eq!(e.not_dispatched(), Some(Reason::Permission));
    assert!(matches!(e, CallError::Refused(_)), "{e}");

    assert!(!marker.exists(), "a payload ran without a valid token");
    assert_eq!(
        s.counts.executed.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(
        s.counts
            .unauthenticated
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );

    // The right token runs it.
    let good = SandboxdClient::connect_plain(s.addr, &Token::new(OLD).unwrap())
        .await
        .unwrap();
    good.execute(req).await.unwrap();
    assert!(marker.exists());
}

#[tokio::test]
async fn two_tokens_are_accepted_during_a_rotation() {
    let s = serve().await;
    let new = Token::new(NEW).unwrap();
    let c = SandboxdClient::connect_plain(s.addr, &new).await.unwrap();
    let e = c.health().await.unwrap_err();
    assert_eq!(e.not_dispatched(), Some(Reason::Permission));

    std::fs::write(&s.token_file, format!("{NEW}\n{OLD}\n")).unwrap();
    assert!(s.tokens.refresh().unwrap());
    c.health().await.unwrap();
    let old = SandboxdClient::connect_plain(s.addr, &Token::new(OLD).unwrap())
        .await
        .unwrap();
    old.health().await.unwrap();

    std::fs::write(&s.token_file, format!("{NEW}\n")).unwrap();
    assert!(s.tokens.refresh().unwrap());
    assert_eq!(
        old.health().await.unwrap_err().not_dispatched(),
        Some(Reason::Permission)
    );
    c.health().await.unwrap();
}

#[tokio::test]
async fn a_second_payload_while_one_runs_is_refused_marked_capacity() {
    let s = serve().await;
    let token = Token::new(OLD).unwrap();
    let c = SandboxdClient::connect_plain(s.addr, &token).await.unwrap();
    let started = s._dir.path().join("started");
    let release = s._dir.path().join("release");
    let first = {
        let c = c.clone();
        let req = project(&[&format!(
            "touch {} && while [ ! -e {} ]; do sleep 0.05; done && echo first",
            started.display(),
            release.display()
        )]);
        tokio::spawn(async move { c.execute(req).await })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !started.exists() {
        assert!(Instant::now() < deadline, "the first payload never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second_marker = s._dir.path().join("second");
    let e = c
        .execute(project(&[&format!("touch {}", second_marker.display())]))
        .await
        .unwrap_err();
    assert_eq!(e.not_dispatched(), Some(Reason::Capacity), "{e}");
    std::fs::write(&release, "").unwrap();
    let out = first.await.unwrap().unwrap();
    assert_eq!(stdout_of(out), b"first\n");
    assert!(!second_marker.exists());
    // Once the first is done, the next one runs.
    let out = c.execute(project(&["echo again"])).await.unwrap();
    assert_eq!(stdout_of(out), b"again\n");
}

#[tokio::test]
async fn health_reports_the_proven_languages() {
    let dir = tempfile::tempdir().unwrap();
    let svc = SandboxdService::new(runner(dir.path())).await;
    assert!(
        svc.languages().iter().any(|l| l == "shell"),
        "{:?}",
        svc.languages()
    );
    let langs = svc.languages().to_vec();
    let route = svc.into_server(Auth::InsecureNoToken);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve_tcp(
        listener,
        route,
        plimsoll_sandboxd::DEFAULT_LIMITS,
        std::future::pending(),
    ));
    let c = SandboxdClient::connect_plain(addr, &Token::new(OLD).unwrap())
        .await
        .unwrap();
    let h = c.health().await.unwrap();
    assert_eq!(h.languages, langs);
    assert_eq!(h.version, env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn the_unix_socket_variant_runs_javascript() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = {
        let f = dir.path().join("token");
        std::fs::write(&f, OLD).unwrap();
        TokenFile::open(&f).unwrap()
    };
    let svc = SandboxdService::with_languages(runner(dir.path()), vec![]);
    let route = svc.into_server(Auth::Tokens(tokens));
    let sock = dir.path().join("sandboxd.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(serve_unix(
        listener,
        route,
        plimsoll_sandboxd::UNIX_SOCKET_LIMITS,
        std::future::pending(),
    ));
    let c = SandboxdClient::connect_unix(&sock, &Token::new(OLD).unwrap())
        .await
        .unwrap();
    let out = c
        .execute(ExecuteRequest {
            timeout_ms: 30_000,
            payload: Some(execute_request::Payload::Javascript(pb::JavaScriptRun {
                code: "console.log(6 * 7)".into(),
                ..Default::default()
            })),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(stdout_of(out), b"42\n");
    // A socket path with nothing behind it: not dispatched.
    let e =
        SandboxdClient::connect_unix(&dir.path().join("nothing.sock"), &Token::new(OLD).unwrap())
            .await
            .unwrap_err();
    assert_eq!(e.not_dispatched(), Some(Reason::Environment));
}

#[tokio::test]
async fn refused_env_and_empty_payload_are_request_refusals() {
    let s = serve().await;
    let c = SandboxdClient::connect_plain(s.addr, &Token::new(OLD).unwrap())
        .await
        .unwrap();
    let mut req = project(&["echo hi"]);
    req.env = vec![EnvVar {
        name: "LD_PRELOAD".into(),
        value: "/tmp/x.so".into(),
    }];
    let e = c.execute(req).await.unwrap_err();
    assert_eq!(e.not_dispatched(), Some(Reason::Request), "{e}");
    let e = c
        .execute(ExecuteRequest {
            timeout_ms: 1000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.not_dispatched(), Some(Reason::Request), "{e}");
    let mut ok = project(&["echo $RELAY"]);
    ok.env = vec![EnvVar {
        name: "RELAY".into(),
        value: "127.0.0.1:1".into(),
    }];
    assert_eq!(stdout_of(c.execute(ok).await.unwrap()), b"127.0.0.1:1\n");
}
