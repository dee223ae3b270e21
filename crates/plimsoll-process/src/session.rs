//! The process provider's sessions: one [`RunnerSession`] per session, in `runs/` below the
//! state directory, with no OS wall around it (tier `process`).
//!
//! # Choices where the specification is silent
//!
//! - **Order of a call.** Read-back of the session's directory first (a difference refuses
//!   the call, nothing ran, and ends the session `SandboxChanged`); then the call, which
//!   sweeps before it returns; a sweep that could not prove the session clean ends it
//!   `BoundaryFailed`; then the disk is measured (past `disk_mb` MiB, when above 0, the
//!   answer is still returned and the session ends `DiskExceeded`).
//! - **Cells.** Only in a language the startup checks proved (`Facts::languages`); others
//!   are refused `unsupported`. Refused cell files are a `request` refusal naming the path;
//!   the interpreter is untouched. Interpreters start lazily: the open's language hint
//!   starts nothing.
//! - **Errors.** As for runs: setup and spawn failures (nothing ran) are `environment`
//!   refusals; anything after the code may have started (an untrustworthy interpreter
//!   answer included) is [`ProviderError::Failed`].
//! - **Grants.** Session calls carry none (plimsolld refuses grants in sessions).
//! - **Closed.** A call after [`ProviderSession::close`] is refused `environment`.

use std::time::Duration;

use plimsoll_core::Refusal;
use plimsoll_provider::{
    Answer, ProviderError, ProviderSession, SessionAnswer, SessionCallOutcome, SessionEndCause,
    SessionEnded, SessionProvider, SessionSpec, SessionWork, Work,
};
use plimsoll_runner::{RunEnv, RunnerError, RunnerSession};

use crate::{runner_error, ProcessProvider};

/// One open session of the process provider.
#[derive(Debug)]
pub struct ProcessSession {
    session: tokio::sync::Mutex<Option<RunnerSession>>,
    /// The session's own user, held until the session is dropped (per-run users only).
    _user: Option<crate::users::Slot>,
    /// The session's disk limit in bytes (0 = not measured).
    disk_limit: u64,
    /// Languages cells may use.
    languages: Vec<String>,
}

#[async_trait::async_trait]
impl SessionProvider for ProcessProvider {
    async fn open(&self, spec: SessionSpec) -> Result<Box<dyn ProviderSession>, ProviderError> {
        let (runner, user) = self.runner_for_one().map_err(ProviderError::Refused)?;
        let session = runner.open_session().map_err(|e| {
            ProviderError::Refused(Refusal::environment(format!(
                "the process provider could not open the session: {e}"
            )))
        })?;
        tracing::info!(tag = session.tag(), "process session opened");
        Ok(Box::new(ProcessSession {
            session: tokio::sync::Mutex::new(Some(session)),
            _user: user,
            disk_limit: u64::from(spec.disk_mb) * 1024 * 1024,
            languages: self.languages.get().cloned().unwrap_or_default(),
        }))
    }
}

impl ProcessSession {
    fn outcome(
        answer: Result<SessionAnswer, ProviderError>,
        ended: Option<(SessionEndCause, String)>,
    ) -> SessionCallOutcome {
        SessionCallOutcome {
            answer,
            ended: ended.map(|(cause, detail)| SessionEnded { cause, detail }),
        }
    }

    async fn dispatch(
        &self,
        s: &RunnerSession,
        work: SessionWork,
        timeout: Duration,
    ) -> Result<SessionAnswer, ProviderError> {
        let none = RunEnv::default();
        match work {
            SessionWork::Run(Work::Javascript(js)) => s
                .javascript(&js, timeout, &none)
                .await
                .map(|r| SessionAnswer::Run(Answer::Javascript(r))),
            SessionWork::Run(Work::Project(p)) => s
                .project(&p, timeout, &none)
                .await
                .map(|r| SessionAnswer::Run(Answer::Project(r))),
            SessionWork::Cell(c) => {
                if !self.languages.contains(&c.language) {
                    return Err(ProviderError::Refused(Refusal::unsupported(format!(
                        "the process provider did not prove cells in {:?} (proved: {})",
                        c.language,
                        self.languages.join(", ")
                    ))));
                }
                s.cell(&c, timeout).await.map(SessionAnswer::Cell)
            }
        }
        .map_err(|e| match e {
            RunnerError::CellFiles(detail) => ProviderError::Refused(Refusal::request(detail)),
            RunnerError::CellLanguage(l) => ProviderError::Refused(Refusal::unsupported(format!(
                "cells in {l:?} are not supported"
            ))),
            other => runner_error(other),
        })
    }
}

#[async_trait::async_trait]
impl ProviderSession for ProcessSession {
    async fn call(&self, work: SessionWork, timeout: Duration) -> SessionCallOutcome {
        let guard = self.session.lock().await;
        let Some(s) = guard.as_ref() else {
            return Self::outcome(
                Err(ProviderError::Refused(Refusal::environment(
                    "the session is closed",
                ))),
                None,
            );
        };
        if let Err(detail) = s.read_back() {
            tracing::warn!(tag = s.tag(), %detail, "process session changed");
            return Self::outcome(
                Err(ProviderError::Refused(Refusal::environment(format!(
                    "the session's sandbox changed: {detail}"
                )))),
                Some((SessionEndCause::SandboxChanged, detail)),
            );
        }
        let answer = self.dispatch(s, work, timeout).await;
        if !s.last_sweep_clean() {
            tracing::warn!(tag = s.tag(), "process session sweep failed");
            return Self::outcome(
                answer,
                Some((
                    SessionEndCause::BoundaryFailed,
                    "a process the call left could not be killed".into(),
                )),
            );
        }
        if self.disk_limit > 0 {
            let used = s.disk_bytes();
            if used > self.disk_limit {
                let detail = if used == u64::MAX {
                    "the session's files could not be measured (too many entries)".to_owned()
                } else {
                    format!(
                        "the session's files take {used} bytes, above its limit of {} bytes",
                        self.disk_limit
                    )
                };
                return Self::outcome(answer, Some((SessionEndCause::DiskExceeded, detail)));
            }
        }
        Self::outcome(answer, None)
    }

    async fn close(&self) {
        if let Some(s) = self.session.lock().await.take() {
            tracing::info!(tag = s.tag(), "process session closed");
            s.close().await;
        }
    }
}
