//! Arbitrary bytes after a PNG signature: the chunk walk, the IDAT stream across chunks and
//! the carving of other chunks must never panic.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use plimsoll_withheld::walk::{scan_file_bytes, FileScan};
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

fn check(name: &str, scan: &FileScan) {
    for (path, reason, _) in &scan.unreadable {
        assert!(path.starts_with(name), "{path}");
        assert!(reason.starts_with("format:") || reason.starts_with("limit:"), "{reason}");
        assert!(!reason.starts_with("format:internal"), "untagged error: {reason}");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut f = b"\x89PNG\r\n\x1a\n".to_vec();
    f.extend_from_slice(data);
    let scan = scan_file_bytes("i", &f, set(), &limits());
    check("i", &scan);
});
