//! The startup session smoke test: before plimsolld serves with sessions on, one real
//! session on the provider proves that the sweep kills a leftover process, that files
//! survive calls, that each proven cell language keeps an interpreter's state, that failing
//! code comes back as a result with its exit code, that a session's code holds no
//! descriptor beyond 0, 1 and 2, and that close ends it. Each step is
//! checked from inside the sandbox by the session's own calls, so it holds for any provider.

use std::time::Duration;

use plimsoll_core::pb;
use plimsoll_provider::{
    Answer, Facts, ProviderSession, SessionAnswer, SessionProvider, SessionSpec, SessionWork, Work,
};

const STEP_TIMEOUT: Duration = Duration::from_secs(20);

fn project(steps: &[&str]) -> SessionWork {
    SessionWork::Run(Work::Project(pb::ProjectRun {
        steps: steps.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }))
}

async fn call(
    s: &dyn ProviderSession,
    what: &str,
    work: SessionWork,
) -> Result<SessionAnswer, String> {
    let out = s.call(work, STEP_TIMEOUT).await;
    if let Some(e) = out.ended {
        return Err(format!(
            "{what}: the session ended ({:?}: {})",
            e.cause, e.detail
        ));
    }
    out.answer.map_err(|e| format!("{what}: {e}"))
}

/// The exit codes of a project answer's steps.
fn exits(a: &SessionAnswer) -> Vec<i32> {
    match a {
        SessionAnswer::Run(Answer::Project(p)) => p.steps.iter().map(|s| s.exit_code).collect(),
        _ => Vec::new(),
    }
}

/// Runs the smoke test; the error names the step that failed.
pub async fn run(opener: &dyn SessionProvider, facts: &Facts) -> Result<(), String> {
    let session = opener
        .open(SessionSpec {
            languages: facts.languages.clone(),
            disk_mb: 0,
            lifetime: Duration::from_secs(300),
        })
        .await
        .map_err(|e| format!("open: {e}"))?;
    let out = steps(session.as_ref(), facts).await;
    session.close().await;
    out
}

async fn steps(s: &dyn ProviderSession, facts: &Facts) -> Result<(), String> {
    let first = call(
        s,
        "leaving a file and a background process",
        project(&[
            "echo kept > smoke-kept.txt",
            "sleep 600 >/dev/null 2>&1 & echo $! > smoke-leftover.pid",
        ]),
    )
    .await?;
    if exits(&first) != [0, 0] {
        return Err(format!(
            "leaving a file and a background process: steps exited {:?}",
            exits(&first)
        ));
    }
    let listed = call(
        s,
        "listing the session's descriptors",
        project(&[plimsoll_provider::smoke::DESCRIPTOR_STEP]),
    )
    .await?;
    if let SessionAnswer::Run(Answer::Project(p)) = &listed {
        use plimsoll_provider::smoke::{check_descriptors, listed_descriptors, step_stdout};
        listed_descriptors(&step_stdout(p, 0)).and_then(|open| check_descriptors(&open, &[]))?;
    } else {
        return Err("listing the session's descriptors: the answer was not a project's".into());
    }
    let second = call(
        s,
        "checking them in the next call",
        project(&[
            "test \"$(cat smoke-kept.txt)\" = kept",
            // Not `kill -0`: a killed process the host's init has not reaped yet is a zombie,
            // which `kill -0` still finds. Alive means a state other than Z or X.
            "st=$(sed 's/.*) //' \"/proc/$(cat smoke-leftover.pid)/stat\" 2>/dev/null | cut -c1); [ -z \"$st\" ] || [ \"$st\" = Z ] || [ \"$st\" = X ]",
        ]),
    )
    .await?;
    match exits(&second).as_slice() {
        [0, 0] => {}
        [0, _] => {
            return Err("the sweep left a background process alive into the next call".into())
        }
        _ => return Err("a file written by one call was gone in the next".into()),
    }
    for (lang, set, get) in [
        ("python", "smoke_value = 41", "smoke_value + 1"),
        ("javascript", "var smokeValue = 41", "smokeValue + 1"),
    ] {
        if !facts.languages.iter().any(|l| l == lang) {
            continue;
        }
        let cell = |code: &str| {
            SessionWork::Cell(pb::CellRun {
                language: lang.into(),
                code: code.into(),
                files: Vec::new(),
            })
        };
        call(s, &format!("a {lang} cell"), cell(set)).await?;
        match call(s, &format!("a second {lang} cell"), cell(get)).await? {
            SessionAnswer::Cell(c) if c.exit_code == 0 && c.stdout.starts_with(b"42") => {}
            SessionAnswer::Cell(c) => {
                return Err(format!(
                    "the {lang} interpreter did not keep its state between cells (exit {}, stdout {:?})",
                    c.exit_code,
                    String::from_utf8_lossy(&c.stdout)
                ))
            }
            SessionAnswer::Run(_) => return Err(format!("a {lang} cell got a run's answer")),
        }
    }
    let failing = call(s, "failing code", project(&["exit 3"])).await?;
    if exits(&failing) != [3] {
        return Err(format!(
            "failing code did not come back as a result with exit code 3 (got {:?})",
            exits(&failing)
        ));
    }
    Ok(())
}
