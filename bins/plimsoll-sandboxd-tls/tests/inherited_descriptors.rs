//! plimsoll-sandboxd-tls started with a descriptor its supervisor left open (fd 7 on a 0600
//! file): the sandboxd it starts does not hold it, and a run through the TLS channel lists
//! its descriptors, tries to read and write fd 7, and sees nothing; the file is unchanged.

mod common;

use common::*;
use plimsoll_core::pb;
use plimsoll_core::sandboxd_pb::{execute_request, execute_response, ExecuteRequest};
use plimsoll_sandboxd::SandboxdClient;
use plimsoll_testkit::inherited::{self, Secret, PROBE};
use plimsoll_tls::ClientTls;

#[test]
fn the_terminators_sandboxd_and_its_runs_do_not_inherit_its_descriptors() {
    let ca = Ca::new("ca");
    let dir = tempfile::tempdir().unwrap();
    let secret = Secret::new(dir.path());
    let pod = Pod::start_through(
        &ca.leaf(&[SERVER_NAME]),
        PodOpts::default(),
        &secret.prefix(),
    );
    let terminator = pod.proc.child.id();
    if let Some(held) = inherited::holds_fd(terminator) {
        assert!(
            held,
            "the supervisor's descriptor did not reach the terminator"
        );
    }
    let sandboxd = pod.sandboxd_pid() as u32;
    match inherited::holds_fd(sandboxd) {
        Some(held) => assert!(!held, "sandboxd inherited the terminator's fd 7"),
        // sandboxd is not dumpable: only root reads its descriptors from outside.
        None => eprintln!("note: sandboxd's descriptors are not readable from outside (not root)"),
    }
    let tls = ClientTls::from_ca_file(ca_file(pod.work.path(), &[&ca]), SERVER_NAME).unwrap();
    runtime().block_on(async {
        let c = SandboxdClient::connect_tls(&tls, pod.addr, &token())
            .await
            .unwrap();
        let out = c
            .execute(ExecuteRequest {
                timeout_ms: 30_000,
                payload: Some(execute_request::Payload::Project(pb::ProjectRun {
                    steps: vec![PROBE.to_owned()],
                    ..Default::default()
                })),
                ..Default::default()
            })
            .await
            .unwrap();
        let Some(execute_response::Result::Project(p)) = out.result else {
            panic!("{out:?}")
        };
        let s = &p.steps[0];
        secret.assert_unreached(&format!(
            "{}\n{}",
            String::from_utf8_lossy(&s.stdout),
            String::from_utf8_lossy(&s.stderr)
        ));
    });
}
