//! Programs under a user of the run's own (`Runner::run_as`, what `plimsoll-sandboxd
//! --run-as` uses in a pod): they run as that user with no supplementary groups, own their
//! working directory and files, cannot read a file only the runner's user may read, and
//! every process of that user is gone when the run ends, even one that left the run's
//! session, group and working directory.
//!
//! Changing user needs root; these tests say so and pass without checking anything when
//! they are not root (CI runs as root).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use plimsoll_core::pb;
use plimsoll_runner::{Limits, RunAs, RunEnv, Runner, RunnerConfig};

const NOBODY: RunAs = RunAs {
    uid: 65534,
    gid: 65534,
};

/// The end of a run kills every process of the run's user, so runs under the same user must
/// not overlap: the tests here take turns.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: changing user needs root");
    false
}

/// A runner whose programs run as nobody, under a root directory nobody may traverse into.
fn runner() -> (tempfile::TempDir, Runner) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let runner = Runner::new(RunnerConfig {
        root_dir: dir.path().join("runs"),
        limits: Limits::default(),
        default_timeout: Duration::from_secs(30),
    })
    .unwrap()
    .run_as(NOBODY)
    .unwrap();
    (dir, runner)
}

fn project(steps: &[&str]) -> pb::ProjectRun {
    pb::ProjectRun {
        files: vec![pb::ProjectFile {
            path: "sub/given.txt".into(),
            content: "given".into(),
        }],
        steps: steps.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn out(r: &pb::ProjectResult, i: usize) -> String {
    String::from_utf8_lossy(&r.steps[i].stdout)
        .trim()
        .to_owned()
}

#[test]
fn uid_or_gid_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for who in [RunAs { uid: 0, gid: 1 }, RunAs { uid: 1, gid: 0 }] {
        let r = Runner::new(RunnerConfig {
            root_dir: dir.path().join("runs"),
            limits: Limits::default(),
            default_timeout: Duration::from_secs(5),
        })
        .unwrap()
        .run_as(who);
        assert!(r.is_err(), "{who:?}");
    }
}

#[tokio::test]
async fn programs_run_as_the_run_user_and_cannot_read_the_runners_secrets() {
    if !root() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let (dir, runner) = runner();
    let secret = dir.path().join("tls.key");
    std::fs::write(&secret, "PRIVATE KEY MATERIAL").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o400)).unwrap();
    let me = std::process::id();
    let steps = [
        "id -u; id -g; id -G".to_owned(),
        // The files the runner wrote are the run's; it can change them and make new ones.
        "echo more >> sub/given.txt && mkdir new && echo ok > new/f && cat sub/given.txt"
            .to_owned(),
        format!("cat {} 2>&1; echo rc=$?", secret.display()),
        format!("cat /proc/{me}/environ 2>&1 >/dev/null; echo rc=$?"),
        format!("head -c 16 /proc/{me}/mem 2>&1 >/dev/null; echo rc=$?"),
    ];
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    let r = runner
        .project(&project(&steps), Duration::ZERO, &RunEnv::default())
        .await
        .unwrap();
    assert_eq!(r.steps.len(), 5, "{r:?}");
    assert_eq!(out(&r, 0), "65534\n65534\n65534", "{r:?}");
    assert_eq!(out(&r, 1), "givenmore", "{r:?}");
    for i in 2..5 {
        let text = out(&r, i);
        assert!(
            text.contains("Permission denied") && text.ends_with("rc=1"),
            "step {}: {text}",
            i + 1
        );
        assert!(!text.contains("PRIVATE KEY"), "{text}");
    }
}

#[tokio::test]
async fn every_process_of_the_run_user_is_gone_when_the_run_ends() {
    if !root() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let (_dir, runner) = runner();
    // Leaves the run's session, process group and working directory, and drops the tag.
    let steps = ["cd / && setsid env -i sh -c 'sleep 600' >/dev/null 2>&1 < /dev/null & sleep 0.2; echo started"];
    let r = runner
        .project(&project(&steps), Duration::ZERO, &RunEnv::default())
        .await
        .unwrap();
    assert_eq!(out(&r, 0), "started", "{r:?}");
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let uid = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
            let live = !status.contains("State:\tZ");
            (live && uid.split_whitespace().next() == Some("65534"))
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect();
    assert!(left.is_empty(), "processes of uid 65534 left: {left:?}");
}

#[tokio::test]
async fn languages_are_proven_one_at_a_time_as_the_run_user() {
    if !root() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let (_dir, runner) = runner();
    let langs = runner.prove_languages().await;
    assert!(langs.contains(&"shell".to_owned()), "{langs:?}");
}
