//! The process provider as root: each run runs as a user of its own, never root, and
//! `SANDBOX_PIDS` bounds that user's processes (`RLIMIT_NPROC`), so a fork bomb inside a
//! run stops at the configured count, the run ends, and the host stays usable. The bomb
//! runs only under an outer `pids.max` cgroup the test creates
//! (`plimsoll_testkit::bound`), and the test checks that outer bound was never hit: the
//! provider's own limit is what stopped it.
//!
//! Changing user needs root; not as root these tests print SKIPPED (CI runs as root).

use std::time::{Duration, Instant};

use plimsoll_core::pb;
use plimsoll_process::{ProcessConfig, ProcessProvider};
use plimsoll_provider::{Answer, Provider, Shared, Work};

const PIDS: u32 = 32;

fn project(step: &str) -> Work {
    Work::Project(pb::ProjectRun {
        steps: vec![step.into()],
        ..Default::default()
    })
}

fn step_out(a: &Answer) -> (String, String, i32) {
    match a {
        Answer::Project(p) => (
            String::from_utf8_lossy(&p.steps[0].stdout).into_owned(),
            String::from_utf8_lossy(&p.steps[0].stderr).into_owned(),
            p.steps[0].exit_code,
        ),
        other => panic!("a project result: {other:?}"),
    }
}

/// Processes (and threads) whose real user is `uid`.
fn tasks_of(uid: u32) -> u64 {
    plimsoll_process::users::tasks_of(uid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_runs_get_a_user_each_and_a_fork_bomb_stops_at_sandbox_pids() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: per-run users need root");
        return;
    }
    // The safety net first, nothing below runs without it: room for this test's own
    // threads, the runs' few programs and PIDS, not for a bomb that RLIMIT_NPROC lets go.
    let Some(outer) = plimsoll_testkit::bound::Bound::pids_above_now(PIDS + 64) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut shared = Shared {
        state_dir: dir.path().to_path_buf(),
        ..Shared::default()
    };
    shared.resources.pids = PIDS;
    let cfg = ProcessConfig::new(&shared);
    assert!(cfg.run_as.is_some(), "as root, runs get users of their own");
    let p = ProcessProvider::new(&cfg).unwrap();
    p.start().await.unwrap();

    // Two runs at once: neither is root, and they are not the same user.
    let t = Duration::from_secs(20);
    let (a, b) = tokio::join!(
        p.run(project("id -u; sleep 1"), t),
        p.run(project("id -u; sleep 1"), t)
    );
    let (ua, ub) = (step_out(&a.unwrap()).0, step_out(&b.unwrap()).0);
    let (ua, ub): (u32, u32) = (ua.trim().parse().unwrap(), ub.trim().parse().unwrap());
    assert_ne!(ua, 0);
    assert_ne!(ub, 0);
    assert_ne!(ua, ub, "two concurrent runs share a user");

    // A fork bomb: each shell forks two more, forever.
    let t0 = Instant::now();
    let bomb = p
        .run(
            project("b() { b | b & }; b; sleep 3"),
            Duration::from_secs(8),
        )
        .await
        .unwrap();
    let took = t0.elapsed();
    let (_, err, _) = step_out(&bomb);
    assert!(
        err.to_lowercase().contains("fork") || err.contains("Resource temporarily unavailable"),
        "the bomb was not refused a fork: {err}"
    );
    assert!(
        took < Duration::from_secs(30),
        "the run did not end: {took:?}"
    );
    assert_eq!(
        outer.hits(),
        0,
        "the outer pids.max was reached: RLIMIT_NPROC did not stop the bomb at {PIDS}"
    );
    // Nothing of the run's users is left, and the host still forks.
    let base = plimsoll_process::DEFAULT_USER.0;
    // Killed before the answer; the last of them may still wait to be reaped by init.
    let gone = Instant::now() + Duration::from_secs(10);
    for uid in base..base + 8 {
        while tasks_of(uid) > 0 && Instant::now() < gone {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(tasks_of(uid), 0, "processes of user {uid} are left");
    }
    let ok = std::process::Command::new("true").status().unwrap();
    assert!(ok.success());
    drop(outer);
}
