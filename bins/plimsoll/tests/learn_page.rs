//! `docs/learn/what-a-sandbox-is.md` says what its five programs print: the programs run
//! again here, through this `plimsoll` binary on the `process` tier, and every generated
//! block of the page must be what they print now. On a mismatch, `cargo xtask pages`
//! rewrites the blocks (and the diff shows what changed). Needs node, like every test of
//! the process provider.

use std::path::Path;

use plimsoll_learn::{blocks, learn_dir, programs, SANDBOX_PAGE};

#[test]
fn the_page_shows_what_its_five_programs_print() {
    let path = learn_dir().join(SANDBOX_PAGE);
    let page = std::fs::read_to_string(&path).expect("the page");
    let ran =
        programs::run_all(Path::new(env!("CARGO_BIN_EXE_plimsoll"))).expect("the programs run");
    assert_eq!(ran.len(), 5);
    assert!(
        ran.iter()
            .all(|r| r.isolation == "process" && r.exit_code == 0),
        "{ran:?}"
    );
    let fresh = programs::render(&page, &ran).expect("the page has every block");
    for name in blocks::names(&page) {
        assert_eq!(
            blocks::extract(&page, &name).unwrap(),
            blocks::extract(&fresh, &name).unwrap(),
            "block {name} of {} differs from what the programs print now; run `cargo xtask pages`",
            path.display()
        );
    }
    assert_eq!(
        blocks::names(&page).len(),
        10,
        "a code and an output block per program"
    );
    assert!(
        page == fresh,
        "the page differs outside its blocks after rendering"
    );
    assert!(page.contains("](rooms.svg)") && learn_dir().join("rooms.svg").is_file());
    // The programs that reach outside their run really did.
    let by = |n: &str| ran.iter().find(|r| r.name == n).unwrap();
    assert!(by("network").stdout.contains("hello from the host"));
    assert!(by("outlive").after[0].contains("still running"));
    assert!(by("outside").after[0].contains("the file is there"));
}
