//! The one place that starts a program: clean environment, own process group, capped and
//! drained output, the deadline on the monotonic clock.

use std::process::Stdio;
use std::time::Duration;

use plimsoll_log::fds::StdioOnly;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::env::program_env;
use crate::scope::RunScope;
use crate::{tree, RunEnv, RunnerError};

/// How long output is still read after a program's main process ended (or was killed),
/// since a background child may hold its pipes open.
pub const OUTPUT_GRACE: Duration = Duration::from_millis(100);

/// The exit code reported for a program stopped at the deadline.
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// What to start.
pub(crate) struct Program<'a> {
    pub path: &'static str,
    pub args: &'a [&'a str],
    pub stdin: Option<Vec<u8>>,
}

/// What one program did.
#[derive(Debug)]
pub(crate) struct Ran {
    pub exit_code: i32,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration: Duration,
}

/// Runs one program in the scope's working directory until it exits or `deadline`
/// passes; at the deadline its process group and every process of the run are killed.
pub(crate) async fn run(
    scope: &RunScope,
    prog: Program<'_>,
    deadline: Instant,
    output_cap: usize,
    extra_env: &RunEnv,
) -> Result<Ran, RunnerError> {
    let mut cmd = Command::new(prog.path);
    cmd.args(prog.args)
        .current_dir(scope.dir())
        .env_clear()
        .envs(program_env(
            scope.dir(),
            scope.tmp(),
            scope.tag(),
            extra_env,
        ))
        .stdin(if prog.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // The program gets 0, 1 and 2 alone, whatever the runner's process inherited.
    cmd.as_std_mut().stdio_only();
    if let Some(who) = scope.run_as() {
        // std drops the supplementary groups too when the runner is root.
        cmd.uid(who.uid).gid(who.gid);
    }
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|source| RunnerError::Spawn {
        program: prog.path.to_owned(),
        source,
    })?;
    // The leader's pid is also its process group id (process_group(0)).
    let pgid = child.id().map(|p| p as i32);
    if let Some(g) = pgid {
        scope.add_group(g);
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let stdout = child.stdout.take().map(|r| {
        let rx = stop_rx.clone();
        tokio::spawn(read_capped(r, output_cap, rx))
    });
    let stderr = child.stderr.take().map(|r| {
        let rx = stop_rx.clone();
        tokio::spawn(read_capped(r, output_cap, rx))
    });
    let feeder = match (child.stdin.take(), prog.stdin) {
        (Some(mut w), Some(data)) => Some(tokio::spawn(async move {
            // A program that stops reading early closes the pipe: not an error of the run.
            let _ = w.write_all(&data).await;
            let _ = w.shutdown().await;
        })),
        _ => None,
    };

    let waited = tokio::select! {
        s = child.wait() => Some(s),
        _ = tokio::time::sleep_until(deadline) => None,
    };
    let (status, timed_out) = match waited {
        Some(s) => (s, false),
        None => {
            // The leader is not reaped yet, so its group id is still this run's.
            if let Some(g) = pgid {
                tree::kill_group(g);
            }
            scope.kill_all().await;
            (child.wait().await, true)
        }
    };
    let duration = started.elapsed();
    if let Some(f) = feeder {
        f.abort();
    }

    // Output: until both pipes close, or the grace ends (a background child holds them).
    let collect = async {
        let out = match stdout {
            Some(h) => h.await.unwrap_or_default(),
            None => Default::default(),
        };
        let err = match stderr {
            Some(h) => h.await.unwrap_or_default(),
            None => Default::default(),
        };
        (out, err)
    };
    tokio::pin!(collect);
    let ((stdout, stdout_truncated), (stderr, stderr_truncated)) =
        match tokio::time::timeout(OUTPUT_GRACE, &mut collect).await {
            Ok(v) => v,
            Err(_) => {
                let _ = stop_tx.send(true);
                collect.await
            }
        };

    let exit_code = if timed_out {
        TIMEOUT_EXIT_CODE
    } else {
        match status {
            Ok(s) => exit_code_of(s),
            Err(source) => {
                return Err(RunnerError::Wait {
                    program: prog.path.to_owned(),
                    source,
                })
            }
        }
    };
    Ok(Ran {
        exit_code,
        timed_out,
        stdout,
        stderr,
        stdout_truncated,
        stderr_truncated,
        duration,
    })
}

/// The exit code, or 128 + the signal number for a program killed by a signal (as shells
/// report it).
pub(crate) fn exit_code_of(s: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => -1,
    }
}

/// Reads a stream to its end (or until told to stop), keeping the first `cap` bytes and
/// reading on past them so the writer never blocks.
async fn read_capped<R: AsyncRead + Unpin>(
    mut r: R,
    cap: usize,
    mut stop: watch::Receiver<bool>,
) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => break,
            n = r.read(&mut chunk) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = cap.saturating_sub(kept.len());
                    if n > room {
                        truncated = true;
                    }
                    kept.extend_from_slice(&chunk[..n.min(room)]);
                }
            },
        }
    }
    (kept, truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn capped_reader_keeps_the_head_and_drains() {
        let data = vec![7u8; 300_000];
        let (_tx, rx) = watch::channel(false);
        let (kept, truncated) = read_capped(&data[..], 1000, rx).await;
        assert_eq!(kept.len(), 1000);
        assert!(truncated);
        let (_tx, rx) = watch::channel(false);
        let (kept, truncated) = read_capped(&data[..10], 1000, rx).await;
        assert_eq!(kept.len(), 10);
        assert!(!truncated);
    }

    #[tokio::test]
    async fn exactly_the_cap_is_not_truncated() {
        let data = vec![1u8; 1000];
        let (_tx, rx) = watch::channel(false);
        let (kept, truncated) = read_capped(&data[..], 1000, rx).await;
        assert_eq!(kept.len(), 1000);
        assert!(!truncated);
    }
}
