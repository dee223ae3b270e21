//! What the startup smoke test accepts as evidence, as pure functions over what a real run
//! inside a sandbox printed: the languages, and every property of the wall the provider
//! claims for tier `container`. A property that does not hold is named; the provider then
//! refuses to start.

use crate::command::SANDBOXD_PATH;
use plimsoll_core::pb;
use plimsoll_provider::smoke::step_stdout as out;
use plimsoll_provider::smoke::{
    check_descriptors, interfaces, listed_descriptors, DESCRIPTOR_STEP,
};

/// Host paths that must not exist inside a sandbox (checked besides the state directory
/// and plimsolld's working directory, which the provider adds).
pub const HOST_PATHS: &[&str] = &[
    "/home",
    "/root",
    "/var",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd",
    "/run/dbus",
    "/etc/shadow",
    "/etc/passwd",
];

/// Whether `p` (plimsolld's working directory, its state directory) names something of the
/// host that must be absent inside: not a place the sandbox has of its own (`/`, `/tmp`,
/// `/work`, `/dev`, `/proc`, `/run`, where it sees fresh mounts), and not under a system
/// directory it sees read-only by design (`/usr`, `/etc`, `/bin`, `/sbin`, `/lib*`).
pub fn host_specific(p: &std::path::Path) -> bool {
    use std::path::Path;
    let own = ["/", "/tmp", "/work", "/dev", "/proc", "/run"];
    let system = [
        "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    ];
    p.is_absolute()
        && !own.iter().any(|o| p == Path::new(o))
        && !system.iter().any(|s| p.starts_with(s))
}

/// The smoke project: each step prints one fact [`check_smoke`] then checks. `absent` are
/// host paths that must not be visible.
pub fn smoke_project(absent: &[String]) -> pb::ProjectRun {
    let quoted: Vec<String> = absent.iter().map(|p| shell_quote(p)).collect();
    let steps = vec![
        // 0-2: languages.
        "node -e \"console.log('plimsoll-smoke-' + 6 * 7)\"".to_owned(),
        "python3 -c \"print('plimsoll-smoke-%d' % (6 * 7))\"".to_owned(),
        "echo plimsoll-smoke-$((6 * 7))".to_owned(),
        // 3: the user namespace's mapping, and the user inside.
        "cat /proc/self/uid_map; echo uid=$(id -u)".to_owned(),
        // 4: capabilities, seccomp, no_new_privs.
        "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|Seccomp|NoNewPrivs):' /proc/self/status".to_owned(),
        // 5: network interfaces.
        "cat /proc/net/dev".to_owned(),
        // 6: PID 1 is sandboxd (the namespace's init; no bwrap init beside the code), and
        // it is this PID namespace's.
        "tr '\\0' ' ' < /proc/1/cmdline; echo; echo self=$$".to_owned(),
        // 7: host paths that must be absent.
        format!(
            "for p in {}; do if [ -e \"$p\" ] || [ -L \"$p\" ]; then echo \"present $p\"; fi; done; echo checked",
            quoted.join(" ")
        ),
        // 8: writes outside the working directory and /tmp fail.
        "for d in / /usr /etc /proc/sys/kernel; do if ( : > \"$d/plimsoll-probe\" ) 2>/dev/null; then echo \"wrote $d\"; fi; done; echo checked".to_owned(),
        // 9: the Landlock layer: a program copied to /tmp or the working directory (the
        // copy must succeed) does not run, and the socket's directory takes no file.
        "for d in /tmp .; do if cp /bin/true \"$d/plimsoll-exec\"; then \"$d/plimsoll-exec\" 2>/dev/null && echo \"ran $d\"; else echo \"no copy in $d\"; fi; done; ( : > /run/plimsoll/s/plimsoll-probe ) 2>/dev/null && echo 'wrote /run/plimsoll/s'; echo checked".to_owned(),
        // 10: the run holds no descriptor beyond 0, 1 and 2 (none of plimsolld's, bwrap's
        // or sandboxd's).
        DESCRIPTOR_STEP.to_owned(),
    ];
    pb::ProjectRun {
        files: vec![],
        steps,
        artifacts: vec![],
        grant_profile: String::new(),
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// What the smoke run proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmokeFacts {
    /// Languages whose step printed the expected line.
    pub languages: Vec<String>,
    /// Whether the Landlock layer held: nothing written could be executed, and the channel
    /// directory took no file. A second layer: its absence (a kernel without Landlock) is
    /// stated, not an error.
    pub landlock: bool,
}

/// Checks what the host sees of a sandbox's processes: `status` is each one's
/// `/proc/<pid>/status` read from outside, where every user and group id (real, effective,
/// saved, filesystem) must be the host user the sandbox is meant to run as, never root.
pub fn check_host_view(status: &[String], uid: u32, gid: u32) -> Result<(), String> {
    if status.is_empty() {
        return Err("no process of the sandbox was found from the host".into());
    }
    for s in status {
        for (name, want) in [("Uid", uid), ("Gid", gid)] {
            let ids: Vec<u32> = s
                .lines()
                .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
                .map(|r| {
                    r.split_whitespace()
                        .filter_map(|f| f.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
            if ids.len() != 4 || ids.iter().any(|i| *i != want) {
                let pname = s.lines().next().unwrap_or("").trim();
                return Err(format!(
                    "a process of the sandbox ({pname}) runs on the host with {name} {ids:?}, not {want}"
                ));
            }
        }
    }
    Ok(())
}

/// Checks the smoke run's report against every property the tier needs; the error names
/// each one that does not hold.
pub fn check_smoke(p: &pb::ProjectResult) -> Result<SmokeFacts, String> {
    const STEPS: usize = 11;
    let languages = plimsoll_provider::smoke::languages(p, STEPS)?;
    let mut wrong = Vec::new();
    if !languages.iter().any(|l| l == "shell") {
        wrong.push("`sh` did not run".to_owned());
    }
    // User namespace: one line mapping one user, not the initial namespace's identity map
    // (which host user it is, is read from outside: `check_host_view`).
    let ids = out(p, 3);
    let map: Vec<&str> = ids.lines().filter(|l| !l.starts_with("uid=")).collect();
    let fields: Vec<u64> = map
        .first()
        .map(|l| {
            l.split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    if !(map.len() == 1 && matches!(fields.as_slice(), [inside, _, 1] if *inside != 0)) {
        wrong.push(format!(
            "no user namespace mapping one non-root user (uid_map: {:?})",
            map.join(" / ")
        ));
    }
    if ids.lines().any(|l| l == "uid=0") {
        wrong.push("code runs as uid 0 inside".into());
    }
    let status = out(p, 4);
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .map(str::trim)
    };
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        match field(cap) {
            Some(v) if v.trim_start_matches('0').is_empty() => {}
            Some(v) => wrong.push(format!("{cap} is {v} (expected all zero)")),
            None => wrong.push(format!("{cap} is unreadable")),
        }
    }
    if field("Seccomp") != Some("2") {
        wrong.push(format!(
            "seccomp mode is {:?} (expected 2, a filter)",
            field("Seccomp").unwrap_or("unreadable")
        ));
    }
    if field("NoNewPrivs") != Some("1") {
        wrong.push(format!(
            "NoNewPrivs is {:?} (expected 1)",
            field("NoNewPrivs").unwrap_or("unreadable")
        ));
    }
    let ifaces = interfaces(&out(p, 5));
    if ifaces != ["lo"] {
        wrong.push(format!(
            "network interfaces are {ifaces:?} (expected lo only)"
        ));
    }
    let init = out(p, 6);
    let cmdline = init.lines().next().unwrap_or("");
    let first = cmdline.split_whitespace().next().unwrap_or("");
    if first != SANDBOXD_PATH {
        wrong.push(format!(
            "PID 1 is {cmdline:?}, not sandboxd ({SANDBOXD_PATH})"
        ));
    }
    let paths = out(p, 7);
    let present: Vec<&str> = paths
        .lines()
        .filter_map(|l| l.strip_prefix("present "))
        .collect::<Vec<_>>();
    if !present.is_empty() || !paths.ends_with("checked") {
        wrong.push(format!("host paths are visible: {present:?}"));
    }
    let writes = out(p, 8);
    let wrote: Vec<&str> = writes
        .lines()
        .filter_map(|l| l.strip_prefix("wrote "))
        .collect::<Vec<_>>();
    if !wrote.is_empty() || !writes.ends_with("checked") {
        wrong.push(format!(
            "writes outside the working directory succeeded in {wrote:?}"
        ));
    }
    if let Err(e) = listed_descriptors(&out(p, 10)).and_then(|open| check_descriptors(&open, &[])) {
        wrong.push(e);
    }
    if !wrong.is_empty() {
        return Err(wrong.join("; "));
    }
    Ok(SmokeFacts {
        languages,
        landlock: out(p, 9) == "checked",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(stdout: &str) -> pb::StepResult {
        pb::StepResult {
            stdout: stdout.as_bytes().to_vec(),
            ..Default::default()
        }
    }

    const STATUS: &str = "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n";
    const FDS: &str = "total 0\nlr-x------ 1 u g 64 Dec 5 0 -> /dev/null\nl-wx------ 1 u g 64 Dec 5 1 -> pipe:[1]\nl-wx------ 1 u g 64 Dec 5 2 -> pipe:[2]\ndescriptors-listed\n";
    const NETDEV: &str = "Inter-|   Receive\n face |bytes\n    lo:       0       0\n";

    fn report(
        uid_map: &str,
        status: &str,
        netdev: &str,
        init: &str,
        paths: &str,
        writes: &str,
    ) -> pb::ProjectResult {
        pb::ProjectResult {
            steps: vec![
                step("plimsoll-smoke-42\n"),
                step("nope\n"),
                step("plimsoll-smoke-42\n"),
                step(uid_map),
                step(status),
                step(netdev),
                step(init),
                step(paths),
                step(writes),
                step("checked\n"),
                step(FDS),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn a_sandbox_with_every_property_passes() {
        let f = check_smoke(&report(
            "      1000      0          1\nuid=1000\n",
            STATUS,
            NETDEV,
            "/run/plimsoll-sandboxd --unix-socket /run/plimsoll/s/sock \nself=3\n",
            "checked\n",
            "checked\n",
        ))
        .unwrap();
        assert_eq!(f.languages, ["javascript", "shell"]);
        assert!(f.landlock);
        let mut open = report(
            "1000 0 1\nuid=1000\n",
            STATUS,
            NETDEV,
            "/run/plimsoll-sandboxd\n",
            "checked\n",
            "checked\n",
        );
        open.steps[9] = step("ran /tmp\nchecked\n");
        assert!(!check_smoke(&open).unwrap().landlock);
    }

    #[test]
    fn each_missing_property_is_named() {
        let mut bad = report(
            "0 0 4294967295\nuid=0\n",
            &STATUS
                .replace("CapEff:\t0000000000000000", "CapEff:\t000001ffffffffff")
                .replace("Seccomp:\t2", "Seccomp:\t0")
                .replace("NoNewPrivs:\t1", "NoNewPrivs:\t0"),
            &format!("{NETDEV}  eth0: 1 2\n"),
            "/sbin/init \nself=4242\n",
            "present /home\nchecked\n",
            "wrote /\nchecked\n",
        );
        bad.steps[10] = step(&FDS.replace(
            "descriptors-listed",
            "lrwx------ 1 u g 64 Dec 5 7 -> /root/secret\ndescriptors-listed",
        ));
        let e = check_smoke(&bad).unwrap_err();
        for needle in [
            "user namespace",
            "uid 0",
            "CapEff",
            "seccomp mode",
            "NoNewPrivs",
            "eth0",
            "PID 1",
            "/home",
            "wrote",
            "7 (/root/secret)",
        ] {
            assert!(
                e.contains(needle) || e.contains(&needle.replace("wrote", "writes")),
                "{needle} missing from {e}"
            );
        }
        // A run that stopped early says how far it got.
        let mut short = report("", STATUS, NETDEV, "bwrap\n", "checked\n", "checked\n");
        short.steps.truncate(4);
        assert!(check_smoke(&short).unwrap_err().contains("4 of 11"));
    }

    #[test]
    fn only_host_specific_places_are_checked_absent() {
        use std::path::Path;
        for yes in [
            "/root",
            "/home/op/plimsoll",
            "/tmp/plimsoll-state",
            "/srv/x",
            "/work/x",
        ] {
            assert!(host_specific(Path::new(yes)), "{yes}");
        }
        for no in ["/", "/tmp", "/work", "/usr/src/app", "/etc", "relative"] {
            assert!(!host_specific(Path::new(no)), "{no}");
        }
    }

    #[test]
    fn the_host_must_see_the_sandbox_user_in_every_id() {
        let st = |u: &str| format!("Name:\tsh\nUid:\t{u}\nGid:\t65534\t65534\t65534\t65534\n");
        check_host_view(&[st("65534\t65534\t65534\t65534")], 65534, 65534).unwrap();
        let e = check_host_view(&[st("65534\t0\t65534\t65534")], 65534, 65534).unwrap_err();
        assert!(e.contains("Uid") && e.contains("sh"), "{e}");
        assert!(check_host_view(&[], 1, 1).is_err());
    }
}
