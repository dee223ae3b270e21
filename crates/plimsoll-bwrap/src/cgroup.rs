//! Memory and CPU limits through a delegated cgroup v2, where the host gives plimsolld one
//! (systemd: `Delegate=yes` on its unit; a container runtime: a cgroup namespace with the
//! controllers enabled). Without one, `SANDBOX_MEMORY_MB` and `SANDBOX_CPUS` are refused at
//! startup, naming why (see [`find`]); they are never claimed on a guess.
//!
//! With one, plimsolld first moves every process of its own cgroup into a leaf
//! (`plimsolld/`, cgroup v2 lets only leaves hold processes), enables the controllers for
//! the cgroup's children, and gives each sandbox a child cgroup of its own (`sandbox-<id>`)
//! with `memory.max` (and `memory.swap.max` 0) and `cpu.max` written before the sandbox's
//! processes are moved in. The move happens once sandboxd listens and before any call is
//! sent, and is read back from each process's `/proc/<pid>/cgroup`; a process that did not
//! land there ends the sandbox and nothing runs in it.

use std::path::{Path, PathBuf};

/// The limits a sandbox's cgroup gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// `memory.max` in MiB (0: not set).
    pub memory_mb: u32,
    /// CPUs, as `cpu.max` over a 100 ms period (0: not set).
    pub cpus: f64,
}

impl Limits {
    /// The controllers these limits need.
    pub fn controllers(&self) -> Vec<&'static str> {
        let mut c = Vec::new();
        if self.memory_mb > 0 {
            c.push("memory");
        }
        if self.cpus > 0.0 {
            c.push("cpu");
        }
        c
    }
}

/// plimsolld's own cgroup v2 directory, found delegated.
#[derive(Debug, Clone)]
pub struct Delegated {
    dir: PathBuf,
}

/// The cgroup v2 path of this process in `/proc/self/cgroup` (the `0::` line).
pub fn own_path(proc_self_cgroup: &str) -> Option<String> {
    proc_self_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_owned)
}

/// The mount point and mounted root of the cgroup2 file system in `/proc/self/mountinfo`.
pub fn cgroup2_mount(mountinfo: &str) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = left.split_whitespace().collect();
        Some((PathBuf::from(f.get(4)?), (*f.get(3)?).to_owned()))
    })
}

/// The directory of cgroup `path` under a cgroup2 mount of `root` at `mount`.
pub fn cgroup_dir(mount: &Path, root: &str, path: &str) -> Option<PathBuf> {
    let rel = if root == "/" {
        path
    } else {
        path.strip_prefix(root)?
    };
    Some(mount.join(rel.trim_start_matches('/')))
}

/// plimsolld's cgroup, if it is a cgroup v2 that offers every controller `limits` needs
/// and that plimsolld may write; otherwise why not, in words for the operator.
pub fn find(limits: &Limits) -> Result<Delegated, String> {
    let need = limits.controllers();
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| own_path(&s))
        .ok_or("plimsolld is in no cgroup v2 (no `0::` line in /proc/self/cgroup)")?;
    let (mount, root) = std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|s| cgroup2_mount(&s))
        .ok_or("no cgroup2 file system is mounted")?;
    let dir = cgroup_dir(&mount, &root, &own)
        .ok_or_else(|| format!("plimsolld's cgroup {own} is outside the mounted {root}"))?;
    let offered = std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
    let offered: Vec<&str> = offered.split_whitespace().collect();
    let missing: Vec<&str> = need
        .iter()
        .copied()
        .filter(|c| !offered.contains(c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "plimsolld's cgroup v2 ({}) does not offer the {} controller (it offers: {}); on a host with cgroup v1 (or a hybrid), or without delegation, there is none",
            dir.display(),
            missing.join(" and "),
            if offered.is_empty() { "none".to_owned() } else { offered.join(" ") }
        ));
    }
    let writable = nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK).is_ok()
        && nix::unistd::access(
            &dir.join("cgroup.subtree_control"),
            nix::unistd::AccessFlags::W_OK,
        )
        .is_ok();
    if !writable {
        return Err(format!(
            "plimsolld may not write its cgroup {} (delegate it: systemd Delegate=yes)",
            dir.display()
        ));
    }
    Ok(Delegated { dir })
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value)
        .map_err(|e| format!("cannot write {value:?} to {}: {e}", path.display()))
}

impl Delegated {
    /// Moves every process of plimsolld's cgroup into the `plimsolld` leaf and enables the
    /// controllers `limits` needs for the children.
    pub fn prepare(&self, limits: &Limits) -> Result<(), String> {
        let leaf = self.dir.join("plimsolld");
        if !leaf.is_dir() {
            std::fs::create_dir(&leaf)
                .map_err(|e| format!("cannot create {}: {e}", leaf.display()))?;
        }
        let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace() {
            // A process that exited meanwhile cannot be moved; it does not need to be.
            let _ = std::fs::write(leaf.join("cgroup.procs"), pid);
        }
        let enable: Vec<String> = limits
            .controllers()
            .iter()
            .map(|c| format!("+{c}"))
            .collect();
        write(&self.dir.join("cgroup.subtree_control"), &enable.join(" "))
    }

    /// A new cgroup for one sandbox, with `limits` written.
    pub fn sandbox(&self, id: &str, limits: &Limits) -> Result<SandboxCgroup, String> {
        let dir = self.dir.join(format!("sandbox-{id}"));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cg = SandboxCgroup { dir };
        let written = (|| {
            if limits.memory_mb > 0 {
                let bytes = u64::from(limits.memory_mb) << 20;
                write(&cg.dir.join("memory.max"), &bytes.to_string())?;
                if cg.dir.join("memory.swap.max").exists() {
                    write(&cg.dir.join("memory.swap.max"), "0")?;
                }
            }
            if limits.cpus > 0.0 {
                write(&cg.dir.join("cpu.max"), &cpu_max(limits.cpus))?;
            }
            Ok(())
        })();
        if let Err(e) = written {
            cg.remove();
            return Err(e);
        }
        Ok(cg)
    }
}

/// `cpu.max` for `cpus` CPUs over a 100 ms period.
pub fn cpu_max(cpus: f64) -> String {
    let quota = (cpus * 100_000.0).round().max(1_000.0) as u64;
    format!("{quota} 100000")
}

/// One sandbox's cgroup.
#[derive(Debug)]
pub struct SandboxCgroup {
    dir: PathBuf,
}

impl SandboxCgroup {
    /// Moves each of `pids` in and reads every move back from `/proc/<pid>/cgroup`.
    pub fn adopt(&self, pids: &[u32]) -> Result<(), String> {
        let procs = self.dir.join("cgroup.procs");
        let want = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for pid in pids {
            write(&procs, &pid.to_string())?;
            let now = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            let inside = own_path(&now).is_some_and(|p| p.ends_with(&format!("/{want}")));
            if !inside {
                return Err(format!(
                    "process {pid} is not in {} after the move",
                    self.dir.display()
                ));
            }
        }
        Ok(())
    }

    /// Removes the cgroup once its processes are gone (waits up to a second for them).
    pub fn remove(&self) {
        for _ in 0..100 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
        tracing::warn!(cgroup = %self.dir.display(), "a sandbox's cgroup could not be removed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_cgroup_is_found_under_the_cgroup2_mount() {
        let cg = "12:memory:/x\n0::/system.slice/plimsolld.service\n";
        assert_eq!(
            own_path(cg).as_deref(),
            Some("/system.slice/plimsolld.service")
        );
        assert_eq!(own_path("12:memory:/x\n"), None);
        let mi = "24 30 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n25 30 0:23 / /proc rw - proc proc rw\n";
        let (m, r) = cgroup2_mount(mi).unwrap();
        assert_eq!(
            (m.as_path(), r.as_str()),
            (Path::new("/sys/fs/cgroup"), "/")
        );
        assert_eq!(
            cgroup_dir(&m, &r, "/system.slice/plimsolld.service").unwrap(),
            Path::new("/sys/fs/cgroup/system.slice/plimsolld.service")
        );
        // A mount of a sub-tree (a cgroup namespace's view from outside).
        assert_eq!(
            cgroup_dir(Path::new("/mnt/cg"), "/a", "/a/b").unwrap(),
            Path::new("/mnt/cg/b")
        );
        assert_eq!(cgroup_dir(Path::new("/mnt/cg"), "/a", "/z"), None);
        assert_eq!(
            cgroup2_mount("25 30 0:23 / /proc rw - proc proc rw\n"),
            None
        );
    }

    #[test]
    fn limits_need_their_controllers_and_cpu_max_is_a_quota_per_100ms() {
        let l = Limits {
            memory_mb: 256,
            cpus: 1.5,
        };
        assert_eq!(l.controllers(), ["memory", "cpu"]);
        assert!(Limits {
            memory_mb: 0,
            cpus: 0.0
        }
        .controllers()
        .is_empty());
        assert_eq!(cpu_max(1.5), "150000 100000");
        assert_eq!(cpu_max(0.001), "1000 100000");
    }
}
