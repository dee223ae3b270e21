//! One sandbox, from launch to removal: its run directory, its host user, the `bwrap`
//! process, the wait for sandboxd's socket, the one channel to sandboxd, and the kill that
//! ends it.
//!
//! The run directory `R` is plimsolld's: the sandbox sees it read-only at `/run/plimsoll`
//! (the token file until sandboxd has read it, and for a granted run the broker relay's
//! socket and clients, written by plimsolld where the code can plant nothing). Only `R/s`
//! is writable inside, for sandboxd's socket; when plimsolld is root it takes `R/s` back
//! (owner root, mode 0755) as soon as sandboxd listens. plimsolld connects once, before any
//! code runs, and never dials that socket again ([`SandboxdClient::connect_unix_once`]).
//!
//! Ending a sandbox is exact: SIGKILL to the outer `bwrap` makes the kernel kill its init
//! (`--die-with-parent`), and when a PID namespace's init dies the kernel kills every other
//! process in it; [`Sandbox::end`] returns only once that init is gone, so no process of
//! the run outlives it, however it forked or detached.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plimsoll_log::fds::StdioOnly;
use plimsoll_sandboxd::{SandboxdClient, Token};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::cgroup::SandboxCgroup;
use crate::command::{self, Spec, SOCKET_DIR, SOCKET_NAME, TOKEN_NAME};

/// Time a new sandbox is given to start sandboxd and bind its socket.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Time the end of a sandbox waits for its PID namespace's init to be gone.
pub const END_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes kept of what bwrap and sandboxd write to standard error (the end is kept).
const LOG_TAIL: usize = 4096;
pub use plimsoll_provider::users::{Slot, Users, USER_RANGE};

/// What a launch needs besides the command line.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The bwrap binary.
    pub bwrap: PathBuf,
    /// The host's system entries as the sandbox sees them (read once, at startup).
    pub system: Vec<command::SystemEntry>,
    /// util-linux's `setpriv`, which starts bwrap with a parent-death signal of its own
    /// (SIGKILL when plimsolld's thread that started it is gone), or `None` without it.
    pub setpriv: Option<PathBuf>,
    /// The seccomp filter file (handed to bwrap as its standard input).
    pub seccomp: PathBuf,
    /// The host users sandboxes run as (`None`: plimsolld's own user).
    pub users: Option<Users>,
    /// The delegated cgroup and the limits each sandbox gets there (`None`: no memory or
    /// CPU limit).
    pub cgroup: Option<(crate::cgroup::Delegated, crate::cgroup::Limits)>,
}

/// A launched sandbox whose sandboxd is listening.
pub struct Sandbox {
    child: Child,
    /// The outer bwrap's host pid.
    pid: u32,
    /// The PID namespace's init (sandboxd, `--as-pid-1`): host pid and start time.
    init: Option<(u32, u64)>,
    dir: PathBuf,
    client: SandboxdClient,
    log: Arc<Mutex<Vec<u8>>>,
    cgroup: Option<SandboxCgroup>,
    /// The host user and group it runs as.
    ids: (u32, u32),
    _slot: Option<Slot>,
    ended: bool,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("pid", &self.pid)
            .field("dir", &self.dir)
            .field("ids", &self.ids)
            .finish()
    }
}

/// Why a sandbox could not be launched (nothing of a run was sent to it).
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The run directory could not be made.
    #[error("cannot prepare the sandbox directory {dir}: {source}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Every host user of the range is taken by a live sandbox.
    #[error(
        "all {USER_RANGE} host users of SANDBOX_BWRAP_USER's range are taken by live sandboxes"
    )]
    NoUser,
    /// bwrap could not be started.
    #[error("cannot start {bwrap}: {source}")]
    Spawn {
        /// The binary.
        bwrap: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// bwrap or sandboxd ended before sandboxd listened.
    #[error("the sandbox ended before sandboxd listened ({status}){}", tail(.log))]
    Ended {
        /// How it ended.
        status: String,
        /// The end of what it wrote to standard error.
        log: String,
    },
    /// sandboxd did not listen in time.
    #[error("sandboxd did not listen within {READY_TIMEOUT:?}{}", tail(.log))]
    Timeout {
        /// The end of what it wrote to standard error.
        log: String,
    },
    /// sandboxd listened but could not be reached.
    #[error("sandboxd's socket did not accept: {0}")]
    Connect(String),
    /// The sandbox's processes could not be put under its memory and CPU limits.
    #[error("the sandbox's cgroup: {0}")]
    Cgroup(String),
}

fn tail(log: &str) -> String {
    if log.trim().is_empty() {
        String::new()
    } else {
        format!(": {}", log.trim())
    }
}

fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 8]>())
}

/// A launch that has not succeeded yet: what it made, undone on drop (an error, or the
/// launch cancelled), unless [`Partial::keep`] hands it over.
struct Partial {
    dir: PathBuf,
    child: Option<Child>,
}

impl Partial {
    fn keep(mut self) -> (PathBuf, Child) {
        let child = self.child.take().expect("a spawned child");
        (std::mem::take(&mut self.dir), child)
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            if let Some(pid) = c.id() {
                kill_launch(pid);
            }
            let _ = c.start_kill();
        }
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Kills a launch's bwrap and what it cloned. bwrap's clone waits for bwrap to write its
/// user mapping before it sets its own parent-death signal: killed in that window, bwrap
/// would leave the clone (the new PID namespace's init) blocked forever. So bwrap is stopped
/// first (a stopped process clones nothing), its children are killed, then bwrap.
fn kill_launch(pid: u32) {
    use nix::sys::signal::{kill, Signal};
    let raw = nix::unistd::Pid::from_raw(pid as i32);
    let _ = kill(raw, Signal::SIGSTOP);
    for (child, _) in descendants(pid) {
        let _ = kill(nix::unistd::Pid::from_raw(child as i32), Signal::SIGKILL);
    }
    let _ = kill(raw, Signal::SIGKILL);
}

impl Sandbox {
    /// Launches a sandbox in a new run directory below `parent` and waits until its
    /// sandboxd listens. On failure (or when the launch is dropped) nothing is left: the
    /// process is killed, the directory removed.
    pub async fn launch(l: &Launch, parent: &Path, spec: Spec) -> Result<Sandbox, LaunchError> {
        let (ids, slot) = match &l.users {
            None => (
                (
                    nix::unistd::geteuid().as_raw(),
                    nix::unistd::getegid().as_raw(),
                ),
                None,
            ),
            Some(u) => {
                let slot = u.take().ok_or(LaunchError::NoUser)?;
                (slot.ids(), Some(slot))
            }
        };
        let dir = parent.join(random_hex());
        let token = Token::new(random_hex()).map_err(|e| LaunchError::Dir {
            dir: dir.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let mut partial = Partial {
            dir: dir.clone(),
            child: None,
        };
        let run_as = l.users.as_ref().map(|_| ids);
        prepare_dir(&dir, &token, run_as).map_err(|source| LaunchError::Dir {
            dir: dir.clone(),
            source,
        })?;
        let spec = Spec {
            run_dir: dir.clone(),
            ..spec
        };
        let mut cmd = match &l.setpriv {
            Some(setpriv) => {
                let mut c = Command::new(setpriv);
                c.args(["--pdeathsig", "KILL", "--"]).arg(&l.bwrap);
                c
            }
            None => Command::new(&l.bwrap),
        };
        cmd.args(command::args(&spec, &l.system))
            .env_clear()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some((uid, gid)) = run_as {
            cmd.uid(uid).gid(gid);
        }
        let seccomp = std::fs::File::open(&l.seccomp).map_err(|source| LaunchError::Dir {
            dir: l.seccomp.clone(),
            source,
        })?;
        cmd.stdin(Stdio::from(seccomp));
        // bwrap gets its filter on stdin and nothing above 2, whatever plimsolld inherited
        // (Landlock and the mount namespace do not apply to an open descriptor).
        cmd.as_std_mut().stdio_only();
        let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            bwrap: l.bwrap.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        partial.child = Some(child);
        let log = Arc::new(Mutex::new(Vec::new()));
        if let Some(mut err) = partial.child.as_mut().and_then(|c| c.stderr.take()) {
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 2048];
                while let Ok(n) = err.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
                    l.extend_from_slice(&buf[..n]);
                    if l.len() > LOG_TAIL {
                        let cut = l.len() - LOG_TAIL;
                        l.drain(..cut);
                    }
                }
            });
        }
        let child = partial.child.as_mut().expect("spawned");
        let client = wait_ready(child, &dir, &token, run_as.is_some(), &log).await?;
        let tree = descendants(pid);
        let init = tree
            .iter()
            .find(|(_, parent)| *parent == pid)
            .and_then(|(p, _)| start_time(*p).map(|t| (*p, t)));
        // Under the limits before any call is sent: nothing of a run starts outside them.
        let cgroup = match &l.cgroup {
            None => None,
            Some((delegated, limits)) => {
                let id = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let cg = delegated
                    .sandbox(&id, limits)
                    .map_err(LaunchError::Cgroup)?;
                let pids: Vec<u32> = std::iter::once(pid)
                    .chain(tree.iter().map(|(p, _)| *p))
                    .collect();
                if pid == 0 || init.is_none() {
                    cg.remove();
                    return Err(LaunchError::Cgroup(
                        "the sandbox's processes could not be found".into(),
                    ));
                }
                if let Err(e) = cg.adopt(&pids) {
                    // Killed first: the cgroup can only go once it is empty.
                    drop(partial);
                    tokio::task::spawn_blocking(move || cg.remove());
                    return Err(LaunchError::Cgroup(e));
                }
                Some(cg)
            }
        };
        let (dir, child) = partial.keep();
        Ok(Sandbox {
            child,
            pid,
            init,
            dir,
            client,
            log,
            cgroup,
            ids,
            _slot: slot,
            ended: false,
        })
    }

    /// The channel to this sandbox's sandboxd.
    pub fn client(&self) -> &SandboxdClient {
        &self.client
    }

    /// The host run directory (seen inside, read-only, at [`command::CHANNEL_DIR`]).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The outer bwrap's host pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The host user and group the sandbox runs as.
    pub fn ids(&self) -> (u32, u32) {
        self.ids
    }

    /// Whether the sandbox is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The end of what bwrap and sandboxd wrote to standard error.
    pub fn log(&self) -> String {
        log_text(&self.log)
    }

    /// `/proc/<pid>/status` of every process of the sandbox, as the host sees them.
    pub fn host_status(&self) -> Vec<String> {
        std::iter::once(self.pid)
            .chain(descendants(self.pid).into_iter().map(|(p, _)| p))
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
            .collect()
    }

    /// Kills every process of the sandbox, returns once its PID namespace's init is gone
    /// (so every process of it is), and removes its run directory and its cgroup.
    pub async fn end(mut self) {
        self.ended = true;
        let _ = self.child.start_kill();
        self.kill_init();
        let _ = self.child.wait().await;
        if let Some((pid, started)) = self.init {
            let deadline = Instant::now() + END_TIMEOUT;
            while alive_since(pid, started) {
                if Instant::now() > deadline {
                    tracing::error!(pid, "a sandbox's PID namespace did not end in time");
                    break;
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(cg) = self.cgroup.take() {
            tokio::task::spawn_blocking(move || cg.remove());
        }
    }
}

impl Drop for Sandbox {
    /// A sandbox dropped without [`Sandbox::end`] (a cancelled run, the pool at exit): killed
    /// now, its directory removed, its cgroup removed once empty.
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let _ = self.child.start_kill();
        self.kill_init();
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(cg) = self.cgroup.take() {
            std::thread::spawn(move || cg.remove());
        }
    }
}

impl Sandbox {
    /// SIGKILL to the PID namespace's init itself (still the process recorded at launch),
    /// besides the parent-death signal bwrap arranges: its death ends every process of the
    /// namespace.
    fn kill_init(&self) {
        if let Some((pid, started)) = self.init {
            if alive_since(pid, started) {
                if let Ok(p) = i32::try_from(pid) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
        }
    }
}

fn log_text(log: &Mutex<Vec<u8>>) -> String {
    String::from_utf8_lossy(&log.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

/// Fields 4 (parent pid) and 22 (start time) of `/proc/<pid>/stat`, after the command
/// name (which may hold spaces and parentheses).
fn stat_fields(pid: u32) -> Option<(u32, u64, char)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f.first()?.chars().next()?;
    Some((f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?, state))
}

fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid).map(|(_, t, _)| t)
}

/// Whether `pid` is still the process that started at `started` and has not exited.
fn alive_since(pid: u32, started: u64) -> bool {
    matches!(stat_fields(pid), Some((_, t, state)) if t == started && state != 'Z' && state != 'X')
}

/// The children of `p`, from `/proc/<p>/task/*/children`; `None` where the kernel has no
/// such file (`CONFIG_PROC_CHILDREN` off).
fn children(p: u32) -> Option<Vec<u32>> {
    let tasks = std::fs::read_dir(format!("/proc/{p}/task")).ok()?;
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let c = std::fs::read_to_string(t.path().join("children")).ok()?;
        out.extend(c.split_whitespace().filter_map(|n| n.parse::<u32>().ok()));
    }
    Some(out)
}

/// Every descendant of `pid` with its parent: from the `children` files where the kernel
/// has them (a few reads), else from the parent pids in every `/proc/*/stat`.
pub fn descendants(pid: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        let Some(kids) = children(p) else {
            return descendants_by_scan(pid);
        };
        for c in kids {
            out.push((c, p));
            queue.push(c);
        }
    }
    out
}

fn descendants_by_scan(pid: u32) -> Vec<(u32, u32)> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if let Some((parent, _, _)) = stat_fields(p) {
                children.entry(parent).or_default().push(p);
            }
        }
    }
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for c in children.get(&p).into_iter().flatten() {
            out.push((*c, p));
            queue.push(*c);
        }
    }
    out
}

/// The run directory `R` (plimsolld's, mode 0711; read-only inside) with the token file
/// (the sandbox user's, 0400) and `R/s` (the sandbox user's, 0700) for sandboxd's socket.
fn prepare_dir(dir: &Path, token: &Token, run_as: Option<(u32, u32)>) -> std::io::Result<()> {
    std::fs::DirBuilder::new().mode(0o711).create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    let tf = dir.join(TOKEN_NAME);
    std::fs::write(&tf, format!("{}\n", token.expose()))?;
    std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o400))?;
    let sock_dir = dir.join(SOCKET_DIR);
    std::fs::DirBuilder::new().mode(0o700).create(&sock_dir)?;
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(&tf, Some(uid), Some(gid))?;
        std::os::unix::fs::chown(&sock_dir, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Waits for sandboxd's socket, deletes the token file (sandboxd read it before it bound
/// the socket), takes the socket's directory back when plimsolld is root, and connects once.
async fn wait_ready(
    child: &mut Child,
    dir: &Path,
    token: &Token,
    take_back: bool,
    log: &Mutex<Vec<u8>>,
) -> Result<SandboxdClient, LaunchError> {
    let sock_dir = dir.join(SOCKET_DIR);
    let sock = sock_dir.join(SOCKET_NAME);
    let start = Instant::now();
    let mut pause = Duration::from_micros(200);
    loop {
        if std::fs::symlink_metadata(&sock).is_ok() {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Let the stderr reader catch the last words.
            tokio::time::sleep(Duration::from_millis(20)).await;
            return Err(LaunchError::Ended {
                status: status.to_string(),
                log: log_text(log),
            });
        }
        if start.elapsed() > READY_TIMEOUT {
            return Err(LaunchError::Timeout { log: log_text(log) });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(5));
    }
    let _ = std::fs::remove_file(dir.join(TOKEN_NAME));
    if take_back {
        let taken = std::os::unix::fs::chown(&sock_dir, Some(0), Some(0)).and_then(|()| {
            std::fs::set_permissions(&sock_dir, std::fs::Permissions::from_mode(0o755))
        });
        if let Err(e) = taken {
            return Err(LaunchError::Dir {
                dir: sock_dir,
                source: e,
            });
        }
    }
    let mut tries = 0;
    loop {
        match SandboxdClient::connect_unix_once(&sock, token).await {
            Ok(c) => return Ok(c),
            // The socket exists a moment before it accepts.
            Err(_) if tries < 100 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err(e) => return Err(LaunchError::Connect(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_and_its_descendants_are_found_by_parent_pid() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5; wait"])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let tree = descendants(child.id());
        assert_eq!(tree.len(), 2, "{tree:?}");
        assert!(tree.iter().all(|(_, parent)| *parent == child.id()));
        let mut scanned = descendants_by_scan(child.id());
        let mut found = tree.clone();
        scanned.sort_unstable();
        found.sort_unstable();
        assert_eq!(scanned, found);
        let t = start_time(child.id()).unwrap();
        assert!(alive_since(child.id(), t));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!alive_since(child.id(), t));
        for (p, _) in tree {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
