//! plimsoll-process: the `process` provider. The runner executes each payload in child
//! processes of plimsolld: tier `process`, which is no wall at all between the code and the
//! host. It needs nothing installed beyond `/bin/sh` (and `node` for JavaScript), and adds a
//! few milliseconds per run.
//!
//! # Choices where the specification is silent
//!
//! - **Whose processes.** When plimsolld runs as root, each run (and each session) runs as
//!   a host user and group of its own from a range of 65,536 starting at
//!   `SANDBOX_PROCESS_USER` (default `2100000000:2100000000`, beside the bwrap provider's
//!   range), never as root: two live runs cannot signal or trace each other, and the end of
//!   a run kills every process of its user. The state directory and its `runs/` and
//!   `grants/` get search permission for others (`o+x`, never read) so those users reach
//!   their own directories; a directory above the state directory they cannot search
//!   stops startup, naming it. When plimsolld is not root, runs share its user and the
//!   variable is refused.
//! - **Processes.** `SANDBOX_PIDS` (default 256) becomes `RLIMIT_NPROC`, set on plimsolld
//!   itself at startup (soft and hard) and so inherited by every program; it counts the
//!   processes and threads of a *real user*. As root with per-run users that is one run's
//!   (root itself is exempt), so a fork bomb stops at `SANDBOX_PIDS` and the end of the run
//!   kills it. Not as root it counts every process of plimsolld's user, plimsolld's own
//!   threads and the user's other programs included: the limit is then set to what that
//!   user runs at startup plus `SANDBOX_PIDS`, and startup warns that a run can still take
//!   that headroom from plimsolld and the user's other programs.
//!
//! Grants: each granted run gets a loopback relay with its own secret and the grant clients
//! in a private directory (handed to the run's user). Whether runs have users of their own
//! or not, plimsolld refuses grants here with more than one caller unless the operator
//! states they trust every caller (`ProviderSetup::RUNS_SHARE_ONE_USER`): the relay is a
//! loopback port any local program may try.

mod session;
pub mod users;

pub use session::ProcessSession;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::{Refusal, Tier};
use plimsoll_provider::{
    Answer, ConfigError, EnvSource, Facts, Provider, ProviderError, ProviderSetup,
    ProviderStartError, Resources, SessionProvider, Shared, Variable, Vars, Work,
};
use plimsoll_runner::{RunEnv, Runner, RunnerConfig};

/// The provider's name.
pub const NAME: &str = "process";

/// Every variable the process provider reads beyond the shared ones, with one line of help.
pub const VARIABLES: &[Variable] = &[(
    "SANDBOX_PROCESS_USER",
    "first host UID:GID of the 65536 users process runs run as, one each, when plimsolld is root (default 2100000000:2100000000)",
)];

/// The first host user and group of the runs' range when plimsolld is root and
/// `SANDBOX_PROCESS_USER` is unset.
pub const DEFAULT_USER: (u32, u32) = (2_100_000_000, 2_100_000_000);
/// Process limit (`RLIMIT_NPROC`) when `SANDBOX_PIDS` is 0.
pub const DEFAULT_PIDS: u32 = 256;
/// The smallest `SANDBOX_PIDS` accepted (a shell step and its program need a few).
pub const MIN_PIDS: u32 = 8;

/// The process provider's settings.
#[derive(Debug, Clone)]
pub struct ProcessConfig {
    /// Working directories go to `runs/` below it, grant clients to `grants/`.
    pub state_dir: PathBuf,
    /// Bytes kept of each output stream per program.
    pub output_bytes: usize,
    /// Deadline of a run whose request states none.
    pub default_timeout: Duration,
    /// The first host user and group of the range runs run as, one each (`None`:
    /// plimsolld's own user, for every run).
    pub run_as: Option<(u32, u32)>,
    /// `RLIMIT_NPROC`: per run with `run_as`, above plimsolld's user's count without.
    pub pids: u32,
}

impl ProcessConfig {
    /// The settings from the shared ones (and the defaults of the provider's variable).
    pub fn new(shared: &Shared) -> ProcessConfig {
        ProcessConfig {
            state_dir: shared.state_dir.clone(),
            output_bytes: shared.output_bytes,
            default_timeout: shared.default_timeout,
            run_as: users::is_root().then_some(DEFAULT_USER),
            pids: if shared.resources.pids == 0 {
                DEFAULT_PIDS
            } else {
                shared.resources.pids
            },
        }
    }
}

impl ProcessConfig {
    /// How processes are bounded, in words (what startup logs, without the count of the
    /// user's processes it reads then).
    pub fn processes_statement(&self) -> String {
        if self.run_as.is_some() {
            format!(
                "processes: each run runs as a user of its own with at most {} processes and threads (RLIMIT_NPROC)",
                self.pids
            )
        } else {
            format!(
                "processes: runs share this user, and RLIMIT_NPROC counts every process of it: a run may take {} processes beyond what the user runs now, from this program and the user's others, until it ends; run as root for a user per run, or use bwrap",
                self.pids
            )
        }
    }
}

impl ProviderSetup for ProcessConfig {
    const NAME: &'static str = NAME;
    const VARIABLES: &'static [Variable] = VARIABLES;
    const RUNS_SHARE_ONE_USER: bool = true;

    fn from_env(env: &dyn EnvSource, shared: &Shared) -> Result<Self, ConfigError> {
        let vars = Vars::new(env);
        let mut c = ProcessConfig::new(shared);
        if let Some(v) = vars.string("SANDBOX_PROCESS_USER") {
            let u = users::parse(&v).map_err(|m| ConfigError::new("SANDBOX_PROCESS_USER", m))?;
            if !users::is_root() {
                return Err(ConfigError::new(
                    "SANDBOX_PROCESS_USER",
                    "only a plimsolld running as root can run programs as other users; unset it (runs then share plimsolld's own user)",
                ));
            }
            c.run_as = Some(u);
        }
        if c.pids < MIN_PIDS {
            return Err(ConfigError::new(
                "SANDBOX_PIDS",
                format!(
                    "{} processes are too few for a shell step and its program; use at least {MIN_PIDS}",
                    c.pids
                ),
            ));
        }
        Ok(c)
    }

    fn check_unselected(env: &dyn EnvSource, chosen: &str) -> Result<(), ConfigError> {
        let vars = Vars::new(env);
        for (name, _) in VARIABLES {
            if vars.is_set(name) {
                return Err(ConfigError::new(
                    *name,
                    format!("it is read only with SANDBOX_PROVIDER=process, and the provider is {chosen}; unset it"),
                ));
            }
        }
        Ok(())
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderStartError> {
        Ok(Arc::new(ProcessProvider::new(self)?))
    }

    fn resources(&self, shared: Resources) -> Resources {
        Resources {
            pids: self.pids,
            ..shared
        }
    }
}

/// The process provider: the runner in child processes of plimsolld. No OS wall.
#[derive(Debug)]
pub struct ProcessProvider {
    runner: Runner,
    languages: std::sync::OnceLock<Vec<String>>,
    /// Per-run directories holding the grant clients (`state_dir/grants`).
    grants_dir: std::path::PathBuf,
    state_dir: std::path::PathBuf,
    /// The users runs take, one each (`None`: plimsolld's own, for every run).
    users: Option<users::Users>,
    pids: u32,
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
            state_dir: cfg.state_dir.clone(),
            users: cfg.run_as.map(users::Users::new),
            pids: cfg.pids,
        })
    }

    /// A runner for one run or session, and the user it holds (given back when dropped):
    /// with per-run users, one of its own; otherwise plimsolld's.
    pub(crate) fn runner_for_one(&self) -> Result<(OneRunner<'_>, Option<users::Slot>), Refusal> {
        let Some(users) = &self.users else {
            return Ok((OneRunner::Shared(&self.runner), None));
        };
        let slot = users.take().ok_or_else(|| {
            Refusal::capacity(format!(
                "all {} users of SANDBOX_PROCESS_USER's range are taken by live runs",
                users::USER_RANGE
            ))
        })?;
        let runner = self.runner.for_user(users::run_as(&slot)).map_err(|e| {
            Refusal::environment(format!(
                "the process provider cannot run as {:?}: {e}",
                users::run_as(&slot)
            ))
        })?;
        Ok((OneRunner::Own(runner), Some(slot)))
    }

    /// Sets `RLIMIT_NPROC` on plimsolld (inherited by every program; see the crate's
    /// choices) and says what it bounds.
    fn limit_processes(&self) -> Result<(), ProviderStartError> {
        use nix::sys::resource::{setrlimit, Resource};
        let (limit, note) = if self.users.is_some() {
            (
                u64::from(self.pids),
                format!("each run runs as a user of its own with at most {} processes and threads (RLIMIT_NPROC)", self.pids),
            )
        } else {
            let uid = nix::unistd::getuid().as_raw();
            let now = users::tasks_of(uid);
            let limit = now + u64::from(self.pids);
            (
                limit,
                format!(
                    "runs share plimsolld's user {uid}, so RLIMIT_NPROC counts every process of that user: it is set to {limit} ({now} running now + SANDBOX_PIDS {}), which stops a fork bomb but lets one run take that headroom from plimsolld's own threads and the user's other programs until the run ends; run plimsolld as root for a user per run, or use a provider with a wall (bwrap)",
                    self.pids
                ),
            )
        };
        setrlimit(Resource::RLIMIT_NPROC, limit, limit).map_err(|e| {
            ProviderStartError::new(
                NAME,
                format!("cannot set the process limit RLIMIT_NPROC to {limit}: {e}"),
            )
        })?;
        // At info, plimsolld's default level: an embedded daemon's caller prints
        // `ProcessConfig::processes_statement` after its first line instead.
        tracing::info!("processes: {note}");
        Ok(())
    }

    /// Runs `work` with `env` added to its programs' environment.
    async fn run_with(
        &self,
        runner: &Runner,
        work: Work,
        timeout: Duration,
        env: &RunEnv,
    ) -> Result<Answer, ProviderError> {
        // Whether node passed the startup check is the service's to ask (`Facts::languages`).
        match work {
            Work::Javascript(js) => runner
                .javascript(&js, timeout, env)
                .await
                .map(Answer::Javascript),
            Work::Project(p) => runner.project(&p, timeout, env).await.map(Answer::Project),
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

/// The runner of one run or session: plimsolld's own, or one for the run's user.
pub(crate) enum OneRunner<'a> {
    Shared(&'a Runner),
    Own(Runner),
}

impl std::ops::Deref for OneRunner<'_> {
    type Target = Runner;
    fn deref(&self) -> &Runner {
        match self {
            OneRunner::Shared(r) => r,
            OneRunner::Own(r) => r,
        }
    }
}

/// Hands `dir` and the entries directly in it to `who` (never following a symlink).
fn give_tree(dir: &std::path::Path, who: plimsoll_runner::RunAs) -> std::io::Result<()> {
    let give = |p: &std::path::Path| std::os::unix::fs::lchown(p, Some(who.uid), Some(who.gid));
    give(dir)?;
    for e in std::fs::read_dir(dir)? {
        give(&e?.path())?;
    }
    Ok(())
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
        if self.users.is_some() {
            users::open_the_way(
                &self.state_dir,
                &[&self.runner.config().root_dir, &self.grants_dir],
            )
            .map_err(|e| ProviderStartError::new(NAME, e))?;
        }
        self.limit_processes()?;
        let langs = {
            let (runner, _slot) = self
                .runner_for_one()
                .map_err(|r| ProviderStartError::new(NAME, r.to_string()))?;
            runner.prove_languages().await
        };
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
        let (runner, _slot) = self.runner_for_one().map_err(ProviderError::Refused)?;
        self.run_with(&runner, work, timeout, &RunEnv::default())
            .await
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
        let (runner, _slot) = self.runner_for_one().map_err(ProviderError::Refused)?;
        let prepared = plimsoll_grants::prepare::loopback(&grant, &self.grants_dir)
            .await
            .map_err(|e| not_ready(e.to_string()))?;
        if let (Some(who), Some(dir)) = (runner.run_as_user(), prepared.made_dir()) {
            // The clients' directory is private: hand it, and what is in it, to the run's user.
            if let Err(e) = give_tree(dir, who) {
                prepared.close().await;
                return Err(not_ready(e.to_string()));
            }
        }
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
        let out = self.run_with(&runner, work, timeout, &env).await;
        prepared.close().await;
        out
    }
}
