//! Arbitrary bytes as one file inside an image: the magic-byte sniffing and every archive and
//! compression reader under it (tar, zip, gzip, zstd, xz, bzip2) must never panic, and the
//! zip walker must hold on its own too.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common/withheld.rs"]
mod withheld;
use withheld::scan_and_check;

fuzz_target!(|data: &[u8]| {
    scan_and_check("f", data);
    let _ = plimsoll_withheld::zip::walk_zip_bytes(data);
});
