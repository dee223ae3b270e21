//! The escape suite (`plimsoll_testkit::escape`) on the bwrap provider: the real plimsolld
//! as a child process holding a 0600 file at descriptor 7, inside a cgroup the test makes
//! (the bombs' outer bound), real bubblewrap sandboxes; every check of the `bwrap` column
//! of `docs/walls.md`.

use plimsoll_testkit::escape::{self, Bound, Fixture, Target, MEMORY_CAP_MIB, PROCESS_CAP};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_escape_suite_holds_the_bwrap_column_of_the_walls_table() {
    if !plimsoll_testkit::bwrap::installed() {
        return;
    }
    let fx = Fixture::new();
    let bound = Bound::new(PROCESS_CAP + 500, u64::from(MEMORY_CAP_MIB) + 1024);
    // State and sandboxd where the sandboxes' host user can reach them.
    let dir = plimsoll_testkit::bwrap::folder();
    let sandboxd = plimsoll_testkit::bwrap::sandboxd_in(dir.path())
        .display()
        .to_string();
    let bin = plimsoll_testkit::plimsolld::binary();
    let (mut d, addr) = escape::daemon(
        &bin,
        dir.path(),
        &[
            ("SANDBOX_PROVIDER", "bwrap"),
            ("SANDBOX_BWRAP_SANDBOXD", &sandboxd),
        ],
        &fx,
        bound.as_ref(),
    );
    let mut c = escape::client(&addr).await;
    let target = Target {
        column: "bwrap".into(),
        state_dir: dir.path().join("state"),
        bombs: bound.is_some(),
    };
    escape::check(&mut c, &fx, &target).await;
    drop(c);
    d.stop();
}
