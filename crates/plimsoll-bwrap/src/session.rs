//! Sessions: one sandbox per session, launched as a run's is (same wall) but with
//! sandboxd's `--session`, never taken from or returned to the warm pool. sandboxd keeps
//! the session's directory in the sandbox's `/work` and sweeps after each call (its PID
//! namespace holds only the session's processes, so the sweep sees every one of them).
//! Before each call the sandbox must still be running, else the session ends
//! `MainProcessEnded` and nothing runs. A call that outlives its deadline plus
//! [`DEADLINE_GRACE`] kills the sandbox and ends the session. `close` kills it.

use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::Refusal;
use plimsoll_provider::{
    ProviderError, ProviderSession, SessionCallOutcome, SessionEndCause, SessionEnded,
    SessionProvider, SessionSpec, SessionWork,
};
use plimsoll_sandboxd::CallError;
use tokio::sync::Mutex;

use crate::provider::{call_error, BwrapProvider, Inner, DEADLINE_GRACE};
use crate::sandbox::Sandbox;

/// One open bwrap session.
struct BwrapSession {
    _inner: Arc<Inner>,
    disk_limit: Option<u64>,
    sandbox: Mutex<Option<Sandbox>>,
}

fn refused(detail: String, ended: Option<SessionEnded>) -> SessionCallOutcome {
    SessionCallOutcome {
        answer: Err(Refusal::environment(detail).into()),
        ended,
    }
}

fn ended(cause: SessionEndCause, detail: impl Into<String>) -> SessionEnded {
    SessionEnded {
        cause,
        detail: detail.into(),
    }
}

#[async_trait::async_trait]
impl SessionProvider for BwrapProvider {
    async fn open(&self, spec: SessionSpec) -> Result<Box<dyn ProviderSession>, ProviderError> {
        let inner = &self.inner;
        let Some(p) = inner.proven.get() else {
            return Err(Refusal::environment("the bwrap provider has not started").into());
        };
        if inner.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Refusal::environment("the bwrap provider is stopping").into());
        }
        let sb = inner.launch(p, true).await.map_err(|e| {
            ProviderError::Refused(Refusal::environment(format!(
                "no sandbox for the session: {e}"
            )))
        })?;
        match sb.client().health().await {
            Ok(h) if h.session => {}
            other => {
                sb.end().await;
                return Err(Refusal::environment(format!(
                    "the session's sandboxd is not in session mode ({other:?})"
                ))
                .into());
            }
        }
        tracing::info!(pid = sb.pid(), "bwrap session opened");
        Ok(Box::new(BwrapSession {
            _inner: inner.clone(),
            disk_limit: (spec.disk_mb > 0).then(|| u64::from(spec.disk_mb) * 1024 * 1024),
            sandbox: Mutex::new(Some(sb)),
        }))
    }
}

#[async_trait::async_trait]
impl ProviderSession for BwrapSession {
    async fn call(&self, work: SessionWork, timeout: Duration) -> SessionCallOutcome {
        let mut guard = self.sandbox.lock().await;
        let Some(sb) = guard.as_mut() else {
            return refused("the bwrap session is over; nothing ran".into(), None);
        };
        if !sb.alive() {
            let why = ended(
                SessionEndCause::MainProcessEnded,
                "the session's sandbox is not running",
            );
            if let Some(sb) = guard.take() {
                sb.end().await;
            }
            return refused(format!("{}; nothing ran", why.detail), Some(why));
        }
        let client = sb.client().clone();
        let reply = tokio::time::timeout(
            timeout + DEADLINE_GRACE,
            client.session_call(work, timeout, Vec::new()),
        )
        .await;
        let Ok(reply) = reply else {
            if let Some(sb) = guard.take() {
                sb.end().await;
            }
            return SessionCallOutcome {
                answer: Err(ProviderError::Failed(format!(
                    "the session's sandbox did not answer within the deadline ({timeout:?}) plus {DEADLINE_GRACE:?} and was killed; the code may have run"
                ))),
                ended: Some(ended(
                    SessionEndCause::MainProcessEnded,
                    "sandboxd did not answer within the deadline plus its grace; the session's sandbox was killed",
                )),
            };
        };
        let mut why = reply.stated_end(self.disk_limit);
        if why.is_none()
            && matches!(
                reply.answer,
                Err(CallError::MayHaveRun(_) | CallError::NoResult)
            )
            && !sb.alive()
        {
            why = Some(ended(
                SessionEndCause::MainProcessEnded,
                "the session's sandbox ended during the call",
            ));
        }
        if let Some(w) = &why {
            tracing::warn!(cause = ?w.cause, detail = %w.detail, "bwrap session ended");
            if let Some(sb) = guard.take() {
                sb.end().await;
            }
        }
        SessionCallOutcome {
            answer: reply.answer.map_err(call_error),
            ended: why,
        }
    }

    async fn close(&self) {
        if let Some(sb) = self.sandbox.lock().await.take() {
            tracing::info!(pid = sb.pid(), "bwrap session closed");
            sb.end().await;
        }
    }
}
