//! plimsoll-testkit: what the workspace's tests and `cargo xtask bench` share, so each
//! fixture is written once. Never published; only ever a dev-dependency (and xtask's).
//!
//! - [`upstream`]: a recording HTTP upstream (plain or TLS).
//! - [`ca`]: a test CA and the server certificates it signs.
//! - [`net`]: free loopback ports.
//! - [`docker`]: the one Docker-engine gate (`PLIMSOLL_REQUIRE_DOCKER=1` fails, else skip).
//! - [`daemon`]: the in-process daemon, built from environment pairs.
//! - [`plimsolld`]: the real `plimsolld` binary as a child process.
//! - [`sessions`]: the session conformance suite every session provider passes.
//! - [`escape`]: the escape suite every provider passes, held to `docs/walls.md`.
//! - [`fake_cluster`]: a fake Kubernetes API server and agent-sandbox controller with real
//!   terminator + sandboxd pods.
//! - [`tsa`]: a live OpenSSL RFC 3161 time-stamp authority on loopback.
//! - [`python`]: the gate for tests driven by independent Python clients.
//! - [`doors`]: an attacker's idle, slow and ping-only connections, for listeners' limits.
//! - [`inherited`]: a descriptor a supervisor leaves open (fd 7 on a 0600 file), the run
//!   step that tries it, and the checks that nothing reached it.
//! - [`bound`]: an outer cgroup bound (processes, memory) for tests that run a bomb.
//! - [`shared_folder`]: a folder a run's own user may write, for markers a test looks for.

pub mod bound;
pub mod bwrap;
pub mod ca;
pub mod daemon;
pub mod docker;
pub mod doors;
pub mod escape;
pub mod fake_cluster;
pub mod inherited;
pub mod net;
pub mod plimsolld;
pub mod python;
pub mod sessions;
pub mod tsa;
pub mod upstream;

/// A folder `name` under `parent` that every user may write (mode 1777, as /tmp), for a
/// marker a test's run leaves and the test then looks for. As root the process provider runs
/// each program as a user of its own, which cannot write into a test's 0700 temporary folder.
pub fn shared_folder(parent: &std::path::Path, name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = parent.join(name);
    std::fs::create_dir_all(&d).expect("a shared folder");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777))
        .expect("a shared folder's mode");
    d
}
