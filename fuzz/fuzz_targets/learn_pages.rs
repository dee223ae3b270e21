//! Arbitrary text as what `plimsoll-learn` reads: a bundle for the page's table
//! (`records::rows`, `records::table`), a Markdown page with generated blocks
//! (`blocks::names`, `extract`, `replace`) and a Chromium net log (`urls_in_net_log`).
//! None of them panics; a block replaced and read back gives what was put in.

#![no_main]

use libfuzzer_sys::fuzz_target;
use plimsoll_learn::{blocks, browser, records};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = records::rows(&text);
    let _ = records::table(&text);
    let _ = browser::urls_in_net_log(&text);
    for name in blocks::names(&text) {
        if blocks::extract(&text, &name).is_ok() {
            let new = blocks::replace(&text, &name, "x\n").expect("a block that extracts replaces");
            assert_eq!(blocks::extract(&new, &name).ok(), Some("x\n"));
        }
    }
});
