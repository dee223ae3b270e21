//! The gate for tests driven by independent Python clients (the official MCP SDK, gRPC's
//! `grpcio`): `.ci/python-venv` builds their virtual environment and `.ci/run` names its
//! interpreter in `PLIMSOLL_TEST_PYTHON`. Without that variable such a test prints a
//! `SKIPPED` line, unless `PLIMSOLL_REQUIRE_DOCKER=1` (CI), when it fails instead; an
//! interpreter that is named but lacks the clients always fails.

use std::path::PathBuf;

/// The variable naming the Python interpreter that has the client packages.
pub const PYTHON: &str = "PLIMSOLL_TEST_PYTHON";

/// The interpreter named by [`PYTHON`] after checking it can import `modules`, or `None`
/// after printing why the current test skips (a failure under `PLIMSOLL_REQUIRE_DOCKER=1`).
pub fn interpreter(modules: &[&str]) -> Option<PathBuf> {
    let named = std::env::var_os(PYTHON).filter(|v| !v.is_empty());
    let python = crate::docker::gate(named.map(PathBuf::from).ok_or_else(|| {
        format!("{PYTHON} is not set (run `bash .ci/python-venv` and set it to the path it prints)")
    }))?;
    let import = format!("import {}", modules.join(", "));
    let out = std::process::Command::new(&python)
        .args(["-c", &import])
        .output()
        .unwrap_or_else(|e| panic!("{PYTHON}={}: cannot start: {e}", python.display()));
    assert!(
        out.status.success(),
        "{PYTHON}={}: `{import}` failed: {}",
        python.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(python)
}
