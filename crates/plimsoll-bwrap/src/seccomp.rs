//! The seccomp filter every sandbox runs under, written as classic BPF by hand (it is a
//! short deny list, and writing it out keeps every instruction visible and its digest
//! stable), and handed to `bwrap --seccomp`.
//!
//! What it denies is what container runtimes deny by default to code without
//! capabilities: mounting and pivoting, tracing other processes or reading their memory,
//! loading kernels, modules or BPF programs, the kernel keyring, `userfaultfd`,
//! `perf_event_open`, `io_uring`, entering or creating namespaces (`unshare`, `setns`, and
//! `clone` with `CLONE_NEWUSER`), taking or comparing other processes' files and memory
//! (`pidfd_getfd`, `kcmp`, `process_madvise`), setting clocks, swap, reboot, accounting and
//! quotas, and sockets of the families a network namespace does not enclose (`AF_VSOCK`,
//! which reaches the hypervisor or the host's VMs) or that expose kernel crypto (`AF_ALG`).
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
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("kcmp", libc::SYS_kcmp),
    ("process_madvise", libc::SYS_process_madvise),
    #[cfg(target_arch = "x86_64")]
    ("iopl", libc::SYS_iopl),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", libc::SYS_ioperm),
    #[cfg(target_arch = "x86_64")]
    ("uselib", libc::SYS_uselib),
];

/// `CLONE_NEWUSER`: `clone` with it is denied.
const CLONE_NEWUSER: u32 = 0x1000_0000;
/// Socket families denied (`socket`'s first argument): `AF_VSOCK`, `AF_ALG`.
const DENIED_FAMILIES: [u32; 2] = [40, 38];

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
    for (_, nr) in DENIED {
        p.push((JEQ_K, 0, 1, *nr as u32));
        p.push((RET_K, 0, 0, eperm));
    }
    p.push((JEQ_K, 0, 1, libc::SYS_clone3 as u32));
    p.push((RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32));
    // socket: denied for the families above (args[0]); allowed otherwise.
    p.push((JEQ_K, 0, 5, libc::SYS_socket as u32));
    p.push((LD_W_ABS, 0, 0, ARG0_LOW));
    p.push((JEQ_K, 2, 0, DENIED_FAMILIES[0]));
    p.push((JEQ_K, 1, 0, DENIED_FAMILIES[1]));
    p.push((RET_K, 0, 0, RET_ALLOW));
    p.push((RET_K, 0, 0, eperm));
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

    /// Runs the filter the way the kernel does, over one `seccomp_data`.
    fn run(arch: u32, nr: u32, arg0: u64) -> u32 {
        let ins = instructions();
        let word = |off: u32| -> u32 {
            match off {
                NR => nr,
                ARCH => arch,
                ARG0_LOW => arg0 as u32,
                other => panic!("the filter loads offset {other}"),
            }
        };
        let (mut pc, mut a) = (0usize, 0u32);
        loop {
            let (code, jt, jf, k) = ins[pc];
            pc += 1;
            match code {
                LD_W_ABS => a = word(k),
                JEQ_K => pc += usize::from(if a == k { jt } else { jf }),
                JGE_K => pc += usize::from(if a >= k { jt } else { jf }),
                JSET_K => pc += usize::from(if a & k != 0 { jt } else { jf }),
                RET_K => return k,
                other => panic!("unknown opcode {other:#x}"),
            }
        }
    }

    #[test]
    fn each_rule_answers_as_documented() {
        let arch = AUDIT_ARCH.expect("a supported architecture");
        let eperm = RET_ERRNO | libc::EPERM as u32;
        let nr = |n: i64| n as u32;
        for (name, n) in DENIED {
            assert_eq!(run(arch, nr(*n), 0), eperm, "{name}");
        }
        assert_eq!(run(arch, nr(libc::SYS_getpid), 0), RET_ALLOW);
        assert_eq!(run(arch, nr(libc::SYS_read), 0), RET_ALLOW);
        assert_eq!(
            run(arch, nr(libc::SYS_clone3), 0),
            RET_ERRNO | libc::ENOSYS as u32
        );
        // clone: denied only with CLONE_NEWUSER among its flags (any other bits set too).
        let clone = nr(libc::SYS_clone);
        assert_eq!(run(arch, clone, 0x0120_0011), RET_ALLOW);
        assert_eq!(run(arch, clone, u64::from(CLONE_NEWUSER) | 0x11), eperm);
        // socket: AF_VSOCK and AF_ALG denied, the rest (AF_UNIX, AF_INET) allowed.
        let socket = nr(libc::SYS_socket);
        assert_eq!(run(arch, socket, 40), eperm);
        assert_eq!(run(arch, socket, 38), eperm);
        assert_eq!(run(arch, socket, 1), RET_ALLOW);
        assert_eq!(run(arch, socket, 2), RET_ALLOW);
        // Another architecture (i386's int 0x80 ABI) is killed, whatever the call.
        assert_eq!(run(0x4000_0003, nr(libc::SYS_getpid), 0), RET_KILL_PROCESS);
        if cfg!(target_arch = "x86_64") {
            // The x32 ABI: numbers with bit 30 set are killed.
            assert_eq!(
                run(arch, 0x4000_0000 | nr(libc::SYS_getpid), 0),
                RET_KILL_PROCESS
            );
        }
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
