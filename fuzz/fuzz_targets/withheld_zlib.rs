//! zlib streams wherever they sit: arbitrary bytes after a zlib header, the zlib compression
//! of arbitrary bytes (so inflated content reaches the git object and the carver), and a
//! zlib stream after arbitrary bytes. The carver's probe, the zlib decoder under the limits
//! and the git loose object reader must never panic or leave an untagged error.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "common/withheld.rs"]
mod withheld;
use withheld::scan_and_check;

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
    scan_and_check("z", &bytes);
});
