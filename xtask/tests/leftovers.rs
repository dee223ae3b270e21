//! `.ci/leftovers`, the CI step that fails when a process started from the build output is
//! still running after the tests: it must name a live one and pass once it is gone.

use std::path::Path;
use std::process::Command;

fn leftovers(checkout: &Path) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/leftovers");
    Command::new("bash")
        .arg(script)
        .arg(checkout)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap()
}

#[test]
fn leftovers_names_a_process_left_running_from_target() {
    let checkout = tempfile::tempdir().unwrap();
    let bin_dir = checkout.path().join("target/debug");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let sleeper = bin_dir.join("leaked-sleeper");
    std::fs::copy("/bin/sleep", &sleeper).unwrap();

    let clean = leftovers(checkout.path());
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );

    let mut child = Command::new(&sleeper).arg("120").spawn().unwrap();
    let out = leftovers(checkout.path());
    let _ = child.kill();
    let _ = child.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("pid {}:", child.id())), "{err}");
    assert!(err.contains("leaked-sleeper 120"), "{err}");

    let after = leftovers(checkout.path());
    assert_eq!(after.status.code(), Some(0));
}
