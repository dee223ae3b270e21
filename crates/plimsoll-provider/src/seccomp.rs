//! The seccomp policy plimsoll's own Linux walls run under, in the two forms they take it:
//! classic BPF written by hand ([`program`], every rule visible and the digest stable),
//! handed to `bwrap --seccomp` by the bwrap provider, and the same rules as a Docker (OCI)
//! JSON profile ([`docker_profile`]) the Docker provider gives each container under runc.
//! One table, two renderings: a test runs both over every call and the arguments each rule
//! reads and requires the same answer.
//!
//! It follows Docker's default profile as it applies to a container without capabilities:
//! `github.com/moby/profiles/seccomp` v0.2.3, the version moby/moby vendors at commit
//! `b985e2313a8676e18072b442911fc8f64f17d440` (`vendor/github.com/moby/profiles/seccomp/default.json`).
//! A call the profile does not allow fails with `EPERM`, as in Docker. A number above the
//! newest call the profile names ([`KNOWN_UP_TO`], `removexattrat`) fails with `ENOSYS`, so a
//! newer C library that tries a newer call falls back to an older one instead of taking the
//! refusal as final; so does `clone3`, whose flags sit in memory the filter cannot read: the
//! C library then uses `clone`, whose flags it checks.
//!
//! Where it is stricter than Docker's profile:
//! - [`DENIED`] holds calls Docker allows unconditionally or from Linux 4.8 on that this
//!   filter refuses whatever their arguments: `ptrace` and `process_vm_readv/writev` (another
//!   process's memory), `modify_ldt`, `memfd_secret`, `adjtimex` and `clock_adjtime`,
//!   `name_to_handle_at`. Every call Docker allows only with a capability (mount, `unshare`,
//!   `setns`, `bpf`, `perf_event_open`, the NUMA policy calls, `quotactl_fd`, …) is refused:
//!   the sandbox has none.
//! - `socket` and `socketpair` only for [`FAMILIES`] (`AF_UNIX`, `AF_INET`, `AF_INET6`,
//!   `AF_NETLINK`); Docker allows every family but `AF_ALG` and `AF_VSOCK`.
//! - `ioctl` refuses `TIOCSTI` and `TIOCLINUX` (typing into, or driving, a terminal).
//! - `execveat` with `AT_EMPTY_PATH` (executing an open file) is refused, and
//!   `memfd_create` unless with `MFD_NOEXEC_SEAL` and without `MFD_EXEC`: a `memfd` is the
//!   one file a run can write that Landlock's execute rule does not cover (the kernel
//!   exempts its internal mount), so `execve("/proc/self/fd/N")` would run it. On kernels
//!   before 6.3, which lack the flag, no `memfd` can be made at all.
//! - `clone` with any namespace flag and `personality` outside Docker's five personas are
//!   refused as in Docker.
//!
//! Any other architecture than the one plimsoll was built for is killed, and so is the x32
//! ABI on x86-64. bwrap sets `no_new_privs` before it installs the filter.

mod docker;

pub use docker::docker_profile;

/// The filter's instructions in the kernel's `struct sock_filter` layout, native endian:
/// 8 bytes each, ready to be read by `bwrap --seccomp FD`.
pub fn program() -> Vec<u8> {
    let ins = instructions();
    let mut out = Vec::with_capacity(ins.len() * 8);
    for (code, jt, jf, k) in ins {
        out.extend_from_slice(&code.to_ne_bytes());
        out.push(jt);
        out.push(jf);
        out.extend_from_slice(&k.to_ne_bytes());
    }
    out
}

/// `sha256:<hex>` of [`program`]: the filter's identity in `Describe` and records.
pub fn digest() -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, &program());
    format!("sha256:{}", hex::encode(d.as_ref()))
}

/// A system call: its name and its number on the architecture plimsoll was built for.
pub type Call = (&'static str, i64);

/// `(name, number)` from the libc crate's `SYS_` constants.
macro_rules! calls {
    ($($sys:ident),* $(,)?) => {
        &[$((stringify!($sys), libc::$sys)),*]
    };
}

/// The newest call Docker's profile names (`removexattrat`, Linux 6.13; the same number on
/// every architecture). Numbers above it fail with `ENOSYS`.
pub const KNOWN_UP_TO: u32 = 466;

/// Docker's allowlist, the calls both x86-64 and AArch64 have, allowed whatever their
/// arguments. (Not here: [`DENIED`], and the calls whose arguments a rule reads.)
#[rustfmt::skip]
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const ALLOWED: &[Call] = calls![
    SYS_accept, SYS_accept4, SYS_bind, SYS_brk, SYS_capget, SYS_capset, SYS_chdir,
    SYS_clock_getres, SYS_clock_gettime, SYS_clock_nanosleep, SYS_close, SYS_close_range,
    SYS_connect, SYS_copy_file_range, SYS_dup, SYS_dup3, SYS_epoll_create1, SYS_epoll_ctl,
    SYS_epoll_pwait, SYS_epoll_pwait2, SYS_eventfd2, SYS_execve, SYS_exit, SYS_exit_group,
    SYS_faccessat, SYS_faccessat2, SYS_fadvise64, SYS_fallocate, SYS_fanotify_mark, SYS_fchdir,
    SYS_fchmod, SYS_fchmodat, SYS_fchown, SYS_fchownat, SYS_fcntl, SYS_fdatasync, SYS_fgetxattr,
    SYS_flistxattr, SYS_flock, SYS_fremovexattr, SYS_fsetxattr, SYS_fstat, SYS_fstatfs, SYS_fsync,
    SYS_ftruncate, SYS_futex, SYS_futex_waitv, SYS_get_robust_list, SYS_getcpu, SYS_getcwd,
    SYS_getdents64, SYS_getegid, SYS_geteuid, SYS_getgid, SYS_getgroups, SYS_getitimer,
    SYS_getpeername, SYS_getpgid, SYS_getpid, SYS_getppid, SYS_getpriority, SYS_getrandom,
    SYS_getresgid, SYS_getresuid, SYS_getrusage, SYS_getsid, SYS_getsockname, SYS_getsockopt,
    SYS_gettid, SYS_gettimeofday, SYS_getuid, SYS_getxattr, SYS_inotify_add_watch,
    SYS_inotify_init1, SYS_inotify_rm_watch, SYS_io_cancel, SYS_io_destroy, SYS_io_getevents,
    SYS_io_setup, SYS_io_submit, SYS_ioprio_get, SYS_ioprio_set, SYS_kill, SYS_landlock_add_rule,
    SYS_landlock_create_ruleset, SYS_landlock_restrict_self, SYS_lgetxattr, SYS_linkat,
    SYS_listen, SYS_listxattr, SYS_llistxattr, SYS_lremovexattr, SYS_lseek, SYS_lsetxattr,
    SYS_madvise, SYS_membarrier, SYS_mincore, SYS_mkdirat, SYS_mknodat, SYS_mlock, SYS_mlock2,
    SYS_mlockall, SYS_mmap, SYS_mprotect, SYS_mq_getsetattr, SYS_mq_notify, SYS_mq_open,
    SYS_mq_timedreceive, SYS_mq_timedsend, SYS_mq_unlink, SYS_mremap, SYS_mseal, SYS_msgctl,
    SYS_msgget, SYS_msgrcv, SYS_msgsnd, SYS_msync, SYS_munlock, SYS_munlockall, SYS_munmap,
    SYS_nanosleep, SYS_newfstatat, SYS_openat, SYS_openat2, SYS_pidfd_open, SYS_pidfd_send_signal,
    SYS_pipe2, SYS_pkey_alloc, SYS_pkey_free, SYS_pkey_mprotect, SYS_ppoll, SYS_prctl,
    SYS_pread64, SYS_preadv, SYS_preadv2, SYS_prlimit64, SYS_process_mrelease, SYS_pselect6,
    SYS_pwrite64, SYS_pwritev, SYS_pwritev2, SYS_read, SYS_readahead, SYS_readlinkat, SYS_readv,
    SYS_recvfrom, SYS_recvmmsg, SYS_recvmsg, SYS_remap_file_pages, SYS_removexattr, SYS_renameat2,
    SYS_restart_syscall, SYS_rseq, SYS_rt_sigaction, SYS_rt_sigpending, SYS_rt_sigprocmask,
    SYS_rt_sigqueueinfo, SYS_rt_sigreturn, SYS_rt_sigsuspend, SYS_rt_sigtimedwait,
    SYS_rt_tgsigqueueinfo, SYS_sched_get_priority_max, SYS_sched_get_priority_min,
    SYS_sched_getaffinity, SYS_sched_getattr, SYS_sched_getparam, SYS_sched_getscheduler,
    SYS_sched_rr_get_interval, SYS_sched_setaffinity, SYS_sched_setattr, SYS_sched_setparam,
    SYS_sched_setscheduler, SYS_sched_yield, SYS_seccomp, SYS_semctl, SYS_semget, SYS_semop,
    SYS_semtimedop, SYS_sendfile, SYS_sendmmsg, SYS_sendmsg, SYS_sendto, SYS_set_robust_list,
    SYS_set_tid_address, SYS_setfsgid, SYS_setfsuid, SYS_setgid, SYS_setgroups, SYS_setitimer,
    SYS_setpgid, SYS_setpriority, SYS_setregid, SYS_setresgid, SYS_setresuid, SYS_setreuid,
    SYS_setsid, SYS_setsockopt, SYS_setuid, SYS_setxattr, SYS_shmat, SYS_shmctl, SYS_shmdt,
    SYS_shmget, SYS_shutdown, SYS_sigaltstack, SYS_signalfd4, SYS_splice, SYS_statfs, SYS_statx,
    SYS_symlinkat, SYS_sync, SYS_syncfs, SYS_sysinfo, SYS_tee, SYS_tgkill, SYS_timer_create,
    SYS_timer_delete, SYS_timer_getoverrun, SYS_timer_gettime, SYS_timer_settime,
    SYS_timerfd_create, SYS_timerfd_gettime, SYS_timerfd_settime, SYS_times, SYS_tkill,
    SYS_truncate, SYS_umask, SYS_uname, SYS_unlinkat, SYS_utimensat, SYS_vmsplice, SYS_wait4,
    SYS_waitid, SYS_write, SYS_writev,
];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ALLOWED: &[Call] = &[];

/// Docker's allowlist, the calls of x86-64 alone: the older ones AArch64 never had, and
/// `arch_prctl`.
#[rustfmt::skip]
#[cfg(target_arch = "x86_64")]
const ALLOWED_HERE: &[Call] = calls![
    SYS_access, SYS_alarm, SYS_arch_prctl, SYS_chmod, SYS_chown, SYS_creat, SYS_dup2,
    SYS_epoll_create, SYS_epoll_ctl_old, SYS_epoll_wait, SYS_epoll_wait_old, SYS_eventfd,
    SYS_fork, SYS_futimesat, SYS_get_thread_area, SYS_getdents, SYS_getpgrp, SYS_getrlimit,
    SYS_inotify_init, SYS_lchown, SYS_link, SYS_lstat, SYS_mkdir, SYS_mknod, SYS_open, SYS_pause,
    SYS_pipe, SYS_poll, SYS_readlink, SYS_rename, SYS_renameat, SYS_rmdir, SYS_select,
    SYS_set_thread_area, SYS_setrlimit, SYS_signalfd, SYS_stat, SYS_symlink, SYS_sync_file_range,
    SYS_time, SYS_unlink, SYS_utime, SYS_utimes, SYS_vfork,
];
/// Docker's allowlist, calls of this architecture the libc crate does not name (numbers
/// from the kernel's `arch/x86/entry/syscalls/syscall_64.tbl`).
#[cfg(target_arch = "x86_64")]
const NUMBERED_HERE: &[Call] = &[("io_pgetevents", 333), ("uretprobe", 335)];
#[cfg(not(target_arch = "x86_64"))]
const ALLOWED_HERE: &[Call] = &[];
/// Docker's allowlist, calls of this architecture the libc crate does not name (numbers
/// from the kernel's `include/uapi/asm-generic/unistd.h`).
#[cfg(target_arch = "aarch64")]
const NUMBERED_HERE: &[Call] = &[
    ("renameat", 38),
    ("sync_file_range", 84),
    ("getrlimit", 163),
    ("setrlimit", 164),
    ("io_pgetevents", 292),
];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const NUMBERED_HERE: &[Call] = &[];

/// Docker's allowlist, calls newer than the libc crate's tables: since Linux 5.1 (424) a
/// new call has one number on every architecture.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const NUMBERED_NEWER: &[Call] = &[
    ("cachestat", 451),
    ("fchmodat2", 452),
    ("map_shadow_stack", 453),
    ("futex_wake", 454),
    ("futex_wait", 455),
    ("futex_requeue", 456),
    ("statmount", 457),
    ("listmount", 458),
    ("setxattrat", 463),
    ("getxattrat", 464),
    ("listxattrat", 465),
    ("removexattrat", 466),
];
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const NUMBERED_NEWER: &[Call] = &[];

/// Every call allowed whatever its arguments.
pub fn allowed() -> Vec<Call> {
    [ALLOWED, ALLOWED_HERE, NUMBERED_HERE, NUMBERED_NEWER].concat()
}

/// Calls refused with `EPERM` whatever their arguments, named so the tests check each one
/// (anything not allowed is refused too). Docker's profile allows some of these to a
/// container without capabilities: `ptrace`, `process_vm_readv/writev`, `modify_ldt`,
/// `memfd_secret`, `adjtimex`, `clock_adjtime`, `name_to_handle_at`.
pub const DENIED: &[Call] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("bpf", libc::SYS_bpf),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("fanotify_init", libc::SYS_fanotify_init),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("reboot", libc::SYS_reboot),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("quotactl_fd", libc::SYS_quotactl_fd),
    ("syslog", libc::SYS_syslog),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("sethostname", libc::SYS_sethostname),
    ("setdomainname", libc::SYS_setdomainname),
    ("vhangup", libc::SYS_vhangup),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("kcmp", libc::SYS_kcmp),
    ("process_madvise", libc::SYS_process_madvise),
    ("get_mempolicy", libc::SYS_get_mempolicy),
    ("set_mempolicy", libc::SYS_set_mempolicy),
    ("set_mempolicy_home_node", libc::SYS_set_mempolicy_home_node),
    ("mbind", libc::SYS_mbind),
    ("move_pages", libc::SYS_move_pages),
    ("migrate_pages", libc::SYS_migrate_pages),
    ("memfd_secret", libc::SYS_memfd_secret),
    #[cfg(target_arch = "x86_64")]
    ("modify_ldt", libc::SYS_modify_ldt),
    #[cfg(target_arch = "x86_64")]
    ("sysfs", libc::SYS_sysfs),
    #[cfg(target_arch = "x86_64")]
    ("iopl", libc::SYS_iopl),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", libc::SYS_ioperm),
    #[cfg(target_arch = "x86_64")]
    ("uselib", libc::SYS_uselib),
];

/// How a call whose arguments the filter reads is answered. Each argument it reads is an
/// `int` or `unsigned int` to the kernel (or, for `clone`, only its low 32 bits are flags),
/// so the low 32 bits are all there is to read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rule {
    /// `clone`: refused with any namespace flag among its flags (`args[0]`), as in Docker.
    Clone,
    /// `socket`, `socketpair`: only the families in [`FAMILIES`] (`args[0]`).
    Family,
    /// `personality`: only the personas in [`PERSONAS`] (`args[0]`), as in Docker.
    Persona,
    /// `ioctl`: refused for the requests in [`REFUSED_IOCTLS`] (`args[1]`).
    Ioctl,
    /// `execveat`: refused with `AT_EMPTY_PATH` (`args[4]`), which executes an open file
    /// (a `memfd`, or a file since deleted) rather than a path.
    ExecveatFd,
    /// `memfd_create`: allowed only with `MFD_NOEXEC_SEAL` and without `MFD_EXEC`
    /// (`args[1]`): a `memfd` is never executable.
    MemfdNoexec,
}

/// The calls whose arguments the filter reads.
pub const RULES: &[(&str, i64, Rule)] = &[
    ("clone", libc::SYS_clone, Rule::Clone),
    ("socket", libc::SYS_socket, Rule::Family),
    ("socketpair", libc::SYS_socketpair, Rule::Family),
    ("personality", libc::SYS_personality, Rule::Persona),
    ("ioctl", libc::SYS_ioctl, Rule::Ioctl),
    ("execveat", libc::SYS_execveat, Rule::ExecveatFd),
    ("memfd_create", libc::SYS_memfd_create, Rule::MemfdNoexec),
];

/// Socket families allowed: `AF_UNIX`, `AF_INET`, `AF_INET6` (the sandbox's network
/// namespace holds only `lo`) and `AF_NETLINK` (the C library reads interfaces through it).
pub const FAMILIES: [u32; 4] = [
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
    libc::AF_NETLINK as u32,
];

/// Personas allowed, Docker's: `PER_LINUX`, `PER_LINUX` with `UNAME26`, `PER_LINUX32`, the
/// same with `UNAME26`, and `0xffffffff`, which only asks for the current one.
pub const PERSONAS: [u32; 5] = [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

/// `ioctl` requests refused: `TIOCSTI` (push input into a terminal) and `TIOCLINUX`.
pub const REFUSED_IOCTLS: [u32; 2] = [libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// The namespace flags of `clone` (Docker's mask): `CLONE_NEWNS`, `CLONE_NEWCGROUP`,
/// `CLONE_NEWUTS`, `CLONE_NEWIPC`, `CLONE_NEWUSER`, `CLONE_NEWPID`, `CLONE_NEWNET`.
pub const CLONE_NAMESPACES: u32 = 0x7E02_0000;
/// `execveat`'s flag to execute the file descriptor itself.
pub const AT_EMPTY_PATH: u32 = libc::AT_EMPTY_PATH as u32;
/// `memfd_create`'s flag for an executable `memfd` (Linux 6.3; the libc crate lacks it).
pub const MFD_EXEC: u32 = 0x10;
/// `memfd_create`'s flag for a `memfd` that is not executable and cannot be made so
/// (Linux 6.3).
pub const MFD_NOEXEC_SEAL: u32 = 0x8;

/// The audit architecture the filter is written for, or `None` where plimsoll has no filter
/// (the provider then refuses to start; see [`supported`]).
#[cfg(all(target_arch = "x86_64", target_endian = "little"))]
const AUDIT_ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(all(target_arch = "aarch64", target_endian = "little"))]
const AUDIT_ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(not(any(
    all(target_arch = "x86_64", target_endian = "little"),
    all(target_arch = "aarch64", target_endian = "little")
)))]
const AUDIT_ARCH: Option<u32> = None;

/// Whether plimsoll has a filter for the architecture it was built for (x86-64 and
/// little-endian AArch64).
pub fn supported() -> Result<(), String> {
    match AUDIT_ARCH {
        Some(_) => Ok(()),
        None => Err(format!(
            "the bwrap provider's seccomp filter is written for x86_64 and aarch64, not {}",
            std::env::consts::ARCH
        )),
    }
}

// Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
const LD_W_ABS: u16 = 0x20;
const JA: u16 = 0x05;
const JEQ_K: u16 = 0x15;
const JGT_K: u16 = 0x25;
const JGE_K: u16 = 0x35;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;
const ENOSYS: u32 = RET_ERRNO | libc::ENOSYS as u32;

// Offsets in `struct seccomp_data`: nr, arch, instruction_pointer, then args[6] of 8 bytes
// each (the low 32 bits first on a little-endian machine).
const NR: u32 = 0;
const ARCH: u32 = 4;
const fn arg_low(i: u32) -> u32 {
    16 + 8 * i
}

/// One instruction: `(code, jt, jf, k)`.
type Instruction = (u16, u8, u8, u32);

/// What the filter answers for one call number.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verdict {
    /// The `RET` value: allow, or an errno.
    Return(u32),
    /// The answer depends on the arguments.
    Rule(Rule),
}

/// The verdict for every number from 0 to [`KNOWN_UP_TO`]: `EPERM` unless allowed.
fn verdicts() -> Vec<Verdict> {
    let mut v = vec![Verdict::Return(EPERM); KNOWN_UP_TO as usize + 1];
    let mut set = |nr: i64, verdict| {
        let slot = usize::try_from(nr).expect("a call number");
        v[slot] = verdict;
    };
    for (_, nr) in allowed() {
        set(nr, Verdict::Return(RET_ALLOW));
    }
    for (_, nr, rule) in RULES {
        set(*nr, Verdict::Rule(*rule));
    }
    set(libc::SYS_clone3, Verdict::Return(ENOSYS));
    // A denial wins over anything above (a test also keeps the lists apart).
    for (_, nr) in DENIED {
        set(*nr, Verdict::Return(EPERM));
    }
    v
}

/// The filter: the architecture, then the call number found by binary search over runs of
/// equal verdicts (a few comparisons, whatever the list's length), then the rule reading
/// the arguments where there is one.
fn instructions() -> Vec<Instruction> {
    // Without a filter for this architecture every call is killed (`supported` keeps the
    // provider from starting first).
    let mut p = vec![
        (LD_W_ABS, 0, 0, ARCH),
        (JEQ_K, 1, 0, AUDIT_ARCH.unwrap_or(0)),
        (RET_K, 0, 0, RET_KILL_PROCESS),
        (LD_W_ABS, 0, 0, NR),
    ];
    if cfg!(target_arch = "x86_64") {
        // The x32 ABI (numbers with bit 30 set) would reach the same calls by other numbers.
        p.push((JGE_K, 0, 1, 0x4000_0000));
        p.push((RET_K, 0, 0, RET_KILL_PROCESS));
    }
    p.push((JGT_K, 0, 1, KNOWN_UP_TO));
    p.push((RET_K, 0, 0, ENOSYS));
    let mut runs: Vec<(u32, Verdict)> = Vec::new();
    for (nr, verdict) in (0u32..).zip(verdicts()) {
        if runs.last().map(|(_, v)| *v) != Some(verdict) {
            runs.push((nr, verdict));
        }
    }
    search(&runs, &mut p);
    p
}

/// The search over `runs` (each a first number and its verdict, up to the next run's first
/// number): at each step, numbers at or above the middle run's first go right.
fn search(runs: &[(u32, Verdict)], p: &mut Vec<Instruction>) {
    if let [(_, verdict)] = runs {
        answer(*verdict, p);
        return;
    }
    let mid = runs.len() / 2;
    let mut below = Vec::new();
    search(&runs[..mid], &mut below);
    p.push((JGE_K, 0, 1, runs[mid].0));
    p.push((JA, 0, 0, below.len() as u32));
    p.extend(below);
    search(&runs[mid..], p);
}

/// The instructions that answer one verdict; every path ends in a return.
fn answer(verdict: Verdict, p: &mut Vec<Instruction>) {
    match verdict {
        Verdict::Return(k) => p.push((RET_K, 0, 0, k)),
        Verdict::Rule(Rule::Clone) => flag(arg_low(0), CLONE_NAMESPACES, EPERM, RET_ALLOW, p),
        Verdict::Rule(Rule::Family) => one_of(arg_low(0), &FAMILIES, RET_ALLOW, EPERM, p),
        Verdict::Rule(Rule::Persona) => one_of(arg_low(0), &PERSONAS, RET_ALLOW, EPERM, p),
        Verdict::Rule(Rule::Ioctl) => one_of(arg_low(1), &REFUSED_IOCTLS, EPERM, RET_ALLOW, p),
        Verdict::Rule(Rule::ExecveatFd) => flag(arg_low(4), AT_EMPTY_PATH, EPERM, RET_ALLOW, p),
        Verdict::Rule(Rule::MemfdNoexec) => {
            // MFD_EXEC refused first; then MFD_NOEXEC_SEAL required.
            p.push((LD_W_ABS, 0, 0, arg_low(1)));
            p.push((JSET_K, 0, 1, MFD_EXEC));
            p.push((RET_K, 0, 0, EPERM));
            p.push((JSET_K, 0, 1, MFD_NOEXEC_SEAL));
            p.push((RET_K, 0, 0, RET_ALLOW));
            p.push((RET_K, 0, 0, EPERM));
        }
    }
}

/// Returns `matched` when the word at `offset` is one of `values`, `otherwise` if not.
fn one_of(offset: u32, values: &[u32], matched: u32, otherwise: u32, p: &mut Vec<Instruction>) {
    p.push((LD_W_ABS, 0, 0, offset));
    let n = values.len();
    for (i, v) in values.iter().enumerate() {
        // From the i-th comparison, `matched` is n - i instructions further on.
        p.push((JEQ_K, (n - i) as u8, 0, *v));
    }
    p.push((RET_K, 0, 0, otherwise));
    p.push((RET_K, 0, 0, matched));
}

/// Returns `set` when the word at `offset` has any bit of `mask`, `clear` if none.
fn flag(offset: u32, mask: u32, set: u32, clear: u32, p: &mut Vec<Instruction>) {
    p.push((LD_W_ABS, 0, 0, offset));
    p.push((JSET_K, 0, 1, mask));
    p.push((RET_K, 0, 0, set));
    p.push((RET_K, 0, 0, clear));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the filter the way the kernel does, over one `seccomp_data` (the low 32 bits of
    /// each argument; the high halves are never loaded).
    pub(super) fn run_with(arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let ins = instructions();
        let word = |off: u32| -> u32 {
            match off {
                NR => nr,
                ARCH => arch,
                o if (16..64).contains(&o) && o % 8 == 0 => args[((o - 16) / 8) as usize] as u32,
                other => panic!("the filter loads offset {other}"),
            }
        };
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let (code, jt, jf, k) = ins[pc];
            pc += 1;
            match code {
                LD_W_ABS => a = word(k),
                JA => pc += k as usize,
                JEQ_K => pc += usize::from(if a == k { jt } else { jf }),
                JGT_K => pc += usize::from(if a > k { jt } else { jf }),
                JGE_K => pc += usize::from(if a >= k { jt } else { jf }),
                JSET_K => pc += usize::from(if a & k != 0 { jt } else { jf }),
                RET_K => return k,
                other => panic!("unknown opcode {other:#x}"),
            }
        }
    }

    pub(super) fn arch() -> u32 {
        AUDIT_ARCH.expect("a supported architecture")
    }

    /// The call `nr` with `arg0`, `arg1` and `arg4` (the arguments rules read).
    fn run(nr: i64, arg0: u64, arg1: u64, arg4: u64) -> u32 {
        run_with(arch(), nr as u32, [arg0, arg1, 0, 0, arg4, 0])
    }

    fn plain(nr: i64) -> u32 {
        run(nr, 0, 0, 0)
    }

    #[test]
    fn each_rule_answers_as_documented() {
        for (name, n) in DENIED {
            assert_eq!(plain(*n), EPERM, "{name}");
        }
        // Refused since the allowlist, allowed before it (the finding of issue 35).
        let refused_now = [
            ("get_mempolicy", libc::SYS_get_mempolicy),
            ("set_mempolicy", libc::SYS_set_mempolicy),
            ("mbind", libc::SYS_mbind),
            ("move_pages", libc::SYS_move_pages),
            ("quotactl_fd", libc::SYS_quotactl_fd),
            ("memfd_secret", libc::SYS_memfd_secret),
            #[cfg(target_arch = "x86_64")]
            ("modify_ldt", libc::SYS_modify_ldt),
            #[cfg(target_arch = "x86_64")]
            ("sysfs", libc::SYS_sysfs),
        ];
        for (name, n) in refused_now {
            assert_eq!(plain(n), EPERM, "{name}");
        }
        // Not in Docker's profile at all: refused by the allowlist's default.
        assert_eq!(plain(libc::SYS_lookup_dcookie), EPERM, "lookup_dcookie");
        assert_eq!(plain(libc::SYS_clone3), ENOSYS);
        // Above the newest call the filter knows: ENOSYS, so a C library falls back.
        assert_eq!(plain(i64::from(KNOWN_UP_TO) + 1), ENOSYS);
        assert_eq!(plain(1000), ENOSYS);

        // clone: refused with any namespace flag (any other bits set too); threads, fork
        // and posix_spawn's vfork pass.
        let clone = libc::SYS_clone;
        for ok in [0x003D_0F00, 0x0120_0011, 0x0000_4111] {
            assert_eq!(run(clone, ok, 0, 0), RET_ALLOW, "clone {ok:#x}");
        }
        for ns in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNS,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWCGROUP,
        ] {
            assert_eq!(run(clone, ns as u64 | 0x11, 0, 0), EPERM, "clone {ns:#x}");
        }

        // socket and socketpair: AF_UNIX, AF_INET, AF_INET6, AF_NETLINK only.
        for call in [libc::SYS_socket, libc::SYS_socketpair] {
            for family in 0..64u64 {
                let want = if FAMILIES.contains(&(family as u32)) {
                    RET_ALLOW
                } else {
                    EPERM
                };
                assert_eq!(run(call, family, 1, 0), want, "{call} family {family}");
            }
            for (name, family) in [
                ("AF_PACKET", libc::AF_PACKET),
                ("AF_KEY", libc::AF_KEY),
                ("AF_BLUETOOTH", libc::AF_BLUETOOTH),
                ("AF_VSOCK", libc::AF_VSOCK),
                ("AF_ALG", libc::AF_ALG),
            ] {
                assert_eq!(run(call, family as u64, 3, 0), EPERM, "{name}");
            }
        }

        // personality: Docker's five personas only.
        let personality = libc::SYS_personality;
        for ok in [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff] {
            assert_eq!(run(personality, ok, 0, 0), RET_ALLOW, "persona {ok:#x}");
        }
        // READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, PER_BSD.
        for refused in [0x0040_0000, 0x0004_0000, 0x6] {
            assert_eq!(
                run(personality, refused, 0, 0),
                EPERM,
                "persona {refused:#x}"
            );
        }

        // ioctl: TIOCSTI and TIOCLINUX refused, the rest (TCGETS, FIONBIO, FIOCLEX) pass.
        let ioctl = libc::SYS_ioctl;
        assert_eq!(run(ioctl, 0, libc::TIOCSTI, 0), EPERM);
        assert_eq!(run(ioctl, 0, libc::TIOCLINUX, 0), EPERM);
        for ok in [libc::TCGETS, libc::FIONBIO, libc::FIOCLEX, libc::TIOCGWINSZ] {
            assert_eq!(run(ioctl, 1, ok, 0), RET_ALLOW, "ioctl {ok:#x}");
        }

        // execveat: refused with AT_EMPTY_PATH (executing an open file), allowed with a path.
        let execveat = libc::SYS_execveat;
        assert_eq!(run(execveat, 3, 0, 0x1000), EPERM);
        assert_eq!(run(execveat, 3, 0, 0x1000 | 0x100), EPERM);
        assert_eq!(run(execveat, libc::AT_FDCWD as u64, 0, 0), RET_ALLOW);
        // memfd_create: only with MFD_NOEXEC_SEAL (with MFD_CLOEXEC or sealing beside it),
        // never with MFD_EXEC, and not without either (executable on Linux 6.3 and later).
        let memfd = libc::SYS_memfd_create;
        for refused in [0x0, 0x1, 0x3, 0x10, 0x10 | 0x1, 0x10 | 0x8] {
            assert_eq!(
                run(memfd, 0, refused, 0),
                EPERM,
                "memfd_create {refused:#x}"
            );
        }
        for ok in [0x8, 0x8 | 0x1, 0x8 | 0x3] {
            assert_eq!(run(memfd, 0, ok, 0), RET_ALLOW, "memfd_create {ok:#x}");
        }

        // Another architecture (i386's int 0x80 ABI) is killed, whatever the call.
        assert_eq!(
            run_with(0x4000_0003, libc::SYS_getpid as u32, [0; 6]),
            RET_KILL_PROCESS
        );
        if cfg!(target_arch = "x86_64") {
            // The x32 ABI: numbers with bit 30 set are killed.
            let x32 = 0x4000_0000 | libc::SYS_getpid as u32;
            assert_eq!(run_with(arch(), x32, [0; 6]), RET_KILL_PROCESS);
        }
    }

    /// What sandboxd (tokio, gRPC on a Unix socket, Landlock), the runner, node, python3
    /// and sh call, among others: all allowed.
    #[test]
    fn ordinary_calls_stay_allowed() {
        let mut ordinary = vec![
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_close,
            libc::SYS_newfstatat,
            libc::SYS_statx,
            libc::SYS_mmap,
            libc::SYS_mprotect,
            libc::SYS_munmap,
            libc::SYS_madvise,
            libc::SYS_brk,
            libc::SYS_futex,
            libc::SYS_rseq,
            libc::SYS_set_robust_list,
            libc::SYS_epoll_create1,
            libc::SYS_epoll_ctl,
            libc::SYS_epoll_pwait,
            libc::SYS_eventfd2,
            libc::SYS_pipe2,
            libc::SYS_accept4,
            libc::SYS_bind,
            libc::SYS_listen,
            libc::SYS_connect,
            libc::SYS_sendmsg,
            libc::SYS_recvmsg,
            libc::SYS_getrandom,
            libc::SYS_execve,
            libc::SYS_wait4,
            libc::SYS_waitid,
            libc::SYS_kill,
            libc::SYS_pidfd_open,
            libc::SYS_pidfd_send_signal,
            libc::SYS_rt_sigaction,
            libc::SYS_rt_sigprocmask,
            libc::SYS_prctl,
            libc::SYS_prlimit64,
            libc::SYS_setsid,
            libc::SYS_sched_getaffinity,
            libc::SYS_faccessat2,
            libc::SYS_close_range,
            libc::SYS_landlock_create_ruleset,
            libc::SYS_landlock_add_rule,
            libc::SYS_landlock_restrict_self,
            libc::SYS_exit_group,
            libc::SYS_getdents64,
            libc::SYS_unlinkat,
            libc::SYS_copy_file_range,
            libc::SYS_ioctl,
            libc::SYS_socket,
            libc::SYS_socketpair,
            libc::SYS_clone,
            libc::SYS_personality,
            452, // fchmodat2
        ];
        #[cfg(target_arch = "x86_64")]
        ordinary.extend([
            libc::SYS_arch_prctl,
            libc::SYS_open,
            libc::SYS_stat,
            libc::SYS_poll,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_pipe,
            libc::SYS_getrlimit,
            libc::SYS_setrlimit,
        ]);
        for nr in ordinary {
            // Arguments the rules let through: AF_UNIX for the socket calls, PER_LINUX,
            // plain fork flags, FIONBIO, no flags.
            let arg0 = if [libc::SYS_socket, libc::SYS_socketpair].contains(&nr) {
                libc::AF_UNIX as u64
            } else {
                0
            };
            assert_eq!(run(nr, arg0, libc::FIONBIO, 0), RET_ALLOW, "{nr}");
        }
    }

    /// Every number from 0 past [`KNOWN_UP_TO`] answers what the tables say, so the search
    /// the program does agrees with the lists it was built from.
    #[test]
    fn every_number_answers_as_the_tables_say() {
        let v = verdicts();
        for nr in 0..KNOWN_UP_TO + 64 {
            let want = match v.get(nr as usize) {
                None => ENOSYS,
                Some(Verdict::Return(k)) => *k,
                Some(Verdict::Rule(_)) => continue,
            };
            assert_eq!(
                run_with(arch(), nr, [7, 7, 7, 7, 7, 7]),
                want,
                "number {nr}"
            );
        }
        for (name, nr) in allowed() {
            assert_eq!(plain(nr), RET_ALLOW, "{name}");
        }
    }

    #[test]
    fn the_lists_are_apart_and_within_the_known_numbers() {
        let allowed = allowed();
        let mut seen = std::collections::BTreeMap::new();
        for (name, nr) in allowed
            .iter()
            .copied()
            .chain(RULES.iter().map(|(n, nr, _)| (*n, *nr)))
            .chain(DENIED.iter().copied())
            .chain([("clone3", libc::SYS_clone3)])
        {
            assert!(
                (0..=i64::from(KNOWN_UP_TO)).contains(&nr),
                "{name} {nr} above KNOWN_UP_TO"
            );
            if let Some(other) = seen.insert(nr, name) {
                panic!("{name} and {other} are both number {nr}, or listed twice");
            }
        }
        assert!(allowed.len() > 250, "{} allowed", allowed.len());
    }

    #[test]
    fn the_program_is_whole_instructions_and_its_digest_is_stable() {
        let p = program();
        assert_eq!(p.len() % 8, 0);
        assert!(
            p.len() / 8 < 4096,
            "BPF programs are limited to 4096 instructions"
        );
        assert_eq!(digest(), digest());
        assert!(digest().starts_with("sha256:") && digest().len() == 7 + 64);
    }

    #[test]
    fn every_jump_lands_inside_the_program_and_it_ends_in_a_return() {
        let ins = instructions();
        for (i, (code, jt, jf, k)) in ins.iter().enumerate() {
            if *code == JA {
                assert!(i + 1 + (*k as usize) < ins.len(), "ja of {i}");
            } else if *code & 0x07 == 0x05 {
                assert!(i + 1 + usize::from(*jt) < ins.len(), "jt of {i}");
                assert!(i + 1 + usize::from(*jf) < ins.len(), "jf of {i}");
            }
        }
        assert_eq!(ins.last().map(|i| i.0), Some(RET_K));
        let names: Vec<&str> = DENIED.iter().map(|(n, _)| *n).collect();
        for must in [
            "mount",
            "ptrace",
            "kexec_load",
            "bpf",
            "keyctl",
            "userfaultfd",
            "unshare",
            "perf_event_open",
            "memfd_secret",
            "mbind",
        ] {
            assert!(names.contains(&must), "{must}");
        }
    }
}
