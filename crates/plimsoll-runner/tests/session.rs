//! Runner sessions against real processes: sh, node, python3, real files under a temp root.
//! Cell tests print `SKIPPED` and pass when their interpreter is missing (CI has both).

use std::time::{Duration, Instant};

mod common;

use common::is_dead;
use plimsoll_core::pb;
use plimsoll_runner::{Limits, RunEnv, Runner, RunnerConfig, RunnerError, RunnerSession};

fn runner() -> (tempfile::TempDir, Runner) {
    let root = tempfile::tempdir().unwrap();
    let runner = Runner::new(RunnerConfig {
        root_dir: root.path().join("runs"),
        limits: Limits::default(),
        default_timeout: Duration::from_secs(30),
    })
    .unwrap();
    (root, runner)
}

fn js(code: &str) -> pb::JavaScriptRun {
    pb::JavaScriptRun {
        code: code.into(),
        grant_profile: String::new(),
    }
}

fn steps(steps: &[&str]) -> pb::ProjectRun {
    pb::ProjectRun {
        steps: steps.iter().map(|s| (*s).into()).collect(),
        ..Default::default()
    }
}

fn cell(language: &str, code: &str) -> pb::CellRun {
    pb::CellRun {
        language: language.into(),
        code: code.into(),
        files: Vec::new(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const T: Duration = Duration::from_secs(20);

/// A call that returned within 3 seconds of `started`, far below its 20-second deadline.
fn returned_soon(started: Instant) {
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "the call took {took:?}");
}

/// Whether `program --version` runs; prints `SKIPPED` when not.
fn have(program: &str, test: &str) -> bool {
    let ok = std::process::Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIPPED {test}: {program} is missing");
    }
    ok
}

/// One project step's stdout, trimmed.
async fn sh(s: &RunnerSession, step: &str) -> String {
    let r = s
        .project(&steps(&[step]), T, &RunEnv::default())
        .await
        .unwrap();
    assert_eq!(r.steps.len(), 1, "{r:?}");
    text(&r.steps[0].stdout).trim().to_owned()
}

async fn run_cell(s: &RunnerSession, language: &str, code: &str) -> pb::CellResult {
    s.cell(&cell(language, code), T).await.unwrap()
}

#[tokio::test]
async fn files_persist_between_a_snippet_and_a_project() {
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    let made = s
        .javascript(
            &js("require('fs').writeFileSync('from-js.txt', 'hello from js')"),
            T,
            &RunEnv::default(),
        )
        .await
        .unwrap();
    assert_eq!(made.exit_code, 0, "{}", text(&made.stderr));
    assert_eq!(sh(&s, "cat from-js.txt").await, "hello from js");
    assert_eq!(sh(&s, "echo from-sh > from-sh.txt && echo ok").await, "ok");
    let read = s
        .javascript(
            &js("process.stdout.write(require('fs').readFileSync('from-sh.txt', 'utf8'))"),
            T,
            &RunEnv::default(),
        )
        .await
        .unwrap();
    assert_eq!(text(&read.stdout).trim(), "from-sh");
    assert!(s.dir().join("from-js.txt").is_file());
    let mode = std::os::unix::fs::PermissionsExt::mode(&s.dir().metadata().unwrap().permissions());
    assert_eq!(mode & 0o7777, 0o700);
    assert!(s
        .dir()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("session-"));
    s.close().await;
}

#[tokio::test]
async fn two_sessions_do_not_share_files() {
    let (_root, r) = runner();
    let a = r.open_session().unwrap();
    let b = r.open_session().unwrap();
    assert_ne!(a.dir(), b.dir());
    assert_ne!(a.tag(), b.tag());
    assert_eq!(sh(&a, "echo secret > mine && cat mine").await, "secret");
    assert_eq!(
        sh(&b, "cat mine 2>/dev/null || echo absent").await,
        "absent"
    );
    assert_eq!(sh(&b, "ls -A | grep -v '^.tmp$' | wc -l").await, "0");
    a.close().await;
    b.close().await;
}

/// Checks, from inside the session, whether the pid in `file` is alive (not a zombie).
const ALIVE: &str = "pid=$(cat \"$0\"); if kill -0 \"$pid\" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' /proc/\"$pid\"/status 2>/dev/null; then echo alive; else echo dead; fi";

#[tokio::test]
async fn no_leftover_process_of_any_kind_reaches_the_next_call() {
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    for (name, step) in [
        ("background", "sleep 1000 & echo $! > pid"),
        ("double fork", "( sleep 1000 & echo $! > pid ) &"),
        ("setsid", "setsid sleep 1000 & echo $! > pid"),
        ("nohup", "nohup sleep 1000 >/dev/null 2>&1 & echo $! > pid"),
        ("closed output", "sleep 1000 >&- 2>&- <&- & echo $! > pid"),
        ("left the directory", "cd / && sleep 1000 & echo $! > pid"),
    ] {
        for via in ["project", "javascript"] {
            let name = format!("{name} via {via}");
            let _ = std::fs::remove_file(s.dir().join("pid"));
            let started = Instant::now();
            if via == "project" {
                let r = s
                    .project(&steps(&[step]), T, &RunEnv::default())
                    .await
                    .unwrap();
                assert_eq!(r.steps[0].exit_code, 0, "{name}: {r:?}");
            } else {
                // A snippet has no artifacts to read: only the session's sweep kills here.
                let code = format!(
                    "require('child_process').execFileSync('sh', ['-c', {step:?}], {{ stdio: 'ignore' }})"
                );
                let r = s
                    .javascript(&js(&code), T, &RunEnv::default())
                    .await
                    .unwrap();
                assert_eq!(r.exit_code, 0, "{name}: {}", text(&r.stderr));
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{name} held the call"
            );
            assert!(s.last_sweep_clean(), "{name}");
            // The pid file is written by the step before it ends, or by a subshell that may
            // still be writing it: give it a moment, but only to appear.
            for _ in 0..200 {
                if std::fs::read_to_string(s.dir().join("pid")).is_ok_and(|p| p.ends_with('\n')) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let pid: i32 = std::fs::read_to_string(s.dir().join("pid"))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let next = s
                .project(
                    &steps(&[&format!("sh -c '{ALIVE}' pid")]),
                    T,
                    &RunEnv::default(),
                )
                .await
                .unwrap();
            assert_eq!(
                text(&next.steps[0].stdout).trim(),
                "dead",
                "{name}: pid {pid}"
            );
            assert!(is_dead(pid), "{name}: pid {pid}");
        }
    }
    s.close().await;
}

#[tokio::test]
async fn a_deadline_ends_the_call_and_the_session_goes_on() {
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    sh(&s, "echo kept > f").await;
    let started = Instant::now();
    let p = s
        .project(
            &steps(&["sleep 30"]),
            Duration::from_millis(300),
            &RunEnv::default(),
        )
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(p.steps[0].timed_out);
    assert_eq!(p.steps[0].exit_code, 124);
    let j = s
        .javascript(
            &js("setInterval(() => {}, 1000)"),
            Duration::from_millis(300),
            &RunEnv::default(),
        )
        .await
        .unwrap();
    assert!(j.timed_out);
    assert_eq!(j.exit_code, 124);
    assert_eq!(sh(&s, "cat f").await, "kept");
    s.close().await;
}

#[tokio::test]
async fn output_a_leftover_holds_open_still_returns() {
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    let started = Instant::now();
    let p = s
        .project(&steps(&["(sleep 30 &); echo done"]), T, &RunEnv::default())
        .await
        .unwrap();
    returned_soon(started);
    assert_eq!(text(&p.steps[0].stdout).trim(), "done");
    let started = Instant::now();
    let j = s
        .javascript(
            &js("require('child_process').spawn('sleep', ['30'], { stdio: 'inherit', detached: true }).unref(); console.log('done')"),
            T,
            &RunEnv::default(),
        )
        .await
        .unwrap();
    returned_soon(started);
    assert_eq!(text(&j.stdout).trim(), "done");
    s.close().await;
}

#[tokio::test]
async fn read_back_sees_a_changed_directory() {
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    assert_eq!(s.read_back(), Ok(()));
    std::fs::set_permissions(s.dir(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    assert!(s.read_back().unwrap_err().contains("mode"));
    std::fs::set_permissions(s.dir(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    assert_eq!(s.read_back(), Ok(()));
    // Replaced by another directory of the same name and mode (the old one is kept aside,
    // so its inode cannot be reused).
    let aside = s.dir().with_extension("aside");
    std::fs::rename(s.dir(), &aside).unwrap();
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(s.dir())
        .unwrap();
    assert!(s.read_back().unwrap_err().contains("replaced"));
    std::fs::remove_dir_all(s.dir()).unwrap();
    assert!(s.read_back().unwrap_err().contains("cannot be read"));
    // Removed, then made again after the old inode was freed.
    std::fs::remove_dir_all(&aside).unwrap();
    std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
        .create(s.dir())
        .unwrap();
    assert!(s.read_back().is_err());
    s.close().await;
}

#[tokio::test]
async fn disk_bytes_counts_the_sessions_files() {
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    let before = s.disk_bytes();
    sh(&s, "head -c 3000000 /dev/urandom > big && echo ok").await;
    let after = s.disk_bytes();
    assert!(after >= before + 2_900_000, "{before} -> {after}");
    s.close().await;
}

#[tokio::test]
async fn close_removes_the_directory_and_kills_the_interpreters() {
    if !have(
        "node",
        "close_removes_the_directory_and_kills_the_interpreters",
    ) || !have(
        "python3",
        "close_removes_the_directory_and_kills_the_interpreters",
    ) {
        return;
    }
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    assert_eq!(text(&run_cell(&s, "python", "1 + 1").await.stdout), "2\n");
    assert_eq!(
        text(&run_cell(&s, "javascript", "1 + 2").await.stdout),
        "3\n"
    );
    let pids = s.interpreter_pids().await;
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|p| !is_dead(*p)));
    let dir = s.dir().to_path_buf();
    s.close().await;
    assert!(!dir.exists());
    assert!(pids.iter().all(|p| is_dead(*p)), "{pids:?}");
}

#[tokio::test]
async fn a_dropped_session_kills_and_cleans_up() {
    if !have("python3", "a_dropped_session_kills_and_cleans_up") {
        return;
    }
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    run_cell(&s, "python", "x = 1").await;
    let pids = s.interpreter_pids().await;
    let dir = s.dir().to_path_buf();
    drop(s);
    assert!(!dir.exists());
    for _ in 0..100 {
        if pids.iter().all(|p| is_dead(*p)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(pids.iter().all(|p| is_dead(*p)), "{pids:?}");
}

#[tokio::test]
async fn python_cells_keep_state_print_the_last_value_and_await() {
    if !have(
        "python3",
        "python_cells_keep_state_print_the_last_value_and_await",
    ) {
        return;
    }
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    let first = run_cell(&s, "python", "x = 41\ndef f(y):\n    return y * 2").await;
    assert_eq!(first.exit_code, 0, "{}", text(&first.stderr));
    assert!(first.interpreter_started);
    assert_eq!(first.stdout, b"");
    let second = run_cell(&s, "python", "print('side')\nf(x + 1)").await;
    assert!(!second.interpreter_started);
    assert_eq!(text(&second.stdout), "side\n84\n");
    assert_eq!(run_cell(&s, "python", "None").await.stdout, b"");
    assert_eq!(
        text(&run_cell(&s, "python", "'a' + 'b'").await.stdout),
        "'ab'\n"
    );
    let awaited = run_cell(
        &s,
        "python",
        "import asyncio\nasync def later(v):\n    await asyncio.sleep(0.01)\n    return v\nz = await later(5)\nawait later(z + 1)",
    )
    .await;
    assert_eq!(awaited.exit_code, 0, "{}", text(&awaited.stderr));
    assert_eq!(text(&awaited.stdout), "6\n");
    assert_eq!(text(&run_cell(&s, "python", "z").await.stdout), "5\n");
    s.close().await;
}

#[tokio::test]
async fn javascript_cells_keep_state_print_the_last_value_and_await() {
    if !have(
        "node",
        "javascript_cells_keep_state_print_the_last_value_and_await",
    ) {
        return;
    }
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    let first = run_cell(
        &s,
        "javascript",
        "let x = 41; var v = 1; function f(y) { return y * 2 }\nglobalThis.g = 'G'",
    )
    .await;
    assert_eq!(first.exit_code, 0, "{}", text(&first.stderr));
    assert!(first.interpreter_started);
    let second = run_cell(&s, "javascript", "console.log('side'); f(x + v)").await;
    assert!(!second.interpreter_started);
    assert_eq!(text(&second.stdout), "side\n84\n");
    assert_eq!(run_cell(&s, "javascript", "undefined").await.stdout, b"");
    assert_eq!(
        text(&run_cell(&s, "javascript", "g + 'x'").await.stdout),
        "'Gx'\n"
    );
    // Top-level let, const and class can be declared again in a later cell.
    let again = run_cell(
        &s,
        "javascript",
        "const x = 1; class C { m() { return 2 } }",
    )
    .await;
    assert_eq!(again.exit_code, 0, "{}", text(&again.stderr));
    let again = run_cell(
        &s,
        "javascript",
        "let x = 3; class C { m() { return 4 } }\nx + new C().m()",
    )
    .await;
    assert_eq!(again.exit_code, 0, "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), "7\n");
    let awaited = run_cell(
        &s,
        "javascript",
        "const z = await new Promise(r => setTimeout(() => r(5), 10))\nawait Promise.resolve(z + 1)",
    )
    .await;
    assert_eq!(awaited.exit_code, 0, "{}", text(&awaited.stderr));
    assert_eq!(text(&awaited.stdout), "6\n");
    assert_eq!(text(&run_cell(&s, "javascript", "z").await.stdout), "5\n");
    s.close().await;
}

#[tokio::test]
async fn an_exception_is_exit_1_with_its_trace_and_keeps_the_interpreter() {
    for (language, prog, set, raise, word, get) in [
        (
            "python",
            "python3",
            "kept = 7",
            "1 / 0",
            "ZeroDivisionError",
            "kept",
        ),
        (
            "javascript",
            "node",
            "var kept = 7",
            "throw new TypeError('boom')",
            "TypeError: boom",
            "kept",
        ),
    ] {
        if !have(
            prog,
            "an_exception_is_exit_1_with_its_trace_and_keeps_the_interpreter",
        ) {
            continue;
        }
        let (_root, r) = runner();
        let s = r.open_session().unwrap();
        run_cell(&s, language, set).await;
        let bad = run_cell(&s, language, raise).await;
        assert_eq!(bad.exit_code, 1, "{language}");
        assert!(
            text(&bad.stderr).contains(word),
            "{language}: {}",
            text(&bad.stderr)
        );
        assert!(!bad.interpreter_ended);
        let after = run_cell(&s, language, get).await;
        assert!(!after.interpreter_started, "{language}");
        assert_eq!(text(&after.stdout), "7\n", "{language}");
        s.close().await;
    }
}

#[tokio::test]
async fn a_timed_out_interpreter_ends_and_the_next_cell_starts_a_fresh_one() {
    for (language, prog, spin) in [
        ("python", "python3", "import subprocess\nchild = subprocess.Popen(['sleep', '1000'])\nopen('child', 'w').write(str(child.pid))\nwhile True: pass"),
        ("javascript", "node", "const c = require('child_process').spawn('sleep', ['1000']); require('fs').writeFileSync('child', String(c.pid)); while (true) {}"),
    ] {
        if !have(prog, "a_timed_out_interpreter_ends_and_the_next_cell_starts_a_fresh_one") {
            continue;
        }
        let (_root, r) = runner();
        let s = r.open_session().unwrap();
        run_cell(&s, language, "var_before = 1").await;
        let old = s.interpreter_pids().await;
        let started = Instant::now();
        let t = s.cell(&cell(language, spin), Duration::from_millis(800)).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "{language}");
        assert_eq!(t.exit_code, 124, "{language}");
        assert!(t.timed_out && t.interpreter_ended, "{language}: {t:?}");
        assert!(s.interpreter_pids().await.is_empty());
        assert!(old.iter().all(|p| is_dead(*p)), "{language}");
        let child: i32 = std::fs::read_to_string(s.dir().join("child")).unwrap().parse().unwrap();
        assert!(is_dead(child), "{language}: the interpreter's child lives on");
        let next = run_cell(&s, language, "1 + 1").await;
        assert!(next.interpreter_started, "{language}");
        assert!(!next.interpreter_ended, "{language}");
        assert_eq!(text(&next.stdout), "2\n", "{language}");
        s.close().await;
    }
}

#[tokio::test]
async fn a_cells_background_child_is_killed_and_the_interpreter_survives() {
    for (language, prog, spawn, check) in [
        (
            "python",
            "python3",
            "import subprocess\nchild = subprocess.Popen(['sleep', '1000'])\nopen('child', 'w').write(str(child.pid))",
            "child.wait()",
        ),
        (
            "javascript",
            "node",
            "var child = require('child_process').spawn('sleep', ['1000']); var code = null; child.on('exit', (c, s) => { code = s }); require('fs').writeFileSync('child', String(child.pid))",
            "await new Promise(r => setTimeout(r, 50)); code",
        ),
    ] {
        if !have(prog, "a_cells_background_child_is_killed_and_the_interpreter_survives") {
            continue;
        }
        let (_root, r) = runner();
        let s = r.open_session().unwrap();
        let first = run_cell(&s, language, spawn).await;
        assert_eq!(first.exit_code, 0, "{language}: {}", text(&first.stderr));
        assert!(s.last_sweep_clean());
        let child: i32 = std::fs::read_to_string(s.dir().join("child")).unwrap().parse().unwrap();
        assert!(is_dead(child), "{language}: the cell's child outlived the call");
        let interp = s.interpreter_pids().await;
        assert_eq!(interp.len(), 1);
        assert!(!is_dead(interp[0]), "{language}: the interpreter was killed");
        // The interpreter itself saw its child killed by SIGKILL.
        let next = run_cell(&s, language, check).await;
        assert!(!next.interpreter_started, "{language}");
        let seen = text(&next.stdout);
        assert!(seen == "-9\n" || seen == "'SIGKILL'\n", "{language}: {seen:?} {}", text(&next.stderr));
        s.close().await;
    }
}

#[tokio::test]
async fn a_forged_control_line_gives_no_answer() {
    for (language, prog, forge) in [
        ("python", "python3", "import os, time\nos.write(3, b'{\"nonce\": \"00\", \"status\": \"ok\"}\\n')\ntime.sleep(0.3)\nprint('after')"),
        ("javascript", "node", "require('fs').writeSync(3, '{\"nonce\":\"00\",\"status\":\"ok\"}\\n'); console.log('after')"),
    ] {
        if !have(prog, "a_forged_control_line_gives_no_answer") {
            continue;
        }
        let (_root, r) = runner();
        let s = r.open_session().unwrap();
        run_cell(&s, language, "1").await;
        let old = s.interpreter_pids().await;
        match s.cell(&cell(language, forge), T).await {
            Err(RunnerError::Interpreter { detail, .. }) => {
                assert!(detail.contains("nonce"), "{language}: {detail}")
            }
            other => panic!("{language}: a forged line was answered: {other:?}"),
        }
        assert!(old.iter().all(|p| is_dead(*p)), "{language}");
        let next = run_cell(&s, language, "2").await;
        assert!(next.interpreter_started, "{language}");
        assert_eq!(text(&next.stdout), "2\n", "{language}");
        s.close().await;
    }
}

#[tokio::test]
async fn a_cells_files_are_written_first_and_a_bad_path_refuses_it() {
    if !have(
        "python3",
        "a_cells_files_are_written_first_and_a_bad_path_refuses_it",
    ) {
        return;
    }
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    let mut c = cell("python", "open('data/in.txt').read()");
    c.files = vec![pb::ProjectFile {
        path: "data/in.txt".into(),
        content: "payload".into(),
    }];
    assert_eq!(text(&s.cell(&c, T).await.unwrap().stdout), "'payload'\n");
    let mut bad = cell("python", "open('ran', 'w').write('x')");
    bad.files = vec![pb::ProjectFile {
        path: "../escape".into(),
        content: "x".into(),
    }];
    match s.cell(&bad, T).await {
        Err(RunnerError::CellFiles(d)) => assert!(d.contains("../escape"), "{d}"),
        other => panic!("{other:?}"),
    }
    assert!(!s.dir().join("ran").exists());
    match s.cell(&cell("ruby", "1"), T).await {
        Err(RunnerError::CellLanguage(l)) => assert_eq!(l, "ruby"),
        other => panic!("{other:?}"),
    }
    s.close().await;
}

#[tokio::test]
async fn a_cells_output_is_capped_and_the_interpreter_goes_on() {
    if !have(
        "python3",
        "a_cells_output_is_capped_and_the_interpreter_goes_on",
    ) {
        return;
    }
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    let cap = Limits::default().output_bytes;
    let big = run_cell(
        &s,
        "python",
        "import sys\nsys.stdout.write('x' * 3_000_000)\nsys.stderr.write('e' * 10)",
    )
    .await;
    assert_eq!(big.exit_code, 0);
    assert_eq!(big.stdout.len(), cap);
    assert!(big.stdout_truncated && !big.stderr_truncated);
    assert_eq!(big.stderr, b"eeeeeeeeee");
    let next = run_cell(&s, "python", "'next'").await;
    assert!(!next.interpreter_started);
    assert_eq!(text(&next.stdout), "'next'\n");
    s.close().await;
}

#[tokio::test]
async fn a_cancelled_cell_leaves_no_trace_in_the_next_one() {
    if !have(
        "python3",
        "a_cancelled_cell_leaves_no_trace_in_the_next_one",
    ) {
        return;
    }
    let (_root, r) = runner();
    let s = r.open_session().unwrap();
    let sleeping = cell("python", "import time\ntime.sleep(30)");
    let slow = s.cell(&sleeping, T);
    assert!(tokio::time::timeout(Duration::from_millis(500), slow)
        .await
        .is_err());
    let old = s.interpreter_pids().await;
    assert_eq!(old.len(), 1);
    let started = Instant::now();
    let next = run_cell(&s, "python", "'fresh'").await;
    returned_soon(started);
    assert!(next.interpreter_started, "the busy interpreter was reused");
    assert_eq!(text(&next.stdout), "'fresh'\n");
    assert!(is_dead(old[0]));
    s.close().await;
}
