//! What the ship scan's fuzz targets share: one withheld set, limits small enough for a
//! fuzzer, and the check every scan answer must pass (each unreadable place named under the
//! scanned file, with a tagged reason). Included with `#[path]` by each target.

use std::sync::OnceLock;

use plimsoll_withheld::walk::scan_file_bytes;
use plimsoll_withheld::{Entry, Limits, Mode, WithheldSet};

fn set() -> &'static WithheldSet {
    static SET: OnceLock<WithheldSet> = OnceLock::new();
    SET.get_or_init(|| {
        let mut s = WithheldSet::empty();
        s.add(Entry::run("run", Mode::Refuse, b"fuzz-withheld-value-0123").unwrap())
            .unwrap();
        s.add(Entry::whole_file("file", Mode::Audit, &b"hello"[..]).unwrap())
            .unwrap();
        s
    })
}

fn limits() -> Limits {
    Limits {
        max_member_decoded: 16 << 20,
        max_total_decoded: 64 << 20,
        ..Limits::default()
    }
}

/// Scans `bytes` as the file `name` and checks the answer.
pub fn scan_and_check(name: &str, bytes: &[u8]) {
    let scan = scan_file_bytes(name, bytes, set(), &limits());
    for (path, reason, _) in &scan.unreadable {
        assert!(path.starts_with(name), "{path}");
        assert!(
            reason.starts_with("format:") || reason.starts_with("limit:"),
            "{reason}"
        );
        assert!(
            !reason.starts_with("format:internal"),
            "untagged error: {reason}"
        );
    }
}
