//! The built `plimsoll` binary, driven as a script would drive it: exit codes, what goes
//! to stdout and stderr, the callers file it writes, and runs through the embedded daemon
//! and through a separately started daemon authenticated by a callers file.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use plimsoll_core::digest::stamp;
use plimsoll_core::pb;

fn plimsoll(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_plimsoll"))
        .args(args)
        .env_remove("PLIMSOLL_ADDR")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("the plimsoll binary starts")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The value after `label` on the line that starts with it.
fn field<'a>(text: &'a str, label: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(label))
        .map(str::trim)
}

// ---- callers ----

#[test]
fn callers_add_list_revoke_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("callers.json");
    let f = file.to_str().unwrap();

    let add = plimsoll(&["callers", "add", "--file", f, "--id", "ci"]);
    assert_eq!(add.status.code(), Some(0), "{}", stderr(&add));
    let out = stdout(&add);
    assert_eq!(out.lines().count(), 1, "the token alone on stdout: {out:?}");
    let token = out.trim();
    assert!(is_hex64(token), "{token:?}");
    assert!(stderr(&add).contains("restart"), "{}", stderr(&add));
    assert!(
        !stderr(&add).contains(token),
        "the token is printed once, on stdout"
    );

    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(token), "the token never reaches the file");
    assert!(text.contains(&plimsoll_callers::fingerprint(token)));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let add2 = plimsoll(&[
        "callers", "add", "--file", f, "--id", "ops", "--scope", "code:run", "--scope", "admin",
    ]);
    assert_eq!(add2.status.code(), Some(0), "{}", stderr(&add2));
    let token2 = stdout(&add2).trim().to_owned();
    assert_ne!(token, token2);

    let dup = plimsoll(&["callers", "add", "--file", f, "--id", "ci"]);
    assert_eq!(dup.status.code(), Some(2));
    assert!(stderr(&dup).contains("already exists"), "{}", stderr(&dup));
    assert!(stdout(&dup).is_empty());

    let list = plimsoll(&["callers", "list", "--file", f]);
    assert_eq!(list.status.code(), Some(0));
    let listed = stdout(&list);
    assert_eq!(listed, "ci\tcode:run\nops\tcode:run,admin\n");
    assert!(!listed.contains(&plimsoll_callers::fingerprint(token)));

    let json = plimsoll(&["callers", "list", "--file", f, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v[1]["id"], "ops");
    assert_eq!(v[1]["scopes"][1], "admin");
    assert!(v[0].get("token_sha256").is_none());

    let revoke = plimsoll(&["callers", "revoke", "--file", f, "--id", "ci"]);
    assert_eq!(revoke.status.code(), Some(0), "{}", stderr(&revoke));
    assert!(stderr(&revoke).contains("restart"));
    let list = plimsoll(&["callers", "list", "--file", f]);
    assert_eq!(stdout(&list), "ops\tcode:run,admin\n");

    let again = plimsoll(&["callers", "revoke", "--file", f, "--id", "ci"]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        stderr(&again).contains("no caller \"ci\""),
        "{}",
        stderr(&again)
    );
}

#[test]
fn callers_refuses_a_broken_file_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("callers.json");
    std::fs::write(
        &file,
        r#"{"clients":[{"id":"*","token_sha256":"ab","scopes":[]}]}"#,
    )
    .unwrap();
    let o = plimsoll(&["callers", "list", "--file", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(file.to_str().unwrap()),
        "{}",
        stderr(&o)
    );
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
}

// ---- record digest ----

fn write_json<T: serde::Serialize>(path: &Path, v: &T) {
    std::fs::write(path, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

fn stamped_pair() -> (pb::RunRequest, pb::RunResponse) {
    let req = pb::RunRequest {
        protocol: 5,
        minimum_isolation: "process".into(),
        timeout_ms: 5000,
        payload: Some(pb::run_request::Payload::Project(pb::ProjectRun {
            files: vec![pb::ProjectFile {
                path: "a.js".into(),
                content: "console.log(42)".into(),
            }],
            steps: vec!["node a.js".into()],
            artifacts: vec![],
            grant_profile: String::new(),
        })),
        ..Default::default()
    };
    let mut resp = pb::RunResponse {
        sandbox: "process".into(),
        isolation: "process".into(),
        duration_ms: 12,
        result: Some(pb::run_response::Result::Project(pb::ProjectResult {
            outcome: pb::ProjectOutcome::Completed as i32,
            steps: vec![pb::StepResult {
                command: "node a.js".into(),
                stdout: b"42\n".to_vec(),
                ..Default::default()
            }],
            ..Default::default()
        })),
        ..Default::default()
    };
    stamp(&req, &mut resp, "", 1_700_000_000_000, 1_700_000_000_012);
    (req, resp)
}

#[test]
fn record_digest_matches_a_stamped_pair_and_finds_a_tampered_byte() {
    let dir = tempfile::tempdir().unwrap();
    let (req, resp) = stamped_pair();
    let rq = dir.path().join("req.json");
    let rs = dir.path().join("resp.json");
    write_json(&rq, &req);
    write_json(&rs, &resp);
    let (rq_s, rs_s) = (rq.to_str().unwrap(), rs.to_str().unwrap());

    let ok = plimsoll(&["record", "digest", "--request", rq_s, "--response", rs_s]);
    assert_eq!(ok.status.code(), Some(0), "{}{}", stdout(&ok), stderr(&ok));
    let rec = resp.record.as_ref().unwrap();
    let text = stdout(&ok);
    for (name, want) in [
        ("request_sha256", &rec.request_sha256),
        ("result_sha256", &rec.result_sha256),
        ("record_sha256", &rec.record_sha256),
    ] {
        let line = field(&text, name).unwrap_or_else(|| panic!("{name} in {text}"));
        assert_eq!(line, format!("{want} match"));
    }

    // One byte of a step's stdout changed after stamping.
    let mut tampered = resp.clone();
    if let Some(pb::run_response::Result::Project(p)) = &mut tampered.result {
        p.steps[0].stdout[0] = b'3';
    }
    let bad = dir.path().join("tampered.json");
    write_json(&bad, &tampered);
    let o = plimsoll(&[
        "record",
        "digest",
        "--request",
        rq_s,
        "--response",
        bad.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["all_match"], false);
    assert_eq!(v["request_sha256"]["matches"], true);
    assert_eq!(v["result_sha256"]["matches"], false);
    assert_eq!(v["result_sha256"]["recorded"], rec.result_sha256.as_str());
    // The record's own digest still recomputes: only the result was changed.
    assert_eq!(v["record_sha256"]["matches"], true);

    // A request that differs from what was stamped.
    let mut other = req.clone();
    other.timeout_ms = 6000;
    let other_path = dir.path().join("other-req.json");
    write_json(&other_path, &other);
    let o = plimsoll(&[
        "record",
        "digest",
        "--request",
        other_path.to_str().unwrap(),
        "--response",
        rs_s,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(field(&stdout(&o), "request_sha256")
        .unwrap()
        .contains("MISMATCH"));
}

#[test]
fn record_digest_refuses_unreadable_input_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let rq = dir.path().join("req.json");
    std::fs::write(&rq, "{not json").unwrap();
    let o = plimsoll(&[
        "record",
        "digest",
        "--request",
        rq.to_str().unwrap(),
        "--response",
        "/nonexistent.json",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--request"), "{}", stderr(&o));
}

// ---- usage ----

#[test]
fn usage_errors_exit_2_with_one_line_naming_the_flag() {
    for (args, needle) in [
        (&["run", "--bogus", "-e", "1"][..], "--bogus"),
        (&["run", "--floor", "none", "-e", "1"][..], "--floor"),
        (&["run", "--timeout", "5h", "-e", "1"][..], "--timeout"),
        (&["run", "--timeout", "0", "-e", "1"][..], "--timeout"),
        (
            &["run", "--step", "ls", "-e", "1"][..],
            "--step needs --project",
        ),
        (
            &["run", "--artifact", "x", "-e", "1"][..],
            "--artifact needs --project",
        ),
        (&["run", "-e", "1", "x.js"][..], "cannot be used with"),
        (&["run"][..], "required"),
        (&["callers", "add", "--file", "x.json"][..], "--id"),
        (
            &[
                "run",
                "--addr",
                "127.0.0.1:9",
                "--token-file",
                "/nonexistent/token",
                "-e",
                "1",
            ][..],
            "--token-file /nonexistent/token",
        ),
        (&["run", "/nonexistent/code.js"][..], "/nonexistent/code.js"),
    ] {
        let o = plimsoll(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
}

#[test]
fn a_binary_project_file_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ok.js"), "console.log(1)").unwrap();
    std::fs::write(
        dir.path().join("image.png"),
        [0x89, b'P', b'N', b'G', 0xff, 0x00],
    )
    .unwrap();
    let o = plimsoll(&[
        "run",
        "--project",
        dir.path().to_str().unwrap(),
        "--step",
        "node ok.js",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("image.png") && stderr(&o).contains("UTF-8"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn help_documents_exit_codes_and_version_answers() {
    for args in [
        &["--help"][..],
        &["run", "--help"][..],
        &["describe", "--help"][..],
    ] {
        let o = plimsoll(args);
        assert_eq!(o.status.code(), Some(0));
        let h = stdout(&o);
        assert!(
            h.contains("Exit codes:") && h.contains("not dispatched"),
            "{args:?}: {h}"
        );
    }
    let o = plimsoll(&["record", "digest", "--help"]);
    assert!(stdout(&o).contains("Exit codes:"));
    let o = plimsoll(&["callers", "add", "--version"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains(env!("CARGO_PKG_VERSION")));
}

#[test]
fn nothing_listening_exits_4() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let o = plimsoll(&["run", "--addr", &addr, "-e", "console.log(1)"]);
    assert_eq!(o.status.code(), Some(4), "{}", stderr(&o));
    assert!(stderr(&o).contains("could not connect"), "{}", stderr(&o));
}

// ---- runs through the embedded daemon ----

#[test]
fn embedded_run_prints_output_tier_and_record() {
    let o = plimsoll(&["run", "--provider", "process", "-e", "console.log(6*7)"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.lines().any(|l| l == "42"), "{text}");
    assert_eq!(field(&text, "provider:"), Some("process"), "{text}");
    assert_eq!(field(&text, "isolation:"), Some("process"), "{text}");
    assert_eq!(field(&text, "exit code:"), Some("0"), "{text}");
    for label in ["record:", "request:", "result:"] {
        assert!(
            is_hex64(field(&text, label).unwrap_or("")),
            "{label} in {text}"
        );
    }
}

#[test]
fn embedded_floor_vm_is_refused_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // As root the run is a user of its own: let it write the marker.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let marker = dir.path().join("marker");
    let code = format!(
        "require('fs').writeFileSync({:?}, 'ran')",
        marker.to_str().unwrap()
    );
    let o = plimsoll(&["run", "--provider", "process", "--floor", "vm", "-e", &code]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not dispatched (isolation)"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty());
    assert!(!marker.exists(), "a refused run must not have run");

    // The same code without the floor does run, so the marker test can fail.
    let o = plimsoll(&["run", "--provider", "process", "-e", &code]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(marker.exists());
}

#[test]
fn exit_code_flag_returns_the_programs_code() {
    let o = plimsoll(&["run", "--provider", "process", "-e", "process.exit(7)"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(field(&stdout(&o), "exit code:"), Some("7"));
    let o = plimsoll(&[
        "run",
        "--provider",
        "process",
        "--exit-code",
        "-e",
        "process.exit(7)",
    ]);
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
    // Under quickjs an uncaught error is exit code 1.
    let o = plimsoll(&["run", "--exit-code", "-e", "throw new Error('x')"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
}

/// The README's first command on a machine with nothing but the binary: no node, python3
/// or sh on PATH, an empty environment, an empty directory.
#[test]
fn the_first_command_needs_nothing_installed() {
    let dir = tempfile::tempdir().unwrap();
    let empty_path = dir.path().join("bin");
    std::fs::create_dir(&empty_path).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_plimsoll"))
        .args(["run", "-e", "console.log(\"hello from the sandbox\")"])
        .env_clear()
        .env("PATH", &empty_path)
        .env("HOME", dir.path())
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.lines().any(|l| l == "hello from the sandbox"),
        "{text}"
    );
    assert_eq!(field(&text, "provider:"), Some("quickjs"), "{text}");
    assert_eq!(field(&text, "isolation:"), Some("process"), "{text}");
    for label in ["record:", "request:", "result:"] {
        assert!(
            is_hex64(field(&text, label).unwrap_or("")),
            "{label} in {text}"
        );
    }
    // (The process provider would still find node: the runner uses its own fixed PATH.
    // The quickjs worker executes nothing at all: its seccomp filter refuses execve.)
}

#[test]
fn embedded_quickjs_states_its_engine_and_refuses_projects() {
    let o = plimsoll(&["describe", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let text = d.to_string();
    assert!(text.contains("quickjs:quickjs-ng-"), "{text}");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "a").unwrap();
    let o = plimsoll(&[
        "run",
        "--provider",
        "quickjs",
        "--project",
        dir.path().to_str().unwrap(),
        "--step",
        "cat a.txt",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--provider process"), "{}", stderr(&o));
}

#[test]
fn embedded_project_and_json_output() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("lib")).unwrap();
    std::fs::write(dir.path().join("lib/m.js"), "module.exports = 6*7").unwrap();
    std::fs::write(
        dir.path().join("main.js"),
        "console.log(require('./lib/m.js'))",
    )
    .unwrap();
    let o = plimsoll(&[
        "run",
        "--json",
        "--project",
        dir.path().to_str().unwrap(),
        "--step",
        "node main.js > out.txt",
        "--step",
        "cat out.txt",
        "--artifact",
        "out.txt",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let resp: pb::RunResponse = serde_json::from_slice(&o.stdout).unwrap();
    let Some(pb::run_response::Result::Project(p)) = &resp.result else {
        panic!("a project result: {resp:?}")
    };
    assert_eq!(p.outcome, pb::ProjectOutcome::Completed as i32);
    assert_eq!(p.steps[1].stdout, b"42\n");
    assert_eq!(p.artifacts[0].content, b"42\n");
    assert_eq!(resp.record.unwrap().record_sha256.len(), 64);
}

#[test]
fn embedded_describe() {
    let o = plimsoll(&["describe"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert_eq!(field(&text, "protocol:"), Some("5"), "{text}");
    assert_eq!(field(&text, "isolation:"), Some("process"), "{text}");
    let o = plimsoll(&["describe", "--json"]);
    let d: pb::DescribeResponse = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(d.protocol, 5);
}

// ---- a daemon started apart, with a callers file written by the CLI ----

#[test]
fn remote_daemon_with_a_token_from_callers_add() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("callers.json");
    let add = plimsoll(&[
        "callers",
        "add",
        "--file",
        file.to_str().unwrap(),
        "--id",
        "ci",
    ]);
    assert_eq!(add.status.code(), Some(0));
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, stdout(&add)).unwrap();
    let wrong_file = dir.path().join("wrong");
    std::fs::write(&wrong_file, plimsoll_callers::generate_token()).unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let registry =
        plimsoll_callers::Registry::new(plimsoll_callers::CallersFile::load(&file).unwrap())
            .unwrap();
    let daemon = rt
        .block_on(plimsoll_daemon::start(plimsoll_daemon::Config::embedded(
            registry,
        )))
        .unwrap();
    let addr = daemon.rpc_addr().to_string();

    let ok = plimsoll(&[
        "run",
        "--addr",
        &addr,
        "--token-file",
        token_file.to_str().unwrap(),
        "-e",
        "console.log(6*7)",
    ]);
    let wrong = plimsoll(&[
        "run",
        "--addr",
        &addr,
        "--token-file",
        wrong_file.to_str().unwrap(),
        "-e",
        "console.log(1)",
    ]);
    let none = plimsoll(&[
        "run",
        "--addr",
        &format!("http://{addr}"),
        "-e",
        "console.log(1)",
    ]);
    rt.block_on(daemon.shutdown());

    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert!(stdout(&ok).lines().any(|l| l == "42"));
    for o in [&wrong, &none] {
        assert_eq!(o.status.code(), Some(3), "{}", stderr(o));
        assert!(
            stderr(o).contains("not dispatched (permission)"),
            "{}",
            stderr(o)
        );
    }
}

// ---- the embedded daemon's choice of wall ----

/// `plimsoll run` with `envs` added (and `SANDBOX_*` of the test's own environment
/// removed), its stdout, stderr and exit code.
fn plimsoll_with(args: &[&str], envs: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plimsoll"));
    cmd.args(args)
        .env_remove("PLIMSOLL_ADDR")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("SANDBOX_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("the plimsoll binary starts")
}

/// With no --provider a project runs behind the strongest wall that proves itself here
/// (bwrap), and the first line on stderr says so; with bwrap unavailable it falls back to
/// the process provider and says why; `--provider bwrap` with bwrap unavailable is a
/// configuration error (exit 2) naming the cause.
#[test]
fn embedded_project_runs_behind_the_strongest_wall_and_says_which() {
    if !plimsoll_testkit::bwrap::installed() {
        return;
    }
    let folder = plimsoll_testkit::bwrap::folder();
    let sandboxd = plimsoll_testkit::bwrap::sandboxd_in(folder.path());
    let project = tempfile::tempdir().unwrap();
    std::fs::write(project.path().join("a.txt"), "hello\n").unwrap();
    let dir = project.path().to_str().unwrap();
    let run = ["run", "--project", dir, "--step", "cat a.txt; id -u"];

    let o = plimsoll_with(&run, &[("SANDBOX_BWRAP_SANDBOXD", &sandboxd)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    let first = err.lines().next().unwrap_or("");
    assert!(
        first.starts_with("plimsoll: provider bwrap (tier container): bwrap ")
            && first.ends_with("passed its smoke test"),
        "{err}"
    );
    let text = stdout(&o);
    assert_eq!(field(&text, "provider:"), Some("bwrap"), "{text}");
    assert_eq!(field(&text, "isolation:"), Some("container"), "{text}");
    assert!(text.contains("hello\n"), "{text}");

    // bwrap unavailable: the process provider, and why.
    let missing = folder.path().join("no-such-bwrap");
    let o = plimsoll_with(
        &run,
        &[
            ("SANDBOX_BWRAP_SANDBOXD", &sandboxd),
            ("SANDBOX_BWRAP_PATH", &missing),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    let first = err.lines().next().unwrap_or("");
    assert!(
        first.starts_with("plimsoll: provider process (no wall): bwrap unavailable: ")
            && first.contains("SANDBOX_BWRAP_PATH")
            && first.ends_with("install bubblewrap for a container wall"),
        "{err}"
    );
    let text = stdout(&o);
    assert_eq!(field(&text, "provider:"), Some("process"), "{text}");
    assert_eq!(field(&text, "isolation:"), Some("process"), "{text}");

    // Named, and unavailable: exit 2, naming the cause; nothing ran.
    let mut named = vec!["run", "--provider", "bwrap"];
    named.extend_from_slice(&run[1..]);
    let o = plimsoll_with(
        &named,
        &[
            ("SANDBOX_BWRAP_SANDBOXD", &sandboxd),
            ("SANDBOX_BWRAP_PATH", &missing),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("--provider bwrap") && err.contains("SANDBOX_BWRAP_PATH"),
        "{err}"
    );
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
}
