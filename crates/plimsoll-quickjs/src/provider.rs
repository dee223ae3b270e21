//! The `quickjs` provider: one worker process per run, answered through the worker's pipes.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use plimsoll_core::{pb, Refusal, Tier};
use plimsoll_provider::smoke::{check_descriptors, OpenDescriptor};
use plimsoll_provider::{Answer, Facts, Provider, ProviderError, ProviderStartError, Work};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::protocol::{Answer as WorkerAnswer, Request};
use crate::worker::{LOCKDOWN_FAILED, WORKER_ARG};

/// How long a worker may run past its deadline before it is killed. The engine checks the
/// deadline between bytecode instructions; one long built-in call (a huge `repeat`, a
/// regular expression) can hold it longer.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// The most of the worker's own stderr kept for an error message.
const WORKER_STDERR_BYTES: u64 = 16 * 1024;

/// What starts a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
}

impl WorkerCommand {
    /// The running binary re-executed with [`WORKER_ARG`] (its `main` must call
    /// [`crate::run_if_worker`] first).
    pub fn current_exe() -> std::io::Result<WorkerCommand> {
        Ok(WorkerCommand {
            program: std::env::current_exe()?,
            args: vec![WORKER_ARG.into()],
        })
    }

    /// A separate worker binary (`plimsoll-quickjs-worker`), started with no arguments.
    pub fn binary(path: PathBuf) -> WorkerCommand {
        WorkerCommand {
            program: path,
            args: Vec::new(),
        }
    }
}

/// The provider's settings.
#[derive(Debug, Clone)]
pub struct QuickJsConfig {
    /// What starts a worker.
    pub worker: WorkerCommand,
    /// The engine's heap limit, in MiB (`SANDBOX_MEMORY_MB`; 0 means the default, 64).
    pub memory_mb: u32,
    /// The engine's stack limit, in bytes.
    pub stack_bytes: u64,
    /// Bytes kept of each output stream.
    pub output_bytes: usize,
    /// The deadline when a request leaves it to the provider.
    pub default_timeout: Duration,
}

/// The heap limit when `SANDBOX_MEMORY_MB` is not set.
pub const DEFAULT_MEMORY_MB: u32 = 64;
/// The engine's stack limit: deep enough for ordinary recursion, well inside the worker's
/// own 8 MiB main-thread stack.
pub const DEFAULT_STACK_BYTES: u64 = 1024 * 1024;
/// The provider's ceiling on a run's deadline, as the release states for its QuickJS wall.
pub const MAX_TIMEOUT_MS: u32 = 30_000;

impl QuickJsConfig {
    /// Defaults around a worker command.
    pub fn new(worker: WorkerCommand) -> QuickJsConfig {
        QuickJsConfig {
            worker,
            memory_mb: DEFAULT_MEMORY_MB,
            stack_bytes: DEFAULT_STACK_BYTES,
            output_bytes: 1024 * 1024,
            default_timeout: Duration::from_millis(u64::from(MAX_TIMEOUT_MS)),
        }
    }

    fn memory_bytes(&self) -> u64 {
        let mb = if self.memory_mb == 0 {
            DEFAULT_MEMORY_MB
        } else {
            self.memory_mb
        };
        u64::from(mb) * 1024 * 1024
    }
}

/// JavaScript snippets in a QuickJS worker per run.
#[derive(Debug)]
pub struct QuickJsProvider {
    cfg: QuickJsConfig,
}

impl QuickJsProvider {
    /// A provider with these settings; [`Provider::start`] proves the worker runs.
    pub fn new(cfg: QuickJsConfig) -> QuickJsProvider {
        QuickJsProvider { cfg }
    }

    /// Runs one snippet in a fresh worker. `Refused` only when the worker could not start or
    /// could not lock itself down, so nothing of the snippet ran.
    pub async fn run_snippet(
        &self,
        code: &str,
        timeout: Duration,
    ) -> Result<pb::JavaScriptResult, ProviderError> {
        self.run_worker(code, timeout, false).await.map(|(r, _)| r)
    }

    /// [`QuickJsProvider::run_snippet`], and with `list_descriptors` the descriptors the
    /// worker held before it locked itself down.
    async fn run_worker(
        &self,
        code: &str,
        timeout: Duration,
        list_descriptors: bool,
    ) -> Result<(pb::JavaScriptResult, Vec<OpenDescriptor>), ProviderError> {
        let timeout = if timeout.is_zero() {
            self.cfg.default_timeout
        } else {
            timeout
        };
        let req = Request {
            code: code.to_owned(),
            memory_bytes: self.cfg.memory_bytes(),
            stack_bytes: self.cfg.stack_bytes,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            output_bytes: self.cfg.output_bytes as u64,
            list_descriptors,
        };
        let body = serde_json::to_vec(&req).map_err(|e| ProviderError::Failed(e.to_string()))?;
        let mut cmd = tokio::process::Command::new(&self.cfg.worker.program);
        // The worker gets its three pipes alone, whatever plimsolld inherited.
        plimsoll_log::fds::StdioOnly::stdio_only(cmd.as_std_mut());
        let mut child = cmd
            .args(&self.cfg.worker.args)
            .env_clear()
            // The engine's Date reads the zone from TZ, so the C library never opens
            // /etc/localtime (the filter would refuse it).
            .env("TZ", "UTC")
            // The worker dies with plimsolld, even if plimsolld is killed.
            .env(
                crate::worker::PARENT_PID_VAR,
                std::process::id().to_string(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                Refusal::environment(format!(
                    "the quickjs provider could not start its worker {}: {e}",
                    self.cfg.worker.program.display()
                ))
            })?;
        let pid = child.id();
        tracing::debug!(pid, "quickjs worker started");
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        // Two base64 streams at their caps, the advice and the JSON around them.
        let answer_cap = (self.cfg.output_bytes as u64) * 3 + 64 * 1024;
        let feed = async move {
            // A worker that dies early closes the pipe: its exit status tells why.
            let _ = stdin.write_all(&body).await;
            let _ = stdin.shutdown().await;
        };
        let read_out = async move {
            let mut buf = Vec::new();
            let _ = (&mut stdout).take(answer_cap).read_to_end(&mut buf).await;
            buf
        };
        let read_err = async move {
            let mut buf = Vec::new();
            let _ = (&mut stderr)
                .take(WORKER_STDERR_BYTES)
                .read_to_end(&mut buf)
                .await;
            buf
        };
        let started = std::time::Instant::now();
        let work = async { tokio::join!(feed, read_out, read_err, child.wait()) };
        let (out, err, status) = match tokio::time::timeout(timeout + KILL_GRACE, work).await {
            Ok(((), out, err, status)) => (out, err, status),
            Err(_) => {
                // The engine did not come back to its interrupt check in time.
                let _ = child.kill().await;
                tracing::warn!(pid, "quickjs worker killed after its deadline");
                return Ok((timed_out_answer(timeout), Vec::new()));
            }
        };
        let status = status
            .map_err(|e| ProviderError::Failed(format!("lost track of the quickjs worker: {e}")))?;
        let worker_said = String::from_utf8_lossy(&err).trim().to_owned();
        if status.code() == Some(i32::from(LOCKDOWN_FAILED)) {
            return Err(Refusal::environment(format!(
                "the quickjs worker could not lock itself down, so nothing ran: {worker_said}"
            ))
            .into());
        }
        let parsed: Option<WorkerAnswer> = if status.success() {
            serde_json::from_slice(&out).ok()
        } else {
            None
        };
        let Some(a) = parsed else {
            use std::os::unix::process::ExitStatusExt;
            if status.signal().is_some() && started.elapsed() >= timeout {
                // Its CPU limit (just past the deadline) ended it: a deadline, not a crash.
                return Ok((timed_out_answer(timeout), Vec::new()));
            }
            let how = match (status.code(), status.signal()) {
                (_, Some(sig)) => format!("killed by signal {sig}"),
                (Some(code), _) => format!("exit code {code}"),
                _ => "no status".to_owned(),
            };
            return Err(ProviderError::Failed(format!(
                "the quickjs worker ended without an answer ({how}); the snippet may have run{}",
                if worker_said.is_empty() {
                    String::new()
                } else {
                    format!(": {worker_said}")
                }
            )));
        };
        let b64 = base64::engine::general_purpose::STANDARD;
        let decode = |s: &str| {
            b64.decode(s).map_err(|e| {
                ProviderError::Failed(format!("the quickjs worker's answer is not valid: {e}"))
            })
        };
        let result = pb::JavaScriptResult {
            stdout: decode(&a.stdout)?,
            stderr: decode(&a.stderr)?,
            exit_code: a.exit_code,
            timed_out: a.timed_out,
            stdout_truncated: a.stdout_truncated,
            stderr_truncated: a.stderr_truncated,
            advice: Vec::new(),
        };
        let descriptors = a
            .descriptors
            .into_iter()
            .map(|(fd, target)| OpenDescriptor { fd, target })
            .collect();
        Ok((result, descriptors))
    }
}

/// The answer for a worker that had to be ended from outside after its deadline.
fn timed_out_answer(timeout: Duration) -> pb::JavaScriptResult {
    pb::JavaScriptResult {
        stderr: format!(
            "plimsoll: the snippet did not stop at its deadline ({} ms); the worker was killed\n",
            timeout.as_millis()
        )
        .into_bytes(),
        exit_code: 124,
        timed_out: true,
        ..Default::default()
    }
}

#[async_trait::async_trait]
impl Provider for QuickJsProvider {
    fn facts(&self) -> Facts {
        Facts {
            name: "quickjs".into(),
            tier: Some(Tier::Process),
            environment: crate::environment_identity(),
            languages: vec!["javascript".into()],
            supports_project: false,
            max_timeout_ms: MAX_TIMEOUT_MS,
            supports_grants: false,
            ..Default::default()
        }
    }

    async fn start(&self) -> Result<(), ProviderStartError> {
        let fail = |message: String| ProviderStartError::new("quickjs", message);
        let (r, descriptors) = self
            .run_worker("console.log(6 * 7)", Duration::from_secs(10), true)
            .await
            .map_err(|e| fail(format!("the smoke test failed: {e}")))?;
        // The worker has no file API, but what it holds the engine could reach through a
        // flaw: it must hold its three pipes alone.
        check_descriptors(&descriptors, &[])
            .map_err(|e| fail(format!("the smoke test's worker: {e}")))?;
        if r.stdout != b"42\n" || r.exit_code != 0 {
            return Err(fail(format!(
                "the smoke test printed {:?} (exit code {}), not 42: {}",
                String::from_utf8_lossy(&r.stdout),
                r.exit_code,
                String::from_utf8_lossy(&r.stderr)
            )));
        }
        tracing::info!(
            environment = %crate::environment_identity(),
            "quickjs provider smoke test passed"
        );
        Ok(())
    }

    async fn ready(&self) -> bool {
        true
    }

    async fn run(&self, work: Work, timeout: Duration) -> Result<Answer, ProviderError> {
        match work {
            Work::Javascript(js) => self
                .run_snippet(&js.code, timeout)
                .await
                .map(Answer::Javascript),
            Work::Project(_) => Err(Refusal::unsupported(
                "the quickjs provider runs JavaScript snippets only; projects need the process, docker or agentsandbox provider",
            )
            .into()),
        }
    }
}
