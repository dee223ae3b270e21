//! Reproduces every vector in `tests/fixtures/golden.json` (provenance in the README beside it).
//!
//! The fixture is part of the repository, so a plain clone passes with nothing beside it.
//! `PLIMSOLL_GOLDEN_JSON` may name another copy of the file (to check a newer set of vectors
//! before copying it in). A missing fixture fails the test.

use plimsoll_core::digest::{record_digest, request_digest, result_digest, session_fingerprint};
use plimsoll_core::pb;

fn fixture() -> serde_json::Value {
    let path = std::env::var("PLIMSOLL_GOLDEN_JSON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden.json")
        });
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden.json parses")
}

#[test]
fn every_golden_vector_reproduces() {
    let g = fixture();
    let mut checked = 0;
    for v in g["requests"].as_array().unwrap() {
        let req: pb::RunRequest = serde_json::from_value(v["request"].clone()).unwrap();
        assert_eq!(
            request_digest(&req),
            v["sha256"].as_str().unwrap(),
            "{}",
            v["name"]
        );
        checked += 1;
    }
    for v in g["results"].as_array().unwrap() {
        let resp: pb::RunResponse = serde_json::from_value(v["response"].clone()).unwrap();
        assert_eq!(
            result_digest(&resp),
            v["sha256"].as_str().unwrap(),
            "{}",
            v["name"]
        );
        checked += 1;
    }
    for v in g["records"].as_array().unwrap() {
        let rec: pb::RunRecord = serde_json::from_value(v["record"].clone()).unwrap();
        assert_eq!(
            record_digest(&rec),
            v["sha256"].as_str().unwrap(),
            "{}",
            v["name"]
        );
        checked += 1;
    }
    for v in g["sessionFingerprints"].as_array().unwrap() {
        assert_eq!(
            session_fingerprint(v["sessionId"].as_str().unwrap()),
            v["sha256"].as_str().unwrap()
        );
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} vectors found");
}
