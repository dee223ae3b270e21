//! The same policy as a Docker (OCI) seccomp profile, for the Docker provider's containers
//! under runc: the engine's JSON format, which runc compiles with libseccomp.
//!
//! Every rule is written so that libseccomp's reading of it cannot differ from the BPF
//! program's:
//! - Each argument rule holds exactly one comparison, so runc never has to split two
//!   comparisons of one argument into rules it joins with OR.
//! - Comparisons are `SCMP_CMP_MASKED_EQ` with a mask inside the low 32 bits, which is what
//!   the kernel reads of each argument these rules look at (and all the BPF program loads);
//!   a plain `SCMP_CMP_EQ` would compare 64 bits, and an `ioctl` request with junk in the
//!   high half would then slip past a rule the kernel ignores the half of.
//! - Refusing two `ioctl` requests and allowing every other is written as the allowed
//!   requests: every 32-bit prefix that leads to neither (at most 32 rules per refused
//!   value), all `SCMP_ACT_ALLOW`. The profile never mixes an allow and a refusal on one
//!   call, whose precedence libseccomp would decide.
//!
//! What it cannot say: a number above the newest known call answers `EPERM` from the
//! profile's default where the BPF program answers `ENOSYS`; runc (1.0 and later) itself
//! answers `ENOSYS` for calls newer than any the profile names. A call this host's
//! libseccomp does not know by name is skipped by runc: it stays refused.

use serde_json::{json, Value};

use super::{
    allowed, Rule, AT_EMPTY_PATH, CLONE_NAMESPACES, FAMILIES, MFD_EXEC, MFD_NOEXEC_SEAL, PERSONAS,
    REFUSED_IOCTLS, RULES,
};

/// libseccomp's name for the architecture plimsoll was built for.
#[cfg(target_arch = "x86_64")]
const ARCHITECTURE: &str = "SCMP_ARCH_X86_64";
#[cfg(target_arch = "aarch64")]
const ARCHITECTURE: &str = "SCMP_ARCH_AARCH64";
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ARCHITECTURE: &str = "SCMP_ARCH_NATIVE";

/// The profile as JSON text, as the engine takes it in `--security-opt seccomp=<json>`.
/// The same text every time (its digest is part of the Docker provider's policy digest).
pub fn docker_profile() -> String {
    profile().to_string()
}

/// The profile as a JSON value.
pub fn profile() -> Value {
    let mut names: Vec<String> = allowed().iter().map(|(n, _)| plain_name(n)).collect();
    names.sort();
    names.dedup();
    let mut syscalls = vec![
        json!({"names": names, "action": "SCMP_ACT_ALLOW"}),
        json!({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS}),
    ];
    for (name, _, rule) in RULES {
        for (index, mask, value) in allowed_when(*rule) {
            syscalls.push(json!({
                "names": [name],
                "action": "SCMP_ACT_ALLOW",
                "args": [{"index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ"}],
            }));
        }
    }
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": libc::EPERM,
        "architectures": [ARCHITECTURE],
        "syscalls": syscalls,
    })
}

/// A call's name as libseccomp knows it (`SYS_read` → `read`).
fn plain_name(name: &str) -> String {
    name.strip_prefix("SYS_").unwrap_or(name).to_owned()
}

/// The argument values a rule allows, as alternatives `(index, mask, value)`: the call is
/// allowed when, for one of them, `args[index] & mask == value`.
fn allowed_when(rule: Rule) -> Vec<(u32, u64, u64)> {
    const LOW: u64 = 0xffff_ffff;
    match rule {
        Rule::Clone => vec![(0, u64::from(CLONE_NAMESPACES), 0)],
        Rule::Family => FAMILIES.iter().map(|f| (0, LOW, u64::from(*f))).collect(),
        Rule::Persona => PERSONAS.iter().map(|p| (0, LOW, u64::from(*p))).collect(),
        Rule::Ioctl => all_but(&REFUSED_IOCTLS)
            .into_iter()
            .map(|(mask, value)| (1, u64::from(mask), u64::from(value)))
            .collect(),
        Rule::ExecveatFd => vec![(4, u64::from(AT_EMPTY_PATH), 0)],
        Rule::MemfdNoexec => vec![(
            1,
            u64::from(MFD_EXEC | MFD_NOEXEC_SEAL),
            u64::from(MFD_NOEXEC_SEAL),
        )],
    }
}

/// Every 32-bit value but `refused`, as `(mask, value)` prefixes: a word `w` is covered
/// when `w & mask == value` for one of them, and no refused value is.
fn all_but(refused: &[u32]) -> Vec<(u32, u32)> {
    fn cover(prefix: u32, bits: u32, refused: &[u32], out: &mut Vec<(u32, u32)>) {
        let mask = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        let inside: Vec<u32> = refused
            .iter()
            .copied()
            .filter(|r| r & mask == prefix)
            .collect();
        if inside.is_empty() {
            out.push((mask, prefix));
        } else if bits < 32 {
            let next = 1u32 << (31 - bits);
            cover(prefix, bits + 1, &inside, out);
            cover(prefix | next, bits + 1, &inside, out);
        }
    }
    let mut out = Vec::new();
    cover(0, 0, refused, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::{arch, run_with};
    use super::super::{DENIED, ENOSYS, EPERM, RET_ALLOW};
    use super::*;

    /// What the engine's runtime answers for `name` with `args`, read the way runc and
    /// libseccomp read the profile: the call is allowed when an `SCMP_ACT_ALLOW` entry
    /// naming it has every comparison true; an `SCMP_ACT_ERRNO` entry naming it (with every
    /// comparison true) answers its errno; anything else gets the default.
    fn answer(p: &Value, name: &str, args: [u64; 6]) -> u32 {
        let mut verdict = None;
        for entry in p["syscalls"].as_array().expect("syscalls") {
            let names = entry["names"].as_array().expect("names");
            if !names.iter().any(|n| n == name) {
                continue;
            }
            let matched = entry["args"].as_array().is_none_or(|conds| {
                conds.iter().all(|c| {
                    assert_eq!(c["op"], "SCMP_CMP_MASKED_EQ", "only masked comparisons");
                    let i = c["index"].as_u64().expect("index") as usize;
                    let mask = c["value"].as_u64().expect("mask");
                    let value = c["valueTwo"].as_u64().expect("value");
                    args[i] & mask == value
                })
            });
            if !matched {
                continue;
            }
            let this = match entry["action"].as_str() {
                Some("SCMP_ACT_ALLOW") => RET_ALLOW,
                Some("SCMP_ACT_ERRNO") => {
                    0x0005_0000 | entry["errnoRet"].as_u64().expect("errnoRet") as u32
                }
                other => panic!("action {other:?}"),
            };
            assert!(
                verdict.is_none_or(|v| v == this),
                "{name}: two entries answer differently"
            );
            verdict = Some(this);
        }
        verdict.unwrap_or(0x0005_0000 | p["defaultErrnoRet"].as_u64().expect("default") as u32)
    }

    /// Argument words worth trying for a rule: every value it names, its neighbours, each
    /// single bit, and the same with junk in the high half (which the kernel ignores).
    fn probes() -> Vec<u64> {
        let mut v: Vec<u64> = vec![0, 1, 2, 0xffff_ffff, 0x1_0000_0000];
        v.extend(FAMILIES.iter().map(|f| u64::from(*f)));
        v.extend(0..64u64);
        v.extend(PERSONAS.iter().map(|p| u64::from(*p)));
        for r in REFUSED_IOCTLS {
            v.extend([r - 1, r, r + 1, r ^ 0x8000_0000].map(u64::from));
        }
        v.extend((0..32).map(|b| 1u64 << b));
        v.extend([0x5401, 0x5413, 0x541b, 0x541d, 0x8004_5430, 0xc008_5401]);
        v.extend([
            0x18,
            0x8,
            0x10,
            0x9,
            0x1000,
            0x1100,
            0x7e02_0000,
            0x0001_0000,
        ]);
        let high: Vec<u64> = v.iter().map(|x| x | 0xdead_0000_0000_0000).collect();
        v.extend(high);
        v
    }

    #[test]
    fn the_profile_answers_every_call_as_the_bpf_program_does() {
        let p = profile();
        let mut calls: Vec<(String, i64)> = allowed()
            .iter()
            .map(|(n, nr)| (plain_name(n), *nr))
            .collect();
        calls.extend(DENIED.iter().map(|(n, nr)| ((*n).to_owned(), *nr)));
        calls.extend(RULES.iter().map(|(n, nr, _)| ((*n).to_owned(), *nr)));
        calls.push(("clone3".to_owned(), libc::SYS_clone3));
        let probes = probes();
        let mut compared = 0;
        for (name, nr) in &calls {
            let ruled = RULES.iter().any(|(n, _, _)| n == name);
            let words: &[u64] = if ruled { &probes } else { &[0] };
            for &w in words {
                for args in [[w, 0, 0, 0, 0, 0], [0, w, 0, 0, 0, 0], [0, 0, 0, 0, w, 0]] {
                    // The BPF program sees the low halves only; so does the kernel.
                    let bpf = run_with(arch(), *nr as u32, args);
                    assert_eq!(answer(&p, name, args), bpf, "{name} {args:x?}");
                    compared += 1;
                }
            }
        }
        assert!(compared > 5_000, "only {compared} comparisons");
        // The answers this relies on, named.
        let sti = u64::from(libc::TIOCSTI as u32);
        assert_eq!(answer(&p, "ioctl", [1, sti, 0, 0, 0, 0]), EPERM);
        assert_eq!(answer(&p, "ioctl", [1, sti | 1 << 40, 0, 0, 0, 0]), EPERM);
        assert_eq!(answer(&p, "ioctl", [1, 0x5401, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(answer(&p, "socket", [40, 1, 0, 0, 0, 0]), EPERM);
        assert_eq!(answer(&p, "clone3", [0; 6]), ENOSYS);
        assert_eq!(answer(&p, "ptrace", [0; 6]), EPERM);
        assert_eq!(answer(&p, "memfd_create", [0, 0x8, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(answer(&p, "memfd_create", [0, 0x0, 0, 0, 0, 0]), EPERM);
    }

    #[test]
    fn every_refused_ioctl_and_nothing_else_is_left_out() {
        let cover = all_but(&REFUSED_IOCTLS);
        assert!(cover.len() <= 64, "{} rules", cover.len());
        let covered = |w: u32| cover.iter().any(|(m, v)| w & m == *v);
        for r in REFUSED_IOCTLS {
            assert!(!covered(r), "{r:#x} allowed");
            for b in 0..32 {
                assert!(covered(r ^ (1 << b)), "{:#x} refused", r ^ (1 << b));
            }
        }
        // The prefixes do not overlap: every word is covered by at most one.
        for w in [0u32, 1, 0x5401, 0x5411, 0x5413, 0x541d, u32::MAX] {
            assert_eq!(cover.iter().filter(|(m, v)| w & m == *v).count(), 1);
        }
    }

    #[test]
    fn the_profile_is_json_the_engine_reads_and_stable() {
        let text = docker_profile();
        assert_eq!(text, docker_profile());
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(v["architectures"], json!([ARCHITECTURE]));
        let names: Vec<&str> = v["syscalls"][0]["names"]
            .as_array()
            .expect("names")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(names.contains(&"read") && names.contains(&"execve"));
        assert!(names.iter().all(|n| !n.starts_with("SYS_")));
        for (denied, _) in DENIED {
            assert!(!text.contains(&format!("\"{denied}\"")), "{denied} named");
        }
    }
}
