//! One sandbox, from launch to removal: its run directory (token, sandboxd's socket, the
//! grant relay's socket), the `bwrap` process, the wait for sandboxd's socket, the channel
//! to sandboxd, and the kill that ends it.
//!
//! Ending a sandbox is exact: SIGKILL to the outer `bwrap` makes the kernel kill its init
//! (`--die-with-parent`), and when a PID namespace's init dies the kernel kills every other
//! process in it; no process of the run can outlive that, however it forked or detached.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use plimsoll_sandboxd::{SandboxdClient, Token};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::cgroup::SandboxCgroup;
use crate::command::{self, Spec, SOCKET_NAME, TOKEN_NAME};

/// Time a new sandbox is given to start sandboxd and bind its socket.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes kept of what bwrap and sandboxd write to standard error (the end is kept).
const LOG_TAIL: usize = 4096;

/// What a launch needs besides the command line.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The bwrap binary.
    pub bwrap: PathBuf,
    /// The seccomp filter file (handed to bwrap as its standard input).
    pub seccomp: PathBuf,
    /// The host user and group the sandbox runs as (`None`: plimsolld's own).
    pub run_as: Option<(u32, u32)>,
    /// The delegated cgroup and the limits each sandbox gets there (`None`: no memory or
    /// CPU limit).
    pub cgroup: Option<(crate::cgroup::Delegated, crate::cgroup::Limits)>,
}

/// A launched sandbox whose sandboxd is listening.
pub struct Sandbox {
    child: Child,
    /// The outer bwrap's host pid.
    pid: u32,
    dir: PathBuf,
    client: SandboxdClient,
    log: Arc<Mutex<Vec<u8>>>,
    cgroup: Option<SandboxCgroup>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("pid", &self.pid)
            .field("dir", &self.dir)
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

impl Sandbox {
    /// Launches a sandbox in a new run directory below `parent` and waits until its
    /// sandboxd listens. On failure nothing is left: the process is killed, the directory
    /// removed.
    pub async fn launch(l: &Launch, parent: &Path, spec: Spec) -> Result<Sandbox, LaunchError> {
        let dir = parent.join(random_hex());
        let token = Token::new(random_hex()).map_err(|e| LaunchError::Dir {
            dir: dir.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        if let Err(source) = prepare_dir(&dir, &token, l.run_as) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(LaunchError::Dir { dir, source });
        }
        let spec = Spec {
            run_dir: dir.clone(),
            ..spec
        };
        let system = command::system_entries(Path::new("/"));
        let mut cmd = Command::new(&l.bwrap);
        cmd.args(command::args(&spec, &system))
            .env_clear()
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some((uid, gid)) = l.run_as {
            cmd.uid(uid).gid(gid);
        }
        let seccomp = std::fs::File::open(&l.seccomp).map_err(|source| LaunchError::Dir {
            dir: l.seccomp.clone(),
            source,
        });
        let seccomp = match seccomp {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        cmd.stdin(Stdio::from(seccomp));
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(source) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(LaunchError::Spawn {
                    bwrap: l.bwrap.clone(),
                    source,
                });
            }
        };
        let pid = child.id().unwrap_or(0);
        let log = Arc::new(Mutex::new(Vec::new()));
        if let Some(mut err) = child.stderr.take() {
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
        let ready = wait_ready(&mut child, &dir, &token, &log).await;
        let client = match ready {
            Ok(client) => client,
            Err(e) => {
                end(&mut child, &dir, None).await;
                return Err(e);
            }
        };
        // Under the limits before any call is sent: nothing of a run starts outside them.
        let cgroup = match &l.cgroup {
            None => None,
            Some((delegated, limits)) => {
                let id = dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                match delegated.sandbox(&id, limits) {
                    Ok(cg) => {
                        let moved = cg.adopt(&descendants(pid));
                        let cg = Some(cg);
                        if let Err(e) = moved {
                            end(&mut child, &dir, cg).await;
                            return Err(LaunchError::Cgroup(e));
                        }
                        cg
                    }
                    Err(e) => {
                        end(&mut child, &dir, None).await;
                        return Err(LaunchError::Cgroup(e));
                    }
                }
            }
        };
        Ok(Sandbox {
            child,
            pid,
            dir,
            client,
            log,
            cgroup,
        })
    }

    /// The channel to this sandbox's sandboxd.
    pub fn client(&self) -> &SandboxdClient {
        &self.client
    }

    /// The host run directory (seen inside at [`command::CHANNEL_DIR`]).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The outer bwrap's host pid.
    pub fn pid(&self) -> u32 {
        self.pid
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
        descendants(self.pid)
            .into_iter()
            .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
            .collect()
    }

    /// Kills every process of the sandbox and removes its run directory (and its cgroup,
    /// once empty, in the background).
    pub async fn end(mut self) {
        let cg = self.cgroup.take();
        end(&mut self.child, &self.dir, cg).await;
    }
}

fn log_text(log: &Mutex<Vec<u8>>) -> String {
    String::from_utf8_lossy(&log.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

/// Every descendant of `pid` (itself included), from `/proc/<pid>/task/*/children`.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() && out.len() < 100_000 {
        let p = out[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                    out.extend(c.split_whitespace().filter_map(|n| n.parse::<u32>().ok()));
                }
            }
        }
        i += 1;
    }
    out
}

async fn end(child: &mut Child, dir: &Path, cgroup: Option<SandboxCgroup>) {
    let _ = child.start_kill();
    let _ = child.wait().await;
    let _ = std::fs::remove_dir_all(dir);
    if let Some(cg) = cgroup {
        // The namespace's last processes die a moment after bwrap: wait for them off the
        // async threads.
        tokio::task::spawn_blocking(move || cg.remove());
    }
}

/// The run directory: private to the sandbox's host user, with the token file in it.
fn prepare_dir(dir: &Path, token: &Token, run_as: Option<(u32, u32)>) -> std::io::Result<()> {
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    let tf = dir.join(TOKEN_NAME);
    std::fs::write(&tf, format!("{}\n", token.expose()))?;
    std::fs::set_permissions(&tf, std::fs::Permissions::from_mode(0o600))?;
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
        std::os::unix::fs::chown(&tf, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// Waits for sandboxd's socket, deletes the token file (sandboxd read it before it bound
/// the socket), and connects.
async fn wait_ready(
    child: &mut Child,
    dir: &Path,
    token: &Token,
    log: &Mutex<Vec<u8>>,
) -> Result<SandboxdClient, LaunchError> {
    let sock = dir.join(SOCKET_NAME);
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
    let mut tries = 0;
    loop {
        match SandboxdClient::connect_unix(&sock, token).await {
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
