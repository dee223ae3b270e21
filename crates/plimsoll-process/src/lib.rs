//! plimsoll-process: the `process` provider. The runner executes each payload in child
//! processes of plimsolld, under plimsolld's own user: tier `process`, which is no wall at
//! all between the code and the host, nor between two runs. It needs nothing installed
//! beyond `/bin/sh` (and `node` for JavaScript), and adds a few milliseconds per run.
//!
//! Grants: each granted run gets a loopback relay with its own secret and the grant clients
//! in a private directory. Runs share one user, so any run could use another live run's
//! relay; plimsolld therefore refuses grants here with more than one caller unless the
//! operator states they trust every caller (`ProviderSetup::RUNS_SHARE_ONE_USER`).

mod session;

pub use session::ProcessSession;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::{Refusal, Tier};
use plimsoll_provider::{
    Answer, ConfigError, EnvSource, Facts, Provider, ProviderError, ProviderSetup,
    ProviderStartError, SessionProvider, Shared, Variable, Work,
};
use plimsoll_runner::{RunEnv, Runner, RunnerConfig};

/// The provider's name.
pub const NAME: &str = "process";

/// The process provider's settings: all of them are shared ones.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// Working directories go to `runs/` below it, grant clients to `grants/`.
    pub state_dir: PathBuf,
    /// Bytes kept of each output stream per program.
    pub output_bytes: usize,
    /// Deadline of a run whose request states none.
    pub default_timeout: Duration,
}

impl ProcessConfig {
    /// The settings from the shared ones.
    pub fn new(shared: &Shared) -> ProcessConfig {
        ProcessConfig {
            state_dir: shared.state_dir.clone(),
            output_bytes: shared.output_bytes,
            default_timeout: shared.default_timeout,
        }
    }
}

impl ProviderSetup for ProcessConfig {
    const NAME: &'static str = NAME;
    const VARIABLES: &'static [Variable] = &[];
    const RUNS_SHARE_ONE_USER: bool = true;

    fn from_env(_: &dyn EnvSource, shared: &Shared) -> Result<Self, ConfigError> {
        Ok(ProcessConfig::new(shared))
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderStartError> {
        Ok(Arc::new(ProcessProvider::new(self)?))
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
    pub fn new(cfg: &ProcessConfig) -> Result<ProcessProvider, ProviderStartError> {
        let runner = Runner::new(RunnerConfig {
            root_dir: cfg.state_dir.join("runs"),
            limits: plimsoll_runner::Limits {
                output_bytes: cfg.output_bytes,
                ..Default::default()
            },
            default_timeout: cfg.default_timeout,
        })
        .map_err(|e| ProviderStartError::new(NAME, e.to_string()))?
        // The answer waits for the sweep, not for the directory's removal.
        .remove_after_answer();
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
        .map_err(runner_error)
    }
}

impl ProcessProvider {
    /// The startup smoke test's descriptor check: one project lists its shell's
    /// descriptors, and any beyond 0, 1 and 2 refuses startup, named.
    async fn check_descriptors(&self) -> Result<(), ProviderStartError> {
        use plimsoll_provider::smoke::{
            check_descriptors, listed_descriptors, step_stdout, DESCRIPTOR_STEP,
        };
        let fail = |m: String| ProviderStartError::new(NAME, format!("the smoke test: {m}"));
        let p = self
            .runner
            .project(
                &plimsoll_core::pb::ProjectRun {
                    steps: vec![DESCRIPTOR_STEP.to_owned()],
                    ..Default::default()
                },
                Duration::from_secs(20),
                &RunEnv::default(),
            )
            .await
            .map_err(|e| fail(e.to_string()))?;
        listed_descriptors(&step_stdout(&p, 0))
            .and_then(|open| check_descriptors(&open, &[]))
            .map_err(fail)
    }
}

/// A runner failure as the provider reports it.
pub(crate) fn runner_error(e: plimsoll_runner::RunnerError) -> ProviderError {
    match e {
        // Setup and spawn failures happen before any program of the run started.
        plimsoll_runner::RunnerError::Setup(_) | plimsoll_runner::RunnerError::Spawn { .. } => {
            ProviderError::Refused(Refusal::environment(format!(
                "the process provider could not start the run: {e}"
            )))
        }
        // Anything else came after a program started: it may have run.
        other => ProviderError::Failed(other.to_string()),
    }
}

#[async_trait::async_trait]
impl Provider for ProcessProvider {
    fn facts(&self) -> Facts {
        Facts {
            name: NAME.into(),
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
            return Err(ProviderStartError::new(
                NAME,
                "the smoke test could not run `sh -c`; check that /bin/sh exists",
            ));
        }
        // No wall, but a run must still start with 0, 1 and 2 alone: nothing plimsolld
        // inherited (docs/plimsolld.md, "Descriptor hygiene").
        self.check_descriptors().await?;
        tracing::info!(languages = ?langs, "process provider smoke test passed");
        let _ = self.languages.set(langs);
        Ok(())
    }

    /// Sessions: see the `session` module.
    fn sessions(&self) -> Option<&dyn SessionProvider> {
        Some(self)
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
