//! Host users for the process provider's runs when plimsolld is root: the run in slot `n`
//! runs as `base + n` (user and group), so no two live runs share a user, and the process
//! limit (`RLIMIT_NPROC`, counted per real user) counts one run.
//!
//! A user is also claimed across processes: a live run holds an exclusive `flock` on
//! `/run/plimsoll/process-users/<uid>` (a root-only folder), so two plimsolld instances, or
//! two `plimsoll run` commands, never hand the same user to two live runs. Without that,
//! the end of one run (every process of its user killed) would kill the other's.

use std::collections::HashSet;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};

use plimsoll_runner::RunAs;

/// How many host users a range holds (`SANDBOX_PROCESS_USER` is its first).
pub const USER_RANGE: u32 = 65_536;

/// Where live runs' users are claimed across processes (one lock file per user).
const CLAIMS: &str = "/run/plimsoll/process-users";

/// Whether plimsolld runs as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Parses `UID:GID`, neither 0, with room for the range.
pub fn parse(v: &str) -> Result<(u32, u32), String> {
    let (u, g) = v
        .trim()
        .split_once(':')
        .ok_or_else(|| format!("{v:?} is not UID:GID"))?;
    let n = |s: &str| {
        s.trim()
            .parse::<u32>()
            .map_err(|_| format!("{v:?} is not UID:GID (numbers)"))
    };
    let (u, g) = (n(u)?, n(g)?);
    if u == 0 || g == 0 {
        return Err(format!(
            "{v:?} would run the code as root or in root's group; use users and groups nothing else uses"
        ));
    }
    let last = u32::MAX - USER_RANGE;
    if u > last || g > last {
        return Err(format!(
            "{v:?} leaves no room for the {USER_RANGE} users and groups of the range (start at most {last})"
        ));
    }
    Ok((u, g))
}

/// The range of users runs take, one each.
#[derive(Debug, Clone)]
pub struct Users {
    base: (u32, u32),
    slots: Arc<Mutex<Slots>>,
}

#[derive(Debug, Default)]
struct Slots {
    next: u32,
    taken: HashSet<u32>,
}

/// A user held by a live run or session; given back when dropped.
#[derive(Debug)]
pub struct Slot {
    n: u32,
    who: RunAs,
    slots: Arc<Mutex<Slots>>,
    _claim: nix::fcntl::Flock<File>,
}

impl Slot {
    /// The user and group.
    pub fn who(&self) -> RunAs {
        self.who
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .taken
            .remove(&self.n);
    }
}

impl Users {
    /// The range starting at `base` (user, group).
    pub fn new(base: (u32, u32)) -> Users {
        // Each range starts at a scattered slot, so two instances rarely even try the same
        // user (the claim below is what keeps them apart), and a user whose last run's
        // processes are still being swept is not the next one another instance takes.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let start = (std::process::id().wrapping_mul(2_654_435_761) ^ nanos) % USER_RANGE;
        Users {
            base,
            slots: Arc::new(Mutex::new(Slots {
                next: start,
                taken: HashSet::new(),
            })),
        }
    }

    /// The next free user, in turn (one is reused only after the whole range went round),
    /// claimed across processes too; `None` when every user is live or the claims folder
    /// cannot be made.
    pub fn take(&self) -> Option<Slot> {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..USER_RANGE {
            let n = s.next;
            s.next = (s.next + 1) % USER_RANGE;
            if s.taken.contains(&n) {
                continue;
            }
            let who = RunAs {
                uid: self.base.0 + n,
                gid: self.base.1 + n,
            };
            match claim(who.uid) {
                Ok(Some(claim)) => {
                    s.taken.insert(n);
                    return Some(Slot {
                        n,
                        who,
                        slots: self.slots.clone(),
                        _claim: claim,
                    });
                }
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, folder = CLAIMS, "cannot claim a run's user");
                    return None;
                }
            }
        }
        None
    }
}

/// An exclusive, non-blocking `flock` on the claim file of `uid`: `None` while another
/// process (or another range in this one) holds it.
fn claim(uid: u32) -> std::io::Result<Option<nix::fcntl::Flock<File>>> {
    use nix::fcntl::{Flock, FlockArg};
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(CLAIMS)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(Path::new(CLAIMS).join(uid.to_string()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
}

/// Makes `state_dir` and the provider's folders below it searchable by the runs' users
/// (`o+x`, never read), and checks every directory above it: `Err` names the ones they
/// cannot search.
pub fn open_the_way(state_dir: &Path, own: &[&Path]) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    for dir in std::iter::once(state_dir).chain(own.iter().copied()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let m = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mode = m.permissions().mode() & 0o7777;
        if mode & 0o001 == 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o001))
                .map_err(|e| format!("cannot allow search (o+x) on {}: {e}", dir.display()))?;
        }
    }
    let canonical =
        std::fs::canonicalize(state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
    let blocked: Vec<String> = canonical
        .ancestors()
        .skip(1)
        .filter_map(|d| {
            let mode = std::fs::metadata(d).ok()?.permissions().mode();
            (mode & 0o001 == 0).then(|| format!("{} ({:04o})", d.display(), mode & 0o7777))
        })
        .collect();
    if blocked.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the runs' users cannot reach the state directory {}: no search permission for others on {}; allow it (chmod o+x) or set PLIMSOLL_STATE_DIR elsewhere",
        state_dir.display(),
        blocked.join(", ")
    ))
}

/// Tasks (processes and threads) whose real user is `uid`: what `RLIMIT_NPROC` counts.
pub fn tasks_of(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0u64;
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        if field("Uid:") == Some(u64::from(uid)) {
            n += field("Threads:").unwrap_or(1);
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_one_per_live_run_and_come_back() {
        if !is_root() {
            eprintln!("SKIPPED: claims live in a root-only folder");
            return;
        }
        let u = Users::new((5000, 6000));
        let a = u.take().unwrap();
        let b = u.take().unwrap();
        let off = a.who().uid - 5000;
        assert_eq!((a.who().uid, a.who().gid), (5000 + off, 6000 + off));
        assert_eq!(b.who().uid - 5000, (off + 1) % USER_RANGE);
        assert_eq!(b.who().gid - 6000, (off + 1) % USER_RANGE);
        drop(a);
        assert_eq!(u.take().unwrap().who().uid - 5000, (off + 2) % USER_RANGE);
    }

    /// Two ranges with one base (two plimsolld instances, or two `plimsoll run`) never hand
    /// out one user to two live runs: the end of one run kills every process of its user.
    #[test]
    fn two_instances_never_share_a_live_user() {
        if !is_root() {
            eprintln!("SKIPPED: claims live in a root-only folder");
            return;
        }
        let one = Users::new((7000, 7000));
        let two = Users::new((7000, 7000));
        let a = one.take().unwrap();
        let b = two.take().unwrap();
        assert_ne!(a.who().uid, b.who().uid);
        let c = one.take().unwrap();
        assert_ne!(c.who().uid, b.who().uid);
        drop(b);
        // Given back: the other range may take it again once it comes round.
        let d = two.take().unwrap();
        assert!(![a.who().uid, c.who().uid].contains(&d.who().uid));
    }

    #[test]
    fn the_range_is_parsed_and_root_refused() {
        assert_eq!(
            parse("2100000000:2100000001"),
            Ok((2_100_000_000, 2_100_000_001))
        );
        for bad in ["0:5", "5:0", "x:1", "1000", "4294967000:5"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
