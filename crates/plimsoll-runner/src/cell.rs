//! A session's kept interpreters: one `node` and one `python3 -I` per session, started
//! lazily by the first cell of their language, each running an embedded driver script.
//!
//! # Choices where the specification is silent
//!
//! - **Start.** `sh -c 'exec 3<&0 </dev/null && exec "$@"' sh node -e <driver>` (or
//!   `python3 -I -c <driver>`): the driver is program text in argv, never a file the cell
//!   could edit. The interpreter's stdin is `/dev/null`; fd 3 is one end of a Unix socket
//!   pair whose other end only the runner holds (the control channel, both ways). stdout and
//!   stderr are pipes the runner reads. The interpreter leads its own process group and
//!   carries the session's tag, in the session's directory, with the fixed environment and
//!   no extras (cells carry no grants).
//! - **Protocol.** Per cell the runner sends one JSON line `{"nonce","code"}` (a fresh
//!   random 128-bit nonce) on fd 3; the driver answers one JSON line `{"nonce","status"}`
//!   (`ok` or `error`) after flushing stdout and stderr. Output is read while the cell runs
//!   and, after the answer, until the pipes hold nothing more (the driver writes its output
//!   before its answer, so all of it is in the pipes by then). A line that is not the
//!   cell's answer (another nonce, malformed, too long) kills the interpreter and the cell
//!   is [`RunnerError::Interpreter`] (it may have run). Code inside the interpreter can
//!   read the driver's memory, so the nonce stops leftovers and blind forgeries, not the
//!   interpreter's own code.
//! - **Between cells.** Output the interpreter writes between cells (a timer) is dropped
//!   before the next cell. A control line found pending before a cell is sent, or an
//!   interpreter still busy with a cell whose call was cancelled, or one that has exited,
//!   is replaced by a fresh one (`interpreter_started`), since nothing of the new cell ran.
//! - **Ends.** At the deadline the interpreter's group is killed, then the session is swept
//!   (exit 124, `timed_out`, `interpreter_ended`). An interpreter that exits during a cell
//!   (`os._exit(3)`, `process.exit(3)`) answers with its exit code (128 + signal when
//!   killed) and `interpreter_ended`; one that closes its control channel but lives on is
//!   killed and the cell is [`RunnerError::Interpreter`].
//! - **Python.** One globals dict (`__name__` is `__main__`) and one asyncio event loop for
//!   the session; code is compiled with `ast.PyCF_ALLOW_TOP_LEVEL_AWAIT`. When the last
//!   statement is an expression its value's `repr` is printed, unless it is `None`. `-I`
//!   keeps the working directory off `sys.path` (so a cell's file named like a module the
//!   driver imports cannot replace it); a cell may add it.
//! - **JavaScript.** Code runs with `vm.runInThisContext` (sloppy mode, one global scope for
//!   the session). Top-level `let` and `const` are rewritten to `var` and `class C` to
//!   `var C = class C …;`, so every top-level name persists and can be declared again in a
//!   later cell (a `const` can then be reassigned). The completion value (as node's REPL
//!   shows it) is printed with `util.inspect`, unless it is `undefined`. Code that does not
//!   compile as a script and uses `await` runs inside an async function: there, a top-level
//!   declaration of a name with an initializer (`let x = await f()`, `const a = 1, b = 2`)
//!   becomes an assignment to a global, `function f` and `class C` become `f = function f`,
//!   `C = class C`, and all persist; destructuring declarations and declarations without an
//!   initializer stay local to that cell. The value of its last expression statement is
//!   printed. Errors thrown later by timers or promises are printed to stderr and keep the
//!   interpreter alive.

use std::os::fd::OwnedFd;
use std::process::Stdio;

use plimsoll_core::pb;
use tokio::net::unix::pipe;
use tokio::net::UnixStream;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::env::program_env;
use crate::exec::{exit_code_of, OUTPUT_GRACE, TIMEOUT_EXIT_CODE};
use crate::scope::{random_hex, RunScope};
use crate::tree::{self, Spared};
use crate::{RunEnv, RunnerError};

const JS_DRIVER: &str = include_str!("drivers/cell.js");
const PY_DRIVER: &str = include_str!("drivers/cell.py");

/// The longest control line the runner accepts.
const MAX_CONTROL_LINE: usize = 4096;

/// The shell step that moves the control socket from stdin to fd 3, then becomes the
/// interpreter.
const MOVE_CONTROL_FD: &str = "exec 3<&0 </dev/null && exec \"$@\"";

/// A cell language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Language {
    Javascript,
    Python,
}

impl Language {
    pub fn parse(name: &str) -> Option<Language> {
        match name {
            "javascript" => Some(Language::Javascript),
            "python" => Some(Language::Python),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Language::Javascript => "javascript",
            Language::Python => "python",
        }
    }

    fn argv(self) -> &'static [&'static str] {
        match self {
            Language::Javascript => &["node", "-e", JS_DRIVER],
            Language::Python => &["python3", "-I", "-c", PY_DRIVER],
        }
    }
}

/// One kept interpreter.
#[derive(Debug)]
pub(crate) struct Interp {
    language: Language,
    child: Child,
    pid: i32,
    ctl: UnixStream,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    /// A cell was sent and its answer not yet read (the call was cancelled midway).
    busy: bool,
}

/// One stream of a cell, capped.
#[derive(Debug)]
struct Capped {
    kept: Vec<u8>,
    cap: usize,
    truncated: bool,
    closed: bool,
}

impl Capped {
    fn new(cap: usize) -> Capped {
        Capped {
            kept: Vec::new(),
            cap,
            truncated: false,
            closed: false,
        }
    }

    fn push(&mut self, data: &[u8]) {
        let room = self.cap.saturating_sub(self.kept.len());
        if data.len() > room {
            self.truncated = true;
        }
        self.kept.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// Reads what the pipe holds now, without waiting. tokio's `try_read` answers
    /// `WouldBlock` from its cached readiness, before its reactor has seen the pipe become
    /// readable, so on `WouldBlock` the kernel itself is asked (the pipe is non-blocking):
    /// output the interpreter flushed before its answer is never left behind.
    fn drain(&mut self, r: &pipe::Receiver, chunk: &mut [u8]) {
        use std::os::fd::AsRawFd;
        while !self.closed {
            match r.try_read(chunk) {
                Ok(0) => self.closed = true,
                Ok(n) => self.push(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    match nix::unistd::read(r.as_raw_fd(), chunk) {
                        Ok(0) => self.closed = true,
                        Ok(n) => self.push(&chunk[..n]),
                        Err(nix::errno::Errno::EAGAIN) => return,
                        Err(_) => self.closed = true,
                    }
                }
                Err(_) => self.closed = true,
            }
        }
    }
}

/// How one cell's exchange ended.
enum Ending {
    Answered { ok: bool },
    TimedOut,
    Exited(std::process::ExitStatus),
    Untrusted(String),
}

impl Interp {
    /// Starts an interpreter in the scope's directory and spares it from the scope's sweeps.
    pub async fn spawn(scope: &RunScope, language: Language) -> Result<Interp, RunnerError> {
        let spawn_err = |source: std::io::Error| RunnerError::Spawn {
            program: language.argv()[0].to_owned(),
            source,
        };
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(spawn_err)?;
        let (out_tx, stdout) = pipe::pipe().map_err(spawn_err)?;
        let (err_tx, stderr) = pipe::pipe().map_err(spawn_err)?;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(MOVE_CONTROL_FD)
            .arg("sh")
            .args(language.argv())
            .current_dir(scope.dir())
            .env_clear()
            .envs(program_env(
                scope.dir(),
                scope.tmp(),
                scope.tag(),
                &RunEnv::default(),
            ))
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::from(out_tx.into_blocking_fd().map_err(spawn_err)?))
            .stderr(Stdio::from(err_tx.into_blocking_fd().map_err(spawn_err)?))
            .process_group(0)
            .kill_on_drop(true);
        // 0, 1 and 2 alone (the control socket is stdin until the shell moves it to fd 3).
        plimsoll_log::fds::StdioOnly::stdio_only(cmd.as_std_mut());
        if let Some(who) = scope.run_as() {
            cmd.uid(who.uid).gid(who.gid);
        }
        let mut child = cmd.spawn().map_err(spawn_err)?;
        // The command holds the child's ends; they must close here so EOF means the child's.
        drop(cmd);
        let Some(pid) = child.id().map(|p| p as i32) else {
            return Err(spawn_err(std::io::Error::other(
                "the interpreter ended at once",
            )));
        };
        scope.add_group(pid);
        let Some(start) = tree::start_time(pid) else {
            tree::kill_group(pid);
            let _ = child.wait().await;
            return Err(spawn_err(std::io::Error::other(
                "the interpreter's start time cannot be read",
            )));
        };
        scope.spare(Spared { pid, start });
        ours.set_nonblocking(true).map_err(spawn_err)?;
        let ctl = UnixStream::from_std(ours).map_err(spawn_err)?;
        tracing::debug!(language = language.name(), pid, "cell interpreter started");
        Ok(Interp {
            language,
            child,
            pid,
            ctl,
            stdout,
            stderr,
            busy: false,
        })
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the interpreter can take the next cell: alive, idle, and nothing unasked
    /// waiting on its control channel.
    fn usable(&mut self) -> bool {
        if self.busy || !matches!(self.child.try_wait(), Ok(None)) {
            return false;
        }
        let mut b = [0u8; 1];
        matches!(self.ctl.try_read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    /// Kills the interpreter's group (its leader not reaped yet, so the group id is still
    /// the session's) and reaps it; the session's sweep then finds what it started.
    pub async fn kill(&mut self, scope: &RunScope) {
        scope.unspare(self.pid);
        // Only while the leader is not reaped is its pid still the session's group id.
        if matches!(self.child.try_wait(), Ok(None)) {
            tree::kill_group(self.pid);
        }
        let _ = self.child.kill().await;
        tracing::debug!(
            language = self.language.name(),
            pid = self.pid,
            "cell interpreter ended"
        );
    }

    /// Sends one cell and reads its answer and output.
    async fn exchange(
        &mut self,
        code: &str,
        deadline: Instant,
        out: &mut Capped,
        err: &mut Capped,
    ) -> Ending {
        let nonce = random_hex(16);
        let mut chunk = vec![0u8; 64 * 1024];
        // Whatever the interpreter printed between cells is not this cell's.
        let mut stale = Capped::new(0);
        stale.drain(&self.stdout, &mut chunk);
        stale.drain(&self.stderr, &mut chunk);
        let mut line = serde_json::json!({ "nonce": nonce, "code": code }).to_string();
        line.push('\n');
        self.busy = true;
        let Interp {
            child,
            ctl,
            stdout,
            stderr,
            ..
        } = self;
        let line = line.as_bytes();
        let mut written = 0;
        let mut answer: Vec<u8> = Vec::new();
        loop {
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline) => return Ending::TimedOut,
                w = ctl.writable(), if written < line.len() => {
                    let sent = w.and_then(|()| ctl.try_write(&line[written..]));
                    match sent {
                        Ok(n) => written += n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => return Ending::Untrusted(format!("the cell could not be sent: {e}")),
                    }
                }
                r = ctl.readable() => {
                    if r.is_err() {
                        return Ending::Untrusted("its control channel failed".into());
                    }
                    match ctl.try_read(&mut chunk) {
                        Ok(0) => {
                            return match tokio::time::timeout(OUTPUT_GRACE, child.wait()).await {
                                Ok(Ok(status)) => Ending::Exited(status),
                                _ => Ending::Untrusted("it closed its control channel".into()),
                            };
                        }
                        Ok(n) => answer.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Ending::Untrusted(format!("its control channel failed: {e}")),
                    }
                    if let Some(end) = answer.iter().position(|b| *b == b'\n') {
                        let Some(ok) = judge(&answer[..end], &nonce).filter(|_| written == line.len()) else {
                            return Ending::Untrusted("a control line did not carry the cell's nonce".into());
                        };
                        if end + 1 != answer.len() {
                            return Ending::Untrusted("it sent more than one answer".into());
                        }
                        out.drain(stdout, &mut chunk);
                        err.drain(stderr, &mut chunk);
                        return Ending::Answered { ok };
                    }
                    if answer.len() > MAX_CONTROL_LINE {
                        return Ending::Untrusted("a control line was too long".into());
                    }
                }
                r = stdout.readable(), if !out.closed => {
                    if r.is_ok() { out.drain(stdout, &mut chunk) } else { out.closed = true }
                }
                r = stderr.readable(), if !err.closed => {
                    if r.is_ok() { err.drain(stderr, &mut chunk) } else { err.closed = true }
                }
                s = child.wait() => {
                    return match s {
                        Ok(status) => Ending::Exited(status),
                        Err(e) => Ending::Untrusted(format!("waiting for it failed: {e}")),
                    };
                }
            }
        }
    }
}

/// `Some(ok)` when `line` is this cell's answer.
fn judge(line: &[u8], nonce: &str) -> Option<bool> {
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    if v.get("nonce")?.as_str()? != nonce {
        return None;
    }
    match v.get("status")?.as_str()? {
        "ok" => Some(true),
        "error" => Some(false),
        _ => None,
    }
}

/// Reads both streams until they close or [`OUTPUT_GRACE`] passes (a child of a dead
/// interpreter may hold them open until the sweep).
async fn read_rest(
    stdout: &pipe::Receiver,
    stderr: &pipe::Receiver,
    out: &mut Capped,
    err: &mut Capped,
) {
    let mut chunk = vec![0u8; 64 * 1024];
    let until = Instant::now() + OUTPUT_GRACE;
    while !(out.closed && err.closed) {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return,
            r = stdout.readable(), if !out.closed => {
                if r.is_ok() { out.drain(stdout, &mut chunk) } else { out.closed = true }
            }
            r = stderr.readable(), if !err.closed => {
                if r.is_ok() { err.drain(stderr, &mut chunk) } else { err.closed = true }
            }
        }
    }
}

/// Runs one cell in the kept interpreter `slot` (starting one when there is none, or the
/// one there cannot be trusted with the next cell).
pub(crate) async fn run(
    scope: &RunScope,
    slot: &mut Option<Interp>,
    language: Language,
    code: &str,
    deadline: Instant,
    output_cap: usize,
) -> Result<pb::CellResult, RunnerError> {
    if let Some(mut old) = slot.take() {
        if old.usable() {
            *slot = Some(old);
        } else {
            tracing::debug!(
                language = language.name(),
                "replacing a cell interpreter that cannot take a cell"
            );
            old.kill(scope).await;
            scope.kill_all().await;
        }
    }
    let started = slot.is_none();
    if started {
        *slot = Some(Interp::spawn(scope, language).await?);
    }
    let Some(interp) = slot.as_mut() else {
        unreachable!("the slot was just filled");
    };
    let mut out = Capped::new(output_cap);
    let mut err = Capped::new(output_cap);
    let ending = interp.exchange(code, deadline, &mut out, &mut err).await;
    let mut result = pb::CellResult {
        interpreter_started: started,
        ..Default::default()
    };
    match ending {
        Ending::Answered { ok } => {
            interp.busy = false;
            result.exit_code = if ok { 0 } else { 1 };
        }
        Ending::TimedOut | Ending::Exited(_) => {
            result.exit_code = match ending {
                Ending::Exited(status) => exit_code_of(status),
                _ => {
                    result.timed_out = true;
                    TIMEOUT_EXIT_CODE
                }
            };
            result.interpreter_ended = true;
            interp.kill(scope).await;
            // What it started may hold its pipes: gone before the rest is read.
            scope.kill_all().await;
            read_rest(&interp.stdout, &interp.stderr, &mut out, &mut err).await;
            *slot = None;
        }
        Ending::Untrusted(detail) => {
            interp.kill(scope).await;
            *slot = None;
            return Err(RunnerError::Interpreter {
                language: language.name(),
                detail,
            });
        }
    }
    result.stdout = out.kept;
    result.stderr = err.kept;
    result.stdout_truncated = out.truncated;
    result.stderr_truncated = err.truncated;
    Ok(result)
}
