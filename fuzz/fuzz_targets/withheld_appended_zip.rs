//! Arbitrary bytes after a header, as zipapp archives and self-extracting executables carry a
//! zip: the carver's local header search, the zip walk at an offset (central directory
//! offsets counted from the file or the zip) and the end record check must never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common/withheld.rs"]
mod withheld;
use withheld::scan_and_check;

fuzz_target!(|data: &[u8]| {
    let mut f = b"#!/usr/bin/env python3\n".to_vec();
    f.extend_from_slice(data);
    scan_and_check("a", &f);
});
