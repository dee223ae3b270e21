//! plimsoll-sandboxd started with a descriptor its supervisor left open (fd 7 on a 0600
//! file), alone and in session mode: a run lists its descriptors, tries to read and write
//! fd 7, and sees nothing; the file is unchanged.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use plimsoll_core::pb;
use plimsoll_core::sandboxd_pb::{execute_request, execute_response, ExecuteRequest};
use plimsoll_sandboxd::{SandboxdClient, Token};
use plimsoll_testkit::inherited::{self, Secret, PROBE};

const TOKEN: &str = "fds-token-0123456789abcdef";

fn probe_in(args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let secret = Secret::new(dir.path());
    let sock = dir.path().join("sandboxd.sock");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let mut child = secret
        .command(env!("CARGO_BIN_EXE_plimsoll-sandboxd"))
        .arg("--unix-socket")
        .arg(&sock)
        .arg("--token-file")
        .arg(&token_file)
        .arg("--root-dir")
        .arg(dir.path().join("runs"))
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[sandboxd] {line}");
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let l = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("sandboxd never said it was listening");
        if l.contains("listening on unix:") {
            break;
        }
    }
    if let Some(held) = inherited::holds_fd(child.id()) {
        assert!(held, "the supervisor's descriptor did not reach sandboxd");
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let out = rt.block_on(async {
        let c = SandboxdClient::connect_unix(&sock, &Token::new(TOKEN).unwrap())
            .await
            .unwrap();
        c.execute(ExecuteRequest {
            timeout_ms: 30_000,
            payload: Some(execute_request::Payload::Project(pb::ProjectRun {
                steps: vec![PROBE.to_owned()],
                ..Default::default()
            })),
            ..Default::default()
        })
        .await
    });
    let _ = child.kill();
    let _ = child.wait();
    let out = out.unwrap();
    let Some(execute_response::Result::Project(p)) = out.result else {
        panic!("{out:?}")
    };
    let s = &p.steps[0];
    secret.assert_unreached(&format!(
        "{}\n{}",
        String::from_utf8_lossy(&s.stdout),
        String::from_utf8_lossy(&s.stderr)
    ));
}

#[test]
fn a_run_does_not_inherit_sandboxds_descriptors() {
    probe_in(&[]);
}

#[test]
fn a_session_call_does_not_inherit_sandboxds_descriptors() {
    probe_in(&["--session"]);
}
