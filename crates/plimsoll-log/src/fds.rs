//! Descriptor hygiene: no descriptor a plimsoll program inherited reaches a program it
//! starts. A supervisor, wrapper or CI pipe that leaves a descriptor open (say
//! `sh -c 'exec plimsolld' 7<>secret`) would otherwise hand it to every run, past Landlock
//! and the mount namespace, which do not apply to a descriptor already open.
//!
//! Two layers. [`close_inherited_on_exec`] runs first thing in every binary's `main`, before
//! any thread starts: every descriptor above 2 is marked close-on-exec
//! (`close_range(3, ~0U, CLOSE_RANGE_CLOEXEC)`, or a walk of `/proc/self/fd` where the
//! kernel lacks it). It does not close them: the process may still use what it was given,
//! its children never see it. [`StdioOnly::stdio_only`] is on every spawn of a wall or a
//! run's program, for libraries embedded in a process that skipped the first step (tests,
//! embedders): the child marks everything above 2 close-on-exec between `fork` and `exec`.
//! Every such spawn passes only 0, 1 and 2 (the bwrap filter travels on stdin, a cell's
//! control socket on stdin until the cell's shell moves it to fd 3), so there is no list of
//! named descriptors to keep.
//!
//! The only module of the workspace allowed `unsafe`: each block says why it is sound.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::sync::OnceLock;

/// Marks every descriptor above 2 close-on-exec, so no program this process starts
/// inherits one it did not name. Call it first thing in `main`, before any thread or
/// runtime starts. Errors only when neither `close_range` nor `/proc/self/fd` is usable.
pub fn close_inherited_on_exec() -> io::Result<()> {
    if close_range_cloexec(3, u32::MAX).is_ok() {
        return Ok(());
    }
    for fd in open_above_stdio()? {
        // A descriptor listed a moment ago may be gone (the listing's own): nothing to mark.
        match set_cloexec(fd) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// [`close_inherited_on_exec`] for a binary's `main`: where it fails (no `close_range` and
/// no `/proc`), `program` says so on stderr and goes on, since every spawn of a wall or a
/// run's program marks the child's descriptors again ([`StdioOnly`]) and fails rather than
/// pass one.
pub fn at_start(program: &str) {
    if let Err(e) = close_inherited_on_exec() {
        eprintln!(
            "{program}: warning: cannot mark inherited descriptors close-on-exec ({e}); each spawn marks them instead"
        );
    }
}

/// A spawn that passes the child only its standard input, output and error.
pub trait StdioOnly {
    /// In the child, between `fork` and `exec` (after the standard streams are set), marks
    /// every descriptor above 2 close-on-exec, so the program starts with 0, 1 and 2 alone
    /// whatever this process holds. Only async-signal-safe calls run in the child.
    fn stdio_only(&mut self) -> &mut Self;
}

impl StdioOnly for std::process::Command {
    fn stdio_only(&mut self) -> &mut Self {
        // Where the kernel (or a seccomp filter) refuses close_range, the child marks the
        // descriptors this process has open now, listed here since listing allocates. Rust
        // opens every descriptor close-on-exec, so one opened after this listing by another
        // thread is already marked.
        let listed: Vec<RawFd> = if close_range_works() {
            Vec::new()
        } else {
            open_above_stdio().unwrap_or_default()
        };
        // SAFETY: the closure runs in the forked child before exec; it makes only the
        // close_range and fcntl system calls (async-signal-safe), allocates nothing, takes
        // no lock, and reads `listed`, which was built before the fork.
        unsafe {
            self.pre_exec(move || {
                if close_range_cloexec(3, u32::MAX).is_ok() {
                    return Ok(());
                }
                for &fd in &listed {
                    // A descriptor listed before the fork may be closed since: not an error.
                    if let Err(e) = set_cloexec(fd) {
                        if e.raw_os_error() != Some(libc::EBADF) {
                            return Err(e);
                        }
                    }
                }
                Ok(())
            })
        }
    }
}

/// Whether `close_range(…, CLOSE_RANGE_CLOEXEC)` works here (Linux 5.11, and not refused
/// by a seccomp filter), asked once with a range that holds no descriptor.
fn close_range_works() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| close_range_cloexec(u32::MAX, u32::MAX).is_ok())
}

/// `close_range(first, last, CLOSE_RANGE_CLOEXEC)` through the raw system call (the C
/// library's wrapper is missing from older glibc and from musl).
fn close_range_cloexec(first: u32, last: u32) -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC closes nothing; it only sets a flag on
    // descriptors, which no Rust object's validity depends on. Plain integer arguments.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            libc::c_uint::from(first),
            libc::c_uint::from(last),
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets `FD_CLOEXEC` on `fd`, keeping its other descriptor flags.
fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFD/F_SETFD read and set one descriptor's flags; an invalid descriptor is
    // an EBADF error, never undefined behaviour.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The descriptors above 2 this process has open, from `/proc/self/fd` (including, while
/// it is read, the listing's own).
fn open_above_stdio() -> io::Result<Vec<RawFd>> {
    let mut fds = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        if let Some(fd) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        {
            if fd > 2 {
                fds.push(fd);
            }
        }
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    /// A descriptor without close-on-exec, as an inheriting supervisor would leave one.
    fn inheritable() -> RawFd {
        let f = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        // SAFETY: f is a descriptor this test owns.
        let flags = unsafe { libc::fcntl(f, libc::F_GETFD) };
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::fcntl(f, libc::F_SETFD, flags & !libc::FD_CLOEXEC) },
            0
        );
        f
    }

    fn child_sees(cmd: &mut std::process::Command, fd: RawFd) -> bool {
        let out = cmd
            .arg("-c")
            .arg(format!(
                "[ -e /proc/self/fd/{fd} ] && echo open || echo closed"
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "open"
    }

    #[test]
    fn a_spawn_passes_the_standard_streams_alone() {
        let fd = inheritable();
        assert!(
            child_sees(&mut std::process::Command::new("sh"), fd),
            "the test's descriptor must be inheritable to prove anything"
        );
        assert!(!child_sees(
            std::process::Command::new("sh").stdio_only(),
            fd
        ));
        // The child's own standard streams are still passed.
        let out = std::process::Command::new("sh")
            .stdio_only()
            .arg("-c")
            .arg("echo out; echo err >&2")
            .output()
            .unwrap();
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        // SAFETY: fd is this test's.
        unsafe { libc::close(fd) };
    }

    #[test]
    fn the_fallback_lists_and_marks_a_descriptor() {
        let fd = inheritable();
        assert!(open_above_stdio().unwrap().contains(&fd));
        set_cloexec(fd).unwrap();
        // SAFETY: F_GETFD on a descriptor this test holds.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        assert!(!child_sees(&mut std::process::Command::new("sh"), fd));
        assert_eq!(
            set_cloexec(i32::MAX).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        // SAFETY: fd is this test's.
        unsafe { libc::close(fd) };
    }
}
