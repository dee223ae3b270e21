//! Arbitrary bytes as a git pack (after a `PACK` version 2 header and a count) and as a
//! delta against a base: the pack reader (object headers, offsets, zlib streams, the object
//! cache) and `git::apply_delta` must never panic, and the rebuilt object never exceeds its
//! bound.

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
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    let mut pack = b"PACK\0\0\0\x02\0\0\0".to_vec();
    pack.push(count % 16);
    pack.extend_from_slice(rest);
    let scan = scan_file_bytes("p", &pack, set(), &limits());
    check("p", &scan);
    let cut = rest.len() / 2;
    if let Ok(out) = plimsoll_withheld::git::apply_delta(&rest[..cut], &rest[cut..], 1 << 16) {
        assert!(out.len() <= 1 << 16);
    }
});
