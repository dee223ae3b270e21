//! The `plimsoll.sandboxd.v1.Sandboxd` service over the runner: the token check (before the
//! request body is decoded), one payload at a time, and `Health`.
//!
//! In session mode ([`SandboxdService::into_session`]) every payload runs in one
//! [`RunnerSession`]: its directory is read back before each call (a changed one runs
//! nothing and says so in `session_changed`), and every answer states the session's disk
//! bytes and whether the sweep after the call proved no process of it is left. A runner
//! failure in a session carries the same two facts in its status metadata
//! ([`SESSION_DISK_BYTES_KEY`], [`SESSION_BOUNDARY_FAILED_KEY`]). Without session mode a
//! cell is refused, marked `unsupported`, before anything runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plimsoll_core::sandboxd_pb::sandboxd_server::{Sandboxd, SandboxdServer};
use plimsoll_core::sandboxd_pb::{
    execute_request, execute_response, ExecuteRequest, ExecuteResponse, HealthRequest,
    HealthResponse,
};
use plimsoll_core::validate::{MAX_REQUEST_BYTES, MAX_TIMEOUT_MS};
use plimsoll_core::Refusal;
use plimsoll_runner::{RunEnv, Runner, RunnerError, RunnerSession};
use tokio::sync::Semaphore;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::token::TokenFile;

/// Who may call: the token file's tokens, or (tests only) anyone.
#[derive(Debug, Clone)]
pub enum Auth {
    /// Every call must present one of the file's tokens.
    Tokens(Arc<TokenFile>),
    /// No token is checked. Only for tests; the binary refuses it without
    /// `--insecure-no-token`.
    InsecureNoToken,
    /// The terminator's private socket (`--terminator-socket`): no token is checked,
    /// because the terminator forwards only connections whose client certificate it
    /// verified (mutual TLS), and the socket's directory is sandboxd's own with no access
    /// for anyone else, so nothing else in the pod can connect.
    Terminator,
    /// Every call is refused: sandboxd has no token file and takes calls only through the
    /// terminator's socket.
    Closed,
}

/// Counts of calls, for logs and tests.
#[derive(Debug, Default)]
pub struct CallCounts {
    /// Calls that reached the token check (any method, any outcome).
    pub received: AtomicU64,
    /// Calls refused for a missing or wrong token.
    pub unauthenticated: AtomicU64,
    /// Payloads handed to the runner.
    pub executed: AtomicU64,
}

/// The token check, run by tonic before the request message is decoded: a call without a
/// valid token never has its payload read.
#[derive(Debug, Clone)]
pub struct Authenticator {
    auth: Auth,
    counts: Arc<CallCounts>,
}

impl tonic::service::Interceptor for Authenticator {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        self.counts.received.fetch_add(1, Ordering::Relaxed);
        let tokens = match &self.auth {
            Auth::InsecureNoToken => {
                tracing::info!("sandboxd call received (no token required: insecure mode)");
                return Ok(req);
            }
            Auth::Terminator => {
                tracing::info!(
                    "sandboxd call received (through the terminator's socket, from sandboxd's own user: no token needed)"
                );
                return Ok(req);
            }
            Auth::Closed => {
                let refusal = Refusal::unauthenticated(
                    "this sandboxd has no token and takes calls only through its terminator (mutual TLS); nothing ran",
                );
                self.counts.unauthenticated.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("sandboxd call received and refused: {}", refusal.message);
                return Err(refusal.to_status());
            }
            Auth::Tokens(f) => f.tokens(),
        };
        let presented = req
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes())
            .and_then(bearer);
        let refusal = match presented {
            None => Refusal::unauthenticated(
                "sandboxd requires `authorization: Bearer <sandboxd token>`; none was sent; nothing ran",
            ),
            Some(t) if tokens.verify(t) => {
                tracing::info!("sandboxd call received (token accepted)");
                return Ok(req);
            }
            Some(_) => Refusal::unauthenticated(
                "the sandboxd token was not accepted; nothing ran",
            ),
        };
        self.counts.unauthenticated.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("sandboxd call received and refused: {}", refusal.message);
        Err(refusal.to_status())
    }
}

/// The token in `Bearer <token>` (scheme case-insensitive).
fn bearer(v: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = v.split_at(v.iter().position(|b| *b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let t = rest.trim_ascii();
    (!t.is_empty()).then_some(t)
}

/// Status metadata of a failed session call: the session's disk bytes after it.
pub const SESSION_DISK_BYTES_KEY: &str = "plimsoll-session-disk-bytes";
/// Status metadata of a failed session call: `1` when the sweep after it could not prove
/// that no process of it is left.
pub const SESSION_BOUNDARY_FAILED_KEY: &str = "plimsoll-session-boundary-failed";

/// The service: runs one payload at a time with the runner.
#[derive(Debug)]
pub struct SandboxdService {
    runner: Arc<Runner>,
    /// Session mode: every payload runs in this one session.
    session: Option<RunnerSession>,
    busy: Semaphore,
    languages: Vec<String>,
    counts: Arc<CallCounts>,
}

impl SandboxdService {
    /// Proves the runner's languages once (what `Health` reports from then on).
    pub async fn new(runner: Arc<Runner>) -> SandboxdService {
        let languages = runner.prove_languages().await;
        Self::with_languages(runner, languages)
    }

    /// A service reporting `languages` without proving them again.
    pub fn with_languages(runner: Arc<Runner>, languages: Vec<String>) -> SandboxdService {
        SandboxdService {
            runner,
            session: None,
            busy: Semaphore::new(1),
            languages,
            counts: Arc::new(CallCounts::default()),
        }
    }

    /// Session mode: opens one runner session, in which every payload from now on runs
    /// (files persist across calls; each call is swept). It lives as long as the service.
    pub fn into_session(mut self) -> Result<SandboxdService, RunnerError> {
        self.session = Some(self.runner.open_session()?);
        Ok(self)
    }

    /// Whether the service runs its payloads in one session.
    pub fn is_session(&self) -> bool {
        self.session.is_some()
    }

    /// The proven languages.
    pub fn languages(&self) -> &[String] {
        &self.languages
    }

    /// The call counters (shared with the [`Authenticator`] built by [`Self::into_server`]).
    pub fn counts(&self) -> Arc<CallCounts> {
        self.counts.clone()
    }

    /// The tonic service: token check in front, request size limit just above the protocol's
    /// own bound (so an oversize request is refused, marked `request`, by the codec).
    pub fn into_server(
        self,
        auth: Auth,
    ) -> InterceptedService<SandboxdServer<Self>, Authenticator> {
        let auth = Authenticator {
            auth,
            counts: self.counts.clone(),
        };
        InterceptedService::new(
            SandboxdServer::new(self).max_decoding_message_size(MAX_REQUEST_BYTES + 1024 * 1024),
            auth,
        )
    }

    /// Two routes to one service (one runner, one payload at a time across both), each
    /// with its own check: the TCP listener's and the terminator socket's.
    pub fn into_servers(
        self,
        first: Auth,
        second: Auth,
    ) -> (
        InterceptedService<SandboxdServer<Self>, Authenticator>,
        InterceptedService<SandboxdServer<Self>, Authenticator>,
    ) {
        let counts = self.counts.clone();
        let shared = Arc::new(self);
        let route = |auth| {
            InterceptedService::new(
                SandboxdServer::from_arc(shared.clone())
                    .max_decoding_message_size(MAX_REQUEST_BYTES + 1024 * 1024),
                Authenticator {
                    auth,
                    counts: counts.clone(),
                },
            )
        };
        (route(first), route(second))
    }

    async fn run(&self, req: ExecuteRequest) -> Result<ExecuteResponse, Status> {
        let timeout = match req.timeout_ms {
            0 => self.runner.config().default_timeout,
            ms => Duration::from_millis(u64::from(ms.min(MAX_TIMEOUT_MS))),
        };
        let env = RunEnv::new(req.env.into_iter().map(|v| (v.name, v.value)).collect())
            .map_err(|e| Refusal::request(format!("{e}; nothing ran")).to_status())?;
        let payload = req.payload.ok_or_else(|| {
            Refusal::request("the request carries no payload; nothing ran").to_status()
        })?;
        match &self.session {
            None => self.run_once(payload, timeout, &env).await,
            Some(session) => self.run_in_session(session, payload, timeout, &env).await,
        }
    }

    /// One payload in a fresh working directory (the one-shot mode); a cell is refused.
    async fn run_once(
        &self,
        payload: execute_request::Payload,
        timeout: Duration,
        env: &RunEnv,
    ) -> Result<ExecuteResponse, Status> {
        let started = Instant::now();
        let result = match payload {
                execute_request::Payload::Javascript(js) => {
                    self.counts.executed.fetch_add(1, Ordering::Relaxed);
                    self.runner
                        .javascript(&js, timeout, env)
                        .await
                        .map(execute_response::Result::Javascript)
                }
                execute_request::Payload::Project(p) => {
                    self.counts.executed.fetch_add(1, Ordering::Relaxed);
                    self.runner
                        .project(&p, timeout, env)
                        .await
                        .map(execute_response::Result::Project)
                }
                execute_request::Payload::Cell(_) => {
                    return Err(Refusal::unsupported(
                        "this sandboxd runs one-shot payloads; cells need a sandboxd started with --session; nothing ran",
                    )
                    .to_status())
                }
            };
        result
            .map(|r| ExecuteResponse {
                duration_ms: started.elapsed().as_millis() as i64,
                result: Some(r),
                ..Default::default()
            })
            .map_err(|e| runner_error_status(&e))
    }

    /// One payload in the session, read back first; the answer states the session's facts.
    async fn run_in_session(
        &self,
        session: &RunnerSession,
        payload: execute_request::Payload,
        timeout: Duration,
        env: &RunEnv,
    ) -> Result<ExecuteResponse, Status> {
        if let Err(why) = session.read_back() {
            tracing::error!("session read-back failed: {why}; nothing ran");
            return Ok(ExecuteResponse {
                session: true,
                session_changed: why,
                ..Default::default()
            });
        }
        let started = Instant::now();
        self.counts.executed.fetch_add(1, Ordering::Relaxed);
        let result = match payload {
            execute_request::Payload::Javascript(js) => session
                .javascript(&js, timeout, env)
                .await
                .map(execute_response::Result::Javascript),
            execute_request::Payload::Project(p) => session
                .project(&p, timeout, env)
                .await
                .map(execute_response::Result::Project),
            execute_request::Payload::Cell(c) => session
                .cell(&c, timeout)
                .await
                .map(execute_response::Result::Cell),
        };
        let duration_ms = started.elapsed().as_millis() as i64;
        let reaped = reap_orphans(session).await;
        if reaped > 0 {
            tracing::debug!(reaped, "reaped the zombies of processes the call left");
        }
        let disk_bytes = session.disk_bytes();
        let boundary_failed = !session.last_sweep_clean();
        if boundary_failed {
            tracing::error!("the sweep after a session call could not prove no process is left");
        }
        match result {
            Ok(r) => Ok(ExecuteResponse {
                duration_ms,
                result: Some(r),
                session: true,
                session_disk_bytes: disk_bytes,
                session_boundary_failed: boundary_failed,
                session_changed: String::new(),
            }),
            Err(e) => {
                let mut status = runner_error_status(&e);
                let m = status.metadata_mut();
                m.insert(SESSION_DISK_BYTES_KEY, disk_bytes.into());
                if boundary_failed {
                    m.insert(
                        SESSION_BOUNDARY_FAILED_KEY,
                        tonic::metadata::MetadataValue::from_static("1"),
                    );
                }
                Err(status)
            }
        }
    }
}

/// Reaps the zombies among sandboxd's own children that the runner is not waiting for,
/// after a session call (the runner has waited for every program it started by then, and
/// the session's turn is held, so no cell interpreter is being replaced).
///
/// In a container sandboxd is PID 1 (there is no init), so every process a call left and
/// the sweep killed is re-parented to it and stays a zombie until sandboxd reaps it: over
/// a session those would fill the container's pids limit. Only exact pids are waited for
/// (never `-1`), and never a kept interpreter's. Returns how many were reaped.
async fn reap_orphans(session: &RunnerSession) -> usize {
    use nix::sys::wait::{waitpid, WaitPidFlag};
    let me = std::process::id();
    let keep = session.interpreter_pids().await;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut reaped = 0;
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if keep.contains(&pid) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (Some(state), Some(ppid)) = (fields.next(), fields.next()) else {
            continue;
        };
        if state == "Z" && ppid.parse::<u32>().ok() == Some(me) {
            let pid = nix::unistd::Pid::from_raw(pid);
            if waitpid(pid, Some(WaitPidFlag::WNOHANG)).is_ok() {
                reaped += 1;
            }
        }
    }
    reaped
}

/// The runner's own failures: those that provably ran nothing carry the mark.
fn runner_error_status(e: &RunnerError) -> Status {
    match e {
        RunnerError::Setup(_) => {
            Refusal::environment(format!("sandboxd: {e}; nothing ran")).to_status()
        }
        RunnerError::Spawn { .. } | RunnerError::CellLanguage(_) => {
            Refusal::unsupported(format!("sandboxd: {e}; nothing ran")).to_status()
        }
        RunnerError::CellFiles(_) => {
            Refusal::request(format!("sandboxd: {e}; nothing ran")).to_status()
        }
        // Anything else may have run something.
        _ => Status::internal(format!("sandboxd: {e}")),
    }
}

#[tonic::async_trait]
impl Sandboxd for SandboxdService {
    async fn execute(
        &self,
        request: Request<ExecuteRequest>,
    ) -> Result<Response<ExecuteResponse>, Status> {
        let Ok(_slot) = self.busy.try_acquire() else {
            return Err(Refusal::capacity(
                "sandboxd runs one payload at a time and one is running; nothing ran",
            )
            .to_status());
        };
        let req = request.into_inner();
        let trace = req.trace_id.clone();
        let kind = match &req.payload {
            Some(execute_request::Payload::Javascript(_)) => "javascript",
            Some(execute_request::Payload::Project(_)) => "project",
            Some(execute_request::Payload::Cell(_)) => "cell",
            None => "none",
        };
        let out = self.run(req).await;
        match &out {
            Ok(r) => {
                tracing::info!(trace_id = %trace, "executed {kind} payload in {} ms", r.duration_ms)
            }
            Err(s) => {
                tracing::warn!(trace_id = %trace, "{kind} payload not executed: {}", s.message())
            }
        }
        out.map(Response::new)
    }

    async fn health(
        &self,
        _request: Request<HealthRequest>,
    ) -> Result<Response<HealthResponse>, Status> {
        Ok(Response::new(HealthResponse {
            languages: self.languages.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            session: self.session.is_some(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer(b"bearer   abc "), Some(&b"abc"[..]));
        assert_eq!(bearer(b"Basic abc"), None);
        assert_eq!(bearer(b"Bearer"), None);
        assert_eq!(bearer(b"Bearer  "), None);
    }

    #[test]
    fn runner_failures_that_ran_nothing_are_marked() {
        use plimsoll_core::{not_dispatched_reason, Reason};
        let setup = runner_error_status(&RunnerError::Setup(std::io::Error::other("disk")));
        assert_eq!(not_dispatched_reason(&setup), Some(Reason::Environment));
        let spawn = runner_error_status(&RunnerError::Spawn {
            program: "node".into(),
            source: std::io::Error::other("missing"),
        });
        assert_eq!(not_dispatched_reason(&spawn), Some(Reason::Unsupported));
        let wait = runner_error_status(&RunnerError::Wait {
            program: "node".into(),
            source: std::io::Error::other("lost"),
        });
        assert_eq!(not_dispatched_reason(&wait), None);
    }
}
