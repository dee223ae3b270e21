//! Sessions: one container per session, launched as a run's is (same lockdown, same
//! checks) but with sandboxd's `--session` and the [`LABEL_SESSION`](crate::engine::LABEL_SESSION)
//! label, and never taken from or returned to the warm pool. What `docker inspect` reported
//! at open is kept; before each call the container is inspected again and must still be
//! running (or paused) with the same image and lockdown ([`Lockdown`]), else the session
//! ends `SandboxChanged` and nothing runs. `suspend` pauses the container (the next call
//! unpauses it); `close` removes it and its run directory.

use std::sync::Arc;

use plimsoll_core::Refusal;
use plimsoll_provider::{
    ProviderError, ProviderSession, SessionAnswer, SessionCallOutcome, SessionEndCause,
    SessionEnded, SessionProvider, SessionSpec, SessionWork,
};
use plimsoll_sandboxd::{CallError, SandboxdClient};
use tokio::sync::Mutex;

use super::{DockerProvider, Inner, Warm, DEADLINE_GRACE};
use crate::engine::{self, Lockdown};
use crate::error::Error;

/// A session's container while the session is open.
struct Open {
    warm: Warm,
    /// The channel to its sandboxd; dropped while the container is paused.
    client: Option<SandboxdClient>,
    paused: bool,
    /// The session ended (a call's outcome said so): no further call runs.
    ended: bool,
}

/// One open Docker session.
struct DockerSession {
    inner: Arc<Inner>,
    /// `SessionSpec::disk_mb` in bytes, when measured.
    disk_limit: Option<u64>,
    opened: Lockdown,
    open: Mutex<Option<Open>>,
}

/// Why the read-back before a call found the session unusable.
enum ReadBack {
    /// The session is over.
    Ended(SessionEnded),
    /// The engine could not be asked; nothing ran, the session goes on.
    Unreachable(String),
}

fn ended(cause: SessionEndCause, detail: impl Into<String>) -> SessionEnded {
    SessionEnded {
        cause,
        detail: detail.into(),
    }
}

fn refused(r: Refusal, end: Option<SessionEnded>) -> SessionCallOutcome {
    SessionCallOutcome {
        answer: Err(r.into()),
        ended: end,
    }
}

#[async_trait::async_trait]
impl SessionProvider for DockerProvider {
    async fn open(&self, spec: SessionSpec) -> Result<Box<dyn ProviderSession>, ProviderError> {
        let s = self.inner.open_session(spec).await?;
        Ok(Box::new(s))
    }
}

impl Inner {
    /// Launches a session's container, records its inspect state and checks it.
    async fn open_session(self: &Arc<Self>, spec: SessionSpec) -> Result<DockerSession, Error> {
        let Some(proven) = self.proven.get().cloned() else {
            return Err(Error::NotStarted);
        };
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        // A never-used one from the session pool, else a fresh one; never a run's.
        let (warm, _pooled) = self
            .take_of(&proven.image_id, true)
            .await
            .map_err(|e| Error::NoContainer(Box::new(e)))?;
        let checked = async {
            let c = self
                .docker
                .inspect_container(&warm.id, None)
                .await
                .map_err(Error::Lost)?;
            let opened = Lockdown::of(&c);
            let mut wrong = opened.check().err().into_iter().collect::<Vec<_>>();
            if opened.get("image") != Some(format!("{:?}", Some(&proven.image_id)).as_str()) {
                wrong.push(format!("image is {}", opened.get("image").unwrap_or("")));
            }
            if !wrong.is_empty() {
                return Err(Error::SessionSandbox(wrong.join(", ")));
            }
            let client = self.connect(&warm).await.map_err(Error::Sandboxd)?;
            let health = client.health().await.map_err(Error::Sandboxd)?;
            if !health.session {
                return Err(Error::SessionSandbox(
                    "its sandboxd is not in session mode (the image's sandboxd predates --session?)"
                        .into(),
                ));
            }
            Ok((opened, client))
        }
        .await;
        let (opened, client) = match checked {
            Ok(v) => v,
            Err(e) => {
                self.discard(warm).await;
                return Err(e);
            }
        };
        tracing::info!(run = %warm.run_id, container = %engine::short(&warm.id), "docker session opened");
        Ok(DockerSession {
            inner: self.clone(),
            disk_limit: (spec.disk_mb > 0).then(|| u64::from(spec.disk_mb) * 1024 * 1024),
            opened,
            open: Mutex::new(Some(Open {
                warm,
                client: Some(client),
                paused: false,
                ended: false,
            })),
        })
    }

    /// Inspects a session's container: whether it is paused, or why the session is over.
    async fn read_back(&self, id: &str, opened: &Lockdown) -> Result<bool, ReadBack> {
        let c = match self.docker.inspect_container(id, None).await {
            Ok(c) => c,
            Err(e) if engine::is_not_found(&e) => {
                return Err(ReadBack::Ended(ended(
                    SessionEndCause::MainProcessEnded,
                    "the session's container is gone",
                )))
            }
            Err(e) => {
                return Err(ReadBack::Unreachable(format!(
                    "the engine could not be asked about the session's container: {e}"
                )))
            }
        };
        let state = c.state.clone().unwrap_or_default();
        if !state.running.unwrap_or(false) {
            return Err(ReadBack::Ended(ended(
                SessionEndCause::MainProcessEnded,
                format!(
                    "the session's container is not running (exit code {})",
                    state.exit_code.unwrap_or(-1)
                ),
            )));
        }
        let now = Lockdown::of(&c);
        let mut what: Vec<String> = now
            .differences(opened)
            .iter()
            .map(|f| format!("{f} differs from what it was opened with"))
            .collect();
        if state.restarting.unwrap_or(false) {
            what.push("it is restarting".into());
        }
        if let Err(e) = now.check() {
            what.push(e);
        }
        if !what.is_empty() {
            return Err(ReadBack::Ended(ended(
                SessionEndCause::SandboxChanged,
                format!("the session's container changed: {}", what.join("; ")),
            )));
        }
        Ok(state.paused.unwrap_or(false))
    }
}

impl DockerSession {
    /// Ends the session now: the container is killed (close removes it).
    async fn end(&self, open: &mut Open, why: SessionEnded) -> Option<SessionEnded> {
        tracing::warn!(container = %engine::short(&open.warm.id), cause = ?why.cause, detail = %why.detail, "docker session ended");
        open.ended = true;
        open.client = None;
        engine::kill(&self.inner.docker, &open.warm.id).await;
        Some(why)
    }

    /// After a call that failed on the channel: whether the container's main process ended.
    async fn lost(&self, open: &Open) -> Option<SessionEnded> {
        match self.inner.read_back(&open.warm.id, &self.opened).await {
            Err(ReadBack::Ended(e)) if e.cause == SessionEndCause::MainProcessEnded => Some(e),
            _ => None,
        }
    }
}

#[async_trait::async_trait]
impl ProviderSession for DockerSession {
    async fn call(&self, work: SessionWork, timeout: std::time::Duration) -> SessionCallOutcome {
        let mut guard = self.open.lock().await;
        let Some(open) = guard.as_mut().filter(|o| !o.ended) else {
            return refused(
                Refusal::environment("the docker session is over; nothing ran"),
                None,
            );
        };
        match self.inner.read_back(&open.warm.id, &self.opened).await {
            Err(ReadBack::Ended(why)) => {
                let r = Refusal::environment(format!("{}; nothing ran", why.detail));
                let end = self.end(open, why).await;
                return refused(r, end);
            }
            Err(ReadBack::Unreachable(why)) => {
                return refused(Refusal::environment(format!("{why}; nothing ran")), None)
            }
            Ok(true) => {
                if let Err(e) = engine::unpause(&self.inner.docker, &open.warm.id).await {
                    return refused(
                        Refusal::environment(format!(
                            "the session's container could not be resumed: {e}; nothing ran"
                        )),
                        None,
                    );
                }
                open.paused = false;
            }
            Ok(false) => {}
        }
        if open.client.is_none() {
            match self.inner.connect(&open.warm).await {
                Ok(c) => open.client = Some(c),
                Err(e) => {
                    let end = match self.lost(open).await {
                        Some(why) => self.end(open, why).await,
                        None => None,
                    };
                    return SessionCallOutcome {
                        answer: Err(Error::Sandboxd(e).into()),
                        ended: end,
                    };
                }
            }
        }
        let Some(client) = open.client.clone() else {
            return refused(
                Refusal::environment("no channel to the session's sandbox; nothing ran"),
                None,
            );
        };
        let reply = tokio::time::timeout(
            timeout + DEADLINE_GRACE,
            client.session_call(work, timeout, Vec::new()),
        )
        .await;
        let Ok(reply) = reply else {
            let answer = Err(Error::NoAnswer {
                timeout,
                container: engine::short(&open.warm.id).to_owned(),
            }
            .into());
            let why = ended(
                SessionEndCause::MainProcessEnded,
                "sandboxd did not answer within the deadline plus its grace; the session's container was killed",
            );
            let end = self.end(open, why).await;
            return SessionCallOutcome { answer, ended: end };
        };
        let mut why = None;
        if let Some(changed) = &reply.changed {
            why = Some(ended(
                SessionEndCause::SandboxChanged,
                format!("the session's directory changed: {changed}"),
            ));
        } else if let Err(CallError::MayHaveRun(_) | CallError::NoResult) = &reply.answer {
            why = self.lost(open).await;
        }
        if why.is_none() && reply.boundary_failed {
            why = Some(ended(
                SessionEndCause::BoundaryFailed,
                "the sweep after the call could not prove that no process of it is left",
            ));
        }
        if why.is_none() {
            if let (Some(limit), Some(used)) = (self.disk_limit, reply.disk_bytes) {
                if used > limit {
                    why = Some(ended(
                        SessionEndCause::DiskExceeded,
                        format!("the session's files take {used} bytes, more than its {limit}"),
                    ));
                }
            }
        }
        let answer: Result<SessionAnswer, ProviderError> =
            reply.answer.map_err(|e| Error::Sandboxd(e).into());
        let end = match why {
            Some(why) => self.end(open, why).await,
            None => None,
        };
        SessionCallOutcome { answer, ended: end }
    }

    async fn suspend(&self) {
        let mut guard = self.open.lock().await;
        let Some(open) = guard.as_mut().filter(|o| !o.ended && !o.paused) else {
            return;
        };
        open.client = None;
        match engine::pause(&self.inner.docker, &open.warm.id).await {
            Ok(()) => {
                open.paused = true;
                tracing::debug!(container = %engine::short(&open.warm.id), "docker session paused");
            }
            Err(e) => {
                tracing::warn!(container = %engine::short(&open.warm.id), error = %e, "could not pause an idle session's container")
            }
        }
    }

    async fn close(&self) {
        let open = self.open.lock().await.take();
        if let Some(open) = open {
            tracing::info!(container = %engine::short(&open.warm.id), "docker session closed");
            self.inner.discard(open.warm).await;
        }
    }
}

impl Drop for DockerSession {
    /// A session dropped without `close` (the daemon always closes; this is a backstop):
    /// its container is removed in the background, or at the provider's drop.
    fn drop(&mut self) {
        let Some(open) = self.open.get_mut().take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            self.inner.discard_later(open.warm);
        }
    }
}
