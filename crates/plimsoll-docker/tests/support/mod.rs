//! What the real-engine tests share: the engine gate. Without an engine or the sandbox image
//! a test skips, unless `PLIMSOLL_REQUIRE_DOCKER=1` (CI), when it fails.

use std::path::Path;

use bollard::Docker;

/// The sandbox image `cargo xtask images` builds.
pub const IMAGE: &str = "plimsoll/sandbox:latest";
/// The engine's socket the tests use.
pub const SOCKET: &str = "/var/run/docker.sock";

/// Whether a missing engine or image is a failure rather than a skip.
pub fn required() -> bool {
    matches!(
        std::env::var("PLIMSOLL_REQUIRE_DOCKER").as_deref(),
        Ok("1") | Ok("true")
    )
}

/// The engine, with the sandbox image present, or `None` (skip) when either is missing and
/// the run does not require them.
pub async fn engine() -> Option<Docker> {
    let found = async {
        let d = plimsoll_docker::provider::connect(Path::new(SOCKET))?;
        d.ping()
            .await
            .map_err(|e| format!("no Docker engine at {SOCKET}: {e}"))?;
        d.inspect_image(IMAGE).await.map_err(|e| {
            format!("image {IMAGE} is missing ({e}); build it with `cargo xtask images`")
        })?;
        Ok::<_, String>(d)
    }
    .await;
    match found {
        Ok(d) => Some(d),
        Err(e) if required() => panic!("PLIMSOLL_REQUIRE_DOCKER=1 but {e}"),
        Err(e) => {
            eprintln!("skipping: {e} (set PLIMSOLL_REQUIRE_DOCKER=1 to make this a failure)");
            None
        }
    }
}
