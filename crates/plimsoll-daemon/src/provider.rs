//! The providers built into plimsolld, and the factory that picks one from the
//! configuration. The interface itself is `plimsoll_provider`.

use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::{Refusal, Tier};
use plimsoll_runner::{RunEnv, Runner, RunnerConfig};

pub use plimsoll_provider::{Answer, Facts, Provider, ProviderError, ProviderStartError, Work};

use crate::config::{Config, ProviderKind};

/// What plimsolld calls last when it stops (after runs were drained, after a failed
/// startup, or on a signal during startup): the docker provider removes every container of
/// its instance here, bounded (docs/docker.md, "Stopping"). The other providers keep
/// nothing outside the process that this would remove.
#[derive(Debug, Clone, Default)]
pub struct Stopper(Option<Arc<plimsoll_docker::DockerProvider>>);

impl Stopper {
    /// Stops the provider; returns when what it started outside the process is removed.
    pub async fn stop(&self) {
        if let Some(d) = &self.0 {
            d.shutdown().await;
        }
    }
}

/// Builds the provider the configuration names, and how to stop it.
pub fn build(cfg: &Config) -> Result<(Arc<dyn Provider>, Stopper), ProviderStartError> {
    match cfg.provider {
        ProviderKind::Disabled => Ok((Arc::new(Disabled), Stopper::default())),
        ProviderKind::QuickJs => {
            let worker = match &cfg.quickjs_worker {
                Some(path) => plimsoll_quickjs::WorkerCommand::binary(path.clone()),
                None => plimsoll_quickjs::WorkerCommand::current_exe().map_err(|e| {
                    ProviderStartError {
                        provider: "quickjs".into(),
                        message: format!("cannot find the running binary to start workers: {e}; set SANDBOX_QUICKJS_WORKER"),
                    }
                })?,
            };
            let mut q = plimsoll_quickjs::QuickJsConfig::new(worker);
            q.memory_mb = cfg.resources.memory_mb;
            q.output_bytes = cfg.output_bytes;
            q.default_timeout = cfg.default_timeout.min(Duration::from_millis(
                plimsoll_quickjs::provider::MAX_TIMEOUT_MS.into(),
            ));
            Ok((
                Arc::new(plimsoll_quickjs::QuickJsProvider::new(q)),
                Stopper::default(),
            ))
        }
        ProviderKind::Process => Ok((Arc::new(ProcessProvider::new(cfg)?), Stopper::default())),
        ProviderKind::Docker => {
            let docker = cfg.docker.clone().ok_or_else(|| ProviderStartError {
                provider: "docker".into(),
                message: "SANDBOX_DOCKER_IMAGE is not set".into(),
            })?;
            let d = Arc::new(plimsoll_docker::DockerProvider::new(docker)?);
            Ok((d.clone(), Stopper(Some(d))))
        }
        ProviderKind::AgentSandbox => {
            let k = cfg.agentsandbox.clone().ok_or_else(|| ProviderStartError {
                provider: "agentsandbox".into(),
                message: "SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE is not set".into(),
            })?;
            Ok((
                Arc::new(plimsoll_agentsandbox::AgentSandboxProvider::new(k)?),
                Stopper::default(),
            ))
        }
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
    /// Per-run directories holding the grant clients (`state_dir/grants`).
    grants_dir: std::path::PathBuf,
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
            grants_dir: cfg.state_dir.join("grants"),
        })
    }

    /// Runs `work` with `env` added to its programs' environment.
    async fn run_with(
        &self,
        work: Work,
        timeout: Duration,
        env: &RunEnv,
    ) -> Result<Answer, ProviderError> {
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
        // Whether node passed the startup check is the service's to ask (`Facts::languages`).
        match work {
            Work::Javascript(js) => self
                .runner
                .javascript(&js, timeout, env)
                .await
                .map(Answer::Javascript),
            Work::Project(p) => self
                .runner
                .project(&p, timeout, env)
                .await
                .map(Answer::Project),
        }
        .map_err(spawn_failed)
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
            supports_grants: true,
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
        self.run_with(work, timeout, &RunEnv::default()).await
    }

    /// The relay is a loopback port with the run's secret; the clients are written to a
    /// private directory named by `PLIMSOLL_GRANT_JS` / `PLIMSOLL_GRANT_PY`, and a project
    /// also gets them at the top of its working directory (unless it brings files of
    /// those names). The relay closes, and the directory goes, when the run ends.
    async fn run_granted(
        &self,
        work: Work,
        timeout: Duration,
        grant: plimsoll_grants::RunGrant,
    ) -> Result<Answer, ProviderError> {
        let not_ready = |e: String| {
            ProviderError::Refused(Refusal::environment(format!(
                "the process provider could not prepare the run's grant: {e}"
            )))
        };
        let prepared = plimsoll_grants::prepare::loopback(&grant, &self.grants_dir)
            .await
            .map_err(|e| not_ready(e.to_string()))?;
        let env = match RunEnv::new(prepared.vars().to_vec()) {
            Ok(env) => env,
            Err(e) => {
                prepared.close().await;
                return Err(not_ready(e.to_string()));
            }
        };
        let mut work = work;
        if let Work::Project(p) = &mut work {
            plimsoll_grants::prepare::add_clients(p);
        }
        let out = self.run_with(work, timeout, &env).await;
        prepared.close().await;
        out
    }
}
