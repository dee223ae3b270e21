//! SIGHUP re-reads the callers file (issue 38: SIGHUP used to end plimsolld, with every
//! session in it, and adding or revoking a caller needed a restart).
//!
//! Against the real process: a caller added to the file is served after SIGHUP, a caller
//! removed from it is refused, a file that does not parse keeps the table in use (and the
//! log says why), and plimsolld is still serving after every SIGHUP.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use plimsoll_callers::CallersFile;
use plimsoll_client::{Client, ClientOptions};
use plimsoll_testkit::plimsolld::Plimsolld;

const BIN: &str = env!("CARGO_BIN_EXE_plimsolld");

/// Whether a caller holding `token` is answered by `Describe`.
fn answered(url: &str, token: &str) -> Result<(), String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut c = Client::connect(
                url,
                ClientOptions {
                    token: Some(token.to_owned()),
                    ca_file: None,
                },
            )
            .await
            .map_err(|e| e.to_string())?;
            c.describe().await.map(|_| ()).map_err(|e| e.to_string())
        })
}

/// Sends SIGHUP and waits (at most 30 s) for the next log line whose message is `want`.
fn hup(p: &mut Plimsolld, want: &str) -> serde_json::Value {
    kill(Pid::from_raw(p.pid() as i32), Signal::SIGHUP).unwrap();
    p.next_message_within(want, std::time::Duration::from_secs(30))
        .unwrap_or_else(|| panic!("no {want:?} line after SIGHUP:\n{}", p.log()))
}

#[test]
fn sighup_reloads_the_callers_file_and_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let callers = dir.path().join("callers.json");
    let mut file = CallersFile::default();
    let first = file.add("first", &[]).unwrap();
    file.save(&callers).unwrap();
    let mut p = Plimsolld::spawn(
        BIN,
        dir.path(),
        &[
            ("PLIMSOLL_CLIENTS_FILE", callers.to_str().unwrap()),
            ("SANDBOX_PROVIDER", "quickjs"),
        ],
    );
    let url = p
        .serving()
        .unwrap_or_else(|| panic!("plimsolld did not serve:\n{}", p.log()));
    answered(&url, &first).unwrap();

    // A new caller: refused before the reload, served after it.
    let second = file.add("second", &[]).unwrap();
    file.save(&callers).unwrap();
    assert!(answered(&url, &second).is_err(), "served before the reload");
    let line = hup(&mut p, "callers file reloaded");
    assert_eq!(line["callers"], 2, "{line}");
    answered(&url, &second).unwrap_or_else(|e| panic!("the added caller: {e}\n{}", p.log()));
    answered(&url, &first).unwrap();

    // A revoked caller is refused from its next request.
    file.revoke("first").unwrap();
    file.save(&callers).unwrap();
    hup(&mut p, "callers file reloaded");
    let refused = answered(&url, &first).expect_err("the revoked caller was served");
    assert!(refused.contains("invalid token"), "{refused}");
    answered(&url, &second).unwrap();

    // A file that does not parse: the table in use stays, and the log says why.
    std::fs::write(&callers, "{\"clients\": [").unwrap();
    let line = hup(&mut p, "callers file not reloaded; the table in use stays");
    assert!(
        line["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{line}"
    );
    answered(&url, &second).unwrap_or_else(|e| panic!("after a bad file: {e}\n{}", p.log()));
    assert!(answered(&url, &first).is_err());

    // Still the same process, and it stops as before.
    assert_eq!(p.stop().code(), Some(0), "{}", p.log());
}
