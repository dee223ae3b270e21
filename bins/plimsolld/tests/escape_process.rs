//! The escape suite (`plimsoll_testkit::escape`) on the process provider: the real
//! plimsolld as a child process holding a 0600 file at descriptor 7, inside a cgroup the
//! test makes (the bombs' outer bound). The process tier has no wall: the suite asserts
//! exactly what `docs/walls.md` says it holds and does not hold. The column is written for
//! a run as root (CI), where each run gets a user of its own; otherwise the test skips.

use plimsoll_testkit::escape::{self, Bound, Fixture, Target, MEMORY_CAP_MIB, PROCESS_CAP};

const BIN: &str = env!("CARGO_BIN_EXE_plimsolld");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_escape_suite_holds_the_process_column_of_the_walls_table() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: the process column of docs/walls.md is written for a run as root");
        return;
    }
    let fx = Fixture::new();
    let bound = Bound::new(PROCESS_CAP + 500, u64::from(MEMORY_CAP_MIB) + 1024);
    let dir = tempfile::tempdir().expect("a folder");
    let (mut d, addr) = escape::daemon(
        BIN,
        dir.path(),
        &[("SANDBOX_PROVIDER", "process")],
        &fx,
        bound.as_ref(),
    );
    let mut c = escape::client(&addr).await;
    let target = Target {
        column: "process".into(),
        state_dir: dir.path().join("state"),
        bombs: bound.is_some(),
    };
    escape::check(&mut c, &fx, &target).await;
    drop(c);
    d.stop();
}
