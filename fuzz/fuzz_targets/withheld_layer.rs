//! Arbitrary bytes as an image export and as a layer tar: the export reader, the tar reader
//! and everything under them must never panic, and must answer with an error or a report.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use plimsoll_withheld::{scan_archive_bytes, Entry, KnownImages, Limits, Mode, WithheldSet};

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
    let (entries, _err) = plimsoll_withheld::tar::walk_tar(data, 1 << 20);
    for e in &entries {
        assert!(e.data_len <= e.entry.size);
        assert!(e.entry.data_start >= e.entry.start);
    }
    if let Ok(reports) = scan_archive_bytes(data, set(), &KnownImages::empty(), &limits) {
        for r in &reports {
            let _ = r.verdict();
        }
    }
});
