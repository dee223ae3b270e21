//! Arbitrary bytes as a git pack (after a `PACK` version 2 header and a count) and as a
//! delta against a base: the pack reader (object headers, offsets, zlib streams, the object
//! cache) and `git::apply_delta` must never panic, and the rebuilt object never exceeds its
//! bound.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common/withheld.rs"]
mod withheld;
use withheld::scan_and_check;

fuzz_target!(|data: &[u8]| {
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    let mut pack = b"PACK\0\0\0\x02\0\0\0".to_vec();
    pack.push(count % 16);
    pack.extend_from_slice(rest);
    scan_and_check("p", &pack);
    let cut = rest.len() / 2;
    if let Ok(out) = plimsoll_withheld::git::apply_delta(&rest[..cut], &rest[cut..], 1 << 16) {
        assert!(out.len() <= 1 << 16);
    }
});
