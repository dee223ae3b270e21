//! Host users for runs when plimsolld is root, shared by the providers that give each run
//! (process) or each sandbox (bwrap) a host user of its own: slot `n` of a range runs as
//! `base + n` (user and group), so no two live runs share a user, and the process limit
//! (`RLIMIT_NPROC`, counted per real user) counts one run.
//!
//! A user is also claimed across processes: a live holder keeps an exclusive `flock` on
//! `/run/plimsoll/users/<uid>` (a root-only folder, one for every provider), so two plimsolld
//! instances, two `plimsoll run` commands, or a process range and a bwrap range that overlap,
//! never hand the same user to two live runs. Without that, the end of one process run
//! (every process of its user killed) would kill the other's.

use std::collections::HashSet;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// How many host users a range holds (its first is the configured `UID:GID`).
pub const USER_RANGE: u32 = 65_536;

/// Where live users are claimed across processes (one lock file per user).
pub const CLAIMS: &str = "/run/plimsoll/users";

/// Parses a range's first `UID:GID`, neither 0, with room for the range's users.
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
    if u == 0 {
        return Err(format!(
            "{v:?} would run the code as root on the host; use users nothing else uses"
        ));
    }
    if g == 0 {
        return Err(format!(
            "{v:?} would run the code in root's group on the host; use groups nothing else uses"
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

/// A range of users, handed out one per live holder.
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

/// A user held by a live run, session or sandbox; given back (and its claim released) when
/// dropped.
#[derive(Debug)]
pub struct Slot {
    n: u32,
    ids: (u32, u32),
    slots: Arc<Mutex<Slots>>,
    _claim: nix::fcntl::Flock<File>,
}

impl Slot {
    /// The user and group.
    pub fn ids(&self) -> (u32, u32) {
        self.ids
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
        // user (the claim is what keeps them apart), and a user whose last run's processes
        // are still being swept is not the next one another instance takes.
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
    /// cannot be made (logged).
    pub fn take(&self) -> Option<Slot> {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..USER_RANGE {
            let n = s.next;
            s.next = (s.next + 1) % USER_RANGE;
            if s.taken.contains(&n) {
                continue;
            }
            let ids = (self.base.0 + n, self.base.1 + n);
            match claim(ids.0) {
                Ok(Some(claim)) => {
                    s.taken.insert(n);
                    return Some(Slot {
                        n,
                        ids,
                        slots: self.slots.clone(),
                        _claim: claim,
                    });
                }
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, folder = CLAIMS, "cannot claim a run's host user");
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
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(Path::new(CLAIMS).join(uid.to_string()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn users_are_one_per_live_holder_and_come_back() {
        if !is_root() {
            eprintln!("SKIPPED: claims live in a root-only folder");
            return;
        }
        let u = Users::new((5000, 6000));
        let a = u.take().unwrap();
        let b = u.take().unwrap();
        let off = a.ids().0 - 5000;
        assert_eq!(a.ids(), (5000 + off, 6000 + off));
        assert_eq!(b.ids().0 - 5000, (off + 1) % USER_RANGE);
        assert_eq!(b.ids().1 - 6000, (off + 1) % USER_RANGE);
        drop(a);
        // Given back, but not the next one taken: the range goes round first.
        assert_eq!(u.take().unwrap().ids().0 - 5000, (off + 2) % USER_RANGE);
    }

    /// Two ranges with one base (two plimsolld instances, or two `plimsoll run`, or a
    /// process range and a bwrap range) never hand out one user to two live holders.
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
        assert_ne!(a.ids(), b.ids());
        let c = one.take().unwrap();
        assert_ne!(c.ids(), b.ids());
        drop(b);
        let d = two.take().unwrap();
        assert!(![a.ids(), c.ids()].contains(&d.ids()));
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
        assert!(parse("0:5").unwrap_err().contains("as root"));
        assert!(parse("5:0").unwrap_err().contains("root's group"));
    }
}
