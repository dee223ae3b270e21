//! plimsoll-runner: executes one payload (a JavaScript snippet or a project's steps) in a
//! fresh working directory, under one shared deadline measured on the monotonic clock,
//! with capped output, a fixed clean environment, and the whole process tree killed at the
//! deadline and at the end of the run.
//!
//! It is the same code in every wall: the process provider calls it inside plimsolld, and
//! plimsoll-sandboxd calls it inside containers and pods. It must never read the wall clock
//! for a duration, never inherit the caller's environment, and never follow a path out of
//! the working directory.

use std::path::PathBuf;
use std::time::Duration;

use plimsoll_core::pb;

/// Per-run output limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes kept of each stream (stdout, stderr) per program; the rest is read and dropped,
    /// and the matching `*_truncated` flag is set.
    pub output_bytes: usize,
    /// Total bytes of artifacts returned; past it `artifacts_truncated` is set.
    pub artifact_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            output_bytes: 1024 * 1024,
            artifact_bytes: 8 * 1024 * 1024,
        }
    }
}

/// How a runner is set up.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Runs get fresh working directories under this directory (created if missing).
    pub root_dir: PathBuf,
    /// Output limits.
    pub limits: Limits,
    /// The deadline when a request leaves it to the provider.
    pub default_timeout: Duration,
}

/// Extra environment variables for a run's programs (for example a grant relay's address),
/// checked so that none of them chooses what a program loads or runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunEnv(Vec<(String, String)>);

/// An environment variable the runner refuses to pass to a program.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {name} would choose what a program loads or runs; it is refused")]
pub struct EnvRefused {
    /// The refused name.
    pub name: String,
}

impl RunEnv {
    /// Checks every name; refuses `PATH`, `LD_*`, `NODE_OPTIONS`, `PYTHONPATH`, `BASH_ENV`,
    /// `ENV` and the rest of that family.
    pub fn new(vars: Vec<(String, String)>) -> Result<RunEnv, EnvRefused> {
        let _ = vars;
        unimplemented!("plimsoll-runner: RunEnv::new")
    }
    /// The variables, in order.
    pub fn vars(&self) -> &[(String, String)] {
        &self.0
    }
}

/// A failure of the runner itself (not of the payload: a non-zero exit is a result).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerError {
    /// The working directory could not be prepared; nothing ran.
    #[error("could not prepare the run's working directory: {0}")]
    Setup(#[source] std::io::Error),
    /// A program could not be started (for example node is missing); nothing ran.
    #[error("could not start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Executes payloads. Cheap to share (`Arc`) across concurrent runs.
#[derive(Debug)]
pub struct Runner {
    cfg: RunnerConfig,
}

impl Runner {
    /// Creates the root directory if needed.
    pub fn new(cfg: RunnerConfig) -> Result<Runner, RunnerError> {
        Ok(Runner { cfg })
    }

    /// The configuration.
    pub fn config(&self) -> &RunnerConfig {
        &self.cfg
    }

    /// Runs a snippet with node. On the deadline: `timed_out`, exit code 124.
    pub async fn javascript(
        &self,
        js: &pb::JavaScriptRun,
        timeout: Duration,
        env: &RunEnv,
    ) -> Result<pb::JavaScriptResult, RunnerError> {
        let _ = (js, timeout, env);
        unimplemented!("plimsoll-runner: javascript")
    }

    /// Writes the files, runs the steps with `sh -c` in order (stopping at the first
    /// non-zero exit), collects the artifacts. Bad paths give `setup_failed`.
    pub async fn project(
        &self,
        p: &pb::ProjectRun,
        timeout: Duration,
        env: &RunEnv,
    ) -> Result<pb::ProjectResult, RunnerError> {
        let _ = (p, timeout, env);
        unimplemented!("plimsoll-runner: project")
    }

    /// Proves which languages this runner can execute by running a tiny program in each:
    /// `javascript` (node), `python` (python3), `shell` (sh).
    pub async fn prove_languages(&self) -> Vec<String> {
        unimplemented!("plimsoll-runner: prove_languages")
    }
}
