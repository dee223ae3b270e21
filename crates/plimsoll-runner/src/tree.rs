//! Finding and killing every process of a run: its process groups, every process that
//! carries the run's tag in its environment, every process whose working directory is
//! inside the run's working directory, and, when the run has a user of its own
//! ([`crate::RunAs`]), every process of that user.

use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// The environment variable that carries a run's unique tag into every program it starts.
pub const RUN_TAG_VAR: &str = "PLIMSOLL_RUN_TAG";

/// Most sweep rounds before giving up (a process stuck in uninterruptible sleep).
const MAX_ROUNDS: usize = 200;
/// Pause between sweep rounds, so killed processes can finish dying.
const ROUND_PAUSE: Duration = Duration::from_millis(5);

/// What one process looks like in /proc.
#[derive(Debug)]
struct Proc {
    pid: i32,
    pgrp: i32,
    tagged: bool,
    cwd_inside: bool,
}

/// Pids of every live (not zombie) process whose environment holds `PLIMSOLL_RUN_TAG=<tag>`.
///
/// Reads `/proc/<pid>/environ`, which this user can read only for its own processes: that
/// is every process a run can start. Returns an empty list when /proc cannot be read.
pub fn processes_with_tag(tag: &str) -> Vec<i32> {
    scan(tag, None, None)
        .into_iter()
        .filter(|p| p.tagged)
        .map(|p| p.pid)
        .collect()
}

/// The real and effective user ids from `/proc/<pid>/status` (readable for every process).
fn uids(status: &str) -> Option<(u32, u32)> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let mut ids = line.split_ascii_whitespace();
    Some((ids.next()?.parse().ok()?, ids.next()?.parse().ok()?))
}

fn scan(tag: &str, workdir: Option<&Path>, run_uid: Option<u32>) -> Vec<Proc> {
    let needle = format!("{RUN_TAG_VAR}={tag}").into_bytes();
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let base = entry.path();
        // Under a user of the run's own, every process of that user is the run's, even one
        // whose environment the runner may not read.
        let owned = run_uid.is_some_and(|u| {
            std::fs::read_to_string(base.join("status"))
                .ok()
                .as_deref()
                .and_then(uids)
                .is_some_and(|(real, effective)| real == u || effective == u)
        });
        // Another user's process (or one already gone): nothing a run could have started,
        // unless it is of the run's own user.
        let environ = match std::fs::read(base.join("environ")) {
            Ok(e) => e,
            Err(_) if owned => Vec::new(),
            Err(_) => continue,
        };
        let Some((state, pgrp)) = std::fs::read_to_string(base.join("stat"))
            .ok()
            .as_deref()
            .and_then(parse_stat)
        else {
            continue;
        };
        if state == 'Z' || state == 'X' {
            continue; // dead, only waiting to be reaped
        }
        let tagged = environ.split(|b| *b == 0).any(|v| v == needle.as_slice());
        let cwd_inside = workdir.is_some_and(|w| {
            std::fs::read_link(base.join("cwd")).is_ok_and(|cwd| cwd_is_inside(&cwd, w))
        });
        if tagged || cwd_inside || owned {
            found.push(Proc {
                pid,
                pgrp,
                tagged,
                cwd_inside,
            });
        }
    }
    found
}

/// Whether a `/proc/<pid>/cwd` target lies inside `dir`, also once the directory has been
/// removed (the kernel then appends " (deleted)").
fn cwd_is_inside(cwd: &Path, dir: &Path) -> bool {
    if cwd.starts_with(dir) {
        return true;
    }
    let s = cwd.as_os_str().as_bytes();
    match s.strip_suffix(b" (deleted)") {
        Some(live) => Path::new(std::ffi::OsStr::from_bytes(live)).starts_with(dir),
        None => false,
    }
}

/// State and process group from `/proc/<pid>/stat` (the command name may hold spaces and
/// parentheses, so fields are counted after the last `)`).
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// Sends SIGKILL to a process group. Only call it while the group is known to be this
/// run's (its leader not yet reaped, or a member of it seen carrying the tag).
pub(crate) fn kill_group(pgid: i32) {
    if pgid > 1 {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// One sweep round: kills every process of the run still alive, and each of `groups`
/// that still holds one of them. Returns how many processes were found.
fn sweep_round(tag: &str, workdir: &Path, groups: &[i32], run_uid: Option<u32>) -> usize {
    let found = scan(tag, Some(workdir), run_uid);
    let live_groups: BTreeSet<i32> = found
        .iter()
        .map(|p| p.pgrp)
        .filter(|g| groups.contains(g))
        .collect();
    for g in live_groups {
        kill_group(g);
    }
    for p in &found {
        tracing::debug!(
            pid = p.pid,
            tagged = p.tagged,
            cwd_inside = p.cwd_inside,
            "killing a process of the run"
        );
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
    found.len()
}

/// Kills every process of the run, repeating until a scan finds none (bounded).
/// Returns whether the run's processes are all gone.
pub(crate) async fn sweep(tag: &str, workdir: &Path, groups: &[i32], run_uid: Option<u32>) -> bool {
    for _ in 0..MAX_ROUNDS {
        if sweep_round(tag, workdir, groups, run_uid) == 0 {
            return true;
        }
        tokio::time::sleep(ROUND_PAUSE).await;
    }
    tracing::warn!(tag, "processes of the run survived every sweep round");
    false
}

/// [`sweep`] for a `Drop`: blocks the calling thread between rounds.
pub(crate) fn sweep_blocking(
    tag: &str,
    workdir: &Path,
    groups: &[i32],
    run_uid: Option<u32>,
) -> bool {
    for _ in 0..MAX_ROUNDS {
        if sweep_round(tag, workdir, groups, run_uid) == 0 {
            return true;
        }
        std::thread::sleep(ROUND_PAUSE);
    }
    tracing::warn!(tag, "processes of the run survived every sweep round");
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_names() {
        assert_eq!(
            parse_stat("42 (a) b (c)) S 1 4242 4242 0 -1"),
            Some(('S', 4242))
        );
        assert_eq!(parse_stat("42 (sleep) Z 1 7 7"), Some(('Z', 7)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x)"), None);
    }

    #[test]
    fn cwd_inside_also_when_deleted() {
        let w = Path::new("/r/run-ab");
        assert!(cwd_is_inside(Path::new("/r/run-ab"), w));
        assert!(cwd_is_inside(Path::new("/r/run-ab/x"), w));
        assert!(cwd_is_inside(Path::new("/r/run-ab (deleted)"), w));
        assert!(cwd_is_inside(Path::new("/r/run-ab/x (deleted)"), w));
        assert!(!cwd_is_inside(Path::new("/r/run-abc"), w));
        assert!(!cwd_is_inside(Path::new("/r/run-abc (deleted)"), w));
        assert!(!cwd_is_inside(Path::new("/"), w));
    }

    #[test]
    fn own_process_is_never_listed() {
        // The test process does not carry a tag; a random tag matches nothing.
        assert!(processes_with_tag("no-such-tag-0123456789abcdef").is_empty());
    }
}
