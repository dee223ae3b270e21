//! The provider's state directory: one lock file and one directory per daemon start
//! (instance), so that the next start can find what a killed predecessor left behind.
//!
//! ```text
//! <state_dir>/instances/<instance>.lock   held (flock) for the life of the daemon start
//! <state_dir>/instances/<instance>/<run>/ per-run directory mounted into the container
//! ```
//!
//! A lock that can be taken belongs to a daemon start that has ended (the kernel drops a
//! `flock` when its holder dies, also by SIGKILL). Only those instances are reconciled: a
//! live daemon sharing the state directory holds its lock, and a daemon with another state
//! directory is never seen at all.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// This daemon start's claim on the state directory.
#[derive(Debug)]
pub struct Instance {
    id: String,
    dir: PathBuf,
    _lock: Flock<File>,
}

/// A daemon start that has ended, found in the state directory. Holding it holds its lock.
#[derive(Debug)]
pub struct Ended {
    /// Its instance id (the `io.plimsoll.instance` label of its containers).
    pub id: String,
    dir: PathBuf,
    lock_path: PathBuf,
    _lock: Flock<File>,
}

fn instances_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("instances")
}

fn mkdir_private(p: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(p)
}

fn lock(path: &Path, create: bool) -> io::Result<Option<Flock<File>>> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        Ok(l) => Ok(Some(l)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(io::Error::from(e)),
    }
}

/// Whether `s` is a plausible instance id (hex), so stray files are never acted on.
fn is_instance_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Instance {
    /// Claims a fresh random instance id under `state_dir` and holds its lock.
    pub fn claim(state_dir: &Path) -> io::Result<Instance> {
        let base = instances_dir(state_dir);
        mkdir_private(&base)?;
        let id = hex::encode(rand::random::<[u8; 16]>());
        let l = lock(&base.join(format!("{id}.lock")), true)?
            .ok_or_else(|| io::Error::other("a fresh instance lock is already held"))?;
        let dir = base.join(&id);
        mkdir_private(&dir)?;
        Ok(Instance { id, dir, _lock: l })
    }

    /// The instance id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where this instance's per-run directories live.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Daemon starts recorded in `state_dir` that have ended (their lock is free), other
    /// than this one. Each returned value holds that lock until dropped.
    pub fn ended(&self, state_dir: &Path) -> io::Result<Vec<Ended>> {
        let base = instances_dir(state_dir);
        let mut out = Vec::new();
        for entry in fs::read_dir(&base)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".lock") else {
                continue;
            };
            if id == self.id || !is_instance_id(id) {
                continue;
            }
            let lock_path = entry.path();
            if let Some(l) = lock(&lock_path, false)? {
                out.push(Ended {
                    id: id.to_owned(),
                    dir: base.join(id),
                    lock_path,
                    _lock: l,
                });
            }
        }
        Ok(out)
    }
}

impl Ended {
    /// Removes what the ended start kept on disk (its per-run directories), then its lock
    /// file. Call after its containers are gone.
    pub fn forget(self) -> io::Result<()> {
        if self.dir.exists() {
            make_removable(&self.dir);
            fs::remove_dir_all(&self.dir)?;
        }
        fs::remove_file(&self.lock_path)
    }
}

/// Gives the owner write and search permission on every directory below `dir`, so a tree
/// whose directories were locked (0755 per-run directories) can be removed by a non-root
/// owner.
pub fn make_removable(dir: &Path) {
    if let Ok(meta) = fs::symlink_metadata(dir) {
        if meta.is_dir() {
            let mode = meta.permissions().mode() | 0o700;
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(mode));
            if let Ok(rd) = fs::read_dir(dir) {
                for e in rd.flatten() {
                    make_removable(&e.path());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_instance_is_never_ended_and_a_dropped_one_is() {
        let d = tempfile::tempdir().unwrap();
        let a = Instance::claim(d.path()).unwrap();
        let b = Instance::claim(d.path()).unwrap();
        assert_ne!(a.id(), b.id());
        // Both alive: neither sees the other as ended.
        assert!(a.ended(d.path()).unwrap().is_empty());
        assert!(b.ended(d.path()).unwrap().is_empty());
        std::fs::create_dir(a.dir().join("run1")).unwrap();
        let a_id = a.id().to_owned();
        drop(a);
        let ended = b.ended(d.path()).unwrap();
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].id, a_id);
        // While b holds the ended lock, a third start does not see it twice.
        let c = Instance::claim(d.path()).unwrap();
        assert!(c.ended(d.path()).unwrap().is_empty());
        for e in ended {
            e.forget().unwrap();
        }
        assert!(!d.path().join("instances").join(&a_id).exists());
        assert!(!d
            .path()
            .join("instances")
            .join(format!("{a_id}.lock"))
            .exists());
    }

    #[test]
    fn stray_files_are_ignored() {
        let d = tempfile::tempdir().unwrap();
        let a = Instance::claim(d.path()).unwrap();
        std::fs::write(d.path().join("instances").join("notes.lock"), "").unwrap();
        assert!(a.ended(d.path()).unwrap().is_empty());
    }
}
