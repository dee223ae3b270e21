//! The providers built into plimsolld, and the factory that picks one from the
//! configuration. The interface itself is `plimsoll_provider`.

use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::{Refusal, Tier};
use plimsoll_runner::{RunEnv, Runner, RunnerConfig};

pub use plimsoll_provider::{Answer, Facts, Provider, ProviderError, ProviderStartError, Work};

use crate::config::{Config, ProviderKind};

/// Builds the provider the configuration names.
pub fn build(cfg: &Config) -> Result<Arc<dyn Provider>, ProviderStartError> {
    match cfg.provider {
        ProviderKind::Disabled => Ok(Arc::new(Disabled)),
        ProviderKind::Process => Ok(Arc::new(ProcessProvider::new(cfg)?)),
        ProviderKind::Docker => {
            let docker = cfg.docker.clone().ok_or_else(|| ProviderStartError {
                provider: "docker".into(),
                message: "SANDBOX_DOCKER_IMAGE is not set".into(),
            })?;
            Ok(Arc::new(plimsoll_docker::DockerProvider::new(docker)?))
        }
        other => Err(ProviderStartError {
            provider: other.as_str().into(),
            message: format!(
                "SANDBOX_PROVIDER={} is not available in this build yet; use SANDBOX_PROVIDER=process",
                other.as_str()
            ),
        }),
    }
}

/// The disabled provider: runs nothing.
#[derive(Debug)]
pub struct Disabled;

#[async_trait::async_trait]
impl Provider for Disabled {
    fn facts(&self) -> Facts {
        Facts {
            name: "disabled".into(),
            ..Default::default()
        }
    }
    async fn start(&self) -> Result<(), ProviderStartError> {
        Ok(())
    }
    async fn ready(&self) -> bool {
        true
    }
    async fn run(&self, _: Work, _: Duration) -> Result<Answer, ProviderError> {
        Err(
            Refusal::disabled("no provider is configured; the operator must set SANDBOX_PROVIDER")
                .into(),
        )
    }
}

/// The process provider: the runner in child processes of plimsolld. No OS wall.
#[derive(Debug)]
pub struct ProcessProvider {
    runner: Runner,
    languages: std::sync::OnceLock<Vec<String>>,
}

impl ProcessProvider {
    /// Prepares the runner under the state directory.
    pub fn new(cfg: &Config) -> Result<ProcessProvider, ProviderStartError> {
        let runner = Runner::new(RunnerConfig {
            root_dir: cfg.state_dir.join("runs"),
            limits: plimsoll_runner::Limits {
                output_bytes: cfg.output_bytes,
                ..Default::default()
            },
            default_timeout: cfg.default_timeout,
        })
        .map_err(|e| ProviderStartError {
            provider: "process".into(),
            message: e.to_string(),
        })?;
        Ok(ProcessProvider {
            runner,
            languages: Default::default(),
        })
    }
}

#[async_trait::async_trait]
impl Provider for ProcessProvider {
    fn facts(&self) -> Facts {
        Facts {
            name: "process".into(),
            tier: Some(Tier::Process),
            languages: self.languages.get().cloned().unwrap_or_default(),
            supports_project: true,
            max_timeout_ms: plimsoll_core::validate::MAX_TIMEOUT_MS,
            ..Default::default()
        }
    }

    async fn start(&self) -> Result<(), ProviderStartError> {
        let langs = self.runner.prove_languages().await;
        if !langs.iter().any(|l| l == "shell") {
            return Err(ProviderStartError {
                provider: "process".into(),
                message: "the smoke test could not run `sh -c`; check that /bin/sh exists".into(),
            });
        }
        tracing::info!(languages = ?langs, "process provider smoke test passed");
        let _ = self.languages.set(langs);
        Ok(())
    }

    async fn ready(&self) -> bool {
        self.runner.config().root_dir.is_dir()
            || std::fs::create_dir_all(&self.runner.config().root_dir).is_ok()
    }

    async fn run(&self, work: Work, timeout: Duration) -> Result<Answer, ProviderError> {
        let env = RunEnv::default();
        let spawn_failed = |e: plimsoll_runner::RunnerError| match e {
            // Setup and spawn failures happen before any program of the run started.
            plimsoll_runner::RunnerError::Setup(_) | plimsoll_runner::RunnerError::Spawn { .. } => {
                ProviderError::Refused(Refusal::environment(format!(
                    "the process provider could not start the run: {e}"
                )))
            }
            // Anything else came after a program started: it may have run.
            other => ProviderError::Failed(other.to_string()),
        };
        match work {
            Work::Javascript(js) => {
                if !self.facts().languages.iter().any(|l| l == "javascript") {
                    return Err(Refusal::unsupported(
                        "node was not found by the startup check; javascript is unavailable",
                    )
                    .into());
                }
                self.runner
                    .javascript(&js, timeout, &env)
                    .await
                    .map(Answer::Javascript)
                    .map_err(spawn_failed)
            }
            Work::Project(p) => self
                .runner
                .project(&p, timeout, &env)
                .await
                .map(Answer::Project)
                .map_err(spawn_failed),
        }
    }
}
