//! Sessions on agent-sandbox: one SandboxClaim held for the whole session (its
//! `lifecycle.shutdownTime` set past the session's lifetime), one TLS 1.3 channel to the
//! pod's sandboxd, which runs with `--session` (the read-back requires it when sessions are
//! on), every call over that channel, and the claim deleted at the end, whatever the end.
//!
//! Choices where the specification is silent: the pod is never paused when idle (the
//! controller has no pause; the pod keeps its place in the pool's count); a channel that
//! breaks mid-call ends the session `MAIN_PROCESS_ENDED` (a pod is not reconnected, since
//! a new connection could reach another pod that took the address); a pod's sandboxd that
//! answers outside a session (not started with `--session`) is refused at open.

use std::net::SocketAddr;
use std::time::Duration;

use plimsoll_core::Refusal;
use plimsoll_provider::{
    ProviderError, ProviderSession, SessionCallOutcome, SessionEndCause, SessionEnded,
    SessionProvider, SessionSpec, SessionWork,
};
use plimsoll_sandboxd::client::{CallError, SandboxdClient};
use tokio::sync::Mutex;

use crate::provider::{AgentSandboxProvider, ClaimGuard};

/// How far past a call's deadline its answer may come before the channel counts as lost.
const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// One agent-sandbox session: the claim, the pod and the channel.
pub struct AgentSandboxSession {
    claim: Mutex<Option<ClaimGuard>>,
    client: SandboxdClient,
    pod: SocketAddr,
    disk_limit: Option<u64>,
    ended: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl SessionProvider for AgentSandboxProvider {
    async fn open(&self, spec: SessionSpec) -> Result<Box<dyn ProviderSession>, ProviderError> {
        let (claim, client, pod) = self.claim_for_session(spec.lifetime).await?;
        let health = client.health().await;
        if !health.as_ref().is_ok_and(|h| h.session) {
            claim.delete().await;
            return Err(Refusal::environment(format!(
                "the pod {pod} of warm pool {} does not run sandboxd with --session; nothing ran",
                self.warm_pool()
            ))
            .into());
        }
        Ok(Box::new(AgentSandboxSession {
            claim: Mutex::new(Some(claim)),
            client,
            pod,
            disk_limit: (spec.disk_mb > 0).then(|| u64::from(spec.disk_mb) * 1024 * 1024),
            ended: Default::default(),
        }))
    }
}

#[async_trait::async_trait]
impl ProviderSession for AgentSandboxSession {
    async fn call(&self, work: SessionWork, timeout: Duration) -> SessionCallOutcome {
        use std::sync::atomic::Ordering;
        if self.ended.load(Ordering::SeqCst) {
            return SessionCallOutcome {
                answer: Err(Refusal::environment("the session's pod is gone; nothing ran").into()),
                ended: None,
            };
        }
        let reply = tokio::time::timeout(
            timeout + DEADLINE_GRACE,
            self.client.session_call(work, timeout, Vec::new()),
        )
        .await;
        let lost = |detail: String| SessionEnded {
            cause: SessionEndCause::MainProcessEnded,
            detail,
        };
        let Ok(reply) = reply else {
            self.ended.store(true, Ordering::SeqCst);
            return SessionCallOutcome {
                answer: Err(ProviderError::Failed(format!(
                    "the pod {} did not answer within the deadline plus {} s; the code may have run",
                    self.pod,
                    DEADLINE_GRACE.as_secs()
                ))),
                ended: Some(lost("the session's pod did not answer in time".into())),
            };
        };
        let mut end = reply.stated_end(self.disk_limit);
        // A call that may have run without an answer: if the pod no longer answers even
        // its health check, the session's sandbox is gone.
        if end.is_none()
            && matches!(
                &reply.answer,
                Err(CallError::MayHaveRun(_) | CallError::NoResult)
            )
            && self.client.health().await.is_err()
        {
            end = Some(lost(format!(
                "the pod {} stopped answering its channel",
                self.pod
            )));
        }
        if end.is_some() {
            self.ended.store(true, Ordering::SeqCst);
        }
        let pod = self.pod;
        SessionCallOutcome {
            answer: reply.answer.map_err(|e| match e.refusal() {
                Some(r) => ProviderError::Refused(r),
                None => ProviderError::Failed(format!("pod {pod}: {e}")),
            }),
            ended: end,
        }
    }

    async fn close(&self) {
        if let Some(claim) = self.claim.lock().await.take() {
            claim.delete().await;
        }
    }
}
