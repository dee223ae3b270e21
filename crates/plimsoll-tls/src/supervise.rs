//! The terminator's child: checks sandboxd's flags, starts sandboxd, waits until it accepts,
//! reaps it (and, as a container's PID 1, every orphan), and stops it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::sync::watch;

/// The two flags sandboxd must be given, literally, so it is never reachable from the pod
/// network and the terminator knows where it is.
pub const REQUIRED_FLAGS: [&str; 2] = ["--listen-host=127.0.0.1", "--grpc-port=9091"];

/// A sandboxd argument list the terminator refuses; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {why}")]
pub struct FlagError {
    /// The flag at fault.
    pub flag: &'static str,
    /// What is wrong.
    pub why: String,
}

/// Refuses sandboxd flags unless they contain `--listen-host=127.0.0.1` and
/// `--grpc-port=9091`, each once, with no other value for either and no `--unix-socket`.
pub fn check_sandboxd_flags(args: &[String]) -> Result<(), FlagError> {
    for (flag, required) in [
        ("--listen-host", REQUIRED_FLAGS[0]),
        ("--grpc-port", REQUIRED_FLAGS[1]),
    ] {
        let mentions: Vec<&String> = args
            .iter()
            .filter(|a| *a == flag || a.starts_with(&format!("{flag}=")))
            .collect();
        match mentions.as_slice() {
            [only] if only.as_str() == required => {}
            [] => {
                return Err(FlagError {
                    flag,
                    why: format!(
                        "sandboxd's flags must include {required} (sandboxd must never be reachable from the pod network)"
                    ),
                })
            }
            [only] => {
                return Err(FlagError {
                    flag,
                    why: format!("must be given exactly as {required}, not {only:?}"),
                })
            }
            _ => {
                return Err(FlagError {
                    flag,
                    why: format!("given {} times; give it once, as {required}", mentions.len()),
                })
            }
        }
    }
    if let Some(a) = args
        .iter()
        .find(|a| *a == "--unix-socket" || a.starts_with("--unix-socket="))
    {
        return Err(FlagError {
            flag: "--unix-socket",
            why: format!("{a:?}: behind the terminator sandboxd serves TCP on 127.0.0.1:9091"),
        });
    }
    if let Some(a) = args.iter().find(|a| {
        *a == TERMINATOR_SOCKET_FLAG || a.starts_with(&format!("{TERMINATOR_SOCKET_FLAG}="))
    }) {
        return Err(FlagError {
            flag: TERMINATOR_SOCKET_FLAG,
            why: format!("{a:?}: the terminator gives sandboxd this flag itself, with a directory of its own, when PLIMSOLL_SANDBOXD_CLIENT_CA is set; remove it"),
        });
    }
    Ok(())
}

/// With mutual TLS the code must run as a user of its own (`--run-as`): the terminator's
/// socket takes calls from sandboxd's own user without a token.
pub fn check_run_as_for_client_ca(args: &[String]) -> Result<(), FlagError> {
    if args
        .iter()
        .any(|a| a.starts_with("--run-as=") || a == "--run-as")
    {
        return Ok(());
    }
    Err(FlagError {
        flag: "--run-as",
        why: format!(
            "{} (mutual TLS) needs sandboxd's --run-as=UID:GID: the code must run as a user of its own, because sandboxd's own user may call it through the terminator's socket without a token",
            crate::client_auth::CLIENT_CA_VAR
        ),
    })
}

/// sandboxd's flag for the terminator's private socket (calls through it need no token).
pub const TERMINATOR_SOCKET_FLAG: &str = "--terminator-socket";

/// A fresh directory for the terminator's socket: created here with mode 0700 (never an
/// existing one), inside `parent`. Returns the socket's path in it.
pub fn private_socket_dir(parent: &Path) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let mut last = None;
    for _ in 0..8 {
        let mut name = [0u8; 6];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut name)
            .map_err(|_| std::io::Error::other("no random bytes"))?;
        let dir = parent.join(format!("plimsoll-tls-{}", hex::encode(name)));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir.join("sandboxd.sock")),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no directory")))
}

/// The flags sandboxd is started with when tests move it to another loopback address
/// (`PLIMSOLL_SANDBOXD_TLS_UPSTREAM`): the two required flags are replaced, the rest kept.
pub fn flags_for_upstream(args: &[String], upstream: SocketAddr) -> Vec<String> {
    args.iter()
        .map(|a| {
            if a == REQUIRED_FLAGS[0] {
                format!("--listen-host={}", upstream.ip())
            } else if a == REQUIRED_FLAGS[1] {
                format!("--grpc-port={}", upstream.port())
            } else {
                a.clone()
            }
        })
        .collect()
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

impl Exit {
    /// The exit code a shell would report: the code, or 128 + the signal number.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => match Signal::try_from(*s) {
                Ok(sig) => write!(f, "signal {sig}"),
                Err(_) => write!(f, "signal {s}"),
            },
        }
    }
}

/// Why sandboxd did not become ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotReady {
    /// It exited first.
    #[error("sandboxd exited before accepting connections ({0})")]
    Exited(Exit),
    /// It did not accept within the bound.
    #[error("sandboxd did not accept connections on {addr} within {after:?}")]
    Timeout {
        /// Where it was expected.
        addr: SocketAddr,
        /// The bound.
        after: Duration,
    },
}

/// The variable that names the terminator to sandboxd, which then asks the kernel to kill it
/// when the terminator dies (even by SIGKILL) and refuses to start if it already has.
pub const PARENT_PID_VAR: &str = "PLIMSOLL_SANDBOXD_PARENT_PID";

/// A running sandboxd child.
#[derive(Debug)]
pub struct Sandboxd {
    pid: Pid,
    exit: watch::Receiver<Option<Exit>>,
}

impl Sandboxd {
    /// Starts `bin` with `args` (stdin closed, stdout and stderr shared, [`PARENT_PID_VAR`] set
    /// to this process) and a reaper that collects it and any orphan the terminator inherits
    /// as PID 1. Must run inside a tokio runtime.
    ///
    /// The kernel's parent-death signal belongs to the thread that forked the child, so call
    /// this from a thread that lives as long as the process (the terminator's one-thread
    /// runtime runs on its main thread).
    pub fn spawn(bin: &Path, args: &[String]) -> std::io::Result<Sandboxd> {
        // Listen for SIGCHLD before the child exists, so its exit cannot be missed.
        let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        // std, not tokio::process: the reaper below owns waiting, and tokio's own child
        // handling must not race it for the status.
        // sandboxd gets 0, 1 and 2 alone, whatever the terminator inherited.
        let child = plimsoll_log::fds::StdioOnly::stdio_only(&mut std::process::Command::new(bin))
            .args(args)
            .env(PARENT_PID_VAR, std::process::id().to_string())
            .stdin(std::process::Stdio::null())
            .spawn()?;
        let pid = Pid::from_raw(child.id() as i32);
        drop(child);
        let (tx, rx) = watch::channel(None);
        // As a container's PID 1 the terminator inherits every orphan and must reap them all;
        // otherwise it waits for its own child only (other children belong to others).
        let target = if std::process::id() == 1 {
            Pid::from_raw(-1)
        } else {
            pid
        };
        tokio::spawn(async move {
            loop {
                loop {
                    match waitpid(target, Some(WaitPidFlag::WNOHANG)) {
                        Ok(WaitStatus::Exited(p, code)) if p == pid => {
                            let _ = tx.send(Some(Exit::Code(code)));
                        }
                        Ok(WaitStatus::Signaled(p, sig, _)) if p == pid => {
                            let _ = tx.send(Some(Exit::Signal(sig as i32)));
                        }
                        Ok(WaitStatus::StillAlive) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                tokio::select! {
                    _ = sigchld.recv() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
        Ok(Sandboxd { pid, exit: rx })
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// How it ended, if it has.
    pub fn try_exit(&self) -> Option<Exit> {
        *self.exit.borrow()
    }

    /// Resolves when it has exited.
    pub async fn exited(&self) -> Exit {
        let mut rx = self.exit.clone();
        loop {
            if let Some(e) = *rx.borrow_and_update() {
                return e;
            }
            if rx.changed().await.is_err() {
                // The reaper never stops while the runtime lives; treat as killed.
                return Exit::Signal(Signal::SIGKILL as i32);
            }
        }
    }

    /// Waits until `addr` accepts a TCP connection, sandboxd exits, or `timeout` passes.
    pub async fn wait_ready(&self, addr: SocketAddr, timeout: Duration) -> Result<(), NotReady> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_exit() {
                return Err(NotReady::Exited(e));
            }
            let attempt =
                tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr));
            if let Ok(Ok(_probe)) = attempt.await {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(NotReady::Timeout {
                    addr,
                    after: timeout,
                });
            }
            tokio::select! {
                e = self.exited() => return Err(NotReady::Exited(e)),
                _ = tokio::time::sleep(Duration::from_millis(25)) => {}
            }
        }
    }

    /// Sends SIGTERM without waiting (sandboxd then refuses new calls and finishes those in
    /// flight, closing its connections).
    pub fn terminate(&self) {
        if self.try_exit().is_none() {
            let _ = kill(self.pid, Signal::SIGTERM);
        }
    }

    /// Sends SIGTERM, waits up to `grace`, then SIGKILL; returns how it ended.
    pub async fn stop(&self, grace: Duration) -> Exit {
        if let Some(e) = self.try_exit() {
            return e;
        }
        let _ = kill(self.pid, Signal::SIGTERM);
        match tokio::time::timeout(grace, self.exited()).await {
            Ok(e) => e,
            Err(_) => {
                tracing::warn!(
                    "sandboxd did not stop within {grace:?} of SIGTERM; sending SIGKILL"
                );
                let _ = kill(self.pid, Signal::SIGKILL);
                self.exited().await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn required_flags_pass() {
        check_sandboxd_flags(&v(&[
            "--listen-host=127.0.0.1",
            "--grpc-port=9091",
            "--root-dir=/tmp/x",
            "--token-file",
            "/t",
        ]))
        .unwrap();
    }

    #[test]
    fn wrong_flags_name_the_flag() {
        let cases: [(&[&str], &str); 7] = [
            (&["--grpc-port=9091"], "--listen-host"),
            (&["--listen-host=127.0.0.1"], "--grpc-port"),
            (
                &["--listen-host=0.0.0.0", "--grpc-port=9091"],
                "--listen-host",
            ),
            (
                &["--listen-host", "127.0.0.1", "--grpc-port=9091"],
                "--listen-host",
            ),
            (
                &[
                    "--listen-host=127.0.0.1",
                    "--listen-host=0.0.0.0",
                    "--grpc-port=9091",
                ],
                "--listen-host",
            ),
            (
                &["--listen-host=127.0.0.1", "--grpc-port=9090"],
                "--grpc-port",
            ),
            (
                &[
                    "--listen-host=127.0.0.1",
                    "--grpc-port=9091",
                    "--unix-socket=/s",
                ],
                "--unix-socket",
            ),
        ];
        for (args, flag) in cases {
            let e = check_sandboxd_flags(&v(args)).unwrap_err();
            assert_eq!(e.flag, flag, "{args:?}");
            assert!(e.to_string().starts_with(flag));
        }
    }

    #[test]
    fn upstream_rewrite_replaces_only_the_two_flags() {
        let out = flags_for_upstream(
            &v(&["--listen-host=127.0.0.1", "--x", "--grpc-port=9091"]),
            "127.0.0.7:4000".parse().unwrap(),
        );
        assert_eq!(
            out,
            v(&["--listen-host=127.0.0.7", "--x", "--grpc-port=4000"])
        );
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(Exit::Code(3).code(), 3);
        assert_eq!(Exit::Signal(9).code(), 137);
    }

    #[tokio::test]
    async fn a_child_that_exits_is_reaped_with_its_status() {
        let sd = Sandboxd::spawn(Path::new("/bin/sh"), &v(&["-c", "exit 7"])).unwrap();
        assert_eq!(sd.exited().await, Exit::Code(7));
        let r = sd
            .wait_ready("127.0.0.1:1".parse().unwrap(), Duration::from_secs(5))
            .await;
        assert_eq!(r, Err(NotReady::Exited(Exit::Code(7))));
    }

    #[tokio::test]
    async fn stop_terminates_a_running_child() {
        let sd = Sandboxd::spawn(Path::new("/bin/sh"), &v(&["-c", "exec sleep 600"])).unwrap();
        assert_eq!(sd.try_exit(), None);
        let e = sd.stop(Duration::from_secs(10)).await;
        assert_eq!(e, Exit::Signal(Signal::SIGTERM as i32));
    }
}
