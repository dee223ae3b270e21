//! plimsoll-process: the `process` provider. The runner executes each payload in child
//! processes of plimsolld, under plimsolld's own user: tier `process`, which is no wall at
//! all between the code and the host, nor between two runs. It needs nothing installed
//! beyond `/bin/sh` (and `node` for JavaScript), and adds a few milliseconds per run.
//!
//! Grants: each granted run gets a loopback relay with its own secret and the grant clients
//! in a private directory. Runs share one user, so any run could use another live run's
//! relay; plimsolld therefore refuses grants here with more than one caller unless the
//! operator states they trust every caller (`ProviderSetup::RUNS_SHARE_ONE_USER`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::{pb, Refusal, Tier};
use plimsoll_provider::{
    Answer, ConfigError, EnvSource, Facts, Provider, ProviderError, ProviderSetup,
    ProviderStartError, Shared, Variable, Work,
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
        .map_err(|e| ProviderStartError::new(NAME, e.to_string()))?;
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
        match work {
            Work::Javascript(js) => {
                if !self.facts().languages.iter().any(|l| l == "javascript") {
                    return Err(Refusal::unsupported(
                        "node was not found by the startup check; javascript is unavailable",
                    )
                    .into());
                }
                self.runner
                    .javascript(&js, timeout, env)
                    .await
                    .map(Answer::Javascript)
                    .map_err(spawn_failed)
            }
            Work::Project(p) => self
                .runner
                .project(&p, timeout, env)
                .await
                .map(Answer::Project)
                .map_err(spawn_failed),
        }
    }
}

/// A fresh private directory (0700) for one run's grant clients.
fn grant_client_dir(parent: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    use rand::RngCore;
    use std::os::unix::fs::DirBuilderExt;
    std::fs::create_dir_all(parent)?;
    let mut b = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut b);
    let dir = parent.join(format!("g-{}", hex::encode(b)));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
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
        let dir = grant_client_dir(&self.grants_dir).map_err(|e| not_ready(e.to_string()))?;
        let prepared = async {
            let files = plimsoll_grants::client::write(&dir).map_err(|e| e.to_string())?;
            let relay = grant.open_loopback().await.map_err(|e| e.to_string())?;
            let mut vars = relay.env();
            vars.push((
                plimsoll_grants::env_names::JS.into(),
                files.js.to_string_lossy().into_owned(),
            ));
            vars.push((
                plimsoll_grants::env_names::PY.into(),
                files.py.to_string_lossy().into_owned(),
            ));
            let env = RunEnv::new(vars).map_err(|e| e.to_string())?;
            Ok::<_, String>((relay, env))
        }
        .await;
        let (relay, env) = match prepared {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(not_ready(e));
            }
        };
        let work = match work {
            Work::Project(mut p) => {
                for (name, text) in [
                    (
                        plimsoll_grants::client::JS_NAME,
                        plimsoll_grants::client::JS,
                    ),
                    (
                        plimsoll_grants::client::PY_NAME,
                        plimsoll_grants::client::PY,
                    ),
                ] {
                    if !p.files.iter().any(|f| f.path == name) {
                        p.files.push(pb::ProjectFile {
                            path: name.into(),
                            content: text.into(),
                        });
                    }
                }
                Work::Project(p)
            }
            other => other,
        };
        let out = self.run_with(work, timeout, &env).await;
        relay.close().await;
        let _ = std::fs::remove_dir_all(&dir);
        out
    }
}
