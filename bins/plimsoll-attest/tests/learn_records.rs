//! The records shipped with `docs/learn/check.html` verify with this `plimsoll-attest`, and
//! the page's generated parts are what they say: `check/bundle.js` carries exactly the
//! bytes of `records/runs.jsonl` and `records/harness.pub`, and the table and the `verify`
//! output in `proof-of-what-ran.md` are what `cargo xtask pages` makes of them now.

use std::process::Command;

use plimsoll_learn::{blocks, learn_dir, records, PROOF_PAGE};

#[test]
fn the_shipped_records_verify_and_the_pages_say_what_they_hold() {
    let learn = learn_dir();
    let jsonl = std::fs::read_to_string(learn.join(records::BUNDLE)).expect("the bundle");
    let key = std::fs::read_to_string(learn.join(records::PUBLIC_KEY)).expect("the key");
    let out = Command::new(env!("CARGO_BIN_EXE_plimsoll-attest"))
        .current_dir(&learn)
        .args(["verify", "--pub", records::PUBLIC_KEY, records::BUNDLE])
        .output()
        .unwrap();
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the shipped bundle does not verify: {shown}"
    );
    assert!(shown.contains("3 runs, 1 sessions (2 calls)"), "{shown}");

    let page = std::fs::read_to_string(learn.join(PROOF_PAGE)).unwrap();
    let command = format!(
        "plimsoll-attest verify --pub {} {}",
        records::PUBLIC_KEY,
        records::BUNDLE
    );
    assert_eq!(
        blocks::extract(&page, "verify-output").unwrap(),
        records::console_block(&command, &shown),
        "the page's verify output is stale; run `cargo xtask pages`"
    );
    assert_eq!(
        blocks::extract(&page, "records-table").unwrap(),
        records::table(&jsonl).unwrap(),
        "the page's table is stale; run `cargo xtask pages`"
    );
    assert_eq!(records::rows(&jsonl).unwrap().len(), 5, "five records");
    let shipped_js = std::fs::read_to_string(learn.join(records::BUNDLE_JS)).unwrap();
    assert!(
        shipped_js == records::bundle_js(&jsonl, &key),
        "check/bundle.js is not the shipped bundle and key; run `cargo xtask pages`"
    );
}
