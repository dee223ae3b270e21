//! `close_inherited_on_exec` in a process of its own (it marks every descriptor of the
//! process, so it cannot share one with tests that need an inheritable descriptor).

#![allow(unsafe_code)]

use std::os::fd::IntoRawFd;

fn child_sees(fd: i32) -> bool {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "[ -e /proc/self/fd/{fd} ] && echo open || echo closed"
        ))
        .output()
        .unwrap();
    out.stdout == b"open\n"
}

#[test]
fn descriptors_inherited_before_main_reach_no_child() {
    let file = std::fs::File::open("/dev/null").unwrap().into_raw_fd();
    // dup2 gives a descriptor without close-on-exec, as a supervisor's `7<>file` would.
    let fd = 70;
    // SAFETY: plain descriptor calls on descriptors this test owns.
    assert_eq!(unsafe { libc::dup2(file, fd) }, fd);
    assert!(child_sees(fd), "the descriptor must be inheritable first");
    plimsoll_log::fds::close_inherited_on_exec().unwrap();
    assert!(!child_sees(fd));
    // Marked, not closed: the process itself still holds it.
    // SAFETY: F_GETFD on a descriptor this test owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
}
