//! The embedder's API (`SetCallFiles`): a program that builds on this crate changes the call
//! files while the server runs, and the next call, fresh or in a session, sees the new set;
//! a refused set leaves the old one. Against a real in-process daemon (process provider).

use plimsoll_client::{Client, ClientOptions};
use plimsoll_core::pb;
use plimsoll_mcp::args::{decode, ToolCall};
use plimsoll_mcp::{CallFiles, PlimsollMcp};
use serde_json::{json, Value};

fn call(v: Value) -> ToolCall {
    let name = v["tool"].as_str().unwrap().to_owned();
    decode(&name, v["args"].as_object()).unwrap()
}

fn file(path: &str, content: &str) -> pb::ProjectFile {
    pb::ProjectFile {
        path: path.into(),
        content: content.into(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn call_files_change_at_run_time_for_fresh_and_session_calls() {
    let setup = plimsoll_testkit::daemon::Setup::tester();
    let daemon = setup
        .start(&[
            ("SANDBOX_MAX_SESSIONS", "2"),
            ("SANDBOX_MAX_SESSIONS_PER_CALLER", "2"),
        ])
        .await;
    let client = Client::connect(
        &format!("http://{}", daemon.rpc_addr()),
        ClientOptions {
            token: Some(setup.token(0).to_owned()),
            ca_file: None,
        },
    )
    .await
    .unwrap();
    let server = PlimsollMcp::new(client, CallFiles::new());
    let cat = json!({"tool": "run_code", "args": {"language": "shell", "code": "cat policy.txt"}});

    let r = server.call(call(cat.clone())).await;
    assert_ne!(
        r.structured_content.as_ref().unwrap()["exit_code"],
        0,
        "no call file yet"
    );

    server
        .call_files()
        .set(vec![file("policy.txt", "v1\n")])
        .unwrap();
    let r = server.call(call(cat.clone())).await;
    assert_eq!(
        r.structured_content.as_ref().unwrap()["stdout"],
        "v1\n",
        "{r:?}"
    );

    let opened = server
        .call(call(json!({"tool": "open_session", "args": {}})))
        .await;
    let handle = opened.structured_content.as_ref().unwrap()["session"]
        .as_str()
        .unwrap()
        .to_owned();
    let in_session = json!({"tool": "run_code", "args": {"language": "python", "session": handle,
        "code": "print(open('policy.txt').read().strip())"}});
    let r = server.call(call(in_session.clone())).await;
    assert_eq!(
        r.structured_content.as_ref().unwrap()["stdout"],
        "v1\n",
        "{r:?}"
    );

    server
        .call_files()
        .set(vec![file("policy.txt", "v2\n")])
        .unwrap();
    assert!(server.call_files().set(vec![file("/abs", "x")]).is_err());
    let r = server.call(call(in_session)).await;
    assert_eq!(
        r.structured_content.as_ref().unwrap()["stdout"],
        "v2\n",
        "the session's next call is rewritten: {r:?}"
    );
    let r = server.call(call(cat)).await;
    assert_eq!(
        r.structured_content.as_ref().unwrap()["stdout"],
        "v2\n",
        "{r:?}"
    );

    assert_eq!(server.open_sessions(), 1);
    server.close_all().await;
    assert_eq!(server.open_sessions(), 0);
    daemon.shutdown().await;
}
