//! The worker's seccomp filter: once QuickJS is loaded, the worker may compute, allocate and
//! free memory, read the time and random bytes, write to its stdout and stderr, and exit.
//! Every other system call fails with `EPERM`: no `open`/`openat` (so no file is opened, for
//! reading or writing), no `execve`, no `socket`, no `clone`/`fork`, no `kill`, no `ptrace`.
//!
//! `no_new_privs` is set first (the kernel requires it for an unprivileged filter, and it
//! keeps anything the worker might execute from gaining privileges).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// System calls allowed with any arguments. (`i64`: seccomp filters exist for 64-bit
/// targets only, where a system call number is a `c_long` of 64 bits.)
const ALLOWED: &[i64] = &[
    libc::SYS_read,
    libc::SYS_close,
    libc::SYS_exit,
    libc::SYS_exit_group,
    // Memory: the allocator and the engine's garbage collector.
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_mprotect,
    // Signals delivered to the worker itself (SIGXCPU at the CPU limit) and their return.
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigaction,
    libc::SYS_sigaltstack,
    // Time, random numbers, locks.
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_gettimeofday,
    libc::SYS_getrandom,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_getpid,
    libc::SYS_gettid,
];

fn arch() -> Result<seccompiler::TargetArch, String> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e| format!("no seccomp filter for this architecture: {e:?}"))
}

/// The filter as a BPF program.
pub fn program() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|n| (*n, Vec::new())).collect();
    // write and writev: to stdout and stderr only.
    let to_fd = |fd: u64| -> Result<SeccompRule, String> {
        let c = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, fd)
            .map_err(|e| e.to_string())?;
        SeccompRule::new(vec![c]).map_err(|e| e.to_string())
    };
    for call in [libc::SYS_write, libc::SYS_writev] {
        rules.insert(call, vec![to_fd(1)?, to_fd(2)?]);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch()?,
    )
    .map_err(|e| format!("cannot build the seccomp filter: {e}"))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| format!("cannot compile the seccomp filter: {e}"))
}

/// Sets `no_new_privs` and installs the filter on every thread of the worker.
pub fn lock_down() -> Result<(), String> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("cannot set no_new_privs: {e}"))?;
    let prog = program()?;
    seccompiler::apply_filter_all_threads(&prog)
        .map_err(|e| format!("cannot install the seccomp filter: {e}"))
}
