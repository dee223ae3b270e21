//! The bwrap provider against the real bubblewrap: startup proof, languages, and the
//! hardening suite the Docker provider passes, from inside a run.

mod support;

use plimsoll_core::{pb, Tier};
use plimsoll_provider::Provider;
use plimsoll_provider::Work;
use support::*;

#[tokio::test]
async fn javascript_python_and_shell_run_in_a_sandbox_proven_container() {
    let Some(_) = bwrap() else { return };
    let (_d, state) = state_dir();
    let p = started(config(&state)).await;
    let f = p.facts();
    assert_eq!(f.tier, Some(Tier::Container));
    assert_eq!(f.languages, ["javascript", "python", "shell"]);
    assert!(f.environment.starts_with("bwrap:0."), "{}", f.environment);
    assert!(
        f.environment.contains(";seccomp=sha256:"),
        "{}",
        f.environment
    );
    let j = as_js(p.run(js("console.log(6 * 7)"), T).await.unwrap());
    assert_eq!(j.stdout, b"42\n", "{j:?}");
    let r = as_project(
        p.run(
            project(&["python3 -c 'print(6*7)'", "echo $((6*7))", "hostname"]),
            T,
        )
        .await
        .unwrap(),
    );
    assert_eq!(stdout(&r, 0), "42");
    assert_eq!(stdout(&r, 1), "42");
    assert_eq!(stdout(&r, 2), "plimsoll");
    p.shutdown().await;
}

/// Host pids whose command line contains `marker`.
fn host_pids_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&c).contains(marker) {
                out.push(pid);
            }
        }
    }
    out
}

fn marker() -> String {
    format!("plimsoll-mark-{}", rand_hex())
}

fn rand_hex() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let n = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:x}{:x}", n, std::process::id())
}

#[tokio::test]
async fn hardening_is_proven_from_inside_a_run() {
    let Some(_) = bwrap() else { return };
    let (_d, state) = state_dir();
    let p = started(config(&state)).await;
    let r = as_project(
        p.run(
            project(&[
                // 0: cannot write / or /usr.
                "touch /plimsoll-probe 2>&1; echo rc=$?; touch /usr/plimsoll-probe 2>/dev/null; echo rc=$?",
                // 1: no interface but lo, by two sources.
                "ls /sys/class/net 2>/dev/null; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
                // 2: not root inside.
                "id -u; id -g",
                // 3: empty capability sets, seccomp filter mode, no new privileges.
                "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|Seccomp|NoNewPrivs):' /proc/self/status",
                // 4: a program can still write where runs are meant to.
                "echo ok > here.txt && cat here.txt && echo tmp > /tmp/x && cat /tmp/x",
                // 5: no route anywhere.
                "python3 -c \"import socket\ntry:\n socket.create_connection(('1.1.1.1', 53), timeout=3)\n print('connected')\nexcept OSError as e:\n print('no-network', e.errno)\"",
                // 6: host paths are absent.
                "for p in /home /root /var /etc/passwd /var/run/docker.sock /run/containerd; do [ -e $p ] && echo present $p; done; echo checked",
                // 7: PID 1 is sandboxd (no bwrap init inside) and only the run's processes are
                // visible.
                "tr '\\0' ' ' < /proc/1/cmdline | cut -d' ' -f1; ls /proc | grep -c '^[0-9]'",
                // 8: (Landlock) a copied binary runs neither from /tmp nor from the working
                // directory, though both are writable.
                "for d in /tmp .; do cp /bin/true $d/t && $d/t; echo \"$d rc=$?\"; done",
                // 9: /dev takes no file, /dev/shm is bounded (16 MiB), /dev/null still works.
                "( : > /dev/plimsoll-probe ) 2>/dev/null && echo 'wrote /dev'; head -c 20971520 /dev/zero > /dev/shm/big 2>/dev/null && echo 'shm unbounded'; echo ok > /dev/null && echo checked",
                // 10: sandboxd shares the run's user but its memory and environment are closed.
                "for p in /proc/[0-9]*; do if tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^/run/plimsoll-sandboxd'; then echo \"sandboxd $p\"; cat $p/environ >/dev/null 2>&1 && echo \"read $p/environ\"; head -c 1 $p/mem >/dev/null 2>&1 && echo \"read $p/mem\"; fi; done",
            ]),
            T,
        )
        .await
        .unwrap(),
    );
    assert_eq!(r.steps.len(), 11, "{r:?}");
    let root = stdout(&r, 0);
    assert!(!root.contains("rc=0"), "{root}");
    assert!(root.contains("Read-only file system"), "{root}");
    let net: Vec<String> = stdout(&r, 1).lines().map(str::to_owned).collect();
    assert!(!net.is_empty());
    assert!(net.iter().all(|i| i == "lo"), "interfaces: {net:?}");
    let ids: Vec<u32> = stdout(&r, 2).lines().map(|l| l.parse().unwrap()).collect();
    assert!(ids.iter().all(|i| *i != 0), "uid/gid {ids:?}");
    let status = stdout(&r, 3);
    for line in status.lines().filter(|l| l.starts_with("Cap")) {
        let v = line.split(':').nth(1).unwrap().trim();
        assert!(v.chars().all(|c| c == '0'), "{line}");
    }
    assert_eq!(
        status.lines().filter(|l| l.starts_with("Cap")).count(),
        5,
        "{status}"
    );
    assert!(status.lines().any(|l| l == "Seccomp:\t2"), "{status}");
    assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");
    assert_eq!(stdout(&r, 4), "ok\ntmp");
    assert!(stdout(&r, 5).starts_with("no-network"), "{}", stdout(&r, 5));
    assert_eq!(stdout(&r, 6), "checked");
    let init = stdout(&r, 7);
    let mut lines = init.lines();
    assert_eq!(lines.next().unwrap(), "/run/plimsoll-sandboxd", "{init}");
    let visible: u32 = lines.next().unwrap().parse().unwrap();
    // sandboxd, the step's shell and its children: a handful, not the host's.
    assert!(visible < 12, "{visible} processes visible: {init}");
    // The kernels plimsoll is tested on offer Landlock: the layer must hold there.
    assert!(
        p.facts().environment.ends_with(";landlock"),
        "{}",
        p.facts().environment
    );
    let exec = stdout(&r, 8);
    assert_eq!(exec.lines().count(), 2, "{exec}");
    for line in exec.lines() {
        assert!(!line.ends_with(" rc=0"), "a copied binary ran: {exec}");
    }
    assert_eq!(stdout(&r, 9), "checked", "/dev");
    let sd = stdout(&r, 10);
    assert!(
        sd.starts_with("sandboxd /proc/"),
        "sandboxd not found: {sd}"
    );
    assert!(
        !sd.contains("read "),
        "the run reads sandboxd's memory or environment: {sd}"
    );
    p.shutdown().await;
}

/// The filter's denials, each checked where the kernel would otherwise allow the call to a
/// user without capabilities (so the answer is the filter's, not the missing capability's).
#[tokio::test]
async fn the_seccomp_filter_denies_what_containers_deny() {
    let Some(_) = bwrap() else { return };
    let (_d, state) = state_dir();
    let p = started(config(&state)).await;
    let code = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
arm = os.uname().machine == 'aarch64'
def call(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(name, r, ctypes.get_errno() if r == -1 else 0)
call('keyctl', 219 if arm else 250, 0, -3, 0)
call('io_uring_setup', 425, 1, ctypes.create_string_buffer(120))
call('clone3', 435, None, 0)
call('unshare', 97 if arm else 272, 0x10000000)
call('userfaultfd', 282 if arm else 323, 1)
call('getpid', 172 if arm else 39)
call('socket_vsock', 198 if arm else 41, 40, 1, 0)
call('socket_alg', 198 if arm else 41, 38, 5, 0)
call('socket_unix', 198 if arm else 41, 1, 1, 0)
r = libc.syscall(220 if arm else 56, 0x10000000 | 17, 0, 0, 0, 0)
if r == 0:
    os._exit(0)
print('clone_newuser', r, ctypes.get_errno() if r == -1 else 0)
"#;
    let r = as_project(
        p.run(
            Work::Project(pb::ProjectRun {
                files: vec![pb::ProjectFile {
                    path: "calls.py".into(),
                    content: code.into(),
                }],
                steps: vec![
                    "python3 calls.py".into(),
                    "unshare -U true; echo rc=$?".into(),
                ],
                artifacts: vec![],
                grant_profile: String::new(),
            }),
            T,
        )
        .await
        .unwrap(),
    );
    let out = stdout(&r, 0);
    let got: std::collections::HashMap<&str, (i64, i64)> = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0], (f[1].parse().unwrap(), f[2].parse().unwrap()))
        })
        .collect();
    let err = String::from_utf8_lossy(&r.steps[0].stderr);
    assert_eq!(got.len(), 10, "{out} {err}");
    // clone with CLONE_NEWUSER: EPERM from the filter (bwrap's --disable-userns alone
    // would answer ENOSPC), as are AF_VSOCK and AF_ALG sockets; AF_UNIX works.
    assert!(got["socket_unix"].0 >= 0, "{out}");
    for denied in [
        "keyctl",
        "io_uring_setup",
        "unshare",
        "userfaultfd",
        "socket_vsock",
        "socket_alg",
        "clone_newuser",
    ] {
        assert_eq!(got[denied], (-1, 1), "{denied} must fail with EPERM: {out}");
    }
    // clone3 falls back: ENOSYS, so the C library uses clone, whose flags the filter reads.
    assert_eq!(got["clone3"], (-1, 38), "{out}");
    assert!(got["getpid"].0 > 0, "{out}");
    assert!(!stdout(&r, 1).ends_with("rc=0"), "{}", stdout(&r, 1));
    p.shutdown().await;
}

/// Runs `code` as `calls.py` in a fresh sandbox and reads its lines `name result errno`.
async fn python_calls(code: &str) -> (std::collections::HashMap<String, (i64, i64)>, String) {
    let (_d, state) = state_dir();
    let p = started(config(&state)).await;
    let r = as_project(
        p.run(
            Work::Project(pb::ProjectRun {
                files: vec![pb::ProjectFile {
                    path: "calls.py".into(),
                    content: code.into(),
                }],
                steps: vec!["python3 calls.py".into()],
                artifacts: vec![],
                grant_profile: String::new(),
            }),
            T,
        )
        .await
        .unwrap(),
    );
    p.shutdown().await;
    let out = stdout(&r, 0);
    let err = String::from_utf8_lossy(&r.steps[0].stderr).into_owned();
    let got = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].to_owned(),
                (f[1].parse().unwrap(), f[2].parse().unwrap()),
            )
        })
        .collect();
    (got, format!("{out}\n{err}"))
}

/// The allowlist's argument rules and the calls it refuses that the deny list allowed
/// (issue 35), each answered `EPERM` where the kernel alone would have answered otherwise
/// (so the answer is the filter's), and what must keep working.
#[tokio::test]
async fn the_allowlist_refuses_personas_socket_families_ioctls_and_numa_calls() {
    let Some(_) = bwrap() else { return };
    let code = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
arm = os.uname().machine == 'aarch64'
def call(name, nr, *args):
    r = libc.syscall(nr, *args)
    print(name, r, ctypes.get_errno() if r == -1 else 0)
    return r
SOCKET, SOCKETPAIR, IOCTL = (198, 199, 29) if arm else (41, 53, 16)
PERSONALITY = 92 if arm else 135
call('personality_read_implies_exec', PERSONALITY, 0x0400000)
call('personality_query', PERSONALITY, 0xffffffff)
for name, family, kind in [('unix', 1, 1), ('inet', 2, 2), ('inet6', 10, 2), ('netlink', 16, 3)]:
    fd = call('socket_' + name, SOCKET, family, kind, 0)
    if fd >= 0:
        os.close(fd)
for name, family in [('packet', 17), ('key', 15), ('bluetooth', 31)]:
    call('socket_' + name, SOCKET, family, 3, 0)
pair = (ctypes.c_int * 2)()
call('socketpair_unix', SOCKETPAIR, 1, 1, 0, pair)
call('socketpair_packet', SOCKETPAIR, 17, 3, 0, pair)
# Every other family, whatever the kernel would say (most are EAFNOSUPPORT without it).
others = [f for f in range(46) if f not in (1, 2, 10, 16)]
answered = [libc.syscall(SOCKET, f, 2, 0) == -1 and ctypes.get_errno() == 1 for f in others]
print('other_families_eperm', sum(answered), len(others))
null = os.open('/dev/null', os.O_RDWR)
c = ctypes.c_char(b'x')
call('ioctl_tiocsti', IOCTL, null, 0x5412, ctypes.byref(c))
call('ioctl_tioclinux', IOCTL, null, 0x541C, ctypes.byref(c))
one = ctypes.c_int(1)
r, w = os.pipe()
call('ioctl_fionbio', IOCTL, r, 0x5421, ctypes.byref(one))
if not arm:
    call('modify_ldt', 154, 0, ctypes.create_string_buffer(64), 64)
    call('sysfs', 139, 3)
call('get_mempolicy', 236 if arm else 239, None, None, 0, None, 0)
call('set_mempolicy', 237 if arm else 238, 0, None, 0)
call('mbind', 235 if arm else 237, None, 0, 0, None, 0, 0)
call('move_pages', 239 if arm else 279, 0, 0, None, None, None, 0)
call('memfd_secret', 447, 0)
call('quotactl_fd', 443, null, 0, 0, None)
call('getpid', 172 if arm else 39)
"#;
    let (got, out) = python_calls(code).await;
    let eperm = (-1, 1);
    let mut refused = vec![
        "personality_read_implies_exec",
        "socket_packet",
        "socket_key",
        "socket_bluetooth",
        "socketpair_packet",
        "ioctl_tiocsti",
        "ioctl_tioclinux",
        "get_mempolicy",
        "set_mempolicy",
        "mbind",
        "move_pages",
        "memfd_secret",
        "quotactl_fd",
    ];
    if cfg!(target_arch = "x86_64") {
        refused.extend(["modify_ldt", "sysfs"]);
    }
    for name in refused {
        assert_eq!(
            got.get(name),
            Some(&eperm),
            "{name} must fail with EPERM: {out}"
        );
    }
    let (n, of) = got["other_families_eperm"];
    assert_eq!(
        n, of,
        "every other socket family must fail with EPERM: {out}"
    );
    for works in [
        "socket_unix",
        "socket_inet",
        "socket_inet6",
        "socket_netlink",
        "personality_query",
        "getpid",
    ] {
        assert!(got[works].0 >= 0, "{works} must work: {out}");
    }
    assert_eq!(got["socketpair_unix"], (0, 0), "{out}");
    assert_eq!(got["ioctl_fionbio"], (0, 0), "{out}");
}

/// A copy of `/bin/true` in a `memfd` does not run. A `memfd` can only be made with
/// `MFD_NOEXEC_SEAL` (not plain, not with `MFD_EXEC`): the Landlock layer does not cover
/// `memfd`s, and a plain one ran through `/proc/self/fd/N` before this rule. `execveat` on
/// the descriptor (`AT_EMPTY_PATH`, and glibc's `fexecve`, which uses it) is refused by the
/// filter; `/proc/self/fd/N` by the kernel, since the `memfd` is sealed non-executable.
/// `execveat` with a path still runs a system program.
#[tokio::test]
async fn a_binary_copied_into_a_memfd_does_not_run() {
    let Some(_) = bwrap() else { return };
    let code = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
arm = os.uname().machine == 'aarch64'
MEMFD_CREATE, EXECVEAT = (279, 281) if arm else (319, 322)
for name, flags in [('memfd_create_mfd_exec', 0x10), ('memfd_create_plain', 0)]:
    r = libc.syscall(MEMFD_CREATE, b'copy', flags)
    print(name, r, ctypes.get_errno() if r == -1 else 0)
fd = os.memfd_create('copy', 0x8)  # MFD_NOEXEC_SEAL
with open('/bin/true', 'rb') as f:
    os.write(fd, f.read())
argv = (ctypes.c_char_p * 2)(b'copy', None)
envp = (ctypes.c_char_p * 1)(None)
def execveat(dirfd, path, flags):
    if libc.syscall(EXECVEAT, dirfd, path, argv, envp, flags) == -1:
        raise OSError(ctypes.get_errno(), 'execveat')
def attempt(name, run):
    pid = os.fork()
    if pid == 0:
        try:
            run()
        except OSError as e:
            os.write(1, ('%s -1 %d\n' % (name, e.errno)).encode())
            os._exit(3)
        os._exit(4)
    status = os.waitpid(pid, 0)[1]
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        print(name, 0, 0)
attempt('execveat_empty_path', lambda: execveat(fd, b'', 0x1000))
attempt('fexecve', lambda: os.execve(fd, ['copy'], {}))
attempt('execve_proc_self_fd', lambda: os.execv('/proc/self/fd/%d' % fd, ['copy']))
attempt('execveat_path', lambda: execveat(-100, b'/bin/true', 0))
"#;
    let (got, out) = python_calls(code).await;
    assert_eq!(got.len(), 6, "{out}");
    // The filter's answers.
    assert_eq!(got["memfd_create_mfd_exec"], (-1, 1), "{out}");
    assert_eq!(got["memfd_create_plain"], (-1, 1), "{out}");
    assert_eq!(got["execveat_empty_path"], (-1, 1), "{out}");
    assert_eq!(got["fexecve"], (-1, 1), "{out}");
    // The kernel's: the sealed memfd has no execute permission (EACCES).
    assert_eq!(got["execve_proc_self_fd"], (-1, 13), "{out}");
    // A system program still runs through execveat (and the harness sees a run).
    assert_eq!(got["execveat_path"], (0, 0), "{out}");
}

#[tokio::test]
async fn the_code_is_not_root_on_the_host() {
    let Some(_) = bwrap() else { return };
    let (_d, state) = state_dir();
    let p = std::sync::Arc::new(started(config(&state)).await);
    let mark = marker();
    let run = {
        let p = p.clone();
        let step = format!("sh -c 'sleep 3; true' {mark}");
        tokio::spawn(async move { p.run(project(&[&step]), T).await })
    };
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen = host_pids_with(&mark);
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        !seen.is_empty(),
        "the run's process was not found from the host"
    );
    // As root: a user and group of the range's own, each sandbox another (not plimsolld's,
    // never root). Otherwise: plimsolld's own user.
    let range = plimsoll_bwrap::BwrapConfig::new(&Default::default()).run_as;
    for pid in seen {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if status.is_empty() {
            continue;
        }
        let ids = |name: &str| -> Vec<u32> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap()
                .split_whitespace()
                .map(|v| v.parse().unwrap())
                .collect()
        };
        let (uids, gids) = (ids("Uid:"), ids("Gid:"));
        assert!(
            uids.iter().all(|u| *u == uids[0]) && gids.iter().all(|g| *g == gids[0]),
            "{uids:?} {gids:?}"
        );
        match range {
            Some((u0, g0)) => {
                assert!(
                    (u0..u0 + 65_536).contains(&uids[0]),
                    "uid {uids:?} outside the range from {u0}"
                );
                assert!(
                    (g0..g0 + 65_536).contains(&gids[0]),
                    "gid {gids:?} outside the range from {g0}"
                );
            }
            None => assert_eq!(uids[0], nix::unistd::geteuid().as_raw()),
        }
        assert!(
            uids[0] != 0 && gids[0] != 0 || !plimsoll_bwrap::is_root(),
            "the code runs as host root"
        );
    }
    run.await.unwrap().unwrap();
    p.shutdown().await;
}

#[tokio::test]
async fn a_fork_bomb_is_stopped_by_the_process_limit() {
    let Some(_) = bwrap() else { return };
    let (_d, state) = state_dir();
    let mut c = config(&state);
    c.pids = 48;
    let p = started(c).await;
    let code = "import os, time\nn = 0\ntry:\n    while n < 10000:\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(60)\n            os._exit(0)\n        n += 1\n    print('unbounded', n)\nexcept OSError as e:\n    print('stopped', n, e.errno)\n";
    let r = as_project(
        p.run(
            Work::Project(pb::ProjectRun {
                files: vec![pb::ProjectFile {
                    path: "bomb.py".into(),
                    content: code.into(),
                }],
                steps: vec!["python3 bomb.py".into()],
                artifacts: vec![],
                grant_profile: String::new(),
            }),
            T,
        )
        .await
        .unwrap(),
    );
    let out = stdout(&r, 0);
    let mut words = out.split_whitespace();
    assert_eq!(
        words.next(),
        Some("stopped"),
        "{out} / {:?}",
        String::from_utf8_lossy(&r.steps[0].stderr)
    );
    let n: u32 = words.next().unwrap().parse().unwrap();
    assert!(n < 48, "{n} processes forked under a limit of 48");
    assert_eq!(words.next(), Some("11"), "EAGAIN expected: {out}");
    // The sandbox and every child of the bomb are gone, and the next run works.
    let j = as_js(p.run(js("console.log('next')"), T).await.unwrap());
    assert_eq!(j.stdout, b"next\n");
    p.shutdown().await;
}

/// The child leaves everything the runner's own sweep looks for (its process group, the
/// run's tag in its environment, a working directory inside the run's): only the end of the
/// sandbox's PID namespace can end it.
#[tokio::test]
async fn a_double_forked_setsid_child_is_gone_after_the_run() {
    let Some(_) = bwrap() else { return };
    let (_d, state) = state_dir();
    let p = started(config(&state)).await;
    let mark = marker();
    let step = format!(
        "cd / && setsid env -i sh -c 'sh -c \"sleep 300; true\" {mark} & exit 0' </dev/null >/dev/null 2>&1; sleep 0.3; echo started"
    );
    let r = as_project(p.run(project(&[&step]), T).await.unwrap());
    assert_eq!(stdout(&r, 0), "started");
    // The answer came after the sandbox's PID namespace ended.
    let left = host_pids_with(&mark);
    assert!(
        left.is_empty(),
        "processes of the run outlived it: {left:?}"
    );
    p.shutdown().await;
}

#[tokio::test]
async fn two_concurrent_runs_cannot_see_each_others_processes_files_or_environment() {
    let Some(_) = bwrap() else { return };
    let (_d, state) = state_dir();
    let p = std::sync::Arc::new(started(config(&state)).await);
    let secret = marker();
    let a = {
        let p = p.clone();
        let secret = secret.clone();
        tokio::spawn(async move {
            p.run_with_env(
                project(&[&format!("echo {secret} > /tmp/a-file; echo {secret} > a-file; sh -c 'sleep 3; true' {secret}")]),
                T,
                vec![("RUN_A_SECRET".into(), secret.clone())],
            )
            .await
        })
    };
    // Wait until run A's sleep is visible from the host.
    for _ in 0..300 {
        if !host_pids_with(&secret).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!host_pids_with(&secret).is_empty(), "run A did not start");
    // A pattern that matches the secret but not its own text (B's command line).
    let pattern = format!("[{}]{}", &secret[..1], &secret[1..]);
    let b = as_project(
        p.run(
            project(&[
                &format!("cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c '{pattern}'; true"),
                &format!("cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c '{pattern}'; true"),
                &format!("grep -rls '{pattern}' /tmp /work /run 2>/dev/null | wc -l"),
                "ls /proc | grep -c '^[0-9]'",
            ]),
            T,
        )
        .await
        .unwrap(),
    );
    // Run A was still running while B looked (B's answer came before A's sleep ended).
    assert!(
        !host_pids_with(&secret).is_empty(),
        "run A ended before run B finished: the runs did not overlap"
    );
    assert_eq!(stdout(&b, 0), "0", "run B sees run A's processes");
    assert_eq!(stdout(&b, 1), "0", "run B sees run A's environment");
    assert_eq!(stdout(&b, 2), "0", "run B sees run A's files");
    let a = as_project(a.await.unwrap().unwrap());
    assert_eq!(a.steps[0].exit_code, 0, "{a:?}");
    p.shutdown().await;
}

/// Where plimsolld has a delegated cgroup v2 with the memory controller, a run over
/// `SANDBOX_MEMORY_MB` fails its allocation or is killed while a small one runs; where it has
/// none (cgroup v1 or a hybrid, no delegation), startup refuses to claim the limit, naming
/// the variable and why.
#[tokio::test]
async fn the_memory_limit_is_enforced_or_startup_refuses_to_claim_it() {
    let Some(_) = bwrap() else { return };
    let (_d, state) = state_dir();
    let limits = plimsoll_bwrap::cgroup::Limits {
        memory_mb: 96,
        cpus: 0.0,
    };
    let shared = plimsoll_provider::Shared {
        state_dir: state.clone(),
        resources: plimsoll_provider::Resources {
            memory_mb: 96,
            ..Default::default()
        },
        explicit_resources: vec!["SANDBOX_MEMORY_MB"],
        ..Default::default()
    };
    let read = <plimsoll_bwrap::BwrapConfig as plimsoll_provider::ProviderSetup>::from_env(
        &plimsoll_config::MapEnv::default(),
        &shared,
    );
    match plimsoll_bwrap::cgroup::find(&limits) {
        Err(why) => {
            // No delegated cgroup v2: the same number becomes a bound per process
            // (RLIMIT_AS, RLIMIT_DATA), stated as such; `bwrap_memory` runs it.
            let c = read.unwrap();
            assert_eq!((c.cgroup.memory_mb, c.process_memory_mb), (0, 96));
            assert!(
                c.memory_statement().contains("per process"),
                "{}",
                c.memory_statement()
            );
            eprintln!("no delegated cgroup v2 here ({why}): memory is bounded per process");
        }
        Ok(_) => {
            let mut c = read.unwrap();
            c.sandboxd = Some(sandboxd(state.parent().unwrap()));
            let stated =
                <plimsoll_bwrap::BwrapConfig as plimsoll_provider::ProviderSetup>::resources(
                    &c,
                    Default::default(),
                );
            assert_eq!(stated.memory_mb, 96);
            let p = started(c).await;
            // The small one first (a project stops at its first failing step).
            let big = "b = bytearray(400 * 1024 * 1024)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('allocated')";
            let r = as_project(
                p.run(
                    project(&[
                        "python3 -c 'b = bytearray(8 << 20); print(len(b))'",
                        &format!("python3 -c '{big}'"),
                    ]),
                    T,
                )
                .await
                .unwrap(),
            );
            assert_eq!(stdout(&r, 0), (8u32 << 20).to_string(), "{r:?}");
            assert_eq!(r.steps.len(), 2, "{r:?}");
            assert!(
                !stdout(&r, 1).contains("allocated"),
                "400 MiB under a 96 MiB limit: {r:?}"
            );
            assert_ne!(r.steps[1].exit_code, 0);
            p.shutdown().await;
        }
    }
}
