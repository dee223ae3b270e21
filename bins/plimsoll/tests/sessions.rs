//! The session commands driven as a script would drive them, against a real `plimsolld`
//! child process (process provider, sessions on, no authentication) and real state files.
//!
//! The same scenarios also run against an in-process daemon whose provider keeps fake
//! sessions (`fake/mod.rs`), so the CLI's side is tested before a real provider keeps sessions.
//!
//! `plimsolld` is the binary built beside `plimsoll` (`cargo build -p plimsolld`): cargo
//! only hands a package's own binaries to its tests.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use plimsoll_testkit::plimsolld::Plimsolld;

mod fake;

/// What the tests against a real plimsolld need.
const NEEDS: &str = "a provider whose sessions pass plimsolld's startup smoke test";

fn plimsolld_bin() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_plimsoll")).with_file_name("plimsolld");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p plimsolld` first",
        bin.display()
    );
    bin
}

/// A plimsolld with the process provider and room for four sessions, and its address.
fn daemon(dir: &Path) -> (Plimsolld, String) {
    let bin = plimsolld_bin();
    let reaper = reaper();
    let reaper: Vec<&str> = reaper.iter().map(String::as_str).collect();
    let mut d = Plimsolld::spawn_as(
        bin.to_str().unwrap(),
        dir,
        &[
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_MAX_SESSIONS", "4"),
            ("SANDBOX_MAX_SESSIONS_PER_CALLER", "4"),
        ],
        &reaper,
    );
    let addr = d
        .serving()
        .unwrap_or_else(|| panic!("plimsolld did not start (this needs {NEEDS}):\n{}", d.log()));
    (d, addr)
}

/// `PLIMSOLL_TEST_REAPER`, split on whitespace: a command that runs plimsolld (and plimsoll)
/// under a child subreaper that reaps at once, such as `/usr/bin/tini -s --`. Where PID 1
/// reaps orphans late, a swept process stays a zombie for a while and plimsolld's session
/// smoke test takes it for one left alive.
fn reaper() -> Vec<String> {
    std::env::var("PLIMSOLL_TEST_REAPER")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
}

fn plimsoll_in(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let reaper = reaper();
    let mut cmd = match reaper.split_first() {
        None => Command::new(env!("CARGO_BIN_EXE_plimsoll")),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(env!("CARGO_BIN_EXE_plimsoll"));
            c
        }
    };
    let mut child = cmd
        .args(args)
        .current_dir(dir)
        .env_remove("PLIMSOLL_ADDR")
        .env("RUST_LOG", "info")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the plimsoll binary starts");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

fn plimsoll(dir: &Path, args: &[&str]) -> Output {
    plimsoll_in(dir, args, None)
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[track_caller]
fn code(o: &Output, want: i32) {
    assert_eq!(o.status.code(), Some(want), "{}", text(o));
}

fn state_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A python cell in the session of `dir/state.json`.
fn python_cell(dir: &Path, code: &str) -> Output {
    let args = [
        "session",
        "cell",
        "--state",
        "state.json",
        "--language",
        "python",
    ];
    let mut args = args.to_vec();
    args.extend(["-e", code]);
    plimsoll(dir, &args)
}

/// `session open` into `dir/s.json` against an address where nothing listens.
fn open_nowhere(dir: &Path) -> Output {
    let args = "session open --addr 127.0.0.1:1 --state s.json";
    plimsoll(dir, &args.split(' ').collect::<Vec<_>>())
}

/// Opens a session into `dir/state.json`; returns the file's path.
fn open(dir: &Path, addr: &str, extra: &[&str]) -> (PathBuf, Output) {
    let state = dir.join("state.json");
    let mut args = vec!["session", "open", "--addr", addr, "--state", "state.json"];
    args.extend_from_slice(extra);
    let o = plimsoll(dir, &args);
    (state, o)
}

#[test]
fn open_run_project_cells_close() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut daemon, addr) = daemon(d);
    let (state, o) = open(d, &addr, &[]);
    code(&o, 0);
    let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the state file is private");
    let saved = state_json(&state);
    let id = saved["session_id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 32, "{saved}");
    let fp = saved["opened"]["session"].as_str().unwrap().to_owned();
    assert!(
        stdout(&o).contains(&format!("session:   {fp}")),
        "{}",
        text(&o)
    );
    assert!(stdout(&o).contains("isolation: process"), "{}", text(&o));
    let mut outputs = vec![o];

    let o = plimsoll(
        d,
        &[
            "session",
            "run",
            "--state",
            "state.json",
            "-e",
            "require('fs').writeFileSync('note.txt', 'left by the snippet\\n')",
        ],
    );
    code(&o, 0);
    assert!(
        stdout(&o).contains(&format!("session:   {fp}  call 1  previous -")),
        "{}",
        text(&o)
    );
    outputs.push(o);

    let project = d.join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("readme.txt"), "a project\n").unwrap();
    let o = plimsoll(
        d,
        &[
            "run",
            "--session",
            "state.json",
            "--project",
            "project",
            "--step",
            "cat note.txt",
        ],
    );
    code(&o, 0);
    assert!(stdout(&o).contains("left by the snippet"), "{}", text(&o));
    assert!(stdout(&o).contains("call 2  previous "), "{}", text(&o));
    outputs.push(o);

    let cell = |code: &str| python_cell(d, code);
    let o = cell("x = 41");
    code(&o, 0);
    outputs.push(o);
    let o = cell("x + 1");
    code(&o, 0);
    assert!(stdout(&o).lines().any(|l| l == "42"), "{}", text(&o));
    assert!(stdout(&o).contains("call 4  previous "), "{}", text(&o));
    let last = state_json(&state)["last_record_sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(state_json(&state)["calls"], 4);
    outputs.push(o);

    let o = plimsoll(d, &["session", "close", "--state", "state.json"]);
    code(&o, 0);
    assert!(stdout(&o).contains("calls:     4"), "{}", text(&o));
    assert!(
        stdout(&o).contains(&format!("last:      {}", &last[..12])),
        "{}",
        text(&o)
    );
    assert!(stdout(&o).contains("ended:     closed"), "{}", text(&o));
    assert!(!state.exists(), "a closed session's state file is removed");
    outputs.push(o);

    for o in &outputs {
        assert!(
            !text(o).contains(&id),
            "the session id was printed:\n{}",
            text(o)
        );
    }
    daemon.stop();
    assert!(
        !daemon.log().contains(&id),
        "the daemon logged the session id"
    );
}

/// A tampered chain position (the call count changed) fails the next call's check (exit
/// 1) and the file then refuses every call before sending (exit 3).
fn tampered_state_scenario(d: &Path, addr: &str) {
    let (state, o) = open(d, addr, &[]);
    code(&o, 0);
    let run = || {
        plimsoll(
            d,
            &[
                "session",
                "run",
                "--state",
                "state.json",
                "-e",
                "console.log(7)",
            ],
        )
    };
    code(&run(), 0);

    let mut s = state_json(&state);
    s["calls"] = serde_json::json!(5);
    std::fs::write(&state, serde_json::to_vec(&s).unwrap()).unwrap();

    let o = run();
    code(&o, 1);
    assert!(stderr(&o).contains("record check"), "{}", text(&o));
    assert!(
        state_json(&state)["lost"].is_string(),
        "the lost chain is kept in the file"
    );

    let o = run();
    code(&o, 3);
    assert!(
        stderr(&o).contains("not dispatched (request)"),
        "{}",
        text(&o)
    );
    assert!(stdout(&o).is_empty(), "{}", text(&o));
    // The daemon counted two executed calls, the file says five.
    let o = plimsoll(d, &["session", "close", "--state", "state.json"]);
    code(&o, 1);
    assert!(stderr(&o).contains("differs"), "{}", text(&o));
}

/// The second close, from a copy of the state file, is answered from the daemon's
/// tombstone: the same counts, ended closed.
fn closing_twice_scenario(d: &Path, addr: &str) {
    let (state, o) = open(d, addr, &[]);
    code(&o, 0);
    code(
        &plimsoll(
            d,
            &[
                "session",
                "run",
                "--state",
                "state.json",
                "-e",
                "console.log(1)",
            ],
        ),
        0,
    );
    std::fs::copy(&state, d.join("copy.json")).unwrap();
    std::fs::copy(&state, d.join("copy2.json")).unwrap();
    let first = plimsoll(d, &["session", "close", "--state", "state.json"]);
    code(&first, 0);
    // The file is gone: a second close with it is a usage error naming it.
    let again = plimsoll(d, &["session", "close", "--state", "state.json"]);
    code(&again, 2);
    assert!(stderr(&again).contains("state.json"), "{}", text(&again));
    let second = plimsoll(d, &["session", "close", "--state", "copy.json"]);
    code(&second, 0);
    assert_eq!(stdout(&first), stdout(&second));
    assert!(
        stdout(&second).contains("calls:     1"),
        "{}",
        text(&second)
    );
    assert!(
        stdout(&second).contains("ended:     closed"),
        "{}",
        text(&second)
    );
    // A call in the closed session is refused: nothing ran.
    let o = plimsoll(d, &["session", "run", "--state", "copy2.json", "-e", "1"]);
    code(&o, 3);
    assert!(stderr(&o).contains("closed"), "{}", text(&o));
}

#[test]
fn a_tampered_state_fails_the_chain_then_refuses_before_sending() {
    let dir = tempfile::tempdir().unwrap();
    let (mut daemon, addr) = daemon(dir.path());
    tampered_state_scenario(dir.path(), &addr);
    daemon.stop();
}

#[test]
fn closing_twice_answers_from_the_tombstone() {
    let dir = tempfile::tempdir().unwrap();
    let (mut daemon, addr) = daemon(dir.path());
    closing_twice_scenario(dir.path(), &addr);
    daemon.stop();
}

#[test]
fn repl_keeps_variables_and_closes_on_eof() {
    let dir = tempfile::tempdir().unwrap();
    let o = plimsoll_in(
        dir.path(),
        &["repl", "--language", "python"],
        Some("x = 41\nprint(x \\\n + 1)\n"),
    );
    code(&o, 0);
    assert!(stdout(&o).lines().any(|l| l == "42"), "{}", text(&o));
    assert!(stdout(&o).contains("calls:     2"), "{}", text(&o));
    assert!(stdout(&o).contains("ended:     closed"), "{}", text(&o));
}

#[test]
fn session_open_without_addr_exits_2_naming_addr() {
    let dir = tempfile::tempdir().unwrap();
    let o = plimsoll(dir.path(), &["session", "open", "--state", "s.json"]);
    code(&o, 2);
    assert!(stderr(&o).contains("--addr"), "{}", text(&o));
    assert!(
        stderr(&o).contains("embedded daemon would die"),
        "{}",
        text(&o)
    );
    assert!(!dir.path().join("s.json").exists());
}

#[test]
fn session_open_refuses_an_existing_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.json");
    std::fs::write(&file, "keep me").unwrap();
    // Nothing listens there: the file is checked before the daemon is asked.
    let o = open_nowhere(dir.path());
    code(&o, 2);
    assert!(stderr(&o).contains("already exists"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

#[test]
fn session_open_that_cannot_connect_exits_4_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let o = open_nowhere(dir.path());
    code(&o, 4);
    assert!(!dir.path().join("s.json").exists(), "{}", text(&o));
}

#[test]
fn session_calls_on_a_missing_or_broken_state_file_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["session", "run", "--state", "none.json", "-e", "1"][..],
        &[
            "session",
            "cell",
            "--state",
            "none.json",
            "--language",
            "python",
            "-e",
            "1",
        ],
        &["session", "close", "--state", "none.json"],
        &["run", "--session", "none.json", "-e", "1"],
    ] {
        let o = plimsoll(dir.path(), args);
        code(&o, 2);
        assert!(stderr(&o).contains("none.json"), "{args:?}: {}", text(&o));
    }
    std::fs::write(dir.path().join("bad.json"), "{\"addr\": 1}").unwrap();
    let o = plimsoll(dir.path(), &["session", "close", "--state", "bad.json"]);
    code(&o, 2);
    assert!(
        stderr(&o).contains("not a session state file"),
        "{}",
        text(&o)
    );
}

#[test]
fn session_help_documents_the_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    for sub in [
        &["session", "open", "--help"][..],
        &["session", "run", "--help"],
        &["session", "cell", "--help"],
        &["session", "close", "--help"],
        &["repl", "--help"],
    ] {
        let o = plimsoll(dir.path(), sub);
        code(&o, 0);
        let out = stdout(&o);
        assert!(out.contains("Exit codes:"), "{sub:?}: {out}");
        assert!(out.contains("not dispatched"), "{sub:?}: {out}");
    }
}

// ---- against the in-process daemon with fake sessions ----

#[test]
fn fake_tampered_state_fails_the_chain_then_refuses_before_sending() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = fake::Daemon::start();
    tampered_state_scenario(dir.path(), &daemon.addr);
}

#[test]
fn fake_closing_twice_answers_from_the_tombstone() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = fake::Daemon::start();
    closing_twice_scenario(dir.path(), &daemon.addr);
}

#[test]
fn fake_open_run_cell_close_keeps_the_chain_and_never_prints_the_id() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let daemon = fake::Daemon::start();
    let (state, o) = open(
        d,
        &daemon.addr,
        &[
            "--language",
            "python",
            "--language",
            "javascript",
            "--owner",
            "ci",
        ],
    );
    code(&o, 0);
    let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the state file is private");
    let id = state_json(&state)["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let fp = state_json(&state)["opened"]["session"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        stdout(&o).contains(&format!("session:   {fp}")),
        "{}",
        text(&o)
    );
    assert!(stdout(&o).contains("provider:  fake"), "{}", text(&o));
    let mut outputs = vec![o];

    let o = plimsoll(
        d,
        &["session", "run", "--state", "state.json", "-e", "snippet"],
    );
    code(&o, 0);
    assert!(
        stdout(&o).lines().any(|l| l == "js: snippet"),
        "{}",
        text(&o)
    );
    assert!(
        stdout(&o).contains(&format!("session:   {fp}  call 1  previous -")),
        "{}",
        text(&o)
    );
    let first = state_json(&state)["last_record_sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    outputs.push(o);

    let o = python_cell(d, "x + 1");
    code(&o, 0);
    assert!(
        stdout(&o).lines().any(|l| l == "cell: x + 1"),
        "{}",
        text(&o)
    );
    let line = format!("call 2  previous {}", &first[..12]);
    assert!(stdout(&o).contains(&line), "{}", text(&o));
    outputs.push(o);

    // A call that fails after it may have run: exit 1, and the file still advances.
    let o = plimsoll(d, &["run", "--session", "state.json", "-e", "fail"]);
    code(&o, 1);
    assert!(stderr(&o).contains("no answer"), "{}", text(&o));
    assert_eq!(state_json(&state)["calls"], 3);
    outputs.push(o);

    let o = plimsoll(
        d,
        &["run", "--session", "state.json", "--json", "-e", "again"],
    );
    code(&o, 0);
    let answer: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(answer["run"]["record"].is_object(), "{}", text(&o));
    outputs.push(o);

    let o = plimsoll(d, &["session", "close", "--state", "state.json"]);
    code(&o, 0);
    assert!(stdout(&o).contains("calls:     4"), "{}", text(&o));
    assert!(stdout(&o).contains("ended:     closed"), "{}", text(&o));
    assert!(!state.exists(), "a closed session's state file is removed");
    outputs.push(o);
    for o in &outputs {
        assert!(
            !text(o).contains(&id),
            "the session id was printed:\n{}",
            text(o)
        );
    }
}

#[test]
fn fake_repl_runs_a_cell_a_line_and_closes_on_eof() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = fake::Daemon::start();
    let o = plimsoll_in(
        dir.path(),
        &["repl", "--addr", &daemon.addr, "--language", "python"],
        Some("x = 41\nprint(x \\\n+ 1)\n"),
    );
    code(&o, 0);
    let out = stdout(&o);
    assert!(out.lines().any(|l| l == "cell: x = 41"), "{}", text(&o));
    assert!(out.contains("cell: print(x \n+ 1)\n"), "{}", text(&o));
    assert!(out.contains("calls:     2"), "{}", text(&o));
    assert!(out.contains("ended:     closed"), "{}", text(&o));
}
