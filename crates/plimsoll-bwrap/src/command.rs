//! The `bwrap` command line of one sandbox, built as a pure function of what it needs
//! (so the tests can read every flag), and the view of the host's system directories it
//! binds.
//!
//! Inside, the sandbox sees: `/usr` and the host's `/bin`, `/sbin`, `/lib*` (symlinks
//! reproduced as symlinks, directories bound read-only), `/etc/alternatives` and
//! `/etc/ld.so.cache` read-only; a fresh `/proc` of its own PID namespace and a minimal,
//! read-only `/dev`; fresh tmpfs mounts at `/tmp`, `/dev/shm` and `/work` (sandboxd's runs),
//! each of bounded size;
//! its own run directory read-only at `/run/plimsoll` (the token until sandboxd read it, the
//! grant relay's socket and clients), with only `/run/plimsoll/s` writable (sandboxd's socket);
//! sandboxd read-only at `/run/plimsoll-sandboxd`. The root itself is read-only. Nothing
//! else of the host: no `/home`, `/root`, host `/tmp`, `/var`, or any daemon's socket.

use std::path::{Path, PathBuf};

/// Where the run directory is seen inside.
pub const CHANNEL_DIR: &str = "/run/plimsoll";
/// The one directory of the run directory the sandbox may write to: sandboxd's socket's.
pub const SOCKET_DIR: &str = "s";
/// sandboxd's socket, in [`SOCKET_DIR`].
pub const SOCKET_NAME: &str = "s.sock";
/// The token file, in the run directory until sandboxd has read it.
pub const TOKEN_NAME: &str = "t";
/// The grant relay's socket, in the run directory.
pub const GRANT_SOCKET_NAME: &str = "g.sock";
/// sandboxd inside.
pub const SANDBOXD_PATH: &str = "/run/plimsoll-sandboxd";
/// sandboxd's root directory for runs (a tmpfs).
pub const WORK_DIR: &str = "/work";
/// The user and group ids inside the sandbox.
pub const INSIDE_ID: u32 = 1000;
/// The hostname inside.
pub const HOSTNAME: &str = "plimsoll";
/// The file descriptor bwrap reads the seccomp filter from (its standard input).
pub const SECCOMP_FD: u32 = 0;

/// Top-level host entries that hold the system's programs and libraries.
const SYSTEM_TOP: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];
/// Files and directories of `/etc` the dynamic loader and `update-alternatives` need.
const SYSTEM_ETC: &[&str] = &["/etc/alternatives", "/etc/ld.so.cache"];

/// What one sandbox's command line is made of.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The host's run directory (bound at [`CHANNEL_DIR`]).
    pub run_dir: PathBuf,
    /// sandboxd on the host.
    pub sandboxd: PathBuf,
    /// Size of `/work`, in bytes.
    pub work_bytes: u64,
    /// Size of `/tmp`, in bytes.
    pub tmp_bytes: u64,
    /// sandboxd's default deadline.
    pub default_timeout_ms: u64,
    /// Bytes kept per output stream.
    pub output_bytes: usize,
    /// Processes the sandbox may have (sandboxd's `--max-processes`).
    pub pids: u32,
    /// Memory per process in MiB (sandboxd's `--max-memory-mb`: `RLIMIT_AS` and
    /// `RLIMIT_DATA`), when no cgroup holds the sandbox's total (0: none).
    pub process_memory_mb: u32,
    /// Languages proven on this host, handed to sandboxd; `None` makes it prove them.
    pub languages: Option<Vec<String>>,
    /// sandboxd in session mode.
    pub session: bool,
}

/// How a top-level system entry appears inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemEntry {
    /// A symlink (merged `/usr`): the same symlink inside.
    Symlink {
        /// Its target as written.
        target: PathBuf,
        /// The path.
        path: PathBuf,
    },
    /// A directory, bound read-only.
    Directory(PathBuf),
}

/// The host's system entries as they appear inside (absent ones are left out).
pub fn system_entries(root: &Path) -> Vec<SystemEntry> {
    let mut out = Vec::new();
    for name in SYSTEM_TOP {
        let host = root.join(name);
        let inside = Path::new("/").join(name);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(&host) {
                    out.push(SystemEntry::Symlink {
                        target,
                        path: inside,
                    });
                }
            }
            Ok(m) if m.is_dir() => out.push(SystemEntry::Directory(inside)),
            _ => {}
        }
    }
    out
}

fn push(args: &mut Vec<String>, items: &[&str]) {
    args.extend(items.iter().map(|s| (*s).to_owned()));
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// bwrap's arguments (not the program itself) for `spec`, with `system` from
/// [`system_entries`].
pub fn args(spec: &Spec, system: &[SystemEntry]) -> Vec<String> {
    let id = INSIDE_ID.to_string();
    let mut a = Vec::new();
    push(
        &mut a,
        &[
            // New user, IPC, PID, network (loopback only), UTS and cgroup namespaces.
            "--unshare-all",
            "--unshare-user",
            "--unshare-cgroup",
            "--disable-userns",
            "--uid",
            &id,
            "--gid",
            &id,
            "--hostname",
            HOSTNAME,
            "--die-with-parent",
            // sandboxd is the PID namespace's init: no bwrap init runs beside the code. That
            // init would share the run's user and be dumpable, so a run could list its
            // descriptors and read its memory through /proc/1; sandboxd is non-dumpable, and
            // as init it ignores every signal from inside it has no handler for (SIGKILL
            // included). sandboxd reaps the orphans a session's calls leave.
            "--as-pid-1",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin",
            "--setenv",
            "TMPDIR",
            "/tmp",
            "--setenv",
            "HOME",
            WORK_DIR,
            "--ro-bind",
            "/usr",
            "/usr",
        ],
    );
    for e in system {
        match e {
            SystemEntry::Symlink { target, path: p } => {
                push(&mut a, &["--symlink", &path(target), &path(p)]);
            }
            SystemEntry::Directory(p) => push(&mut a, &["--ro-bind", &path(p), &path(p)]),
        }
    }
    for p in SYSTEM_ETC {
        push(&mut a, &["--ro-bind-try", p, p]);
    }
    push(
        &mut a,
        &[
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            // bwrap's /dev is a tmpfs of no size: a bounded /dev/shm in it, and the rest
            // read-only (its device nodes still read and write).
            "--size",
            &spec.tmp_bytes.to_string(),
            "--perms",
            "1777",
            "--tmpfs",
            "/dev/shm",
            "--remount-ro",
            "/dev",
            "--size",
            &spec.tmp_bytes.to_string(),
            "--perms",
            "1777",
            "--tmpfs",
            "/tmp",
            "--size",
            &spec.work_bytes.to_string(),
            "--tmpfs",
            WORK_DIR,
            "--ro-bind",
            &path(&spec.run_dir),
            CHANNEL_DIR,
            "--bind",
            &path(&spec.run_dir.join(SOCKET_DIR)),
            &format!("{CHANNEL_DIR}/{SOCKET_DIR}"),
            "--ro-bind",
            &path(&spec.sandboxd),
            SANDBOXD_PATH,
            "--remount-ro",
            "/",
            "--seccomp",
            &SECCOMP_FD.to_string(),
            "--chdir",
            WORK_DIR,
            "--",
            SANDBOXD_PATH,
            "--unix-socket",
            &format!("{CHANNEL_DIR}/{SOCKET_DIR}/{SOCKET_NAME}"),
            "--token-file",
            &format!("{CHANNEL_DIR}/{TOKEN_NAME}"),
            "--root-dir",
            WORK_DIR,
            "--default-timeout-ms",
            &spec.default_timeout_ms.to_string(),
            "--output-bytes",
            &spec.output_bytes.to_string(),
            "--max-processes",
            &spec.pids.to_string(),
            "--landlock",
            "--log-format",
            "json",
        ],
    );
    if let Some(l) = &spec.languages {
        let list = if l.is_empty() {
            "none".to_owned()
        } else {
            l.join(",")
        };
        push(&mut a, &["--languages", &list]);
    }
    if spec.process_memory_mb > 0 {
        push(
            &mut a,
            &["--max-memory-mb", &spec.process_memory_mb.to_string()],
        );
    }
    if spec.session {
        a.push("--session".to_owned());
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            run_dir: "/state/bwrap/i/r".into(),
            sandboxd: "/opt/bin/plimsoll-sandboxd".into(),
            work_bytes: 160 << 20,
            tmp_bytes: 16 << 20,
            default_timeout_ms: 30_000,
            output_bytes: 1 << 20,
            pids: 256,
            process_memory_mb: 0,
            languages: None,
            session: false,
        }
    }

    fn pair(a: &[String], flag: &str) -> Vec<String> {
        a.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].clone())
            .collect()
    }

    #[test]
    fn the_wall_flags_are_all_there_and_only_the_system_is_bound() {
        let sys = vec![
            SystemEntry::Symlink {
                target: "usr/lib".into(),
                path: "/lib".into(),
            },
            SystemEntry::Directory("/lib64".into()),
        ];
        let a = args(&spec(), &sys);
        for f in [
            "--unshare-all",
            "--unshare-user",
            "--unshare-cgroup",
            "--disable-userns",
            "--die-with-parent",
            "--as-pid-1",
            "--new-session",
            "--clearenv",
            "--landlock",
        ] {
            assert!(a.iter().any(|x| x == f), "{f} missing: {a:?}");
        }
        assert_eq!(pair(&a, "--cap-drop"), ["ALL"]);
        assert_eq!(pair(&a, "--seccomp"), ["0"]);
        assert_eq!(pair(&a, "--remount-ro"), ["/dev", "/"]);
        assert_eq!(pair(&a, "--symlink"), ["usr/lib"]);
        // Read-only: the system, the run directory, sandboxd. Writable: the socket's
        // directory only.
        assert_eq!(
            pair(&a, "--ro-bind"),
            [
                "/usr",
                "/lib64",
                "/state/bwrap/i/r",
                "/opt/bin/plimsoll-sandboxd"
            ]
        );
        assert_eq!(pair(&a, "--bind"), ["/state/bwrap/i/r/s"]);
        assert_eq!(pair(&a, "--unix-socket"), ["/run/plimsoll/s/s.sock"]);
        for host in ["/home", "/root", "/var", "/tmp"] {
            assert!(
                !pair(&a, "--bind")
                    .iter()
                    .chain(&pair(&a, "--ro-bind"))
                    .any(|s| s == host),
                "{host} is bound"
            );
        }
        assert_eq!(pair(&a, "--tmpfs"), ["/dev/shm", "/tmp", WORK_DIR]);
        let (tmp, work) = ((16u64 << 20).to_string(), (160u64 << 20).to_string());
        assert_eq!(pair(&a, "--size"), [tmp.clone(), tmp, work]);
        assert_eq!(pair(&a, "--max-processes"), ["256"]);
        assert!(!a
            .iter()
            .any(|x| x == "--languages" || x == "--session" || x == "--max-memory-mb"));
        let sep = a.iter().position(|x| x == "--").unwrap();
        assert_eq!(a[sep + 1], SANDBOXD_PATH);
    }

    #[test]
    fn proven_languages_and_session_mode_reach_sandboxd() {
        let mut s = spec();
        s.languages = Some(vec!["python".into(), "shell".into()]);
        s.session = true;
        let a = args(&s, &[]);
        assert_eq!(pair(&a, "--languages"), ["python,shell"]);
        assert_eq!(a.last().map(String::as_str), Some("--session"));
        s.languages = Some(vec![]);
        assert_eq!(pair(&args(&s, &[]), "--languages"), ["none"]);
        // Without a cgroup holding the total: the per-process memory bound.
        s.process_memory_mb = 1024;
        assert_eq!(pair(&args(&s, &[]), "--max-memory-mb"), ["1024"]);
    }

    #[test]
    fn merged_usr_symlinks_stay_symlinks() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("usr")).unwrap();
        std::os::unix::fs::symlink("usr/bin", root.path().join("bin")).unwrap();
        std::fs::create_dir(root.path().join("lib")).unwrap();
        assert_eq!(
            system_entries(root.path()),
            [
                SystemEntry::Symlink {
                    target: "usr/bin".into(),
                    path: "/bin".into()
                },
                SystemEntry::Directory("/lib".into()),
            ]
        );
    }
}
