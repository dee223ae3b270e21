//! plimsolld with `SANDBOX_PROVIDER=bwrap`, the real binary: what `Describe` and records
//! state, the floors it serves and refuses, and each bad configuration as a clear startup
//! error (no bwrap, too old a bwrap, user namespaces disabled, a limit it cannot hold).
//!
//! Without bwrap on PATH these print SKIPPED, unless PLIMSOLL_REQUIRE_BWRAP is set (CI).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use plimsoll_client::{Client, ClientOptions};
use plimsoll_core::pb::{self, run_request::Payload, run_response::Result as R};
use plimsoll_core::Reason;
use plimsoll_testkit::plimsolld::Plimsolld;

const BIN: &str = env!("CARGO_BIN_EXE_plimsolld");

fn have_bwrap() -> bool {
    plimsoll_testkit::bwrap::installed()
}

/// A folder the sandboxes' host user (nobody, when the tests run as root) can search.
fn folder() -> tempfile::TempDir {
    plimsoll_testkit::bwrap::folder()
}

/// sandboxd, copied into `dir` where the sandboxes' host user can reach it.
fn sandboxd(dir: &Path) -> String {
    plimsoll_testkit::bwrap::sandboxd_in(dir)
        .display()
        .to_string()
}

fn request(code: &str, floor: &str) -> pb::RunRequest {
    pb::RunRequest {
        protocol: 5,
        timeout_ms: 10_000,
        minimum_isolation: floor.into(),
        payload: Some(Payload::Javascript(pb::JavaScriptRun {
            code: code.into(),
            grant_profile: String::new(),
        })),
        ..Default::default()
    }
}

#[test]
fn plimsolld_serves_from_bwrap_states_its_wall_and_keeps_the_floors() {
    if !have_bwrap() {
        return;
    }
    let dir = folder();
    let sd = sandboxd(dir.path());
    let mut d = Plimsolld::spawn(
        BIN,
        dir.path(),
        &[
            ("SANDBOX_PROVIDER", "bwrap"),
            ("SANDBOX_BWRAP_SANDBOXD", &sd),
            ("PLIMSOLL_INSECURE", "1"),
        ],
    );
    let addr = d.serving().unwrap_or_else(|| panic!("{}", d.log()));
    assert!(
        d.log()
            .contains("bwrap provider proved its wall (tier container)"),
        "{}",
        d.log()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = Client::connect(&addr, ClientOptions::default())
            .await
            .unwrap();
        let desc = c.describe().await.unwrap();
        assert_eq!(desc.sandbox, "bwrap");
        assert_eq!(desc.isolation, "container");
        let pe = desc.project_environment.clone().unwrap();
        let env = &pe.identity;
        assert!(
            env.starts_with("bwrap:0.") && env.contains(";seccomp=sha256:"),
            "{env}"
        );
        assert_eq!(pe.languages, ["javascript", "python", "shell"]);
        let res = desc.resources.unwrap();
        // Without a delegated cgroup v2 (the test machines') memory is the per-process
        // bound, 1024 MiB by default; with one and SANDBOX_MEMORY_MB unset, the same.
        assert_eq!((res.memory_mb, res.pids), (1024, 256), "{res:?}");

        for floor in ["", "process", "container"] {
            let resp = c.run(request("console.log(6 * 7)", floor)).await.unwrap();
            let Some(R::Javascript(j)) = &resp.result else {
                panic!("{resp:?}")
            };
            assert_eq!(j.stdout, b"42\n");
            assert_eq!(resp.isolation, "container");
            let record = resp.record.clone().unwrap();
            assert_eq!(
                (record.provider.as_str(), record.isolation.as_str()),
                ("bwrap", "container")
            );
            assert_eq!(&record.environment, env, "the record names the environment");
        }
        for floor in ["kernel", "vm"] {
            let e = c.run(request("console.log(1)", floor)).await.unwrap_err();
            assert_eq!(e.not_dispatched(), Some(Reason::Isolation), "{floor}: {e}");
        }
    });
    d.stop();
}

/// Starts plimsolld with the bwrap provider and `vars`, expects it to stop with `code`,
/// and returns what it printed.
fn refused(vars: &[(&str, &str)], prefix: &[&str], code: i32) -> String {
    let dir = folder();
    let sd = sandboxd(dir.path());
    let mut all = vec![
        ("SANDBOX_PROVIDER", "bwrap"),
        ("SANDBOX_BWRAP_SANDBOXD", sd.as_str()),
        ("PLIMSOLL_INSECURE", "1"),
    ];
    all.extend_from_slice(vars);
    let mut d = Plimsolld::spawn_as(BIN, dir.path(), &all, prefix);
    let status = d.wait();
    let log = d.log();
    assert_eq!(status.code(), Some(code), "{log}");
    log
}

fn fake_bwrap(dir: &Path, version_line: &str) -> PathBuf {
    let p = dir.join("bwrap");
    std::fs::write(&p, format!("#!/bin/sh\necho '{version_line}'\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

#[test]
fn bad_bwrap_configuration_is_a_clear_startup_error() {
    if !have_bwrap() {
        return;
    }
    // No bwrap where it is said to be (a configuration error, exit 2), and none on PATH
    // (startup cannot go on, exit 1).
    let log = refused(&[("SANDBOX_BWRAP_PATH", "/nonexistent/bwrap")], &[], 2);
    assert!(
        log.contains("SANDBOX_BWRAP_PATH: /nonexistent/bwrap is not an executable file"),
        "{log}"
    );
    assert!(log.contains("apt-get install bubblewrap"), "{log}");
    let log = refused(&[("PATH", "/nonexistent")], &[], 1);
    assert!(log.contains("bubblewrap (`bwrap`) is not on PATH"), "{log}");
    // Too old, and not bubblewrap at all.
    let tools = folder();
    let old = fake_bwrap(tools.path(), "bubblewrap 0.7.0");
    let log = refused(&[("SANDBOX_BWRAP_PATH", old.to_str().unwrap())], &[], 1);
    assert!(
        log.contains("bubblewrap 0.7.0, too old") && log.contains("0.8.0 or later"),
        "{log}"
    );
    let other = fake_bwrap(tools.path(), "GNU bash, version 5.2");
    let log = refused(&[("SANDBOX_BWRAP_PATH", other.to_str().unwrap())], &[], 1);
    assert!(log.contains("not bubblewrap's version line"), "{log}");
    // A CPU limit the provider cannot hold here (no delegated cgroup v2) is refused by
    // name, before anything starts (memory becomes a bound per process instead).
    let cpu = plimsoll_bwrap::cgroup::Limits {
        memory_mb: 0,
        cpus: 1.0,
    };
    if let Err(why) = plimsoll_bwrap::cgroup::find(&cpu) {
        let log = refused(&[("SANDBOX_CPUS", "1")], &[], 2);
        assert!(
            log.contains("SANDBOX_CPUS")
                && log.contains("delegated cgroup v2")
                && log.contains(&why),
            "{log}"
        );
    }
    // A floor above the tier: refused at startup.
    let log = refused(&[("SANDBOX_MIN_ISOLATION", "kernel")], &[], 2);
    assert!(log.contains("kernel"), "{log}");
}

#[test]
fn disabled_user_namespaces_are_a_clear_startup_error() {
    if !have_bwrap() {
        return;
    }
    // plimsolld in a user namespace of its own where no further one may be created
    // (user.max_user_namespaces = 0 there): the kernel's own setting, for real.
    let probe = std::process::Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            "echo 0 > /proc/sys/user/max_user_namespaces",
        ])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!(
            "SKIPPED: cannot make a user namespace with user namespaces disabled inside (unshare)"
        );
        return;
    }
    let log = refused(
        &[],
        &[
            "unshare",
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$0\" \"$@\"",
        ],
        1,
    );
    assert!(
        log.contains("user namespaces are disabled (user.max_user_namespaces is 0)"),
        "{log}"
    );
}
