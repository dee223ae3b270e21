//! The seccomp filter every sandbox runs under, written as classic BPF by hand (it is a
//! short deny list, and writing it out keeps every instruction visible and its digest
//! stable), and handed to `bwrap --seccomp`.
//!
//! What it denies is what container runtimes deny by default to code without
//! capabilities: mounting and pivoting, tracing other processes or reading their memory,
//! loading kernels, modules or BPF programs, the kernel keyring, `userfaultfd`,
//! `perf_event_open`, `io_uring`, entering or creating namespaces (`unshare`, `setns`, and
//! `clone` with `CLONE_NEWUSER`), setting clocks, swap, reboot, accounting and quotas.
//! Denied calls fail with `EPERM`. `clone3` fails with `ENOSYS`, because its flags sit in
//! memory the filter cannot read: the C library then falls back to `clone`, whose flags
//! the filter checks. Any other architecture than the one plimsoll was built for is
//! killed, and so is the x32 ABI on x86-64.
//!
//! bwrap sets `no_new_privs` before it installs the filter.

/// The filter's instructions in the kernel's `struct sock_filter` layout, native endian:
/// 8 bytes each, ready to be read by `bwrap --seccomp FD`.
pub fn program() -> Vec<u8> {
    let mut out = Vec::with_capacity(instructions().len() * 8);
    for (code, jt, jf, k) in instructions() {
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

/// System calls denied with `EPERM`, whatever their arguments.
pub const DENIED: &[(&str, i64)] = &[
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
    ("syslog", libc::SYS_syslog),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("sethostname", libc::SYS_sethostname),
    ("setdomainname", libc::SYS_setdomainname),
    ("vhangup", libc::SYS_vhangup),
    #[cfg(target_arch = "x86_64")]
    ("iopl", libc::SYS_iopl),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", libc::SYS_ioperm),
    #[cfg(target_arch = "x86_64")]
    ("uselib", libc::SYS_uselib),
];

/// `CLONE_NEWUSER`: `clone` with it is denied.
const CLONE_NEWUSER: u32 = 0x1000_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

// Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;

// Offsets in `struct seccomp_data`: nr, arch, then instruction_pointer, then args[6]
// (the low 32 bits of args[0] on a little-endian machine).
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0_LOW: u32 = 16;

/// The filter, one `(code, jt, jf, k)` per instruction.
fn instructions() -> Vec<(u16, u8, u8, u32)> {
    let eperm = RET_ERRNO | libc::EPERM as u32;
    let mut p = vec![
        (LD_W_ABS, 0, 0, ARCH),
        (JEQ_K, 1, 0, AUDIT_ARCH),
        (RET_K, 0, 0, RET_KILL_PROCESS),
        (LD_W_ABS, 0, 0, NR),
    ];
    if cfg!(target_arch = "x86_64") {
        // The x32 ABI (numbers with bit 30 set) would reach the same calls by other numbers.
        p.push((JGE_K, 0, 1, 0x4000_0000));
        p.push((RET_K, 0, 0, RET_KILL_PROCESS));
    }
    for (_, nr) in DENIED {
        p.push((JEQ_K, 0, 1, *nr as u32));
        p.push((RET_K, 0, 0, eperm));
    }
    p.push((JEQ_K, 0, 1, libc::SYS_clone3 as u32));
    p.push((RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32));
    // clone: denied when its flags (args[0]) ask for a new user namespace.
    p.push((JEQ_K, 0, 3, libc::SYS_clone as u32));
    p.push((LD_W_ABS, 0, 0, ARG0_LOW));
    p.push((JSET_K, 0, 1, CLONE_NEWUSER));
    p.push((RET_K, 0, 0, eperm));
    p.push((RET_K, 0, 0, RET_ALLOW));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for (i, (code, jt, jf, _)) in ins.iter().enumerate() {
            if *code & 0x07 == 0x05 {
                assert!(i + 1 + usize::from(*jt) < ins.len(), "jt of {i}");
                assert!(i + 1 + usize::from(*jf) < ins.len(), "jf of {i}");
            }
        }
        assert_eq!(ins.last(), Some(&(RET_K, 0, 0, RET_ALLOW)));
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
        ] {
            assert!(names.contains(&must), "{must}");
        }
    }
}
