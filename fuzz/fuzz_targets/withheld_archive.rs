//! Arbitrary bytes as one file inside an image: the magic-byte sniffing and every archive and
//! compression reader under it (tar, zip, gzip, zstd, xz, bzip2) must never panic, and the
//! zip walker must hold on its own too.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
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

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_member_decoded: 16 << 20,
        max_total_decoded: 64 << 20,
        ..Limits::default()
    };
    let scan = scan_file_bytes("f", data, set(), &limits);
    for (path, reason, _) in &scan.unreadable {
        assert!(path.starts_with('f'));
        assert!(reason.starts_with("format:") || reason.starts_with("limit:"), "{reason}");
        assert!(!reason.starts_with("format:internal"), "untagged error: {reason}");
    }
    let _ = plimsoll_withheld::zip::walk_zip_bytes(data);
});
