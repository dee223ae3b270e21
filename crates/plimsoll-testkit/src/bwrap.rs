//! What the bwrap provider's tests share: the one gate for a missing `bwrap`
//! (`PLIMSOLL_REQUIRE_BWRAP` makes it a failure, as `.ci/run` does), and folders the
//! sandboxes' host user can reach. When the tests run as root the sandboxes run as nobody,
//! which must be able to search every directory above the state directory and sandboxd:
//! so both live in a fresh folder under `/tmp` (mode 0711), never under the checkout or
//! `$TMPDIR`, whose parents may be closed.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Whether `bwrap` is installed; prints SKIPPED when it is not, and panics then if
/// `PLIMSOLL_REQUIRE_BWRAP` is set.
pub fn installed() -> bool {
    let found = ["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"]
        .iter()
        .any(|p| Path::new(p).exists());
    if !found {
        assert!(
            std::env::var_os("PLIMSOLL_REQUIRE_BWRAP").is_none(),
            "PLIMSOLL_REQUIRE_BWRAP is set but bwrap is not installed (apt-get install bubblewrap)"
        );
        eprintln!("SKIPPED: bwrap is not installed (apt-get install bubblewrap)");
    }
    found
}

/// A fresh folder under `/tmp` that any user may search (not list).
pub fn folder() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("plimsoll-bwrap-test")
        .tempdir_in("/tmp")
        .expect("a folder under /tmp");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o711))
        .expect("chmod the folder");
    d
}

/// plimsoll-sandboxd, built for this profile and copied into `dir/bin` (so the sandboxes'
/// user can reach it wherever the checkout is).
pub fn sandboxd_in(dir: &Path) -> PathBuf {
    let built = crate::fake_cluster::sandboxd_binaries()
        .expect("sandboxd built")
        .join("plimsoll-sandboxd");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("bin folder");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod bin");
    let copy = bin.join("plimsoll-sandboxd");
    std::fs::copy(&built, &copy).expect("copy sandboxd");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755))
        .expect("chmod sandboxd");
    copy
}
