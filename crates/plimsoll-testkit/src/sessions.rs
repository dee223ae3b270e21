//! The session conformance suite every session provider passes: one function per property,
//! each driving a real daemon through the real client library (every answer's record and
//! chain link checked), so the process, docker and agentsandbox tests run the same checks.
//!
//! Each check opens its own sessions and closes them. They need `sh` and, for the cell
//! checks, `python3` and `node` in the sandbox.

use std::time::{Duration, Instant};

use plimsoll_client::{Client, ClientError, Session};
use plimsoll_core::pb::{self, run_response::Result as R, session_run_request::Payload};
use plimsoll_core::{Reason, Tier};

/// How long a session call in these checks may take.
pub const CALL_TIMEOUT_MS: i32 = 20_000;

/// A session with defaults.
pub async fn open(c: &mut Client) -> Session {
    open_with(c, pb::OpenSessionRequest::default()).await
}

/// A session opened with `req` (its protocol set here).
pub async fn open_with(c: &mut Client, req: pb::OpenSessionRequest) -> Session {
    c.open_session(pb::OpenSessionRequest {
        protocol: plimsoll_core::PROTOCOL,
        ..req
    })
    .await
    .expect("the session opens")
}

/// A session call of `payload` under `timeout_ms`.
pub fn call(payload: Payload, timeout_ms: i32) -> pb::SessionRunRequest {
    pb::SessionRunRequest {
        protocol: plimsoll_core::PROTOCOL,
        timeout_ms,
        payload: Some(payload),
        ..Default::default()
    }
}

/// A project payload of `steps`.
pub fn steps(steps: &[&str]) -> Payload {
    Payload::Project(pb::ProjectRun {
        steps: steps.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    })
}

/// A cell payload.
pub fn cell(language: &str, code: &str) -> Payload {
    Payload::Cell(pb::CellRun {
        language: language.into(),
        code: code.into(),
        files: Vec::new(),
    })
}

/// Runs `payload`; panics unless it is answered and checked.
pub async fn run(c: &mut Client, s: &mut Session, payload: Payload) -> pb::RunResponse {
    run_within(c, s, payload, CALL_TIMEOUT_MS).await
}

/// [`run`] with a deadline of its own.
pub async fn run_within(
    c: &mut Client,
    s: &mut Session,
    payload: Payload,
    timeout_ms: i32,
) -> pb::RunResponse {
    let a = c
        .session_run(s, call(payload, timeout_ms))
        .await
        .unwrap_or_else(|e| panic!("the session call is answered: {e}"));
    assert_eq!(a.ended, 0, "the session ended: {}", a.end_detail);
    a.run.expect("a run")
}

/// The exit codes of a project answer's steps.
pub fn exits(r: &pb::RunResponse) -> Vec<i32> {
    match &r.result {
        Some(R::Project(p)) => p.steps.iter().map(|s| s.exit_code).collect(),
        other => panic!("not a project answer: {other:?}"),
    }
}

/// A cell answer.
pub fn cell_result(r: &pb::RunResponse) -> &pb::CellResult {
    match &r.result {
        Some(R::Cell(c)) => c,
        other => panic!("not a cell answer: {other:?}"),
    }
}

/// Files written by a snippet are read by a project, and the other way round.
pub async fn files_persist_between_a_snippet_and_a_project(c: &mut Client) {
    let mut s = open(c).await;
    let js = Payload::Javascript(pb::JavaScriptRun {
        code: "require('fs').writeFileSync('from-snippet.txt', 'snippet')".into(),
        grant_profile: String::new(),
    });
    run(c, &mut s, js).await;
    let r = run(
        c,
        &mut s,
        steps(&[
            "test \"$(cat from-snippet.txt)\" = snippet",
            "echo project > from-project.txt",
        ]),
    )
    .await;
    assert_eq!(exits(&r), [0, 0], "the project saw the snippet's file");
    let js = Payload::Javascript(pb::JavaScriptRun {
        code: "process.stdout.write(require('fs').readFileSync('from-project.txt', 'utf8'))".into(),
        grant_profile: String::new(),
    });
    let r = run(c, &mut s, js).await;
    let Some(R::Javascript(j)) = &r.result else {
        panic!("not a snippet answer")
    };
    assert_eq!(j.stdout, b"project\n");
    c.close_session(&s).await.expect("close");
}

/// Two sessions do not share a working directory; with a wall (`strict`: tier container or
/// above) neither can reach the other's files by path nor see its processes.
pub async fn two_sessions_cannot_see_each_other(c: &mut Client, strict: bool) {
    let mut a = open(c).await;
    let mut b = open(c).await;
    let r = run(
        c,
        &mut a,
        steps(&["echo only-a > secret.txt && pwd > where.txt && pwd"]),
    )
    .await;
    let Some(R::Project(p)) = &r.result else {
        panic!()
    };
    let a_dir = String::from_utf8_lossy(&p.steps[0].stdout)
        .trim()
        .to_owned();
    let probe = if strict {
        format!("test ! -e secret.txt && ! cat '{a_dir}/secret.txt' 2>/dev/null")
    } else {
        "test ! -e secret.txt".to_owned()
    };
    let r = run(c, &mut b, steps(&[&probe])).await;
    assert_eq!(exits(&r), [0], "session b reached session a's file");
    c.close_session(&a).await.expect("close a");
    c.close_session(&b).await.expect("close b");
}

/// A shell function `alive PID`: true when the process exists and is neither a zombie nor
/// dead (`kill -0` also finds zombies, which a host whose init does not reap keeps around).
pub const ALIVE_FN: &str =
    "alive() { st=$(sed 's/.*) //' \"/proc/$1/stat\" 2>/dev/null | cut -c1); [ -n \"$st\" ] && [ \"$st\" != Z ] && [ \"$st\" != X ]; }";

/// No process a call leaves (background job, `setsid`, `nohup`, a double fork, one that
/// closed its output) is alive in the next call.
pub async fn no_leftover_process_reaches_the_next_call(c: &mut Client) {
    let mut s = open(c).await;
    let r = run(
        c,
        &mut s,
        steps(&[
            "sleep 300 >/dev/null 2>&1 & echo $! > bg.pid",
            "setsid sh -c 'sleep 300 & echo $! > setsid.pid' >/dev/null 2>&1 </dev/null",
            "nohup sleep 300 >/dev/null 2>&1 & echo $! > nohup.pid",
            "(sh -c 'sleep 300 & echo $! > double.pid' &) >/dev/null 2>&1",
            "sh -c 'exec >&- 2>&-; sleep 300' & echo $! > closed.pid",
            &format!("{ALIVE_FN}; for f in bg setsid nohup double closed; do i=0; while [ ! -s $f.pid ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; alive \"$(cat $f.pid)\" || exit 9; done"),
        ]),
    )
    .await;
    assert_eq!(
        exits(&r),
        [0; 6],
        "every leftover was alive during its call"
    );
    // A snippet's leftover: node starts a detached child and exits at once.
    let js = Payload::Javascript(pb::JavaScriptRun {
        code: "const c = require('child_process').spawn('sleep', ['300'], {detached: true, stdio: 'ignore'}); require('fs').writeFileSync('js.pid', String(c.pid)); c.unref();".into(),
        grant_profile: String::new(),
    });
    run(c, &mut s, js).await;
    let r = run(
        c,
        &mut s,
        steps(&[&format!("{ALIVE_FN}; for f in bg setsid nohup double closed js; do if alive \"$(cat $f.pid)\"; then echo \"$f alive\"; exit 1; fi; done")]),
    )
    .await;
    assert_eq!(
        exits(&r),
        [0],
        "a leftover process reached the next call: {r:?}"
    );
    c.close_session(&s).await.expect("close");
}

/// A deadline ends the call (exit 124), not the session.
pub async fn a_deadline_ends_the_call_not_the_session(c: &mut Client) {
    let mut s = open(c).await;
    let r = run_within(
        c,
        &mut s,
        steps(&["echo before > kept.txt", "sleep 30"]),
        700,
    )
    .await;
    let Some(R::Project(p)) = &r.result else {
        panic!()
    };
    assert_eq!(p.outcome, pb::ProjectOutcome::TimedOut as i32);
    let r = run(c, &mut s, steps(&["test \"$(cat kept.txt)\" = before"])).await;
    assert_eq!(exits(&r), [0]);
    c.close_session(&s).await.expect("close");
}

/// Output a leftover process holds open does not hold the answer.
pub async fn held_open_output_still_returns(c: &mut Client) {
    let mut s = open(c).await;
    let t0 = Instant::now();
    let r = run(c, &mut s, steps(&["sleep 30 & echo started"])).await;
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "the answer waited for the leftover"
    );
    assert_eq!(exits(&r), [0]);
    c.close_session(&s).await.expect("close");
}

/// A floor above the session's tier is refused, marked, and not counted.
pub async fn a_floor_above_the_tier_is_refused(c: &mut Client, tier: Tier) {
    let Some(above) = Tier::ALL.into_iter().find(|t| *t > tier) else {
        return;
    };
    let mut s = open(c).await;
    let mut req = call(steps(&["touch ran"]), CALL_TIMEOUT_MS);
    req.minimum_isolation = above.to_string();
    let e = c.session_run(&mut s, req).await.unwrap_err();
    assert_eq!(e.not_dispatched(), Some(Reason::Isolation), "{e}");
    let r = run(c, &mut s, steps(&["test ! -e ran"])).await;
    assert_eq!(exits(&r), [0], "the refused call ran");
    assert_eq!(c.close_session(&s).await.expect("close").calls, 1);
}

/// Close ends a session (a later call is refused `CLOSED`); so does its lifetime.
pub async fn close_and_lifetime_end_the_session(c: &mut Client) {
    let mut s = open(c).await;
    run(c, &mut s, steps(&["true"])).await;
    c.close_session(&s).await.expect("close");
    let e = c
        .session_run(&mut s, call(steps(&["true"]), CALL_TIMEOUT_MS))
        .await
        .unwrap_err();
    assert_ended(&e, pb::SessionEnd::Closed);
    let mut short = open_with(
        c,
        pb::OpenSessionRequest {
            lifetime_ms: 1500,
            ..Default::default()
        },
    )
    .await;
    run(c, &mut short, steps(&["true"])).await;
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let e = c
        .session_run(&mut short, call(steps(&["true"]), CALL_TIMEOUT_MS))
        .await
        .unwrap_err();
    assert_ended(&e, pb::SessionEnd::Expired);
}

fn assert_ended(e: &ClientError, want: pb::SessionEnd) {
    let ClientError::Refused { status, .. } = e else {
        panic!("expected a refusal naming the end, got {e}")
    };
    let ended = plimsoll_core::session_ended(status).expect("a SessionEnded detail");
    assert_eq!(ended.reason(), want, "{e}");
}

/// A cell keeps its variables across calls, in python and javascript, and prints the last
/// expression's value.
pub async fn cells_keep_state_in_both_languages(c: &mut Client) {
    let mut s = open(c).await;
    for (lang, set, get) in [
        ("python", "x = 41", "x + 1"),
        ("javascript", "var x = 41", "x + 1"),
    ] {
        let first = run(c, &mut s, cell(lang, set)).await;
        assert!(
            cell_result(&first).interpreter_started,
            "{lang}: the first cell starts one"
        );
        let second = run(c, &mut s, cell(lang, get)).await;
        let r = cell_result(&second);
        assert_eq!(
            r.exit_code,
            0,
            "{lang}: {:?}",
            String::from_utf8_lossy(&r.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "42", "{lang}");
        assert!(!r.interpreter_started, "{lang}: the interpreter was kept");
    }
    c.close_session(&s).await.expect("close");
}

/// A cell past its deadline kills its interpreter (124, `interpreter_ended`); the next cell
/// starts a fresh one, which says so and has lost the old variables.
pub async fn a_killed_interpreter_reports_fresh(c: &mut Client) {
    let mut s = open(c).await;
    run(c, &mut s, cell("python", "kept = 1")).await;
    let r = run_within(
        c,
        &mut s,
        cell("python", "import time\ntime.sleep(30)"),
        700,
    )
    .await;
    let r = cell_result(&r);
    assert_eq!(r.exit_code, 124);
    assert!(r.timed_out && r.interpreter_ended, "{r:?}");
    let r = run(c, &mut s, cell("python", "'kept' in globals()")).await;
    let r = cell_result(&r);
    assert!(r.interpreter_started, "{r:?}");
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "False");
    c.close_session(&s).await.expect("close");
}

/// A cell whose answer is lost (its code writes a forged line on the interpreter's control
/// channel, fd 3 on the process provider) is an unanswered call: a checked version-3 record
/// in the chain, and the session goes on with a fresh interpreter.
pub async fn a_lost_answer_is_unanswered_and_the_session_goes_on(c: &mut Client) {
    let mut s = open(c).await;
    run(c, &mut s, steps(&["echo kept > kept.txt"])).await;
    let forged = cell(
        "javascript",
        "require('fs').writeSync(3, '{\"nonce\":\"forged\",\"status\":\"ok\"}\\n')",
    );
    let e = c
        .session_run(&mut s, call(forged, CALL_TIMEOUT_MS))
        .await
        .unwrap_err();
    let ClientError::Unanswered { record, .. } = &e else {
        panic!("expected an unanswered record, got {e}")
    };
    assert_eq!((record.version, record.sequence), (3, 2));
    let r = run(c, &mut s, steps(&["test \"$(cat kept.txt)\" = kept"])).await;
    assert_eq!(exits(&r), [0]);
    assert_eq!(
        r.record.as_ref().expect("a record").previous_sha256,
        record.record_sha256
    );
    let r = run(c, &mut s, cell("javascript", "40 + 2")).await;
    assert!(cell_result(&r).interpreter_started);
    assert_eq!(c.close_session(&s).await.expect("close").calls, 4);
}
