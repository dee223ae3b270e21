//! The page's bundle checker (`verify.js` under node) and the Rust verifier
//! (`plimsoll_attest::verify_bundle`) reach the same verdict, and name the same first bad
//! line, on the shipped bundle and on changed copies of it: one byte of an answer, of a
//! signature or of a link; a line removed, two swapped, the last checkpoint cut; another key; the
//! lines of two bundles signed by one key spliced together (only the link to the previous
//! line tells). Both Ed25519 engines of the page run (node's WebCrypto and the pure-JS
//! fallback).

mod common;

use std::process::Command;

use common::*;
use plimsoll_attest::bundle::{verify_bundle, Appender};
use plimsoll_attest::{PublicKey, SigningKey};
use plimsoll_core::pb;
use rand::{Rng as _, SeedableRng as _};

struct Js {
    ok: bool,
    first_bad: Option<u64>,
    reason: String,
    engine: String,
}

fn js(lines: &[String], pub_pem: &str, engine: &str) -> Js {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b.jsonl");
    let k = dir.path().join("k.pub");
    std::fs::write(
        &b,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    std::fs::write(&k, pub_pem).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/bundle.js");
    let out = Command::new("node")
        .arg(script)
        .arg(&b)
        .arg(&k)
        .arg(engine)
        .output()
        .expect("node runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let first_bad = v["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l[2] == false)
        .map(|l| l[0].as_u64().unwrap());
    Js {
        ok: v["ok"].as_bool().unwrap(),
        first_bad,
        reason: v["reason"].as_str().unwrap_or("").to_owned(),
        engine: v["engine"].as_str().unwrap().to_owned(),
    }
}

fn rust(lines: &[String], pub_pem: &str) -> Result<(), Option<u64>> {
    let key = PublicKey::from_spki_pem(pub_pem).unwrap();
    let bytes: String = lines.iter().map(|l| format!("{l}\n")).collect();
    verify_bundle(bytes.as_bytes(), &key)
        .map(|_| ())
        .map_err(|e| e.line())
}

fn agree(name: &str, lines: &[String], pub_pem: &str) -> Js {
    let r = rust(lines, pub_pem);
    let mut last = None;
    for engine in ["webcrypto", "js"] {
        let j = js(lines, pub_pem, engine);
        assert_eq!(
            j.ok,
            r.is_ok(),
            "{name} ({engine}): JavaScript says ok={} ({}), Rust {r:?}",
            j.ok,
            j.reason
        );
        if let Err(Some(line)) = r {
            // The page checks every line; Rust stops at the first bad one. They must agree on it
            // (a bundle that is only incomplete has no bad line on the page).
            if let Some(first) = j.first_bad {
                assert_eq!(
                    first, line,
                    "{name} ({engine}): first bad line {first} in JavaScript ({}), {line} in Rust",
                    j.reason
                );
            } else {
                assert_eq!(line as usize, lines.len(), "{name}: only the end is wrong");
            }
        }
        if engine == "js" {
            assert_eq!(j.engine, "javascript");
        }
        last = Some(j);
    }
    last.unwrap()
}

#[test]
fn javascript_and_rust_agree_on_the_shipped_bundle_and_on_changed_copies() {
    let lines = shipped_lines();
    let key = shipped_pub();
    let recs = record_lines(&lines);
    assert_eq!(recs.len(), 5, "the shipped bundle holds five records");
    let good = agree("shipped", &lines, &key);
    assert!(good.ok && good.first_bad.is_none());

    for c in one_byte_changes(&lines) {
        let j = agree(c.name, &c.lines, &key);
        assert!(j.reason.contains(c.reason), "{}: {}", c.name, j.reason);
    }

    let mut changed = lines.clone();
    changed[recs[4] - 1] = change_answer(&lines[recs[4] - 1]);
    agree("session call answer byte", &changed, &key);

    let mut removed = lines.clone();
    removed.remove(recs[1] - 1);
    agree("a line removed", &removed, &key);

    let mut swapped = lines.clone();
    swapped.swap(recs[3] - 1, recs[4] - 1);
    agree("two calls swapped", &swapped, &key);

    let mut cut = lines.clone();
    cut.pop();
    let j = agree("the last checkpoint cut", &cut, &key);
    assert!(
        j.reason.contains("does not end in a checkpoint"),
        "{}",
        j.reason
    );

    let other = plimsoll_attest::SigningKey::generate().unwrap().public();
    let j = agree("another key", &lines, &other.to_spki_pem());
    assert!(j.reason.contains("does not verify"), "{}", j.reason);
}

/// A bundle of one run of `code`, signed with `key`, made in this process.
fn one_run_bundle(key: &SigningKey, code: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    let key = SigningKey::from_pkcs8_pem(&key.to_pkcs8_pem()).unwrap();
    let (mut app, _) = Appender::open(&path, key, false).unwrap();
    let req = plimsoll_testkit::daemon::js_request(code, "", 1000);
    let mut resp = pb::RunResponse {
        sandbox: "process".into(),
        isolation: "process".into(),
        result: Some(pb::run_response::Result::Javascript(pb::JavaScriptResult {
            stdout: b"1\n".to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    };
    plimsoll_core::digest::stamp(&req, &mut resp, "", 1_800_000_000_000, 1_800_000_000_005);
    app.append_run(&req, &resp).unwrap();
    app.checkpoint().unwrap();
    drop(app);
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_line_from_another_bundle_of_the_same_key_breaks_the_link_to_the_line_before() {
    let key = SigningKey::generate().unwrap();
    let pub_pem = key.public().to_spki_pem();
    let a = one_run_bundle(&key, "console.log(1)");
    let b = one_run_bundle(&key, "console.log(2)");
    agree("bundle a", &a, &pub_pem);
    let spliced = vec![a[0].clone(), b[1].clone()];
    let j = agree("a's run, b's checkpoint", &spliced, &pub_pem);
    assert_eq!(j.first_bad, Some(2));
    assert!(
        j.reason.contains("changed after it was linked"),
        "{}",
        j.reason
    );
}

#[test]
fn random_one_byte_changes_get_the_same_verdict_from_javascript_and_rust() {
    let lines = shipped_lines();
    let key = shipped_pub();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x05ee_d1e5_50dd_ba11);
    let alphabet = b"{}[]\":,0123456789abcdefABCDEF+/=xyz \\";
    let cases: Vec<Vec<String>> = (0..300)
        .map(|_| {
            let mut c = lines.clone();
            let n = rng.gen_range(0..c.len());
            let mut bytes = c[n].clone().into_bytes();
            let at = rng.gen_range(0..bytes.len());
            let mut b = alphabet[rng.gen_range(0..alphabet.len())];
            if b == bytes[at] {
                b = if b == b'a' { b'b' } else { b'a' };
            }
            bytes[at] = b;
            c[n] = String::from_utf8(bytes).unwrap();
            c
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let cases_file = dir.path().join("cases.json");
    let key_file = dir.path().join("k.pub");
    std::fs::write(&cases_file, serde_json::to_string(&cases).unwrap()).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/bundle.js");
    let out = Command::new("node")
        .arg(script)
        .arg("--many")
        .arg(&cases_file)
        .arg(&key_file)
        .output()
        .expect("node runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(reports.len(), cases.len());
    for (i, (case, js)) in cases.iter().zip(&reports).enumerate() {
        let r = rust(case, &key);
        assert_eq!(
            js["ok"].as_bool().unwrap(),
            r.is_ok(),
            "case {i}: JavaScript {js}, Rust {r:?}"
        );
        if let Err(Some(line)) = r {
            assert_eq!(
                js["first_bad"].as_u64(),
                Some(line),
                "case {i}: JavaScript {js}, Rust line {line}"
            );
        }
    }
}
