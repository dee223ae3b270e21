//! What the real-engine tests share: the engine (through the workspace's one gate,
//! `plimsoll_testkit::docker::gate`), and the runtime the suite runs under. Without an
//! engine or the sandbox image a test skips, unless `PLIMSOLL_REQUIRE_DOCKER=1` (CI), when
//! it fails. `PLIMSOLL_TEST_DOCKER_RUNTIME=runsc` runs the same tests under gVisor
//! (`.ci/run` runs the suite once per runtime); then a missing runsc is a failure too.

use std::path::Path;
use std::time::Duration;

use bollard::Docker;
use plimsoll_core::Tier;
use plimsoll_docker::{DockerConfig, Runtime};

/// The engine ([`engine`]), or a return from the test (skip) when it is missing.
#[allow(unused_macros)]
macro_rules! need_engine {
    () => {
        match crate::support::engine().await {
            Some(d) => d,
            None => return,
        }
    };
}

/// The sandbox image `cargo xtask images` builds.
pub const IMAGE: &str = "plimsoll/sandbox:latest";
/// The engine's socket the tests use.
pub const SOCKET: &str = "/var/run/docker.sock";

/// The runtime the suite runs under: `PLIMSOLL_TEST_DOCKER_RUNTIME` (`runc` when unset).
pub fn runtime() -> Runtime {
    let v = std::env::var("PLIMSOLL_TEST_DOCKER_RUNTIME").unwrap_or_default();
    Runtime::parse(&v).unwrap_or_else(|e| panic!("PLIMSOLL_TEST_DOCKER_RUNTIME: {e}"))
}

/// Whether the suite runs under gVisor.
#[allow(dead_code)]
pub fn gvisor() -> bool {
    runtime() == Runtime::Runsc
}

/// The tier the provider must state under [`runtime`].
#[allow(dead_code)]
pub fn tier() -> Tier {
    match runtime() {
        Runtime::Runc => Tier::Container,
        Runtime::Runsc => Tier::Kernel,
    }
}

/// The environment identity the provider states for `image_id` under [`runtime`].
#[allow(dead_code)]
pub fn environment(image_id: &str) -> String {
    plimsoll_docker::provider::environment(image_id, runtime())
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
        let rt = runtime().as_str();
        let listed = d
            .info()
            .await
            .map_err(|e| format!("cannot read the engine's info: {e}"))?
            .runtimes
            .unwrap_or_default();
        if !listed.contains_key(rt) {
            return Err(format!(
                "PLIMSOLL_TEST_DOCKER_RUNTIME={rt} but the engine does not list runtime {rt:?}; register it with .ci/register-runsc"
            ));
        }
        Ok::<_, String>(d)
    }
    .await;
    plimsoll_testkit::docker::gate(found)
}

/// The provider's configuration for the tests: the sandbox image, state under `state`, a
/// 30 s default deadline, the suite's runtime.
#[allow(dead_code)]
pub fn config(state: &Path) -> DockerConfig {
    let mut c = DockerConfig::new(IMAGE, state.join("docker"));
    c.default_timeout = Duration::from_secs(30);
    c.runtime = runtime();
    c
}
