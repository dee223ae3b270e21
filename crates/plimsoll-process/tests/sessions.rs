//! The process provider through the provider interface, with real processes: sessions, and
//! the cleanup of one-shot runs.
//! Cell tests print `SKIPPED` and pass when their interpreter is missing (CI has both).

use std::time::Duration;

use plimsoll_core::{pb, Reason};
use plimsoll_process::{ProcessConfig, ProcessProvider};
use plimsoll_provider::{
    Answer, Provider, ProviderError, ProviderSession, SessionAnswer, SessionCallOutcome,
    SessionEndCause, SessionSpec, SessionWork, Shared, Work,
};

const T: Duration = Duration::from_secs(20);

async fn provider() -> (tempfile::TempDir, ProcessProvider) {
    let dir = tempfile::tempdir().unwrap();
    let shared = Shared {
        state_dir: dir.path().to_path_buf(),
        ..Shared::default()
    };
    let p = ProcessProvider::new(&ProcessConfig::new(&shared)).unwrap();
    p.start().await.unwrap();
    (dir, p)
}

async fn open(p: &ProcessProvider, disk_mb: u32) -> Box<dyn ProviderSession> {
    p.sessions()
        .expect("the process provider offers sessions")
        .open(SessionSpec {
            languages: Vec::new(),
            disk_mb,
            ..Default::default()
        })
        .await
        .unwrap()
}

fn step(s: &str) -> SessionWork {
    SessionWork::Run(Work::Project(pb::ProjectRun {
        steps: vec![s.into()],
        ..Default::default()
    }))
}

fn cell(language: &str, code: &str) -> SessionWork {
    SessionWork::Cell(pb::CellRun {
        language: language.into(),
        code: code.into(),
        files: Vec::new(),
    })
}

fn stdout(o: &SessionCallOutcome) -> String {
    match &o.answer {
        Ok(SessionAnswer::Run(Answer::Project(p))) => String::from_utf8_lossy(&p.steps[0].stdout)
            .trim()
            .to_owned(),
        Ok(SessionAnswer::Run(Answer::Javascript(j))) => {
            String::from_utf8_lossy(&j.stdout).trim().to_owned()
        }
        Ok(SessionAnswer::Cell(c)) => String::from_utf8_lossy(&c.stdout).trim().to_owned(),
        Err(e) => panic!("no answer: {e}"),
    }
}

fn refused(o: &SessionCallOutcome) -> Reason {
    match &o.answer {
        Err(ProviderError::Refused(r)) => r.reason,
        other => panic!("not refused: {other:?}"),
    }
}

fn has(lang: &str, p: &ProcessProvider, test: &str) -> bool {
    let ok = p.facts().languages.iter().any(|l| l == lang);
    if !ok {
        println!("SKIPPED {test}: {lang} was not proved");
    }
    ok
}

#[tokio::test]
async fn files_persist_and_cells_keep_state_through_the_provider() {
    let (_d, p) = provider().await;
    let s = open(&p, 0).await;
    let o = s.call(step("echo one > f && echo ok"), T).await;
    assert!(o.ended.is_none());
    assert_eq!(stdout(&o), "ok");
    let o = s
        .call(
            SessionWork::Run(Work::Javascript(pb::JavaScriptRun {
                code: "process.stdout.write(require('fs').readFileSync('f', 'utf8'))".into(),
                grant_profile: String::new(),
            })),
            T,
        )
        .await;
    assert_eq!(stdout(&o), "one");
    if has(
        "python",
        &p,
        "files_persist_and_cells_keep_state_through_the_provider",
    ) {
        s.call(cell("python", "n = open('f').read().strip()"), T)
            .await;
        let o = s.call(cell("python", "n * 2"), T).await;
        assert_eq!(stdout(&o), "'oneone'");
    }
    s.close().await;
    assert_eq!(refused(&s.call(step("true"), T).await), Reason::Environment);
}

#[tokio::test]
async fn disk_exceeded_ends_the_session_but_answers() {
    let (_d, p) = provider().await;
    let s = open(&p, 1).await;
    let o = s
        .call(step("head -c 100000 /dev/zero > small && echo ok"), T)
        .await;
    assert!(o.ended.is_none(), "{:?}", o.ended);
    let o = s
        .call(step("head -c 3000000 /dev/urandom > big && echo ok"), T)
        .await;
    assert_eq!(stdout(&o), "ok");
    let ended = o.ended.expect("the session should end");
    assert_eq!(ended.cause, SessionEndCause::DiskExceeded);
    assert!(ended.detail.contains("bytes"), "{}", ended.detail);
    s.close().await;
    // Not measured when the limit is 0.
    let s = open(&p, 0).await;
    let o = s
        .call(step("head -c 3000000 /dev/zero > big && echo ok"), T)
        .await;
    assert!(o.ended.is_none());
    s.close().await;
}

#[tokio::test]
async fn a_removed_or_replaced_directory_is_sandbox_changed() {
    let (_d, p) = provider().await;
    for (what, change) in [
        ("removed", "cd / && rm -rf \"$HOME\""),
        (
            "replaced",
            "cd / && mv \"$HOME\" \"$HOME.old\" && mkdir -m 700 \"$HOME\" && mkdir -m 700 \"$HOME/.tmp\"",
        ),
        ("opened up", "chmod 755 \"$HOME\""),
    ] {
        let s = open(&p, 0).await;
        let home = stdout(&s.call(step("echo \"$HOME\""), T).await);
        let o = s.call(step(change), T).await;
        assert!(o.ended.is_none(), "{what}");
        let Ok(SessionAnswer::Run(Answer::Project(done))) = &o.answer else {
            panic!("{what}: no project answer: {:?}", o.answer)
        };
        if done.steps[0].exit_code != 0 {
            // As root each session has a user of its own, which may not remove or rename
            // its folder (the folder above is not its own): the wall held. The change is
            // made from outside instead, as anything else on the host could.
            let outside = std::process::Command::new("sh")
                .args(["-c", change])
                .env("HOME", &home)
                .status()
                .unwrap();
            assert!(outside.success(), "{what} from outside");
        }
        let o = s.call(step("echo must-not-run > ran"), T).await;
        assert_eq!(refused(&o), Reason::Environment, "{what}");
        assert_eq!(
            o.ended.as_ref().map(|e| e.cause),
            Some(SessionEndCause::SandboxChanged),
            "{what}"
        );
        s.close().await;
    }
}

#[tokio::test]
async fn cells_in_unproved_languages_and_bad_files_are_refused() {
    let (_d, p) = provider().await;
    let s = open(&p, 0).await;
    assert_eq!(
        refused(&s.call(cell("ruby", "1"), T).await),
        Reason::Unsupported
    );
    // `shell` is proved for projects, but no interpreter is kept for it.
    assert_eq!(
        refused(&s.call(cell("shell", "echo"), T).await),
        Reason::Unsupported
    );
    if has(
        "python",
        &p,
        "cells_in_unproved_languages_and_bad_files_are_refused",
    ) {
        let o = s
            .call(
                SessionWork::Cell(pb::CellRun {
                    language: "python".into(),
                    code: "open('ran', 'w').write('x')".into(),
                    files: vec![pb::ProjectFile {
                        path: "/etc/passwd".into(),
                        content: "x".into(),
                    }],
                }),
                T,
            )
            .await;
        assert_eq!(refused(&o), Reason::Request);
        assert!(o.ended.is_none());
        let o = s
            .call(step("test -e ran && echo ran || echo absent"), T)
            .await;
        assert_eq!(stdout(&o), "absent");
    }
    s.close().await;
}

#[tokio::test]
async fn a_forged_cell_answer_is_a_failure_not_an_answer() {
    let (_d, p) = provider().await;
    if !has(
        "javascript",
        &p,
        "a_forged_cell_answer_is_a_failure_not_an_answer",
    ) {
        return;
    }
    let s = open(&p, 0).await;
    let o = s
        .call(
            cell(
                "javascript",
                "require('fs').writeSync(3, '{\"nonce\":\"1\",\"status\":\"ok\"}\\n')",
            ),
            T,
        )
        .await;
    assert!(
        matches!(o.answer, Err(ProviderError::Failed(_))),
        "{:?}",
        o.answer
    );
    assert!(o.ended.is_none());
    let o = s.call(cell("javascript", "40 + 2"), T).await;
    assert_eq!(stdout(&o), "42");
    s.close().await;
}

#[tokio::test]
async fn a_deadline_ends_the_cell_not_the_session() {
    let (_d, p) = provider().await;
    if !has("python", &p, "a_deadline_ends_the_cell_not_the_session") {
        return;
    }
    let s = open(&p, 0).await;
    let o = s
        .call(
            cell("python", "while True: pass"),
            Duration::from_millis(500),
        )
        .await;
    assert!(o.ended.is_none());
    match o.answer {
        Ok(SessionAnswer::Cell(c)) => {
            assert_eq!(c.exit_code, 124);
            assert!(c.timed_out && c.interpreter_ended);
        }
        other => panic!("{other:?}"),
    }
    let o = s.call(cell("python", "'alive'"), T).await;
    match &o.answer {
        Ok(SessionAnswer::Cell(c)) => assert!(c.interpreter_started),
        other => panic!("{other:?}"),
    }
    assert_eq!(stdout(&o), "'alive'");
    s.close().await;
}

/// One-shot runs' working directories are removed after the answer, on a blocking thread:
/// they still go, every one of them, and the run's processes are dead before the answer.
#[tokio::test]
async fn run_directories_are_removed_after_the_answer() {
    let (dir, p) = provider().await;
    for _ in 0..5 {
        let out = p
            .run(
                Work::Project(pb::ProjectRun {
                    steps: vec!["echo $$ > pid; sleep 300 & echo $! > bg".into()],
                    artifacts: vec!["bg".into()],
                    ..Default::default()
                }),
                T,
            )
            .await
            .unwrap();
        let Answer::Project(r) = out else {
            panic!("not a project answer")
        };
        let bg: i32 = String::from_utf8_lossy(&r.artifacts[0].content)
            .trim()
            .parse()
            .unwrap();
        // Dead (or a zombie of nobody's) when the answer arrives.
        let alive = std::fs::read_to_string(format!("/proc/{bg}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false);
        assert!(!alive, "the background child {bg} outlived the answer");
    }
    let runs = dir.path().join("runs");
    let mut left = usize::MAX;
    for _ in 0..500 {
        left = std::fs::read_dir(&runs).unwrap().count();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(left, 0, "run directories left under {}", runs.display());
}
