//! The escape suite (`plimsoll_testkit::escape`) on quickjs: plimsolld with
//! `SANDBOX_PROVIDER=quickjs` as a child process holding a 0600 file at descriptor 7. A
//! snippet has no OS API (asserted), so every check but the memory bomb is `n/a` in
//! `docs/walls.md`; the memory bomb must end the snippet.

use plimsoll_testkit::escape::{self, Fixture, Target};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_escape_suite_holds_the_quickjs_column_of_the_walls_table() {
    let fx = Fixture::new();
    let dir = tempfile::tempdir().expect("a folder");
    let bin = plimsoll_testkit::plimsolld::binary();
    let (mut d, addr) = escape::daemon(
        &bin,
        dir.path(),
        &[("SANDBOX_PROVIDER", "quickjs")],
        &fx,
        None,
    );
    let mut c = escape::client(&addr).await;
    let target = Target {
        column: "quickjs".into(),
        state_dir: dir.path().join("state"),
        bombs: true,
    };
    escape::check(&mut c, &fx, &target).await;
    drop(c);
    d.stop();
}
