//! The escape suite (`plimsoll_testkit::escape`) on the Docker provider: the real plimsolld
//! as a child process holding a 0600 file at descriptor 7, the real engine and the sandbox
//! image; the `docker (runc)` column of `docs/walls.md`, or `docker (runsc)` under
//! `PLIMSOLL_TEST_DOCKER_RUNTIME=runsc`. The containers are the engine's, not plimsolld's
//! children, so the bombs are bounded by the engine's limits and the probe's own cap.

#[macro_use]
mod support;

use plimsoll_testkit::escape::{self, Fixture, Target};
use support::IMAGE;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_escape_suite_holds_the_docker_column_of_the_walls_table() {
    let _engine = need_engine!();
    let fx = Fixture::new();
    let dir = tempfile::tempdir().expect("a folder");
    let runtime = support::runtime();
    let bin = plimsoll_testkit::plimsolld::binary();
    let (mut d, addr) = escape::daemon(
        &bin,
        dir.path(),
        &[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_IMAGE", IMAGE),
            ("SANDBOX_DOCKER_RUNTIME", runtime.as_str()),
        ],
        &fx,
        None,
    );
    let mut c = escape::client(&addr).await;
    let target = Target {
        column: format!("docker ({})", runtime.as_str()),
        state_dir: dir.path().join("state"),
        bombs: true,
    };
    escape::check(&mut c, &fx, &target).await;
    drop(c);
    d.stop();
}
