//! sandboxd's session mode over a real Unix socket with the real runner: files persist
//! across calls, what a call started is gone by the next, a python cell keeps its
//! variables, every answer states the session's facts; a one-shot sandboxd refuses cells.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::sandboxd_pb::{
    execute_request::Payload, execute_response, ExecuteRequest, ExecuteResponse, HealthRequest,
};
use plimsoll_core::{not_dispatched_reason, pb, Reason};
use plimsoll_runner::{Limits, Runner, RunnerConfig};
use plimsoll_sandboxd::{serve_unix, Auth, SandboxdService};

use plimsoll_core::sandboxd_pb::sandboxd_client::SandboxdClient as RawClient;

async fn serve(dir: &Path, session: bool) -> RawClient<tonic::transport::Channel> {
    let runner = Arc::new(
        Runner::new(RunnerConfig {
            root_dir: dir.join("runs"),
            limits: Limits::default(),
            default_timeout: Duration::from_secs(30),
        })
        .unwrap(),
    );
    let mut svc = SandboxdService::with_languages(runner, vec!["shell".into()]);
    if session {
        svc = svc.into_session().unwrap();
    }
    assert_eq!(svc.is_session(), session);
    let route = svc.into_server(Auth::InsecureNoToken);
    let sock = dir.join("sd.sock");
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(serve_unix(
        listener,
        route,
        plimsoll_sandboxd::UNIX_SOCKET_LIMITS,
        std::future::pending(),
    ));
    let channel = tonic::transport::Endpoint::from_static("http://sandboxd.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let sock = sock.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(sock).await?,
                ))
            }
        }))
        .await
        .unwrap();
    RawClient::new(channel)
}

fn req(payload: Payload) -> ExecuteRequest {
    ExecuteRequest {
        timeout_ms: 20_000,
        payload: Some(payload),
        ..Default::default()
    }
}

fn project(steps: &[&str]) -> Payload {
    Payload::Project(pb::ProjectRun {
        steps: steps.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
}

fn python(code: &str) -> Payload {
    Payload::Cell(pb::CellRun {
        language: "python".into(),
        code: code.into(),
        files: vec![],
    })
}

async fn call(c: &mut RawClient<tonic::transport::Channel>, p: Payload) -> ExecuteResponse {
    c.execute(req(p)).await.unwrap().into_inner()
}

fn step_out(r: &ExecuteResponse, i: usize) -> String {
    match &r.result {
        Some(execute_response::Result::Project(p)) => String::from_utf8_lossy(&p.steps[i].stdout)
            .trim()
            .to_owned(),
        other => panic!("expected a project result, got {other:?}"),
    }
}

fn cell_out(r: &ExecuteResponse) -> String {
    match &r.result {
        Some(execute_response::Result::Cell(c)) => {
            String::from_utf8_lossy(&c.stdout).trim().to_owned()
        }
        other => panic!("expected a cell result, got {other:?}"),
    }
}

#[tokio::test]
async fn a_session_keeps_files_and_cells_and_sweeps_each_call() {
    // As sandboxd is PID 1 in a container, this process becomes the parent of whatever a
    // call leaves behind, so its zombies are sandboxd's to reap.
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut c = serve(dir.path(), true).await;
    assert!(
        c.health(HealthRequest {})
            .await
            .unwrap()
            .into_inner()
            .session
    );

    let w = call(
        &mut c,
        project(&["echo kept > f.txt", "head -c 100000 /dev/zero > big"]),
    )
    .await;
    assert!(w.session, "{w:?}");
    assert!(!w.session_boundary_failed);
    assert!(w.session_changed.is_empty());
    assert!(w.session_disk_bytes >= 100_000, "{}", w.session_disk_bytes);

    let r = call(&mut c, project(&["cat f.txt"])).await;
    assert_eq!(step_out(&r, 0), "kept");

    // A background process started in one call is gone by the next.
    let bg = call(
        &mut c,
        project(&["sleep 300 & echo $! > pid; echo started"]),
    )
    .await;
    assert_eq!(step_out(&bg, 0), "started");
    assert!(!bg.session_boundary_failed);
    let check = call(
        &mut c,
        // A zombie counts as alive: sandboxd must have reaped it.
        project(&["if kill -0 $(cat pid) 2>/dev/null; then echo alive; else echo gone; fi"]),
    )
    .await;
    assert_eq!(step_out(&check, 0), "gone");

    // A python cell keeps its variables across calls.
    let a = call(&mut c, python("x = 6 * 7")).await;
    assert!(a.session, "{a:?}");
    let b = call(&mut c, python("print(x)")).await;
    assert_eq!(cell_out(&b), "42");
}

#[tokio::test]
async fn a_one_shot_sandboxd_refuses_cells_and_states_no_session() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = serve(dir.path(), false).await;
    assert!(
        !c.health(HealthRequest {})
            .await
            .unwrap()
            .into_inner()
            .session
    );
    let e = c.execute(req(python("print(1)"))).await.unwrap_err();
    assert_eq!(
        not_dispatched_reason(&e),
        Some(Reason::Unsupported),
        "{e:?}"
    );
    assert!(e.message().contains("--session"), "{}", e.message());

    let w = call(&mut c, project(&["echo x > f.txt"])).await;
    assert!(!w.session);
    assert_eq!(w.session_disk_bytes, 0);
    let r = call(&mut c, project(&["cat f.txt 2>/dev/null || echo missing"])).await;
    assert_eq!(step_out(&r, 0), "missing");
}
