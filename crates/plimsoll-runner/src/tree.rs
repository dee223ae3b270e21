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
    start: u64,
    tagged: bool,
    cwd_inside: bool,
}

/// A process a sweep must leave alive (a session's kept interpreter): its pid *and* its start
/// time (field 22 of `/proc/<pid>/stat`, in clock ticks since boot), so that another process
/// that got the same pid later is never spared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spared {
    pub pid: i32,
    pub start: u64,
}

/// The start time (field 22 of `/proc/<pid>/stat`) of a process, zombies included.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    read_stat(
        Path::new(&format!("/proc/{pid}/stat")),
        &mut [0u8; STAT_BUF],
    )
    .map(|s| s.start)
}

/// Pids of every live (not zombie) process whose environment holds `PLIMSOLL_RUN_TAG=<tag>`.
///
/// Reads `/proc/<pid>/environ`, which this user can read only for its own processes: that
/// is every process a run can start. Returns an empty list when /proc cannot be read.
pub fn processes_with_tag(tag: &str) -> Vec<i32> {
    scan(tag, None, None, None)
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

/// Lists the processes that carry `tag`, work inside `workdir`, or run as `run_uid`.
/// Without `run_uid`, a process that started before `born` (a start time, see [`Target`])
/// is passed over after its `stat` alone: nothing forked before the run's first program
/// can be the run's, so its environment and working directory are never read. That keeps
/// a sweep at one small read per process on a busy host.
fn scan(tag: &str, workdir: Option<&Path>, run_uid: Option<u32>, born: Option<u64>) -> Vec<Proc> {
    let needle = format!("{RUN_TAG_VAR}={tag}").into_bytes();
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut stat_buf = [0u8; STAT_BUF];
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
        let Some(Stat { state, pgrp, start }) = read_stat(&base.join("stat"), &mut stat_buf) else {
            continue;
        };
        if state == 'Z' || state == 'X' {
            continue; // dead, only waiting to be reaped
        }
        if run_uid.is_none() && born.is_some_and(|b| start < b) {
            continue; // older than the run's first program
        }
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
        let tagged = environ.split(|b| *b == 0).any(|v| v == needle.as_slice());
        let cwd_inside = workdir.is_some_and(|w| {
            std::fs::read_link(base.join("cwd")).is_ok_and(|cwd| cwd_is_inside(&cwd, w))
        });
        if tagged || cwd_inside || owned {
            found.push(Proc {
                pid,
                pgrp,
                start,
                tagged,
                cwd_inside,
            });
        }
    }
    found
}

/// Room for one `/proc/<pid>/stat` line: 52 numeric fields and a command name of at most
/// 64 bytes fit in well under 1 KiB.
const STAT_BUF: usize = 1024;

/// Reads and parses a `stat` file with one `read` (open, read, close): a sweep reads one
/// per process on the host, and `fs::read_to_string` would add a `statx` and a second
/// `read` to each. A line that does not fit is read again the long way.
fn read_stat(path: &Path, buf: &mut [u8; STAT_BUF]) -> Option<Stat> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let n = f.read(buf).ok()?;
    if n < buf.len() {
        return parse_stat(std::str::from_utf8(&buf[..n]).ok()?);
    }
    let mut rest = String::from_utf8(buf.to_vec()).ok()?;
    f.read_to_string(&mut rest).ok()?;
    parse_stat(&rest)
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

/// The fields of `/proc/<pid>/stat` a sweep needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    state: char,
    pgrp: i32,
    /// Field 22: when the process started, in clock ticks since boot.
    start: u64,
}

/// State, process group and start time from `/proc/<pid>/stat` (the command name may hold
/// spaces and parentheses, so fields are counted after the last `)`: the state is field 3).
fn parse_stat(stat: &str) -> Option<Stat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    // Fields 6 to 21 lie between the process group (5) and the start time (22).
    let start = fields.nth(16)?.parse().ok()?;
    Some(Stat { state, pgrp, start })
}

/// Sends SIGKILL to a process group. Only call it while the group is known to be this
/// run's (its leader not yet reaped, or a member of it seen carrying the tag).
pub(crate) fn kill_group(pgid: i32) {
    if pgid > 1 {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// What a sweep kills: the run's tag, working directory, process groups and user, and the
/// processes it spares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub tag: &'a str,
    pub workdir: &'a Path,
    pub groups: &'a [i32],
    pub run_uid: Option<u32>,
    pub spared: &'a [Spared],
    /// The start time of the run's first program, once one started (see [`scan`]).
    pub born: Option<u64>,
}

/// One sweep round: kills every process of the run still alive (but the spared ones), and
/// each of the run's groups that still holds one of them, unless a spared process leads it
/// (a kept interpreter's children are killed one by one). Returns how many processes were
/// found, the spared ones not counted.
fn sweep_round(t: &Target<'_>) -> usize {
    let (spared, found): (Vec<Proc>, Vec<Proc>) = scan(t.tag, Some(t.workdir), t.run_uid, t.born)
        .into_iter()
        .partition(|p| {
            t.spared
                .iter()
                .any(|s| s.pid == p.pid && s.start == p.start)
        });
    let spared_groups: BTreeSet<i32> = spared.iter().map(|p| p.pgrp).collect();
    let live_groups: BTreeSet<i32> = found
        .iter()
        .map(|p| p.pgrp)
        .filter(|g| t.groups.contains(g) && !spared_groups.contains(g))
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

/// Kills every process of the run (but the spared ones), repeating until a scan finds none
/// (bounded). Returns whether the run's processes are all gone.
pub(crate) async fn sweep(t: Target<'_>) -> bool {
    for _ in 0..MAX_ROUNDS {
        if sweep_round(&t) == 0 {
            return true;
        }
        tokio::time::sleep(ROUND_PAUSE).await;
    }
    tracing::warn!(
        tag = t.tag,
        "processes of the run survived every sweep round"
    );
    false
}

/// [`sweep`] for a `Drop`: blocks the calling thread between rounds.
pub(crate) fn sweep_blocking(t: Target<'_>) -> bool {
    for _ in 0..MAX_ROUNDS {
        if sweep_round(&t) == 0 {
            return true;
        }
        std::thread::sleep(ROUND_PAUSE);
    }
    tracing::warn!(
        tag = t.tag,
        "processes of the run survived every sweep round"
    );
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_names() {
        let tail = "0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 100 200";
        assert_eq!(
            parse_stat(&format!("42 (a) b (c)) S 1 4242 4242 {tail}")),
            Some(Stat {
                state: 'S',
                pgrp: 4242,
                start: 987654
            })
        );
        assert_eq!(
            parse_stat(&format!("42 (sleep) Z 1 7 7 {tail}")).map(|s| (s.state, s.pgrp)),
            Some(('Z', 7))
        );
        assert_eq!(parse_stat("42 (sleep) Z 1 7 7"), None);
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x)"), None);
    }

    #[test]
    fn one_read_of_stat_agrees_with_the_long_way() {
        let path = Path::new("/proc/self/stat");
        let mut buf = [0u8; STAT_BUF];
        let quick = read_stat(path, &mut buf).expect("own stat");
        let long = parse_stat(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!((quick.pgrp, quick.start), (long.pgrp, long.start));
        assert!(read_stat(Path::new("/proc/self/no-such-file"), &mut buf).is_none());
    }

    #[test]
    fn start_time_of_this_process_is_stable() {
        let me = std::process::id() as i32;
        let a = start_time(me).expect("own stat");
        assert!(a > 0);
        assert_eq!(start_time(me), Some(a));
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

    /// A `sleep` carrying `tag`, returned once /proc shows it with the tag (so a sweep
    /// cannot run before the process is visible to it).
    /// `group`: 0 leads a new process group, another number joins that group.
    fn tagged_sleep(tag: &str, group: i32) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("100").env(RUN_TAG_VAR, tag).process_group(group);
        let mut child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        for _ in 0..2000 {
            if processes_with_tag(tag).contains(&pid) {
                return child;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("the tagged process never showed in /proc");
    }

    /// The signal that ended `child`, waiting at most two seconds for it to end.
    fn killed_by(child: &mut std::process::Child) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        for _ in 0..400 {
            if let Some(status) = child.try_wait().unwrap() {
                return status.signal();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    fn target<'a>(
        tag: &'a str,
        dir: &'a Path,
        groups: &'a [i32],
        spared: &'a [Spared],
    ) -> Target<'a> {
        Target {
            tag,
            workdir: dir,
            groups,
            run_uid: None,
            spared,
            born: None,
        }
    }

    #[test]
    fn a_spared_pid_with_another_start_time_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let tag = crate::scope::random_hex(16);
        let mut child = tagged_sleep(&tag, 0);
        let pid = child.id() as i32;
        let start = start_time(pid).unwrap();
        // Spared by pid and start time (its group is the run's too): it lives on.
        let right = [Spared { pid, start }];
        assert!(sweep_blocking(target(&tag, dir.path(), &[pid], &right)));
        assert!(child.try_wait().unwrap().is_none());
        assert_eq!(processes_with_tag(&tag), [pid]);
        // The same pid with another start time is another process: killed.
        let wrong = [Spared {
            pid,
            start: start + 1,
        }];
        assert!(sweep_blocking(target(&tag, dir.path(), &[], &wrong)));
        assert_eq!(killed_by(&mut child), Some(9));
    }

    #[test]
    fn only_the_spared_process_of_a_group_survives() {
        let dir = tempfile::tempdir().unwrap();
        let tag = crate::scope::random_hex(16);
        let mut leader = tagged_sleep(&tag, 0);
        let pid = leader.id() as i32;
        // In the spared process's group, as a kept interpreter's children are.
        let mut other = tagged_sleep(&tag, pid);
        let spared = [Spared {
            pid,
            start: start_time(pid).unwrap(),
        }];
        assert!(sweep_blocking(target(&tag, dir.path(), &[pid], &spared)));
        assert_eq!(killed_by(&mut other), Some(9));
        assert!(leader.try_wait().unwrap().is_none());
        assert!(sweep_blocking(target(&tag, dir.path(), &[pid], &[])));
        assert_eq!(killed_by(&mut leader), Some(9));
    }
}
