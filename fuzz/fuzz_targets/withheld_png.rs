//! Arbitrary bytes after a PNG signature: the chunk walk, the IDAT stream across chunks and
//! the carving of other chunks must never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common/withheld.rs"]
mod withheld;
use withheld::scan_and_check;

fuzz_target!(|data: &[u8]| {
    let mut f = b"\x89PNG\r\n\x1a\n".to_vec();
    f.extend_from_slice(data);
    scan_and_check("i", &f);
});
