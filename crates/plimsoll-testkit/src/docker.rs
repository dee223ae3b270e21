//! The one Docker-engine gate: a test that needs the engine (or something only the engine
//! provides, such as the sandbox image) skips with a printed `SKIPPED` line when it is
//! missing, unless `PLIMSOLL_REQUIRE_DOCKER=1` (CI), when the test fails instead.

/// The variable that turns a missing engine into a failure.
pub const REQUIRE: &str = "PLIMSOLL_REQUIRE_DOCKER";

/// Whether a missing engine is a failure rather than a skip: `PLIMSOLL_REQUIRE_DOCKER=1`.
pub fn required() -> bool {
    std::env::var(REQUIRE).as_deref() == Ok("1")
}

/// `found`, or `None` after printing why the current test skips; panics instead when
/// [`required`]. The test's name is the name of the thread it runs on.
pub fn gate<T>(found: Result<T, String>) -> Option<T> {
    match found {
        Ok(t) => Some(t),
        Err(why) => {
            let test = std::thread::current().name().unwrap_or("a test").to_owned();
            if required() {
                panic!("{test}: {REQUIRE}=1 but {why}");
            }
            eprintln!("{test}: SKIPPED: {why} (set {REQUIRE}=1 to fail instead)");
            None
        }
    }
}

/// Whether a Docker engine answers the `docker` command; see [`gate`].
pub fn engine_answers() -> bool {
    let ok = std::process::Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    gate(if ok {
        Ok(())
    } else {
        Err("no Docker engine answers".to_owned())
    })
    .is_some()
}
