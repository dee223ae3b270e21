//! A session: one persistent working directory for many calls (snippets, projects and
//! cells), with the session's kept interpreters, swept after every call.
//!
//! # Choices where the specification is silent
//!
//! - **Directory.** `root_dir/session-<32 hex>` (0700), `.tmp` inside as `TMPDIR`, one
//!   random tag for every program of the session. It stays across calls and is removed by
//!   [`RunnerSession::close`] or when the session is dropped (synchronously, as a run's).
//! - **Calls.** One call at a time (a call waits for the one before). Snippets and projects
//!   behave as in a one-shot run, in the session's directory; a project's pre-artifact kill
//!   spares the kept interpreters.
//! - **Sweep.** Every call method sweeps before it returns: every process with the tag, a
//!   working directory inside the session's directory, or in one of the session's process
//!   groups is killed, but the kept interpreters, each recognised by pid *and* start time.
//!   What the interpreters started is killed (one by one: their groups are spared). A call
//!   whose future was dropped leaves the sweep to the start of the next call. Whether the
//!   last sweep proved the session clean is [`RunnerSession::last_sweep_clean`].
//! - **Disk.** [`RunnerSession::disk_bytes`] sums the allocated blocks of everything under
//!   the directory, never following a symlink, over at most [`DISK_WALK_LIMIT`] entries;
//!   past that it reports `u64::MAX` (unmeasurable counts as full).
//! - **Read-back.** The directory must still be the one created: same device and inode (and
//!   birth time, where the filesystem records one), a directory, mode 0700, same owner.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use plimsoll_core::pb;

use crate::cell::{self, Interp, Language};
use crate::scope::RunScope;
use crate::{deadline_after, javascript_in, project_in, Limits, RunEnv, Runner, RunnerError};

/// Most directory entries [`RunnerSession::disk_bytes`] visits.
pub const DISK_WALK_LIMIT: usize = 200_000;

/// What the session's directory was when it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirIdentity {
    dev: u64,
    ino: u64,
    uid: u32,
    /// The birth time where the filesystem records one: an inode number can be reused by a
    /// directory made after the first was removed.
    born: Option<std::time::SystemTime>,
}

/// The session's kept interpreters; its lock is also the session's turn.
#[derive(Debug, Default)]
struct Cells {
    javascript: Option<Interp>,
    python: Option<Interp>,
}

impl Cells {
    fn slot(&mut self, l: Language) -> &mut Option<Interp> {
        match l {
            Language::Javascript => &mut self.javascript,
            Language::Python => &mut self.python,
        }
    }
}

/// One open session of a [`Runner`]. See the module documentation.
#[derive(Debug)]
pub struct RunnerSession {
    cells: tokio::sync::Mutex<Cells>,
    scope: RunScope,
    limits: Limits,
    default_timeout: Duration,
    identity: DirIdentity,
    clean: AtomicBool,
    /// A call started and has not swept yet (its future may have been dropped).
    unswept: AtomicBool,
}

impl Runner {
    /// Opens a session: a fresh persistent working directory with its own tag.
    pub fn open_session(&self) -> Result<RunnerSession, RunnerError> {
        let scope = RunScope::create_named(&self.root, "session", self.run_as)
            .map_err(RunnerError::Setup)?;
        let m = std::fs::symlink_metadata(scope.dir()).map_err(RunnerError::Setup)?;
        tracing::debug!(tag = scope.tag(), "session opened");
        Ok(RunnerSession {
            cells: Default::default(),
            limits: self.cfg.limits,
            default_timeout: self.cfg.default_timeout,
            identity: DirIdentity {
                dev: m.dev(),
                ino: m.ino(),
                uid: m.uid(),
                born: m.created().ok(),
            },
            scope,
            clean: AtomicBool::new(true),
            unswept: AtomicBool::new(false),
        })
    }
}

impl RunnerSession {
    /// The session's working directory.
    pub fn dir(&self) -> &Path {
        self.scope.dir()
    }

    /// The tag every program of the session carries in `PLIMSOLL_RUN_TAG`.
    pub fn tag(&self) -> &str {
        self.scope.tag()
    }

    /// The pids of the kept interpreters that are running now (javascript, python).
    pub async fn interpreter_pids(&self) -> Vec<i32> {
        let cells = self.cells.lock().await;
        [&cells.javascript, &cells.python]
            .into_iter()
            .flatten()
            .map(|i| i.pid())
            .collect()
    }

    /// Runs a snippet in the session's directory, as [`Runner::javascript`] does; sweeps.
    pub async fn javascript(
        &self,
        snippet: &pb::JavaScriptRun,
        timeout: Duration,
        env: &RunEnv,
    ) -> Result<pb::JavaScriptResult, RunnerError> {
        let _turn = self.begin().await;
        let deadline = deadline_after(timeout, self.default_timeout);
        let out = javascript_in(&self.scope, snippet, deadline, &self.limits, env).await;
        self.sweep().await;
        out
    }

    /// Runs a project in the session's directory, as [`Runner::project`] does; sweeps.
    pub async fn project(
        &self,
        project: &pb::ProjectRun,
        timeout: Duration,
        env: &RunEnv,
    ) -> Result<pb::ProjectResult, RunnerError> {
        let _turn = self.begin().await;
        let deadline = deadline_after(timeout, self.default_timeout);
        let out = project_in(&self.scope, project, deadline, &self.limits, env).await;
        self.sweep().await;
        out
    }

    /// Runs a cell in the session's interpreter of its language (see the `cell` module's
    /// documentation); sweeps. The cell's files are written first: a refused or unwritable
    /// path is [`RunnerError::CellFiles`] and the code does not run.
    pub async fn cell(
        &self,
        c: &pb::CellRun,
        timeout: Duration,
    ) -> Result<pb::CellResult, RunnerError> {
        let mut cells = self.begin().await;
        let deadline = deadline_after(timeout, self.default_timeout);
        let out = match Language::parse(&c.language) {
            None => Err(RunnerError::CellLanguage(c.language.clone())),
            Some(language) => match self.scope.write_files(&c.files) {
                Err(detail) => Err(RunnerError::CellFiles(detail)),
                Ok(()) => {
                    tracing::debug!(tag = self.tag(), language = language.name(), "cell starts");
                    cell::run(
                        &self.scope,
                        cells.slot(language),
                        language,
                        &c.code,
                        deadline,
                        self.limits.output_bytes,
                    )
                    .await
                }
            },
        };
        self.sweep().await;
        out
    }

    /// Takes the session's turn, sweeping first if the last call did not.
    async fn begin(&self) -> tokio::sync::MutexGuard<'_, Cells> {
        let cells = self.cells.lock().await;
        if self.unswept.swap(true, Ordering::SeqCst) {
            self.sweep().await;
            self.unswept.store(true, Ordering::SeqCst);
        }
        cells
    }

    /// Kills every process of the session but the kept interpreters (bounded rounds).
    /// Returns whether it proved none is left; the call methods run it themselves.
    pub async fn sweep(&self) -> bool {
        let clean = self.scope.kill_all().await;
        self.clean.store(clean, Ordering::SeqCst);
        self.unswept.store(false, Ordering::SeqCst);
        clean
    }

    /// Whether the last sweep proved that no process of the session but its kept
    /// interpreters is left.
    pub fn last_sweep_clean(&self) -> bool {
        self.clean.load(Ordering::SeqCst)
    }

    /// Bytes allocated to the session's files (see the module documentation).
    pub fn disk_bytes(&self) -> u64 {
        disk_bytes(self.scope.dir(), DISK_WALK_LIMIT)
    }

    /// Checks that the session's directory is still the one it was opened with; `Err` says
    /// what differs.
    pub fn read_back(&self) -> Result<(), String> {
        let m = std::fs::symlink_metadata(self.scope.dir())
            .map_err(|e| format!("the session's directory cannot be read: {e}"))?;
        if !m.is_dir() {
            return Err("the session's directory is no longer a directory".into());
        }
        if (m.dev(), m.ino()) != (self.identity.dev, self.identity.ino)
            || m.created().ok() != self.identity.born
        {
            return Err("the session's directory was replaced".into());
        }
        if m.mode() & 0o7777 != 0o700 {
            return Err(format!(
                "the session's directory has mode {:o}, not 700",
                m.mode() & 0o7777
            ));
        }
        if m.uid() != self.identity.uid {
            return Err("the session's directory changed owner".into());
        }
        Ok(())
    }

    /// Ends the session: kills every process of it, the interpreters too, and removes its
    /// directory.
    pub async fn close(self) {
        let mut guard = self.cells.lock().await;
        let cells = &mut *guard;
        for slot in [&mut cells.javascript, &mut cells.python] {
            if let Some(mut i) = slot.take() {
                i.kill(&self.scope).await;
            }
        }
        drop(guard);
        tracing::debug!(tag = self.tag(), "session closed");
        self.scope.end().await;
    }
}

/// Allocated bytes under `dir`, not following symlinks; `u64::MAX` past `limit` entries.
fn disk_bytes(dir: &Path, limit: usize) -> u64 {
    let mut total: u64 = 0;
    let mut seen = 0usize;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > limit {
                return u64::MAX;
            }
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            total = total.saturating_add(m.blocks().saturating_mul(512));
            if m.is_dir() {
                todo.push(e.path());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_walk_counts_files_and_stops_at_the_limit() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/f"), vec![1u8; 100_000]).unwrap();
        std::os::unix::fs::symlink("/usr", d.path().join("link")).unwrap();
        let n = disk_bytes(d.path(), 100);
        assert!((100_000..1_000_000).contains(&n), "{n}");
        assert_eq!(disk_bytes(d.path(), 2), u64::MAX);
    }
}
