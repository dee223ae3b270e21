//! plimsoll-runner: executes one payload (a JavaScript snippet or a project's steps) in a
//! fresh working directory, under one shared deadline measured on the monotonic clock,
//! with capped output, a fixed clean environment, and the whole process tree killed at the
//! deadline and at the end of the run.
//!
//! It is the same code in every wall: the process provider calls it inside plimsolld, and
//! plimsoll-sandboxd calls it inside containers and pods. It must never read the wall clock
//! for a duration, never inherit the caller's environment, and never follow a path out of
//! the working directory.
//!
//! # Choices where the specification is silent
//!
//! - **Working directory.** `root_dir/run-<32 hex>` (mode 0700), with `.tmp` inside it as
//!   `TMPDIR`. It is removed at the end of every run, also when the run's future is dropped
//!   (the drop kills the run's processes and removes the directory synchronously). A
//!   directory a program made unreadable is made writable again and removed.
//! - **Deadline.** One [`tokio::time::Instant`] for the whole run; a `timeout` of zero means
//!   [`RunnerConfig::default_timeout`]. A step that would start after the deadline is not
//!   started (and not listed); the outcome is `timed_out`. Output is still read for a
//!   bounded grace ([`OUTPUT_GRACE`], 100 ms) after a program's main process ended or was
//!   killed, because a background child may hold the pipes open; then the pipes are closed.
//! - **Exit codes.** A program killed by a signal (not by the runner's deadline) reports
//!   128 + the signal number, as shells do; the deadline reports [`TIMEOUT_EXIT_CODE`] (124).
//! - **Output caps.** [`Limits::output_bytes`] bytes are kept per stream per program (a
//!   project's steps each get their own cap); past it the stream is read and dropped.
//! - **Killing.** Every program starts in its own process group and carries
//!   `PLIMSOLL_RUN_TAG=<random hex>` ([`RUN_TAG_VAR`]). At the deadline the program's group
//!   is killed (its leader not yet reaped, so the group id cannot have been reused), then the
//!   run is swept: `/proc` is scanned for every live process carrying the tag or whose
//!   working directory lies inside the run's directory; each is killed, with each of the
//!   run's process groups that still holds one; the scan repeats until it finds none
//!   (bounded: 200 rounds, 5 ms apart). Background children of a step that exited live on
//!   until the steps are over; the sweep then runs **before** the artifacts are read, so no
//!   program of the run can swap a path while it is read, and once more at the very end
//!   unless the sweep before found nothing and no program started since (nothing of the
//!   run can exist then). A scan reads only the `stat` of a process that started before the
//!   run's first program (start times from `/proc/<pid>/stat`, which only grow): nothing
//!   forked earlier can be the run's, so its environment and working directory are not read.
//!   Under a user of the run's own ([`RunAs`]) every process of that user is still swept,
//!   whatever its age. Where a run's time goes is logged at debug level under
//!   [`PHASES_TARGET`].
//! - **Environment.** Programs get exactly `PATH` ([`FIXED_PATH`]), `HOME` (the working
//!   directory), `TMPDIR`, `LANG=C.UTF-8`, the run tag, then the [`RunEnv`] extras. See
//!   [`RunEnv::new`] for what is refused.
//! - **Files.** All paths are checked (`check_relative_path`) before any is written; a parent
//!   component or the file itself that is a symlink is refused, and the final open uses
//!   `O_NOFOLLOW`. A file path that cannot be written (for example `a` and `a/b` both as
//!   files) is `setup_failed` naming it.
//! - **Artifacts.** Read in the order asked. Each is opened, then judged by what was opened
//!   (`/proc/self/fd`): it must lie inside the working directory, be a regular file, and have
//!   one hard link (a second link could name a file outside). A symlink to a file inside the
//!   working directory is followed. A missing artifact is skipped, unless a symlink on its
//!   way points outside (a refusal). Any refusal gives `setup_failed` naming the path, keeps
//!   the steps' results and returns no artifacts. An artifact that does not fit in what is
//!   left of [`Limits::artifact_bytes`] is dropped (later smaller ones may still fit) and
//!   `artifacts_truncated` is set.
//! - **Spawn failures.** If the first program cannot be started the run returns
//!   [`RunnerError::Spawn`] (nothing ran). If a later step cannot be started (for example a
//!   step's background children exhausted the process limit), the earlier results are kept
//!   and the outcome is `setup_failed` naming the step.
//!
//! - **Sessions.** [`Runner::open_session`] gives a [`RunnerSession`]: one persistent
//!   `root_dir/session-<32 hex>` directory for snippets, projects and cells (kept `node` and
//!   `python3 -I` interpreters), swept after every call but for the interpreters. See the
//!   `session` and `cell` modules' documentation for the choices made there.
//!
//! # Known gaps (process tier)
//!
//! A program that leaves its process group, removes the tag from its environment *and*
//! leaves the working directory (`cd / && setsid env -i sleep 1000 &`) escapes the sweep.
//! So does a set-user-ID program started in the background that left the process group:
//! /proc hides its environment. The process tier is no wall; the container tiers bound such
//! a program with their PID namespace and cgroup.
//!
//! In a session the same holds, and more: code in a kept interpreter can read the driver's
//! memory, so it can answer its own cell with the right nonce (the nonce stops leftovers and
//! blind forgeries); and a call that moves the session's directory away leaves the moved
//! copy behind when the session closes (the next call's read-back ends the session).

mod cell;
mod env;
mod exec;
mod scope;
mod session;
mod tree;

use std::path::PathBuf;
use std::time::Duration;

use plimsoll_core::pb;
use tokio::time::Instant;

pub use env::{FIXED_PATH, REFUSED_NAMES, REFUSED_PREFIXES};
pub use exec::{OUTPUT_GRACE, TIMEOUT_EXIT_CODE};
pub use scope::TMP_DIR_NAME;
pub use tree::{processes_with_tag, RUN_TAG_VAR};

pub use session::{RunnerSession, DISK_WALK_LIMIT};

use exec::Program;
use scope::RunScope;

/// `outcome_detail` of a project stopped by the deadline.
pub const TIMED_OUT_DETAIL: &str = "run exceeded the time budget";

/// The deadline of each `prove_languages` probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

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

/// The user and group a runner's programs run as, when they must not share the runner's
/// (`plimsoll-sandboxd --run-as`): the programs then cannot read what only the runner's user
/// may read (the pod's TLS key and sandboxd token), nor its processes' memory or environment.
///
/// The runner must be able to change user (root, or `CAP_SETUID`, `CAP_SETGID`, `CAP_CHOWN`,
/// `CAP_KILL`, `CAP_DAC_OVERRIDE` and `CAP_FOWNER`). Each run's working directory and files are
/// given to this user; programs start with no supplementary groups; and at the end of a run
/// every process of this user is killed. So the user must belong to this runner alone, and
/// the runner must run one payload at a time (sandboxd does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunAs {
    /// The user id (never 0).
    pub uid: u32,
    /// The group id (never 0).
    pub gid: u32,
}

/// Extra environment variables for a run's programs (for example a grant relay's address),
/// checked so that none of them chooses what a program loads or runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunEnv(Vec<(String, String)>);

/// An environment variable the runner refuses to pass to a program.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "environment variable {name:?} is refused: it is malformed, fixed by the runner, or would choose what a program loads or runs"
)]
pub struct EnvRefused {
    /// The refused name.
    pub name: String,
}

impl RunEnv {
    /// Checks every name; refuses `PATH`, `LD_*`, `NODE_OPTIONS`, `PYTHONPATH`, `BASH_ENV`,
    /// `ENV` and the rest of that family.
    ///
    /// Names are compared after ASCII upper-casing. Refused:
    /// - names the runner fixes itself: `PATH`, `HOME`, `TMPDIR`, `LANG`, `PLIMSOLL_RUN_TAG`;
    /// - every name starting with `LD_`, `DYLD_`, `PYTHON` (`PYTHONPATH`, `PYTHONSTARTUP`,
    ///   `PYTHONHOME`, `PYTHONBREAKPOINT`, `PYTHONWARNINGS`, and also harmless ones such as
    ///   `PYTHONUNBUFFERED`: the family is refused whole), `PERL` (`PERL5LIB`, `PERL5OPT`),
    ///   `RUBY` (`RUBYOPT`, `RUBYLIB`), `BASH_FUNC_`, `NPM_CONFIG_`, `GIT_CONFIG`;
    /// - `NODE_OPTIONS`, `NODE_PATH`, `NODE_EXTRA_CA_CERTS`, `NODE_REPL_EXTERNAL_MODULE`,
    ///   `NODE_ICU_DATA`; `BASH_ENV`, `ENV`, `SHELLOPTS`, `BASHOPTS`, `PS4`, `IFS`, `CDPATH`,
    ///   `PROMPT_COMMAND`, `GLOBIGNORE`; `GCONV_PATH`, `LOCPATH`, `NLSPATH`, `HOSTALIASES`,
    ///   `GETCONF_DIR`; `GEM_HOME`, `GEM_PATH`, `BUNDLE_GEMFILE`; `JAVA_TOOL_OPTIONS`,
    ///   `_JAVA_OPTIONS`, `JDK_JAVA_OPTIONS`, `CLASSPATH`; `OPENSSL_CONF`, `OPENSSL_ENGINES`,
    ///   `OPENSSL_MODULES`; `EDITOR`, `VISUAL`, `PAGER`, `SHELL`, `SSH_ASKPASS`,
    ///   `GIT_EXEC_PATH`, `GIT_SSH`, `GIT_SSH_COMMAND`, `GIT_ASKPASS`, `GIT_EDITOR`,
    ///   `GIT_PAGER`, `GIT_PROXY_COMMAND`, `GIT_EXTERNAL_DIFF`, `GIT_TEMPLATE_DIR`
    ///   ([`REFUSED_NAMES`], [`REFUSED_PREFIXES`]);
    /// - a name that is empty or holds `=` or NUL, and a value that holds NUL.
    ///
    /// The first refused variable is named in the error.
    pub fn new(vars: Vec<(String, String)>) -> Result<RunEnv, EnvRefused> {
        RunEnv::checked(vars)
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
    /// A cell's files could not be written (a refused path, or one that cannot be
    /// written); nothing of the cell ran. Names the path.
    #[error("the cell's files were refused: {0}")]
    CellFiles(String),
    /// A cell named a language the runner keeps no interpreter for; nothing ran.
    #[error("cells in {0:?} are not supported (javascript, python)")]
    CellLanguage(String),
    /// A session's kept interpreter answered a cell in a way the runner cannot trust (a
    /// control line without the cell's nonce, or a closed control channel while it lives).
    /// The cell may have run; the interpreter has been killed.
    #[error("the {language} interpreter gave no trustworthy answer: {detail}")]
    Interpreter {
        /// `javascript` or `python`.
        language: &'static str,
        /// What was seen (never the cell's code or output).
        detail: String,
    },
    /// The runner lost track of a program it started (waiting for it failed); the program
    /// may have run, and has been killed.
    #[error("could not wait for {program}: {source}")]
    Wait {
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
    run_as: Option<RunAs>,
    /// `cfg.root_dir`, canonical, so paths the kernel reports compare equal.
    root: PathBuf,
    /// One-shot runs' directories are removed on a blocking thread after the answer.
    remove_after_answer: bool,
}

impl Runner {
    /// Creates the root directory if needed.
    pub fn new(cfg: RunnerConfig) -> Result<Runner, RunnerError> {
        std::fs::create_dir_all(&cfg.root_dir).map_err(RunnerError::Setup)?;
        let root = std::fs::canonicalize(&cfg.root_dir).map_err(RunnerError::Setup)?;
        Ok(Runner {
            cfg,
            run_as: None,
            root,
            remove_after_answer: false,
        })
    }

    /// Removes each one-shot run's working directory on a blocking thread once the run's
    /// processes are dead, instead of before the answer: the removal (a few `rmdir`s, slow
    /// on a journaled disk) leaves the answer's path. The answer still waits for the sweep.
    /// Sessions and probes are unaffected. A daemon killed in that window leaves the
    /// directory behind (mode 0700, under the state directory).
    pub fn remove_after_answer(mut self) -> Runner {
        self.remove_after_answer = true;
        self
    }

    /// Runs every program as `who` (see [`RunAs`]). Refuses uid or gid 0.
    pub fn run_as(mut self, who: RunAs) -> Result<Runner, RunnerError> {
        if who.uid == 0 || who.gid == 0 {
            return Err(RunnerError::Setup(std::io::Error::other(
                "a run's programs must not run as uid or gid 0",
            )));
        }
        self.run_as = Some(who);
        Ok(self)
    }

    /// A runner like this one whose programs run as `who` (see [`RunAs`]): the same root
    /// directory and limits, for one run or session of a user of its own (the process
    /// provider's per-run users). Refuses uid or gid 0. Nothing is created.
    pub fn for_user(&self, who: RunAs) -> Result<Runner, RunnerError> {
        Runner {
            cfg: self.cfg.clone(),
            run_as: None,
            root: self.root.clone(),
            remove_after_answer: self.remove_after_answer,
        }
        .run_as(who)
    }

    /// The user programs run as, when it is not the runner's own.
    pub fn run_as_user(&self) -> Option<RunAs> {
        self.run_as
    }

    /// The configuration.
    pub fn config(&self) -> &RunnerConfig {
        &self.cfg
    }

    fn deadline(&self, timeout: Duration) -> Instant {
        deadline_after(timeout, self.cfg.default_timeout)
    }

    fn scope(&self) -> Result<RunScope, RunnerError> {
        RunScope::create(&self.root, self.run_as).map_err(RunnerError::Setup)
    }

    /// Runs a snippet with node. On the deadline: `timed_out`, exit code 124.
    pub async fn javascript(
        &self,
        js: &pb::JavaScriptRun,
        timeout: Duration,
        env: &RunEnv,
    ) -> Result<pb::JavaScriptResult, RunnerError> {
        let deadline = self.deadline(timeout);
        let t0 = Instant::now();
        let scope = self.scope()?;
        let setup = t0.elapsed();
        let out = javascript_in(&scope, js, deadline, &self.cfg.limits, env).await;
        finish(scope, "javascript", t0, setup, self.remove_after_answer).await;
        out
    }

    /// Writes the files, runs the steps with `sh -c` in order (stopping at the first
    /// non-zero exit), collects the artifacts. Bad paths give `setup_failed`.
    pub async fn project(
        &self,
        p: &pb::ProjectRun,
        timeout: Duration,
        env: &RunEnv,
    ) -> Result<pb::ProjectResult, RunnerError> {
        let deadline = self.deadline(timeout);
        let t0 = Instant::now();
        let scope = self.scope()?;
        let setup = t0.elapsed();
        let out = project_in(&scope, p, deadline, &self.cfg.limits, env).await;
        finish(scope, "project", t0, setup, self.remove_after_answer).await;
        out
    }

    /// Proves which languages this runner can execute by running a tiny program in each:
    /// `javascript` (node), `python` (python3), `shell` (sh).
    ///
    /// Each probe computes a value the runner checks, runs in its own working directory
    /// with the clean environment, and is bounded by [`PROBE_TIMEOUT`].
    pub async fn prove_languages(&self) -> Vec<String> {
        if self.run_as.is_some() {
            // Under another user, the end of each run kills every process of that user, so
            // probes must not overlap.
            let mut out = Vec::new();
            for (name, path, args) in [
                (
                    "javascript",
                    "node",
                    &["-e", "console.log('plimsoll-probe-' + 6 * 7)"][..],
                ),
                (
                    "python",
                    "python3",
                    &["-c", "print('plimsoll-probe-%d' % (6 * 7))"][..],
                ),
                ("shell", "sh", &["-c", "echo plimsoll-probe-$((6 * 7))"][..]),
            ] {
                out.extend(self.probe(name, path, args).await);
            }
            return out;
        }
        let (js, py, sh) = tokio::join!(
            self.probe(
                "javascript",
                "node",
                &["-e", "console.log('plimsoll-probe-' + 6 * 7)"]
            ),
            self.probe(
                "python",
                "python3",
                &["-c", "print('plimsoll-probe-%d' % (6 * 7))"]
            ),
            self.probe("shell", "sh", &["-c", "echo plimsoll-probe-$((6 * 7))"]),
        );
        [js, py, sh].into_iter().flatten().collect()
    }

    /// Runs one language probe; `Some(name)` when it printed the expected line.
    async fn probe(&self, name: &str, path: &'static str, args: &[&str]) -> Option<String> {
        let scope = self.scope().ok()?;
        let ran = exec::run(
            &scope,
            Program {
                path,
                args,
                stdin: None,
            },
            Instant::now() + PROBE_TIMEOUT,
            4096,
            &RunEnv::default(),
        )
        .await;
        scope.end().await;
        match ran {
            Ok(r) if r.exit_code == 0 && r.stdout == b"plimsoll-probe-42\n" => {
                Some(name.to_owned())
            }
            Ok(r) => {
                tracing::info!(
                    language = name,
                    exit_code = r.exit_code,
                    "language probe failed"
                );
                None
            }
            Err(e) => {
                tracing::info!(language = name, error = %e, "language probe could not start");
                None
            }
        }
    }
}

/// The target of the per-run phase breakdown (`RUST_LOG=plimsoll_runner::phases=debug`),
/// which `cargo xtask bench process` reads.
pub const PHASES_TARGET: &str = "plimsoll_runner::phases";

/// Ends a one-shot run's scope and logs, at debug level, where its time went: `setup_us`
/// (the working directory), `programs_us` (writing files, the programs from spawn to the
/// end of their output, reading artifacts), `sweep_us` over `sweeps` looks at `/proc`,
/// and `remove_us` (removing the directory, or handing it to a blocking thread with
/// [`Runner::remove_after_answer`]). In microseconds.
async fn finish(
    scope: RunScope,
    kind: &'static str,
    t0: Instant,
    setup: Duration,
    remove_later: bool,
) {
    let before_end = t0.elapsed();
    let (swept_before, _) = scope.swept();
    let ended = scope.end_measured(remove_later).await;
    let total = t0.elapsed();
    let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    tracing::debug!(
        target: "plimsoll_runner::phases",
        kind,
        setup_us = us(setup),
        programs_us = us(before_end.saturating_sub(setup).saturating_sub(swept_before)),
        sweep_us = us(ended.swept),
        sweeps = ended.sweeps,
        remove_us = us(ended.remove),
        total_us = us(total),
        "run phases"
    );
}

/// The deadline of a call: `timeout` from now, or `default` when `timeout` is zero.
fn deadline_after(timeout: Duration, default: Duration) -> Instant {
    let t = if timeout.is_zero() { default } else { timeout };
    Instant::now() + t
}

/// A snippet in `scope`'s working directory (a run's fresh one, or a session's). The
/// caller ends or sweeps the scope.
async fn javascript_in(
    scope: &RunScope,
    js: &pb::JavaScriptRun,
    deadline: Instant,
    limits: &Limits,
    env: &RunEnv,
) -> Result<pb::JavaScriptResult, RunnerError> {
    tracing::debug!(tag = scope.tag(), "javascript run starts");
    let ran = exec::run(
        scope,
        Program {
            path: "node",
            args: &["-"],
            stdin: Some(js.code.as_bytes().to_vec()),
        },
        deadline,
        limits.output_bytes,
        env,
    )
    .await?;
    Ok(pb::JavaScriptResult {
        stdout: ran.stdout,
        stderr: ran.stderr,
        exit_code: ran.exit_code,
        timed_out: ran.timed_out,
        stdout_truncated: ran.stdout_truncated,
        stderr_truncated: ran.stderr_truncated,
        advice: Vec::new(),
    })
}

/// A project in `scope`'s working directory. Every process of the scope but the spared ones
/// is killed before the artifacts are read; the caller ends or sweeps the scope.
async fn project_in(
    scope: &RunScope,
    p: &pb::ProjectRun,
    deadline: Instant,
    limits: &Limits,
    env: &RunEnv,
) -> Result<pb::ProjectResult, RunnerError> {
    tracing::debug!(
        tag = scope.tag(),
        steps = p.steps.len(),
        "project run starts"
    );
    let mut result = pb::ProjectResult {
        outcome: pb::ProjectOutcome::Completed as i32,
        ..Default::default()
    };
    if let Err(detail) = scope.write_files(&p.files) {
        result.outcome = pb::ProjectOutcome::SetupFailed as i32;
        result.outcome_detail = detail;
        return Ok(result);
    }
    for (i, step) in p.steps.iter().enumerate() {
        if Instant::now() >= deadline {
            result.outcome = pb::ProjectOutcome::TimedOut as i32;
            result.outcome_detail = TIMED_OUT_DETAIL.to_owned();
            break;
        }
        let ran = exec::run(
            scope,
            Program {
                path: "sh",
                args: &["-c", step],
                stdin: None,
            },
            deadline,
            limits.output_bytes,
            env,
        )
        .await;
        let ran = match ran {
            Ok(r) => r,
            Err(e) if i == 0 && matches!(e, RunnerError::Spawn { .. }) => return Err(e),
            Err(e) => {
                result.outcome = pb::ProjectOutcome::SetupFailed as i32;
                result.outcome_detail = format!("step {}: {e}", i + 1);
                break;
            }
        };
        let stop = ran.timed_out || ran.exit_code != 0;
        if ran.timed_out {
            result.outcome = pb::ProjectOutcome::TimedOut as i32;
            result.outcome_detail = TIMED_OUT_DETAIL.to_owned();
        }
        result.steps.push(pb::StepResult {
            command: step.clone(),
            stdout: ran.stdout,
            stderr: ran.stderr,
            exit_code: ran.exit_code,
            timed_out: ran.timed_out,
            duration_ms: i64::try_from(ran.duration.as_millis()).unwrap_or(i64::MAX),
            stdout_truncated: ran.stdout_truncated,
            stderr_truncated: ran.stderr_truncated,
        });
        if stop {
            break;
        }
    }
    // No program of the run may touch the tree while the artifacts are read.
    scope.kill_all().await;
    match scope.collect(&p.artifacts, limits.artifact_bytes) {
        Ok(c) => {
            result.artifacts = c.artifacts;
            result.artifacts_truncated = c.truncated;
        }
        Err(detail) => {
            result.outcome = pb::ProjectOutcome::SetupFailed as i32;
            result.outcome_detail = detail;
        }
    }
    Ok(result)
}
