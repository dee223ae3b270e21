//! An outer bound for tests that run a fork bomb or a memory bomb on purpose: the test's
//! whole process moved into a cgroup of its own (below its current one) with `pids.max` or
//! a memory limit, so that whatever plimsoll's own bound does, the machine stays usable.
//! cgroup v2 where the controller is offered there, else cgroup v1's hierarchy of it. A
//! test that cannot create its bound must not run its bomb: [`Bound::pids`] and
//! [`Bound::memory`] return `None` after printing SKIPPED (a failure with
//! `PLIMSOLL_REQUIRE_BWRAP`, which CI sets, since CI runs as root).

use std::path::{Path, PathBuf};

/// The test process inside a cgroup of its own; moved back out and removed when dropped.
#[derive(Debug)]
pub struct Bound {
    dir: PathBuf,
    v1: bool,
}

impl Bound {
    /// At most `max` processes and threads for this test process and everything it starts.
    pub fn pids(max: u32) -> Option<Bound> {
        Bound::create("pids", |b| {
            std::fs::write(b.dir.join("pids.max"), max.to_string())
        })
    }

    /// At most `extra` processes and threads more than this test process has now, for it
    /// and everything it starts.
    pub fn pids_above_now(extra: u32) -> Option<Bound> {
        // No limit for the moment of the move, then the real one.
        let b = Bound::create("pids", |b| std::fs::write(b.dir.join("pids.max"), "max"))?;
        let now: u32 = std::fs::read_to_string(b.dir.join("pids.current"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if let Err(e) = std::fs::write(b.dir.join("pids.max"), (now + extra).to_string()) {
            skip(&format!(
                "cannot write {}: {e}",
                b.dir.join("pids.max").display()
            ));
            return None;
        }
        Some(b)
    }

    /// At most `bytes` of memory (swap included where the kernel counts it) for this test
    /// process and everything it starts.
    pub fn memory(bytes: u64) -> Option<Bound> {
        Bound::create("memory", |b| {
            if b.v1 {
                std::fs::write(b.dir.join("memory.limit_in_bytes"), bytes.to_string())?;
                // Absent without swap accounting: the limit above still holds.
                let _ =
                    std::fs::write(b.dir.join("memory.memsw.limit_in_bytes"), bytes.to_string());
                Ok(())
            } else {
                std::fs::write(b.dir.join("memory.max"), bytes.to_string())?;
                let _ = std::fs::write(b.dir.join("memory.swap.max"), "0");
                Ok(())
            }
        })
    }

    /// Times the limit was hit (`pids.events`' `max`; memory: `memory.failcnt` or
    /// `memory.events`' `max`).
    pub fn hits(&self) -> u64 {
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        let field = |text: String, key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        if self.dir.join("pids.events").exists() {
            field(read("pids.events"), "max ")
        } else if self.v1 {
            read("memory.failcnt").trim().parse().unwrap_or(0)
        } else {
            field(read("memory.events"), "max ")
        }
    }

    fn create(
        controller: &str,
        limit: impl FnOnce(&Bound) -> std::io::Result<()>,
    ) -> Option<Bound> {
        let found = place(controller);
        let Some((parent, v1)) = found else {
            skip(&format!(
                "no cgroup offers the {controller} controller to this test"
            ));
            return None;
        };
        let dir = parent.join(format!("plimsoll-test-{}-{controller}", std::process::id()));
        if let Err(e) = std::fs::create_dir(&dir) {
            skip(&format!("cannot create {}: {e}", dir.display()));
            return None;
        }
        let b = Bound { dir, v1 };
        let ready = limit(&b).and_then(|()| {
            std::fs::write(b.dir.join("cgroup.procs"), std::process::id().to_string())
        });
        if let Err(e) = ready {
            skip(&format!(
                "cannot bound the test in {}: {e}",
                b.dir.display()
            ));
            return None;
        }
        Some(b)
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::write(parent.join("cgroup.procs"), std::process::id().to_string());
        }
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

fn skip(why: &str) {
    assert!(
        std::env::var_os("PLIMSOLL_REQUIRE_BWRAP").is_none(),
        "an outer bound is required for this test: {why}"
    );
    eprintln!("SKIPPED: {why}; the test's bomb needs an outer bound of its own");
}

/// The directory of this process's cgroup for `controller`, and whether it is cgroup v1.
fn place(controller: &str) -> Option<(PathBuf, bool)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    // cgroup v1: a hierarchy of its own for the controller.
    for line in own.lines() {
        let mut f = line.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        if ctrls.split(',').any(|c| c == controller) {
            let mount = Path::new("/sys/fs/cgroup").join(ctrls);
            let dir = mount.join(path.trim_start_matches('/'));
            if dir.is_dir() {
                return Some((dir, true));
            }
        }
    }
    // cgroup v2: the controller offered and enabled for children.
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let enabled = std::fs::read_to_string(dir.join("cgroup.subtree_control")).ok()?;
    enabled
        .split_whitespace()
        .any(|c| c == controller)
        .then_some((dir, false))
}
