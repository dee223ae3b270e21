//! Memory in a bwrap sandbox without a delegated cgroup v2: every process gets
//! `RLIMIT_AS` and `RLIMIT_DATA` of `SANDBOX_MEMORY_MB` (default 1024 MiB), so an
//! allocation beyond it fails inside (Python's `MemoryError`) instead of taking the
//! host's memory, while node, python3 and sh still run. The test runs under an outer
//! memory cgroup of its own (`plimsoll_testkit::bound`) as the safety net, and checks that
//! net was never reached.

mod support;

use plimsoll_provider::Provider;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_cgroup_an_allocation_beyond_the_per_process_bound_fails() {
    let Some(bwrap) = bwrap() else { return };
    let no_cgroup = plimsoll_bwrap::cgroup::find(&plimsoll_bwrap::cgroup::Limits {
        memory_mb: 256,
        cpus: 0.0,
    })
    .is_err();
    if !no_cgroup {
        eprintln!("SKIPPED: this host delegates a cgroup v2, which holds memory instead");
        return;
    }
    // The safety net first: 3 GiB for this test and everything it starts.
    let Some(outer) = plimsoll_testkit::bound::Bound::memory(3 << 30) else {
        return;
    };
    let (_dir, state) = state_dir();
    let mut c = config(&state);
    c.bwrap = Some(bwrap);
    c.pool = 0;
    assert_eq!(
        c.process_memory_mb,
        plimsoll_bwrap::DEFAULT_PROCESS_MEMORY_MB
    );
    assert!(
        c.memory_statement().contains("not bounded"),
        "{}",
        c.memory_statement()
    );
    let p = started(c).await;
    let answer = p
        .run(
            project(&[
                // 64 MiB fits; 2 GiB does not.
                "python3 -c 'b = bytearray(64 << 20); print(len(b) >> 20)'",
                "node -e 'console.log(6 * 7)'",
                "python3 -c 'bytearray(2 << 30); print(\"allocated\")'",
            ]),
            T,
        )
        .await
        .unwrap();
    let r = as_project(answer);
    assert_eq!(stdout(&r, 0), "64", "{r:?}");
    assert_eq!(stdout(&r, 1), "42", "{r:?}");
    let last = &r.steps[2];
    let err = String::from_utf8_lossy(&last.stderr);
    assert!(err.contains("MemoryError"), "{err}");
    assert_ne!(last.exit_code, 0);
    assert!(!String::from_utf8_lossy(&last.stdout).contains("allocated"));
    assert_eq!(outer.hits(), 0, "the outer memory limit was reached");
    p.stop().await;
}
