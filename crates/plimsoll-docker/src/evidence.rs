//! What the startup checks accept as evidence, as pure functions over what the engine and
//! the smoke run reported: the image's environment, the hardening seen from inside a
//! container, and whether the kernel inside is gVisor's.

use plimsoll_core::pb;
pub use plimsoll_provider::smoke::interfaces;
use plimsoll_provider::smoke::step_stdout as out;
use plimsoll_provider::smoke::{check_descriptors, listed_descriptors, DESCRIPTOR_STEP};
use plimsoll_runner::RunEnv;

/// Names in the image's `ENV` that the runner would refuse as a run's extra variable
/// (they choose what a program loads or runs), except those the runner sets itself for
/// every program anyway (`PATH`, `HOME`, `TMPDIR`, `LANG`).
pub fn refused_image_env(env: &[String]) -> Vec<String> {
    env.iter()
        .filter_map(|kv| {
            let name = kv.split_once('=').map_or(kv.as_str(), |(k, _)| k);
            let overridden = ["PATH", "HOME", "TMPDIR", "LANG"]
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name));
            let refused = RunEnv::new(vec![(name.to_owned(), String::new())]).is_err();
            (refused && !overridden).then(|| name.to_owned())
        })
        .collect()
}

/// The smoke test's project: each step prints one fact the provider then checks.
pub fn smoke_project() -> pb::ProjectRun {
    let steps = [
        // Languages.
        "node -e \"console.log('plimsoll-smoke-' + 6 * 7)\"",
        "python3 -c \"print('plimsoll-smoke-%d' % (6 * 7))\"",
        "echo plimsoll-smoke-$((6 * 7))",
        // Hardening, seen from inside.
        "id -u",
        "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status",
        "cat /proc/net/dev",
        "if ( : > /plimsoll-root-probe ) 2>/dev/null; then echo writable; else echo read-only; fi",
        // The kernel the code talks to.
        "cat /proc/version",
        "dmesg 2>&1 | head -n 20; true",
        // No descriptor beyond 0, 1 and 2 reaches a run (none of plimsolld's, the engine's
        // or sandboxd's).
        DESCRIPTOR_STEP,
    ];
    pb::ProjectRun {
        files: vec![],
        steps: steps.iter().map(|s| (*s).to_owned()).collect(),
        artifacts: vec![],
        grant_profile: String::new(),
    }
}

/// What the smoke run proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmokeFacts {
    /// Languages whose step printed the expected line.
    pub languages: Vec<String>,
    /// `/proc/version` inside.
    pub proc_version: String,
    /// The first lines of `dmesg` inside (or its error).
    pub dmesg: String,
}

/// Checks the smoke run's report: every hardening fact must hold, else the message names
/// each one that does not.
pub fn check_smoke(p: &pb::ProjectResult) -> Result<SmokeFacts, String> {
    let languages = plimsoll_provider::smoke::languages(p, 10)?;
    let mut wrong = Vec::new();
    if !languages.iter().any(|l| l == "shell") {
        wrong.push("`sh` did not run".to_owned());
    }
    match out(p, 3).parse::<u32>() {
        Ok(0) => wrong.push("code runs as root (uid 0)".into()),
        Ok(_) => {}
        Err(_) => wrong.push(format!("`id -u` printed {:?}", out(p, 3))),
    }
    let caps = out(p, 4);
    let cap_lines: Vec<&str> = caps.lines().collect();
    if cap_lines.len() < 3 {
        wrong.push(format!("capability sets unreadable: {caps:?}"));
    }
    for line in cap_lines {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        if !value.trim().trim_start_matches('0').is_empty() {
            wrong.push(format!("{name} is {} (expected all zero)", value.trim()));
        }
    }
    let ifaces = interfaces(&out(p, 5));
    if ifaces.iter().any(|i| i != "lo") {
        wrong.push(format!("network interfaces besides lo: {ifaces:?}"));
    }
    if out(p, 6) != "read-only" {
        wrong.push("the root filesystem is writable".into());
    }
    if let Err(e) = listed_descriptors(&out(p, 9)).and_then(|open| check_descriptors(&open, &[])) {
        wrong.push(e);
    }
    if !wrong.is_empty() {
        return Err(wrong.join("; "));
    }
    Ok(SmokeFacts {
        languages,
        proc_version: out(p, 7),
        dmesg: out(p, 8),
    })
}

/// Whether the kernel seen inside the container is gVisor's: it must differ from the
/// host's kernel (`/proc/version` on the host), and gVisor must say so itself (its `dmesg`
/// starts with "Starting gVisor", its `/proc/version` is a fixed `Linux version 4.4.0`
/// string). Either alone is not enough: the first rules out runc sharing the host kernel,
/// the second names what replaced it.
pub fn gvisor_evidence(
    inside_version: &str,
    inside_dmesg: &str,
    host_version: &str,
) -> Result<String, String> {
    if inside_version.trim().is_empty() {
        return Err("the smoke run could not read /proc/version inside the container".into());
    }
    if inside_version.trim() == host_version.trim() {
        return Err(format!(
            "the container sees the host's own kernel ({:?}); runsc did not put gVisor in between",
            inside_version.trim()
        ));
    }
    let says_gvisor = inside_dmesg.contains("gVisor");
    if !says_gvisor {
        return Err(format!(
            "the kernel inside differs from the host's but does not say it is gVisor (dmesg: {:?})",
            inside_dmesg.lines().next().unwrap_or("")
        ));
    }
    Ok(format!(
        "inside kernel {:?} differs from the host's and dmesg names gVisor",
        inside_version.trim()
    ))
}

/// The value of runsc flag `name` among a runtime's registered arguments, as runsc's flag
/// parser reads them (`-name=v`, `--name=v`, `-name v`, `--name v`; the last one wins), or
/// `None` when it is not given (runsc's default applies).
pub fn runsc_flag(args: &[String], name: &str) -> Option<String> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let Some(flag) = a.strip_prefix("--").or_else(|| a.strip_prefix('-')) else {
            continue;
        };
        if let Some(v) = flag.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_owned());
        } else if flag == name {
            found = it.next().cloned();
        }
    }
    found
}

/// What a runsc runtime's registered arguments let the provider do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunscChannel {
    /// `--host-uds` lets code inside connect to a Unix socket the host created (the grant
    /// relay, `g.sock`): `open` or `all`.
    pub grants: bool,
}

/// Checks the arguments the engine passes to a runsc runtime: gVisor's own network stack
/// must be off (`--network=none`: the container has no network, and this runsc refuses to
/// start a container in the root network namespace without it), and sandboxd must be able
/// to create a socket the host can connect to in the mounted run directory
/// (`--host-uds=create` or `all`; runsc's default `none` keeps such a socket inside
/// gVisor). `all` also lets the code connect to the grant relay's socket; with `create`
/// the provider offers no grants. The error names every missing setting and where it goes.
pub fn check_runsc_args(name: &str, path: &str, args: &[String]) -> Result<RunscChannel, String> {
    let mut missing = Vec::new();
    let network = runsc_flag(args, "network");
    if network.as_deref() != Some("none") {
        missing.push(format!(
            "--network=none (it has {}: gVisor's network stack must be off, the container has no network)",
            network.map_or("no --network, so runsc's default \"sandbox\"".to_owned(), |v| format!("--network={v}"))
        ));
    }
    let uds = runsc_flag(args, "host-uds").unwrap_or_else(|| "none".to_owned());
    let create = matches!(uds.as_str(), "create" | "all");
    if !create {
        missing.push(format!(
            "--host-uds=all (it has --host-uds={uds}: sandboxd's socket in the mounted run directory must be reachable from the host, and a granted run's code must reach the relay's socket; `create` allows the first only, and then no grants are offered)"
        ));
    }
    if !missing.is_empty() {
        return Err(format!(
            "the engine runs runtime {name:?} ({path}) with runtimeArgs {args:?}; add {} to \"runtimes\": {{\"{name}\": {{\"runtimeArgs\": [...]}}}} in /etc/docker/daemon.json, then send SIGHUP to dockerd (.ci/register-runsc does both)",
            missing.join(" and ")
        ));
    }
    Ok(RunscChannel {
        grants: matches!(uds.as_str(), "open" | "all"),
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

    fn report(uid: &str, caps: &str, netdev: &str, root: &str) -> pb::ProjectResult {
        pb::ProjectResult {
            steps: vec![
                step("plimsoll-smoke-42\n"),
                step("plimsoll-smoke-42\n"),
                step("plimsoll-smoke-42\n"),
                step(uid),
                step(caps),
                step(netdev),
                step(root),
                step("Linux version 6.1\n"),
                step("dmesg: read kernel buffer failed: Operation not permitted\n"),
                step(FDS),
            ],
            ..Default::default()
        }
    }

    const FDS: &str = "total 0\nlr-x------ 1 u g 64 Dec 5 0 -> /dev/null\nl-wx------ 1 u g 64 Dec 5 1 -> pipe:[1]\nl-wx------ 1 u g 64 Dec 5 2 -> pipe:[2]\ndescriptors-listed\n";
    const CAPS0: &str = "CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\n";
    const NETDEV_LO: &str = "Inter-|   Receive\n face |bytes\n    lo:       0       0\n";

    #[test]
    fn a_locked_down_report_passes() {
        let f = check_smoke(&report("61000\n", CAPS0, NETDEV_LO, "read-only\n")).unwrap();
        assert_eq!(f.languages, ["javascript", "python", "shell"]);
    }

    #[test]
    fn each_weakness_is_named() {
        let mut bad = report(
            "0\n",
            &CAPS0.replace("CapEff:\t0000000000000000", "CapEff:\t00000000a80425fb"),
            &format!("{NETDEV_LO}  eth0: 1 2\n"),
            "writable\n",
        );
        bad.steps[9] = step(&FDS.replace(
            "descriptors-listed",
            "lrwx------ 1 u g 64 Dec 5 7 -> /root/secret\ndescriptors-listed",
        ));
        let e = check_smoke(&bad).unwrap_err();
        for needle in ["root", "CapEff", "eth0", "writable", "7 (/root/secret)"] {
            assert!(e.contains(needle), "{needle} missing from {e}");
        }
    }

    #[test]
    fn interfaces_are_parsed() {
        assert_eq!(
            interfaces("h1\nh2\n  lo: 1\n eth0: 2\n"),
            vec!["lo".to_owned(), "eth0".to_owned()]
        );
    }

    #[test]
    fn image_env_that_chooses_what_loads_is_named() {
        let env = vec![
            "PATH=/usr/bin".to_owned(),
            "LD_PRELOAD=/x.so".to_owned(),
            "NODE_OPTIONS=--require /x.js".to_owned(),
            "LANG=C.UTF-8".to_owned(),
            "FOO=bar".to_owned(),
        ];
        assert_eq!(refused_image_env(&env), ["LD_PRELOAD", "NODE_OPTIONS"]);
    }

    #[test]
    fn gvisor_needs_a_different_kernel_that_names_itself() {
        let host = "Linux version 6.18.44 (gcc 12)";
        let g = "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016";
        let dmesg = "[    0.000000] Starting gVisor...\n[    0.1] Mounting deweydecimalfs...";
        assert!(gvisor_evidence(g, dmesg, host).is_ok());
        assert!(gvisor_evidence(host, dmesg, host)
            .unwrap_err()
            .contains("host's own kernel"));
        assert!(gvisor_evidence(g, "permission denied", host)
            .unwrap_err()
            .contains("does not say"));
        assert!(gvisor_evidence("", dmesg, host).is_err());
    }

    #[test]
    fn runsc_arguments_must_keep_the_network_off_and_allow_the_socket_channel() {
        let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            runsc_flag(&v(&["-network", "none", "--host-uds=all"]), "network").as_deref(),
            Some("none")
        );
        assert_eq!(
            runsc_flag(&v(&["--network=none", "--network=host"]), "network").as_deref(),
            Some("host")
        );
        assert_eq!(runsc_flag(&v(&["--networkx=none"]), "network"), None);
        let ok = check_runsc_args(
            "runsc",
            "/usr/bin/runsc",
            &v(&["--network=none", "--host-uds=all"]),
        );
        assert_eq!(ok, Ok(RunscChannel { grants: true }));
        let create = check_runsc_args(
            "runsc",
            "/usr/bin/runsc",
            &v(&["--network=none", "--host-uds=create"]),
        );
        assert_eq!(create, Ok(RunscChannel { grants: false }));
        let bare = check_runsc_args("runsc-bare", "/usr/bin/runsc", &[]).unwrap_err();
        assert!(
            bare.contains("--network=none") && bare.contains("--host-uds=all"),
            "{bare}"
        );
        assert!(
            bare.contains("/etc/docker/daemon.json") && bare.contains("runsc-bare"),
            "{bare}"
        );
        let open = check_runsc_args(
            "r",
            "/usr/bin/runsc",
            &v(&["--network=none", "--host-uds=open"]),
        )
        .unwrap_err();
        assert!(!open.contains("--network=none (it"), "{open}");
        assert!(open.contains("--host-uds=open"), "{open}");
        let host = check_runsc_args(
            "r",
            "/usr/bin/runsc",
            &v(&["--network=host", "--host-uds=all"]),
        )
        .unwrap_err();
        assert!(host.contains("it has --network=host"), "{host}");
    }
}
