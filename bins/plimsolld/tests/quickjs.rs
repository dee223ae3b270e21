//! plimsolld with `SANDBOX_PROVIDER=quickjs`: the real binary re-executes itself as the
//! worker, states tier `process` and its engine in `Describe`, answers with a record the
//! client check accepts, and refuses projects marked `unsupported`.

use plimsoll_client::{Client, ClientError, ClientOptions};
use plimsoll_core::pb::{self, run_request::Payload, run_response::Result as R};
use plimsoll_core::Reason;
use plimsoll_testkit::plimsolld::Plimsolld;

const BIN: &str = env!("CARGO_BIN_EXE_plimsolld");

fn request(payload: Payload) -> pb::RunRequest {
    pb::RunRequest {
        protocol: 5,
        timeout_ms: 5_000,
        payload: Some(payload),
        ..Default::default()
    }
}

#[test]
fn plimsolld_serves_snippets_from_its_own_quickjs_worker() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Plimsolld::spawn(
        BIN,
        dir.path(),
        &[
            ("SANDBOX_PROVIDER", "quickjs"),
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_MEMORY_MB", "32"),
        ],
    );
    let addr = d.serving().unwrap_or_else(|| panic!("{}", d.log()));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = Client::connect(&addr, ClientOptions::default())
            .await
            .unwrap();
        let desc = c.describe().await.unwrap();
        assert_eq!(desc.sandbox, "quickjs");
        let text = serde_json::to_string(&desc).unwrap();
        assert!(text.contains("quickjs:quickjs-ng-"), "{text}");

        // The client checks the record (digests, tier against the floor) before answering.
        let resp = c
            .run(request(Payload::Javascript(pb::JavaScriptRun {
                code: "console.log([1, 2, 3].map(x => x * 2).join(','))".into(),
                grant_profile: String::new(),
            })))
            .await
            .unwrap();
        let Some(R::Javascript(j)) = &resp.result else {
            panic!("{resp:?}")
        };
        assert_eq!(j.stdout, b"2,4,6\n");
        assert_eq!(resp.isolation, "process");
        assert_eq!(resp.record.as_ref().unwrap().record_sha256.len(), 64);

        let err = c
            .run(request(Payload::Project(pb::ProjectRun {
                steps: vec!["echo no".into()],
                ..Default::default()
            })))
            .await
            .unwrap_err();
        match err {
            ClientError::Refused { reason, .. } => assert_eq!(reason, Reason::Unsupported),
            other => panic!("{other:?}"),
        }
    });
    assert_eq!(d.stop().code(), Some(0), "{}", d.log());
}
