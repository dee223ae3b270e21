//! One run's scope: its fresh working directory, its tag, the process groups it started.
//! Ending the scope (or dropping it, if the run's future is cancelled) kills every process
//! of the run and removes the directory.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use plimsoll_core::pb;
use plimsoll_core::validate::check_relative_path;
use rand::RngCore;

use crate::tree::{self, Spared, Target};
use crate::RunAs;

/// Name of the directory, inside the working directory, that programs get as `TMPDIR`.
pub const TMP_DIR_NAME: &str = ".tmp";

/// A run in progress.
#[derive(Debug)]
pub(crate) struct RunScope {
    dir: PathBuf,
    tmp: PathBuf,
    tag: String,
    groups: Mutex<Vec<i32>>,
    /// Processes sweeps leave alive: a session's kept interpreters.
    spared: Mutex<Vec<Spared>>,
    run_as: Option<RunAs>,
    /// Start time (clock ticks since boot, `/proc/<pid>/stat` field 22) of the run's first
    /// program. Every process of the run was forked at or after it, so a sweep need not
    /// read the environment or working directory of an older process.
    /// Only the first program's start time may be taken: if it cannot be read, a later
    /// program's would pass over the first one's children, so the field stays `None` for
    /// good (the outer `Option`: whether the first program has been seen).
    born: Mutex<Option<Option<u64>>>,
    /// Programs started so far (bumped by [`RunScope::add_group`]).
    started: AtomicU64,
    /// The value of `started` when a sweep last found nothing left (`u64::MAX`: never).
    clean_at: AtomicU64,
    /// Time spent in sweeps, and how many there were, for the phase breakdown.
    swept: Mutex<(Duration, u32)>,
    ended: bool,
}

/// What reading the artifacts gave.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub artifacts: Vec<pb::Artifact>,
    pub truncated: bool,
}

pub(crate) fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

impl RunScope {
    /// Creates a fresh working directory (mode 0700, random name) under `root`, owned by
    /// `run_as` when the run's programs run as another user.
    pub fn create(root: &Path, run_as: Option<RunAs>) -> std::io::Result<RunScope> {
        RunScope::create_named(root, "run", run_as)
    }

    /// [`RunScope::create`] with the directory named `<prefix>-<32 hex>`.
    pub fn create_named(
        root: &Path,
        prefix: &str,
        run_as: Option<RunAs>,
    ) -> std::io::Result<RunScope> {
        let dir = root.join(format!("{prefix}-{}", random_hex(16)));
        fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let tmp = dir.join(TMP_DIR_NAME);
        let scope = RunScope {
            dir,
            tmp,
            tag: random_hex(16),
            groups: Mutex::new(Vec::new()),
            spared: Mutex::new(Vec::new()),
            run_as,
            born: Mutex::new(None),
            started: AtomicU64::new(0),
            clean_at: AtomicU64::new(u64::MAX),
            swept: Mutex::new((Duration::ZERO, 0)),
            ended: false,
        };
        // From here on, dropping `scope` removes the directory.
        fs::DirBuilder::new().mode(0o700).create(&scope.tmp)?;
        scope.give(&scope.dir)?;
        scope.give(&scope.tmp)?;
        Ok(scope)
    }

    /// The user the run's programs run as, when it is not the runner's.
    pub fn run_as(&self) -> Option<RunAs> {
        self.run_as
    }

    /// Hands a path the runner created to the run's user (never following a symlink).
    fn give(&self, path: &Path) -> std::io::Result<()> {
        match self.run_as {
            Some(who) => std::os::unix::fs::lchown(path, Some(who.uid), Some(who.gid)),
            None => Ok(()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn tmp(&self) -> &Path {
        &self.tmp
    }

    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Remembers a program this run started (`pgid`: its pid, which leads its own process
    /// group), for the end-of-run kill. Call it right after the spawn, before the program
    /// is waited for: the first call reads the program's start time.
    pub fn add_group(&self, pgid: i32) {
        self.started.fetch_add(1, Ordering::SeqCst);
        {
            let mut born = lock(&self.born);
            if born.is_none() {
                *born = Some(tree::start_time(pgid));
            }
        }
        let mut groups = lock(&self.groups);
        if !groups.contains(&pgid) {
            groups.push(pgid);
        }
    }

    /// The run's own user id, when its programs run as another user than the runner.
    fn uid(&self) -> Option<u32> {
        self.run_as.map(|w| w.uid)
    }

    fn groups(&self) -> Vec<i32> {
        lock(&self.groups).clone()
    }

    /// Leaves `p` alive in every later sweep but the last one ([`RunScope::end`], drop).
    pub fn spare(&self, p: Spared) {
        lock(&self.spared).push(p);
    }

    /// Stops sparing `pid`.
    pub fn unspare(&self, pid: i32) {
        lock(&self.spared).retain(|s| s.pid != pid);
    }

    /// Kills every process of the run but the spared ones (bounded repeat until none is
    /// found). Returns whether none is left.
    pub async fn kill_all(&self) -> bool {
        let t0 = Instant::now();
        let started = self.started.load(Ordering::SeqCst);
        let (groups, spared) = (self.groups(), lock(&self.spared).clone());
        let clean = tree::sweep(self.target(&groups, &spared)).await;
        if clean && spared.is_empty() {
            // Nothing of the run is alive, and nothing can start again unless a program
            // is started after this point.
            self.clean_at.store(started, Ordering::SeqCst);
        }
        let mut swept = lock(&self.swept);
        swept.0 += t0.elapsed();
        swept.1 += 1;
        clean
    }

    /// Whether a sweep found nothing left after the last program was started: then no
    /// process of the run can exist, and another sweep would only read `/proc` again.
    fn known_clean(&self) -> bool {
        self.clean_at.load(Ordering::SeqCst) == self.started.load(Ordering::SeqCst)
    }

    /// Time spent in sweeps so far and their number.
    pub fn swept(&self) -> (Duration, u32) {
        *lock(&self.swept)
    }

    fn target<'a>(&'a self, groups: &'a [i32], spared: &'a [Spared]) -> Target<'a> {
        Target {
            tag: &self.tag,
            workdir: &self.dir,
            groups,
            run_uid: self.uid(),
            spared,
            born: lock(&self.born).flatten(),
        }
    }

    /// Writes every file, or names the first path that is refused or cannot be written.
    /// All paths are checked before anything is written.
    pub fn write_files(&self, files: &[pb::ProjectFile]) -> Result<(), String> {
        for f in files {
            check_relative_path(&f.path).map_err(|e| format!("file {e}"))?;
        }
        for f in files {
            self.write_file(&f.path, f.content.as_bytes())?;
        }
        Ok(())
    }

    fn write_file(&self, rel: &str, content: &[u8]) -> Result<(), String> {
        let comps: Vec<&str> = rel.split('/').collect();
        let (last, parents) = comps.split_last().expect("a checked path is non-empty");
        let mut at = self.dir.clone();
        for c in parents {
            at.push(c);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(format!("file path {rel:?} passes through a symlink"))
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(format!(
                        "file path {rel:?}: a parent component is not a directory"
                    ))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    fs::create_dir(&at)
                        .map_err(|e| format!("file path {rel:?}: cannot create a parent: {e}"))?;
                    self.give(&at).map_err(|e| {
                        format!("file path {rel:?}: cannot hand a parent to the run's user: {e}")
                    })?;
                }
                Err(e) => return Err(format!("file path {rel:?}: {e}")),
            }
        }
        at.push(last);
        if fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(format!("file path {rel:?} is a symlink"));
        }
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            // Never write through a symlink, even one that appeared after the check.
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(&at)
            .map_err(|e| format!("file path {rel:?} cannot be written: {e}"))?;
        f.write_all(content)
            .map_err(|e| format!("file path {rel:?} cannot be written: {e}"))?;
        if let Some(who) = self.run_as {
            // Through the open descriptor: the very file written, whatever the path became.
            std::os::unix::fs::fchown(&f, Some(who.uid), Some(who.gid))
                .map_err(|e| format!("file path {rel:?}: cannot hand it to the run's user: {e}"))?;
        }
        Ok(())
    }

    /// Reads the artifacts, in order, keeping at most `cap` bytes in all. A missing artifact
    /// is skipped; one that does not fit is dropped and sets `truncated`. `Err` names an
    /// artifact that is refused: its path is not clean, it resolves outside the working
    /// directory, it is not a regular file, or it has a second hard link (which could be a
    /// name for a file outside). Call it only after the run's processes are dead.
    pub fn collect(&self, paths: &[String], cap: usize) -> Result<Collected, String> {
        for p in paths {
            check_relative_path(p).map_err(|e| format!("artifact {e}"))?;
        }
        let mut out = Collected::default();
        let mut used = 0usize;
        for rel in paths {
            let Some(mut file) = self.open_artifact(rel)? else {
                continue;
            };
            let room = cap - used;
            let mut content = Vec::new();
            (&mut file)
                .take(room as u64 + 1)
                .read_to_end(&mut content)
                .map_err(|e| format!("artifact {rel:?} cannot be read: {e}"))?;
            if content.len() > room {
                out.truncated = true;
                continue;
            }
            used += content.len();
            out.artifacts.push(pb::Artifact {
                path: rel.clone(),
                content,
            });
        }
        Ok(out)
    }

    fn open_artifact(&self, rel: &str) -> Result<Option<fs::File>, String> {
        let path = self.dir.join(rel);
        let file = match OpenOptions::new()
            .read(true)
            // A FIFO must not block the runner.
            .custom_flags(OFlag::O_NONBLOCK.bits())
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // Missing, or a dangling symlink: only skip it when no symlink is on the way
                // out (a dangling link to outside is still an escape attempt).
                if let Some(why) = self.escape_on_the_way(rel) {
                    return Err(format!("artifact {rel:?} {why}"));
                }
                return Ok(None);
            }
            Err(e) => return Err(format!("artifact {rel:?} cannot be opened: {e}")),
        };
        // Judge what was actually opened, not the path: no race can swap it afterwards.
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let opened = fs::read_link(format!("/proc/self/fd/{fd}"))
            .map_err(|e| format!("artifact {rel:?}: cannot tell where it resolves: {e}"))?;
        if !opened.starts_with(&self.dir) {
            return Err(format!(
                "artifact {rel:?} resolves outside the working directory"
            ));
        }
        let meta = file
            .metadata()
            .map_err(|e| format!("artifact {rel:?} cannot be read: {e}"))?;
        if !meta.is_file() {
            return Err(format!("artifact {rel:?} is not a regular file"));
        }
        if meta.nlink() > 1 {
            return Err(format!(
                "artifact {rel:?} has more than one hard link; it could name a file outside the working directory"
            ));
        }
        Ok(Some(file))
    }

    /// Why a path that does not resolve to a file still counts as an escape attempt.
    fn escape_on_the_way(&self, rel: &str) -> Option<&'static str> {
        let mut at = self.dir.clone();
        for c in rel.split('/') {
            at.push(c);
            match fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    let target = fs::read_link(&at).ok()?;
                    let parent = at.parent()?;
                    let resolved = normalize(&parent.join(target));
                    if !resolved.starts_with(&self.dir) {
                        return Some("is a symlink that points outside the working directory");
                    }
                    return None;
                }
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    }

    /// Ends the run: kills every process of it, the spared ones too (no second look at
    /// `/proc` when the last sweep found none and no program started since), then removes
    /// the working directory.
    pub async fn end(self) {
        self.end_measured(false).await;
    }

    /// [`RunScope::end`], telling where the time went. With `remove_later`, the directory
    /// is removed on a blocking thread after this returns (the processes are dead by then).
    pub async fn end_measured(mut self, remove_later: bool) -> Ended {
        lock(&self.spared).clear();
        if !self.known_clean() {
            self.kill_all().await;
        }
        let t0 = Instant::now();
        if remove_later {
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || remove_tree(&dir));
        } else {
            remove_tree(&self.dir);
        }
        self.ended = true;
        let (swept, sweeps) = self.swept();
        Ended {
            remove: t0.elapsed(),
            swept,
            sweeps,
        }
    }
}

/// Where an ended scope's cleanup time went.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ended {
    /// Removing the working directory.
    pub remove: Duration,
    /// Every sweep of the run, the last one included, and their number.
    pub swept: Duration,
    pub sweeps: u32,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for RunScope {
    fn drop(&mut self) {
        if !self.ended {
            // The run's future was dropped (cancelled) or panicked: clean up right here,
            // sparing nothing.
            let groups = self.groups();
            tree::sweep_blocking(self.target(&groups, &[]));
            remove_tree(&self.dir);
        }
    }
}

/// Lexical normalization (no filesystem access) of an absolute path.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Removes a directory tree even when a program took the permissions off parts of it.
fn remove_tree(dir: &Path) {
    for attempt in 0..3 {
        match fs::remove_dir_all(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                if attempt == 2 {
                    tracing::warn!(dir = %dir.display(), error = %e, "could not remove a run's working directory");
                    return;
                }
                restore_permissions(dir);
            }
        }
    }
}

fn restore_permissions(dir: &Path) {
    let Ok(m) = fs::symlink_metadata(dir) else {
        return;
    };
    if !m.is_dir() {
        return;
    }
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            restore_permissions(&e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, content: &str) -> pb::ProjectFile {
        pb::ProjectFile {
            path: path.into(),
            content: content.into(),
        }
    }

    #[test]
    fn writes_and_removes() {
        let root = tempfile::tempdir().unwrap();
        let scope = RunScope::create(root.path(), None).unwrap();
        let dir = scope.dir().to_path_buf();
        scope
            .write_files(&[file("a/b/c.txt", "hi"), file("top", "x")])
            .unwrap();
        assert_eq!(fs::read_to_string(dir.join("a/b/c.txt")).unwrap(), "hi");
        assert!(scope.tmp().is_dir());
        drop(scope);
        assert!(!dir.exists());
    }

    #[test]
    fn refuses_bad_paths_before_writing_any() {
        let root = tempfile::tempdir().unwrap();
        let scope = RunScope::create(root.path(), None).unwrap();
        for bad in ["/etc/x", "../x", "a/../../x", "a//b", ""] {
            let err = scope
                .write_files(&[file("first", "1"), file(bad, "2")])
                .unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        assert!(!scope.dir().join("first").exists());
    }

    #[test]
    fn refuses_writing_through_a_symlink() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let scope = RunScope::create(root.path(), None).unwrap();
        std::os::unix::fs::symlink(outside.path(), scope.dir().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("f"), scope.dir().join("leaf")).unwrap();
        assert!(scope.write_files(&[file("link/x", "1")]).is_err());
        assert!(scope.write_files(&[file("leaf", "1")]).is_err());
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[test]
    fn artifacts_inside_links_ok_outside_refused() {
        let root = tempfile::tempdir().unwrap();
        let scope = RunScope::create(root.path(), None).unwrap();
        scope.write_files(&[file("real.txt", "data")]).unwrap();
        std::os::unix::fs::symlink("real.txt", scope.dir().join("inner")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", scope.dir().join("outer")).unwrap();
        std::os::unix::fs::symlink("/nonexistent/x", scope.dir().join("dangling")).unwrap();
        let got = scope
            .collect(&["inner".into(), "missing".into()], 100)
            .unwrap();
        assert_eq!(got.artifacts.len(), 1);
        assert_eq!(got.artifacts[0].content, b"data");
        assert!(scope
            .collect(&["outer".into()], 100)
            .unwrap_err()
            .contains("outer"));
        assert!(scope
            .collect(&["dangling".into()], 100)
            .unwrap_err()
            .contains("dangling"));
        fs::hard_link(scope.dir().join("real.txt"), scope.dir().join("hard")).unwrap();
        assert!(scope.collect(&["hard".into()], 100).is_err());
    }

    #[test]
    fn artifact_cap_drops_what_does_not_fit() {
        let root = tempfile::tempdir().unwrap();
        let scope = RunScope::create(root.path(), None).unwrap();
        scope
            .write_files(&[file("a", "1234"), file("b", "123456"), file("c", "12")])
            .unwrap();
        let got = scope
            .collect(&["a".into(), "b".into(), "c".into()], 7)
            .unwrap();
        assert!(got.truncated);
        let names: Vec<_> = got.artifacts.iter().map(|a| a.path.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
    }

    #[tokio::test]
    async fn a_clean_sweep_spares_the_last_one_until_a_program_starts() {
        let root = tempfile::tempdir().unwrap();
        let scope = RunScope::create(root.path(), None).unwrap();
        assert!(scope.kill_all().await);
        // Nothing started since the clean sweep: ending does not look at /proc again.
        let ended = scope.end_measured(false).await;
        assert_eq!(ended.sweeps, 1);

        let scope = RunScope::create(root.path(), None).unwrap();
        assert!(scope.kill_all().await);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        scope.add_group(child.id() as i32);
        child.wait().unwrap();
        // A program started after the clean sweep: the end sweeps again.
        assert_eq!(scope.end_measured(false).await.sweeps, 2);
    }

    #[test]
    fn removes_a_tree_without_permissions() {
        let root = tempfile::tempdir().unwrap();
        let scope = RunScope::create(root.path(), None).unwrap();
        let dir = scope.dir().to_path_buf();
        scope.write_files(&[file("locked/f", "x")]).unwrap();
        fs::set_permissions(dir.join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
        drop(scope);
        assert!(!dir.exists());
    }
}
