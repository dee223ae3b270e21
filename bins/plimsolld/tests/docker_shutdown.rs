//! SIGTERM to a real `plimsolld` on the real Docker engine leaves no container of its
//! instance behind: not while the warm pool refills, not during the startup smoke test, not
//! during a run (issue 22). `docs/docker.md` ("Stopping") states what shutdown guarantees.
//!
//! Without an engine or the sandbox image (`cargo xtask images`) these tests skip with a
//! message, unless `PLIMSOLL_REQUIRE_DOCKER=1` (CI), when they fail.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use bollard::Docker;
use plimsoll_core::pb;
use plimsoll_docker::engine::{containers_labelled, remove, LABEL_INSTANCE};

#[path = "../../../crates/plimsoll-docker/tests/support/mod.rs"]
mod docker_support;
use plimsoll_testkit::plimsolld::Plimsolld;

const BIN: &str = env!("CARGO_BIN_EXE_plimsolld");

/// plimsolld on the docker provider (the image and runtime the engine gate chose), insecure,
/// with its state in `state`.
fn spawn(state: &Path, vars: &[(&str, &str)]) -> Plimsolld {
    let runtime = docker_support::runtime();
    let state_dir = state.to_str().unwrap();
    let mut all = vec![
        ("PLIMSOLL_INSECURE", "1"),
        ("PLIMSOLL_STATE_DIR", state_dir),
        ("SANDBOX_PROVIDER", "docker"),
        ("SANDBOX_DOCKER_IMAGE", docker_support::IMAGE),
        ("SANDBOX_DOCKER_RUNTIME", runtime.as_str()),
    ];
    all.extend_from_slice(vars);
    Plimsolld::spawn(BIN, state, &all)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The engine with the sandbox image, or `None` (skip).
fn engine(rt: &tokio::runtime::Runtime) -> Option<Docker> {
    rt.block_on(docker_support::engine())
}

fn labelled(rt: &tokio::runtime::Runtime, d: &Docker, instance: &str) -> Vec<String> {
    rt.block_on(containers_labelled(d, LABEL_INSTANCE, instance))
        .unwrap()
}

/// The instance id whose lock the daemon holds in its state directory, once it exists.
fn instance_of(p: &mut Plimsolld, state: &Path) -> String {
    let dir = state.join("docker").join("instances");
    loop {
        let found: Vec<String> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".lock"))
                    .map(str::to_owned)
            })
            .collect();
        if let [one] = found.as_slice() {
            return one.clone();
        }
        assert!(found.len() <= 1, "more than one instance: {found:?}");
        if let Some(status) = p.child.try_wait().unwrap() {
            panic!(
                "plimsolld exited ({status}) before claiming its instance:\n{}",
                p.log()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Returns what is labelled with `instance` now, and removes it, so a failing test leaves
/// no container behind either. The engine may still be creating one (a daemon that exited
/// mid-create): the removal is repeated until the label lists nothing, a few times at most.
fn sweep(rt: &tokio::runtime::Runtime, d: &Docker, instance: &str) -> Vec<String> {
    let found = labelled(rt, d, instance);
    let mut left = found.clone();
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        for id in &left {
            rt.block_on(remove(d, id));
        }
        std::thread::sleep(Duration::from_millis(100));
        left = labelled(rt, d, instance);
    }
    found
}

#[test]
fn sigterm_while_the_warm_pool_refills_leaves_no_container() {
    let rt = runtime();
    let Some(d) = engine(&rt) else { return };
    let mut rounds = Vec::new();
    let mut dirs = Vec::new();
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let mut p = spawn(&state, &[("SANDBOX_DOCKER_POOL", "2")]);
        let instance = instance_of(&mut p, &state);
        if p.wait_message("serving").is_none() {
            sweep(&rt, &d, &instance);
            panic!(
                "round {round}: plimsolld ended before serving:\n{}",
                p.log()
            );
        }
        // The refills start as it serves: SIGTERM lands while they launch containers.
        p.sigterm();
        let status = p.wait();
        let left = labelled(&rt, &d, &instance);
        rounds.push((round, instance, status, left, p.log()));
        dirs.push(dir);
    }
    // Looked at again after every round, so a container the engine finished creating
    // after its daemon exited is found too.
    let mut failures = Vec::new();
    for (round, instance, status, left, log) in &rounds {
        let later = sweep(&rt, &d, instance);
        if !status.success() || !left.is_empty() || !later.is_empty() {
            failures.push(format!(
                "round {round}: exit {status}, containers of instance {instance} left at exit {left:?}, later {later:?}\n{log}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rounds failed:\n{}",
        failures.len(),
        rounds.len(),
        failures.join("\n\n")
    );
}

#[test]
fn sigterm_during_the_startup_smoke_test_leaves_no_container() {
    let rt = runtime();
    let Some(d) = engine(&rt) else { return };
    let mut hits = 0;
    let mut failures = Vec::new();
    // The window is the smoke test (a real node, python3 and sh run in one container):
    // SIGTERM is sent as soon as that container exists. A round whose daemon served
    // before the signal landed is not counted.
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let mut p = spawn(&state, &[("SANDBOX_DOCKER_POOL", "0")]);
        let instance = instance_of(&mut p, &state);
        loop {
            if !labelled(&rt, &d, &instance).is_empty() || p.has_logged("serving") {
                break;
            }
            if p.child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        p.sigterm();
        let status = p.wait();
        let served = p.has_logged("serving");
        let left = sweep(&rt, &d, &instance);
        if !served {
            hits += 1;
        }
        if !status.success() || !left.is_empty() {
            failures.push(format!(
                "round {round} (served before the signal: {served}): exit {status}, containers of instance {instance} left {left:?}\n{}",
                p.log()
            ));
        }
        if hits > 0 {
            break;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(
        hits > 0,
        "SIGTERM never landed during the smoke test in 3 rounds"
    );
}

/// One HTTP/1.0 GET on the metrics listener; the body.
fn metrics(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn sigterm_during_a_run_answers_it_and_leaves_no_container() {
    let rt = runtime();
    let Some(d) = engine(&rt) else { return };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut p = spawn(
        &state,
        &[
            ("SANDBOX_DOCKER_POOL", "1"),
            ("PLIMSOLL_METRICS_ADDR", "127.0.0.1:0"),
        ],
    );
    let instance = instance_of(&mut p, &state);
    let Some(serving) = p.wait_message("serving") else {
        sweep(&rt, &d, &instance);
        panic!("plimsolld ended before serving:\n{}", p.log());
    };
    let addr = serving["addr"].as_str().unwrap().to_owned();
    let maddr = serving["metrics"]
        .as_str()
        .and_then(|m| m.strip_prefix("Some(")?.strip_suffix(')'))
        .unwrap()
        .to_owned();

    // The run waits for a file the test writes into its run directory (the container's
    // /run/plimsoll), so it is in flight for certain when SIGTERM is sent.
    let (tx, answer) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = runtime();
        let r = rt.block_on(async {
            let mut c = plimsoll_client::Client::connect(
                &format!("http://{addr}"),
                plimsoll_client::ClientOptions::default(),
            )
            .await?;
            c.run(pb::RunRequest {
                protocol: 5,
                timeout_ms: 120_000,
                payload: Some(pb::run_request::Payload::Project(pb::ProjectRun {
                    files: vec![],
                    steps: vec![
                        "while [ ! -e /run/plimsoll/go ]; do sleep 0.02; done; echo done".into(),
                    ],
                    artifacts: vec![],
                    grant_profile: String::new(),
                })),
                ..Default::default()
            })
            .await
        });
        let _ = tx.send(r);
    });
    while !metrics(&maddr).contains("\nplimsoll_inflight 1\n") {
        std::thread::sleep(Duration::from_millis(5));
    }
    p.sigterm();
    // Let every container of this instance (the run's among them) find its file.
    let runs = state.join("docker").join("instances").join(&instance);
    let answer = loop {
        if let Ok(a) = answer.try_recv() {
            break a;
        }
        for e in std::fs::read_dir(&runs).into_iter().flatten().flatten() {
            let _ = std::fs::write(e.path().join("go"), "");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let status = p.wait();
    let left = sweep(&rt, &d, &instance);
    let log = p.log();
    let resp = answer.unwrap_or_else(|e| panic!("the run in flight was not answered: {e}\n{log}"));
    let Some(pb::run_response::Result::Project(r)) = resp.result else {
        panic!("no project result: {resp:?}")
    };
    assert_eq!(String::from_utf8_lossy(&r.steps[0].stdout), "done\n");
    assert!(status.success(), "exit {status}\n{log}");
    assert!(
        left.is_empty(),
        "containers of instance {instance} left: {left:?}\n{log}"
    );
    drop(dir);
}
