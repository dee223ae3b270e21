//! What `fuzz/fuzz_targets/learn_pages.rs` asks, on seeded random inputs in every
//! `cargo test`: the shipped bundle, both pages and a net log with random bytes changed,
//! cut or doubled never make `records::rows`, `records::table`, the block functions or
//! `browser::urls_in_net_log` panic, and a block that extracts can be replaced and read back.

use plimsoll_learn::{blocks, browser, learn_dir, records};
use rand::{Rng as _, SeedableRng as _};

fn mutate(rng: &mut rand::rngs::StdRng, text: &str) -> String {
    let mut b = text.as_bytes().to_vec();
    match rng.gen_range(0..4) {
        0 if !b.is_empty() => {
            let at = rng.gen_range(0..b.len());
            b[at] = rng.gen();
        }
        1 => b.truncate(rng.gen_range(0..=b.len())),
        2 if !b.is_empty() => {
            let at = rng.gen_range(0..b.len());
            let piece = b[at..(at + 40).min(b.len())].to_vec();
            b.splice(at..at, piece);
        }
        _ => b.extend((0..rng.gen_range(0..30)).map(|_| rng.gen::<u8>())),
    }
    String::from_utf8_lossy(&b).into_owned()
}

#[test]
fn changed_bundles_pages_and_net_logs_never_panic() {
    let learn = learn_dir();
    let inputs = [
        std::fs::read_to_string(learn.join(records::BUNDLE)).unwrap(),
        std::fs::read_to_string(learn.join(plimsoll_learn::SANDBOX_PAGE)).unwrap(),
        std::fs::read_to_string(learn.join(plimsoll_learn::PROOF_PAGE)).unwrap(),
        r#"{"constants":{},"events":[{"params":{"url":"file:///x"}},{"params":{"url":"http://127.0.0.1:9/"}}]}"#.to_owned(),
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    for round in 0..400 {
        let text = mutate(&mut rng, &inputs[round % inputs.len()]);
        let _ = records::rows(&text);
        let _ = records::table(&text);
        let _ = browser::urls_in_net_log(&text);
        for name in blocks::names(&text) {
            if blocks::extract(&text, &name).is_ok() {
                let new = blocks::replace(&text, &name, "x\n").unwrap();
                assert_eq!(
                    blocks::extract(&new, &name).ok(),
                    Some("x\n"),
                    "round {round}"
                );
            }
        }
    }
}
