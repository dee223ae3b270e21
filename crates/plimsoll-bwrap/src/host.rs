//! What the provider checks on the host before its smoke test: the bwrap binary and its
//! version, sandboxd, whether user namespaces can be created, and whether the sandboxes'
//! host user can reach the files bound into them. Each failure says what to fix.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The oldest bubblewrap accepted: 0.8.0 brought `--disable-userns` and `--size`.
pub const MIN_VERSION: (u32, u32, u32) = (0, 8, 0);

/// `name` on `PATH` (an executable regular file), like a shell finds it.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

/// Whether `p` is a regular file with an execute bit.
pub fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
}

/// The bwrap binary: `configured` (`SANDBOX_BWRAP_PATH`) or `bwrap` on `PATH`; never a
/// set-user-id one (that bwrap refuses the options the provider needs, and runs as root).
pub fn find_bwrap(configured: Option<&Path>) -> Result<PathBuf, String> {
    let found = find_bwrap_file(configured)?;
    if std::fs::metadata(&found).is_ok_and(|m| m.mode() & 0o4000 != 0) {
        return Err(format!(
            "{} is installed set-user-id; the bwrap provider needs a bwrap that is not (Debian's is not): chmod u-s it, or point SANDBOX_BWRAP_PATH at another",
            found.display()
        ));
    }
    Ok(found)
}

fn find_bwrap_file(configured: Option<&Path>) -> Result<PathBuf, String> {
    match configured {
        Some(p) if is_executable(p) => Ok(p.to_owned()),
        Some(p) => Err(format!(
            "SANDBOX_BWRAP_PATH {} is not an executable file; install bubblewrap (Debian: apt-get install bubblewrap) and point it there, or unset it to use bwrap on PATH",
            p.display()
        )),
        None => on_path("bwrap").ok_or_else(|| {
            "bubblewrap (`bwrap`) is not on PATH; install it (Debian: apt-get install bubblewrap) or set SANDBOX_BWRAP_PATH".to_owned()
        }),
    }
}

/// Parses `bwrap --version` output (`bubblewrap 0.8.0`).
pub fn parse_version(out: &str) -> Option<(u32, u32, u32)> {
    let v = out.split_whitespace().nth(1)?;
    let mut it = v.split('.').map(|n| {
        n.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    });
    let major = it.next()??;
    let minor = it.next()??;
    let patch = it.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// Runs `bwrap --version` and checks it against [`MIN_VERSION`]; returns the version text.
pub async fn check_version(bwrap: &Path) -> Result<String, String> {
    let mut cmd = tokio::process::Command::new(bwrap);
    plimsoll_log::fds::StdioOnly::stdio_only(cmd.as_std_mut());
    let out = cmd
        .arg("--version")
        .output()
        .await
        .map_err(|e| format!("cannot run {} --version: {e}", bwrap.display()))?;
    let text = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    let Some(v) = parse_version(&text) else {
        return Err(format!(
            "{} --version printed {text:?}, which is not bubblewrap's version line; SANDBOX_BWRAP_PATH must name bubblewrap",
            bwrap.display()
        ));
    };
    if v < MIN_VERSION {
        let (a, b, c) = MIN_VERSION;
        return Err(format!(
            "{} is bubblewrap {}.{}.{}, too old: the bwrap provider needs {a}.{b}.{c} or later (Debian 12 and later ship it)",
            bwrap.display(),
            v.0,
            v.1,
            v.2
        ));
    }
    Ok(format!("{}.{}.{}", v.0, v.1, v.2))
}

/// plimsoll-sandboxd: `configured` (`SANDBOX_BWRAP_SANDBOXD`), else beside this program,
/// else on `PATH`.
pub fn find_sandboxd(configured: Option<&Path>) -> Result<PathBuf, String> {
    const NAME: &str = "plimsoll-sandboxd";
    if let Some(p) = configured {
        return if is_executable(p) {
            Ok(p.to_owned())
        } else {
            Err(format!(
                "SANDBOX_BWRAP_SANDBOXD {} is not an executable file",
                p.display()
            ))
        };
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(NAME)))
        .filter(|p| is_executable(p));
    beside.or_else(|| on_path(NAME)).ok_or_else(|| {
        format!("{NAME} is neither beside plimsolld nor on PATH; install it there or set SANDBOX_BWRAP_SANDBOXD")
    })
}

/// Whether this process may create user namespaces, from the kernel's own settings:
/// `user.max_user_namespaces` (0 disables them) and Debian's
/// `kernel.unprivileged_userns_clone` (0 disables them for users other than root, which is
/// what the sandboxes run as). A file that does not exist says nothing.
pub fn check_userns(proc_sys: &Path, unprivileged: bool) -> Result<(), String> {
    let read = |rel: &str| {
        std::fs::read_to_string(proc_sys.join(rel))
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    if read("user/max_user_namespaces") == Some(0) {
        return Err("user namespaces are disabled (user.max_user_namespaces is 0); the bwrap provider needs them: sysctl -w user.max_user_namespaces=15000".into());
    }
    if unprivileged && read("kernel/unprivileged_userns_clone") == Some(0) {
        return Err("unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone is 0) and the sandboxes run as an unprivileged user; enable them: sysctl -w kernel.unprivileged_userns_clone=1".into());
    }
    if unprivileged && read("kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        return Err("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns is 1); allow bwrap with an AppArmor profile (Ubuntu: the bwrap-userns-restrict profile) or set it to 0".into());
    }
    Ok(())
}

/// Checks that host user `uid`/`gid` can search every directory above `path`, and `path`
/// itself when it is a directory (bwrap, running as that user, must reach the run
/// directories and sandboxd).
pub fn check_reachable(path: &Path, uid: u32, gid: u32, what: &str) -> Result<(), String> {
    let mut blocked = Vec::new();
    let skip = usize::from(!path.is_dir());
    for dir in path.ancestors().skip(skip) {
        let Ok(m) = std::fs::metadata(dir) else {
            continue;
        };
        let mode = m.mode();
        let ok = if m.uid() == uid {
            mode & 0o100 != 0
        } else if m.gid() == gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !ok {
            blocked.push(format!("{} ({:04o})", dir.display(), mode & 0o7777));
        }
    }
    if blocked.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the sandboxes run as host user {uid}:{gid}, which cannot reach {what} {}: no search permission on {}; allow it (chmod o+x) or choose another place",
        path.display(),
        blocked.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        assert_eq!(parse_version("bubblewrap 0.8.0\n"), Some((0, 8, 0)));
        assert_eq!(parse_version("bubblewrap 0.11.0-rc1"), Some((0, 11, 0)));
        assert_eq!(parse_version("bubblewrap 0.4"), Some((0, 4, 0)));
        assert_eq!(parse_version("bash"), None);
        assert!(parse_version("bubblewrap 0.7.9").unwrap() < MIN_VERSION);
    }

    #[test]
    fn disabled_user_namespaces_are_named() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("user")).unwrap();
        std::fs::create_dir_all(d.path().join("kernel")).unwrap();
        check_userns(d.path(), true).unwrap();
        std::fs::write(d.path().join("kernel/unprivileged_userns_clone"), "0\n").unwrap();
        assert!(check_userns(d.path(), true)
            .unwrap_err()
            .contains("unprivileged_userns_clone"));
        check_userns(d.path(), false).unwrap();
        std::fs::write(d.path().join("user/max_user_namespaces"), "0\n").unwrap();
        assert!(check_userns(d.path(), false)
            .unwrap_err()
            .contains("max_user_namespaces"));
    }

    #[test]
    fn a_closed_directory_on_the_way_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let inner = d.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(d.path().join("a"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let e = check_reachable(
            &inner.join("x"),
            me.wrapping_add(4242),
            4242,
            "the state directory",
        )
        .unwrap_err();
        assert!(e.contains("/a (0700)"), "{e}");
        std::fs::set_permissions(d.path().join("a"), std::fs::Permissions::from_mode(0o711))
            .unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o711)).unwrap();
        check_reachable(&inner, me.wrapping_add(4242), 4242, "x").unwrap();
    }
}
