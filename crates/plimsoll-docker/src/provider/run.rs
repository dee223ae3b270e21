//! One run: its checks, a ready container (a warm one that turns out unusable is replaced
//! by one fresh container, once), the grant's relay in the run's directory, the sandboxd
//! call under the deadline plus [`DEADLINE_GRACE`], and the container killed when the run
//! timed out or the call failed, then removed in the background.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::pb;
use plimsoll_grants::prepare;
use plimsoll_provider::{Answer, ProviderError, Work};
use plimsoll_runner::RunEnv;
use plimsoll_sandboxd::SandboxdClient;

use super::{Inner, Warm, DEADLINE_GRACE, GRANT_SOCKET_NAME};
use crate::engine::{self, CHANNEL_DIR};
use crate::error::Error;

impl Inner {
    /// Runs `work` with `env` added to its programs' environment, and with `grant`'s relay
    /// when it has one.
    pub(super) async fn run(
        self: &Arc<Self>,
        work: Work,
        timeout: Duration,
        env: Vec<(String, String)>,
        grant: Option<plimsoll_grants::RunGrant>,
    ) -> Result<Answer, ProviderError> {
        let Some(proven) = self.proven.get().cloned() else {
            return Err(Error::NotStarted.into());
        };
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed.into());
        }
        RunEnv::new(env.clone()).map_err(Error::Env)?;
        let (warm, client) = self.ready(&proven.image_id).await?;
        // The run's relay opens in its own directory, once the container is chosen.
        let mut env = env;
        let relay = match &grant {
            None => None,
            Some(g) => {
                match prepare::unix_socket(g, &warm.dir, GRANT_SOCKET_NAME, CHANNEL_DIR).await {
                    Ok(prepared) => {
                        env.extend_from_slice(prepared.vars());
                        Some(prepared)
                    }
                    Err(e) => {
                        self.discard_later(warm);
                        return Err(Error::Grant(e).into());
                    }
                }
            }
        };
        let outcome =
            tokio::time::timeout(timeout + DEADLINE_GRACE, client.run(work, timeout, env)).await;
        drop(client);
        // The grant ends with the run.
        if let Some(relay) = relay {
            relay.close().await;
        }
        let answer = match outcome {
            Err(_) => Err(Error::NoAnswer {
                timeout,
                container: engine::short(&warm.id).to_owned(),
            }),
            Ok(r) => r.map_err(Error::Sandboxd),
        };
        let timed_out = match &answer {
            Ok(Answer::Javascript(j)) => j.timed_out,
            Ok(Answer::Project(p)) => p.outcome == pb::ProjectOutcome::TimedOut as i32,
            // sandboxd did not answer, or its answer cannot be used: the container is
            // killed before the run is answered.
            Err(_) => true,
        };
        if timed_out {
            // Whatever the runner's sweep missed dies with the container, before the caller
            // hears the deadline passed.
            engine::kill(&self.docker, &warm.id).await;
        }
        self.discard_later(warm);
        answer.map_err(ProviderError::from)
    }

    /// A ready container and a channel to its sandboxd. A pool member that died while it
    /// waited sent nothing: one fresh container is tried in its place.
    async fn ready(self: &Arc<Self>, image_id: &str) -> Result<(Warm, SandboxdClient), Error> {
        let no_container = |e| Error::NoContainer(Box::new(e));
        let (mut w, mut pooled) = self.take(image_id).await.map_err(no_container)?;
        loop {
            match self.connect(&w).await {
                Ok(c) => return Ok((w, c)),
                Err(e) => {
                    self.discard_later(w);
                    if !pooled {
                        return Err(Error::Sandboxd(e));
                    }
                    tracing::warn!(error = %e, "a warm container was unusable; starting a fresh one");
                    w = self.launch(image_id).await.map_err(no_container)?;
                    pooled = false;
                }
            }
        }
    }
}
