//! plimsoll-provider: the one interface between plimsolld and a wall. A provider owns one
//! kind of wall (quickjs, process, bwrap, docker, agentsandbox) and states its tier from evidence it
//! checked at startup; the daemon talks to it only through [`Provider`], and configures and
//! builds it only through [`ProviderSetup`] (its variables, reading, hardened-mode gaps).
//!
//! A provider must never claim a tier it did not prove, and must return
//! [`ProviderError::Refused`] only when it is certain nothing ran.

pub mod seccomp;
pub mod smoke;
pub mod users;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::{pb, Refusal, Tier};

pub use plimsoll_config::{ConfigError, EnvSource, Variable, Vars};

/// What a provider states about itself, after its startup checks.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The provider's name (`process`, `docker`, `agentsandbox`, `disabled`).
    pub name: String,
    /// The tier runs actually get; `None` for the disabled provider.
    pub tier: Option<Tier>,
    /// The outer environment identity (content-addressed), or empty.
    pub environment: String,
    /// The software identity of what runs, or empty when the provider states none.
    pub software_identity: String,
    /// Languages the startup checks proved.
    pub languages: Vec<String>,
    /// Whether project payloads are supported.
    pub supports_project: bool,
    /// The provider's ceiling on a run's deadline.
    pub max_timeout_ms: u32,
    /// Verified sandbox policy digest, or empty.
    pub policy: String,
    /// Whether runs can carry a grant: the provider implements [`Provider::run_granted`] and
    /// its runs reach the broker's relay without the credential entering the wall. `false`
    /// (the default) makes plimsolld refuse granted requests marked `unsupported`.
    pub supports_grants: bool,
}

/// A payload the daemon admitted.
#[derive(Debug, Clone)]
pub enum Work {
    /// A JavaScript snippet.
    Javascript(pb::JavaScriptRun),
    /// A project.
    Project(pb::ProjectRun),
}

/// A provider's answer.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A snippet's result.
    Javascript(pb::JavaScriptResult),
    /// A project's result.
    Project(pb::ProjectResult),
}

/// A provider failure. Only [`ProviderError::Refused`] promises that nothing ran.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// Nothing ran; the refusal carries its reason.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Something failed after the payload may have started.
    #[error("{0}")]
    Failed(String),
}

/// A startup failure of a provider, naming what to fix.
#[derive(Debug, thiserror::Error)]
#[error("provider {provider}: {message}")]
pub struct ProviderStartError {
    /// The provider.
    pub provider: String,
    /// What failed and what to do.
    pub message: String,
    /// Which check failed.
    pub kind: StartFailure,
}

impl ProviderStartError {
    /// A startup check or the smoke test failed.
    pub fn new(provider: impl Into<String>, message: impl Into<String>) -> ProviderStartError {
        ProviderStartError {
            provider: provider.into(),
            message: message.into(),
            kind: StartFailure::Check,
        }
    }

    /// The ship scan refused what the provider would run (`PLIMSOLL_WITHHELD_SET`), or could
    /// not read it. The message names each place, never the matched bytes.
    pub fn ship_scan(
        provider: impl Into<String>,
        message: impl Into<String>,
    ) -> ProviderStartError {
        ProviderStartError {
            provider: provider.into(),
            message: message.into(),
            kind: StartFailure::ShipScan,
        }
    }
}

/// Which part of a provider's startup failed (plimsolld words and codes them apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFailure {
    /// A startup check, or the smoke test.
    Check,
    /// The ship scan of the image the provider would run.
    ShipScan,
}

/// One kind of wall.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// What the provider states (valid after `start`).
    fn facts(&self) -> Facts;
    /// Startup checks and the smoke test: one real run through the wall. Nothing is
    /// served until this succeeds.
    async fn start(&self) -> Result<(), ProviderStartError>;
    /// Whether the provider can take runs now (`/readyz`).
    async fn ready(&self) -> bool;
    /// Called last when plimsolld stops (after runs were drained, after a failed startup, or
    /// on a signal during startup); returns when whatever the provider started outside the
    /// process is gone. The default does nothing: only providers that leave something behind
    /// (the docker provider's containers) implement it.
    async fn stop(&self) {}
    /// The provider's sessions, when it keeps sandboxes across calls. The default is `None`:
    /// plimsolld then refuses to start with `SANDBOX_MAX_SESSIONS` above 0.
    fn sessions(&self) -> Option<&dyn SessionProvider> {
        None
    }
    /// Runs one admitted payload under `timeout`.
    async fn run(&self, work: Work, timeout: Duration) -> Result<Answer, ProviderError>;
    /// Runs one admitted payload whose request named a grant profile the caller may use.
    /// The provider opens the run's relay with `grant` in the way its wall allows
    /// ([`plimsoll_grants::RunGrant::open_loopback`] or
    /// [`plimsoll_grants::RunGrant::open_unix`]), gives the run the relay's variables
    /// ([`plimsoll_grants::Relay::env`]), and closes the relay when the run ends; the daemon
    /// reads the grant's trace afterwards.
    ///
    /// Called only when [`Facts::supports_grants`] is true. The default refuses, marked
    /// `unsupported`, so providers without grants need not implement it.
    async fn run_granted(
        &self,
        work: Work,
        timeout: Duration,
        grant: plimsoll_grants::RunGrant,
    ) -> Result<Answer, ProviderError> {
        let _ = (work, timeout);
        Err(Refusal::unsupported(format!(
            "the {} provider does not offer grants (profile {:?})",
            self.facts().name,
            grant.profile_name()
        ))
        .into())
    }
}

/// Per-run resource limits from `SANDBOX_MEMORY_MB`, `SANDBOX_CPUS`, `SANDBOX_PIDS` and
/// `SANDBOX_DISK_MB` (0 = the provider's default).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Resources {
    /// Memory in MiB.
    pub memory_mb: u32,
    /// CPUs.
    pub cpus: f64,
    /// Processes.
    pub pids: u32,
    /// Writable disk in MiB.
    pub disk_mb: u32,
}

/// The daemon-wide settings plimsolld reads once and every provider may use.
#[derive(Debug, Clone)]
pub struct Shared {
    /// `PLIMSOLL_STATE_DIR`: each provider keeps its files in a folder of its own below it.
    pub state_dir: PathBuf,
    /// `SANDBOX_OUTPUT_BYTES`: bytes kept of each output stream per program.
    pub output_bytes: usize,
    /// `SANDBOX_DEFAULT_TIMEOUT_MS`: the deadline of a run whose request states none.
    pub default_timeout: Duration,
    /// The per-run limits.
    pub resources: Resources,
    /// Which of the four resource variables were set (a provider that keeps only some of
    /// them refuses the others, naming them).
    pub explicit_resources: Vec<&'static str>,
    /// Whether sessions are on (`SANDBOX_MAX_SESSIONS` > 0): a provider whose sandboxes
    /// must be set up for them checks that at startup.
    pub sessions: bool,
    /// `SANDBOX_SESSION_POOL`: never-used session sandboxes a provider keeps ready (only
    /// the docker provider has such a pool; plimsolld refuses it for any other).
    pub session_pool: usize,
}

impl Default for Shared {
    fn default() -> Shared {
        Shared {
            state_dir: std::env::temp_dir().join("plimsoll"),
            output_bytes: 1024 * 1024,
            default_timeout: Duration::from_secs(30),
            resources: Resources::default(),
            explicit_resources: Vec::new(),
            sessions: false,
            session_pool: 0,
        }
    }
}

/// How plimsolld configures and builds one kind of provider. Each provider crate implements
/// it on its configuration type; plimsolld's provider list names the type once, and gets
/// from it the variables for `--help`, the reading, the checks when another provider is
/// chosen, hardened mode's gaps and the provider itself.
pub trait ProviderSetup: Sized + std::fmt::Debug + Clone + Send + Sync + 'static {
    /// The name in `SANDBOX_PROVIDER`, in `Describe` and in records.
    const NAME: &'static str;
    /// Every variable this provider reads beyond the shared ones, with one line of help.
    const VARIABLES: &'static [Variable];
    /// Whether every run executes as plimsolld's own user with no wall between runs, so one
    /// run can read another's relay secret: plimsolld then refuses grants with more than one
    /// caller unless the operator states they trust every caller with every grant.
    const RUNS_SHARE_ONE_USER: bool = false;

    /// Reads and checks the provider's settings (`SANDBOX_PROVIDER` names this provider).
    fn from_env(env: &dyn EnvSource, shared: &Shared) -> Result<Self, ConfigError>;

    /// Checks this provider's variables when another provider is chosen: a variable that
    /// would silently do nothing (or is malformed) is refused here, naming it. The default
    /// accepts everything.
    fn check_unselected(env: &dyn EnvSource, chosen: &str) -> Result<(), ConfigError> {
        let _ = (env, chosen);
        Ok(())
    }

    /// The provider, ready for [`Provider::start`].
    fn build(&self) -> Result<Arc<dyn Provider>, ProviderStartError>;

    /// Hardened mode's safeguards this provider's settings lack, each with what to set
    /// (the tier and the daemon-wide safeguards are checked by plimsolld).
    fn hardened_gaps(&self) -> Vec<String> {
        Vec::new()
    }

    /// The limits runs get when they differ from the shared ones (stated by `Describe`).
    fn resources(&self, shared: Resources) -> Resources {
        shared
    }
}

/// What a session call runs: a snippet or project (as in a run), or a cell.
#[derive(Debug, Clone)]
pub enum SessionWork {
    /// A snippet or a project, run in the session's working directory.
    Run(Work),
    /// A cell: code for the session's kept interpreter of its language.
    Cell(pb::CellRun),
}

/// What a session call answered.
#[derive(Debug, Clone)]
pub enum SessionAnswer {
    /// A snippet's or project's result.
    Run(Answer),
    /// A cell's result.
    Cell(pb::CellResult),
}

/// How a session is to be opened (already checked and clamped by plimsolld).
#[derive(Debug, Clone, Default)]
pub struct SessionSpec {
    /// Languages the caller hinted it will use in cells (`javascript`, `python`), each one
    /// the provider proved; a provider may start their interpreters early.
    pub languages: Vec<String>,
    /// `SANDBOX_SESSION_DISK_MB`: bytes the session's files may take, measured after each
    /// call (0 = not measured). Past it the session ends with `DiskExceeded`.
    pub disk_mb: u32,
    /// The session's lifetime: plimsolld ends it then; a provider whose sandbox needs an
    /// expiry of its own (a claim's shutdown time) sets it a little later.
    pub lifetime: Duration,
}

/// Why a provider ended a session during or after a call (the reasons plimsolld itself
/// produces, such as closed, expired or replaced, are the daemon's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEndCause {
    /// The session's files grew past [`SessionSpec::disk_mb`].
    DiskExceeded,
    /// The sweep after a call could not prove that no process of the call is left.
    BoundaryFailed,
    /// The read-back before a call found the sandbox differs from what was opened.
    SandboxChanged,
    /// The sandbox's main process ended.
    MainProcessEnded,
}

impl SessionEndCause {
    /// The protocol's end reason.
    pub fn to_wire(self) -> pb::SessionEnd {
        match self {
            SessionEndCause::DiskExceeded => pb::SessionEnd::DiskExceeded,
            SessionEndCause::BoundaryFailed => pb::SessionEnd::BoundaryFailed,
            SessionEndCause::SandboxChanged => pb::SessionEnd::SandboxChanged,
            SessionEndCause::MainProcessEnded => pb::SessionEnd::MainProcessEnded,
        }
    }
}

/// The session ended: why, and one sentence for the caller (`end_detail`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEnded {
    /// Why.
    pub cause: SessionEndCause,
    /// What was found, naming no secret.
    pub detail: String,
}

/// One session call's outcome.
#[derive(Debug)]
pub struct SessionCallOutcome {
    /// The answer; [`ProviderError::Refused`] only when nothing of the call ran (the
    /// session then goes on, unless `ended` says otherwise).
    pub answer: Result<SessionAnswer, ProviderError>,
    /// Set when the session ended during or after this call: no further call runs in it.
    pub ended: Option<SessionEnded>,
}

/// One open session: one sandbox kept for many calls. plimsolld runs one call at a time in
/// it, and calls [`ProviderSession::close`] exactly once, at its end, whatever the reason.
///
/// Files persist across calls; after every answer, every process the call left is killed,
/// except the kept interpreters of cells. A session is one trust domain: its sandbox is
/// never given to anyone else, before or after.
#[async_trait::async_trait]
pub trait ProviderSession: Send + Sync {
    /// Runs one call under `timeout`; a deadline ends the call, never the session.
    async fn call(&self, work: SessionWork, timeout: Duration) -> SessionCallOutcome;
    /// Called when the session has been idle for its idle timeout. The default does
    /// nothing; a provider that can pause its sandbox does so, and resumes on the next call.
    async fn suspend(&self) {}
    /// Ends the session: every process of it is killed and its files are removed. Returns
    /// when that is done.
    async fn close(&self);
}

/// Providers that keep sandboxes across calls implement this, and return it from
/// [`Provider::sessions`].
#[async_trait::async_trait]
pub trait SessionProvider: Send + Sync {
    /// Opens a session. [`ProviderError::Refused`] when nothing was left behind.
    async fn open(&self, spec: SessionSpec) -> Result<Box<dyn ProviderSession>, ProviderError>;
}
