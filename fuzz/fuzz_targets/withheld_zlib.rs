//! zlib streams wherever they sit: arbitrary bytes after a zlib header, the zlib compression
//! of arbitrary bytes (so inflated content reaches the git object and the carver), and a
//! zlib stream after arbitrary bytes. The carver's probe, the zlib decoder under the limits
//! and the git loose object reader must never panic or leave an untagged error.

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

fn zlib(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut e, b).unwrap();
    e.finish().unwrap()
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = match mode % 3 {
        0 => [&[0x78, 0x9c][..], rest].concat(),
        1 => zlib(rest),
        _ => {
            let cut = rest.len() / 2;
            [&rest[..cut], &zlib(&rest[cut..])[..]].concat()
        }
    };
    let scan = scan_file_bytes("z", &bytes, set(), &limits());
    check("z", &scan);
});
