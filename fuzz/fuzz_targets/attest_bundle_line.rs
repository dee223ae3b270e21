//! Arbitrary bytes as a bundle, alone or spliced into a real signed bundle: verification
//! never panics, stays bounded (lines over the cap are refused before parsing), and every
//! refusal names a line. Only the untouched bundle (or a prefix of it ending in a
//! checkpoint) may verify.

#![no_main]

use libfuzzer_sys::fuzz_target;
use plimsoll_attest::bundle::{verify_bundle, Entry};
use plimsoll_attest::dsse::Envelope;
use plimsoll_attest::statement::{link_statement, Link};
use plimsoll_attest::{sign_record, SigningKey};
use plimsoll_core::digest::stamp;
use plimsoll_core::pb;

struct Fixture {
    key: SigningKey,
    bundle: Vec<u8>,
}

fn sha(b: &[u8]) -> String {
    plimsoll_core::digest::sha256_hex(b)
}

fn fixture() -> &'static Fixture {
    static F: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();
    F.get_or_init(|| {
        let mut der = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        der.extend_from_slice(&[9u8; 32]);
        let key = SigningKey::from_pkcs8_der(&der).expect("a fixed seed loads");
        let req = pb::RunRequest {
            protocol: 5,
            timeout_ms: 1000,
            payload: Some(pb::run_request::Payload::Javascript(pb::JavaScriptRun {
                code: "console.log(1)".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut resp = pb::RunResponse {
            sandbox: "process".into(),
            isolation: "process".into(),
            result: Some(pb::run_response::Result::Javascript(pb::JavaScriptResult {
                stdout: b"1\n".to_vec(),
                ..Default::default()
            })),
            ..Default::default()
        };
        stamp(&req, &mut resp, "", 1, 2);
        let env = sign_record(&key, resp.record.as_ref().unwrap()).unwrap();
        let entry = Entry::exchange(&req, Some(&resp), Some(env));
        let content = entry.content_json();
        let mut bundle = Vec::new();
        let link = Link {
            index: 1,
            entry_sha256: sha(content.as_bytes()),
            ..Default::default()
        };
        let line = Entry::line_json(&content, &Envelope::sign(&key, link_statement(&link)));
        let cp = Link {
            index: 2,
            previous_sha256: sha(line.as_bytes()),
            checkpoint: true,
            lines: 1,
            ..Default::default()
        };
        let cp_line = Entry::line_json("{}", &Envelope::sign(&key, link_statement(&cp)));
        for l in [line, cp_line] {
            bundle.extend_from_slice(l.as_bytes());
            bundle.push(b'\n');
        }
        verify_bundle(&bundle, &key.public()).expect("the fixture verifies");
        Fixture { key, bundle }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let input = match data.split_first() {
        // Spliced: replace a range of the real bundle with the input.
        Some((&sel, rest)) if sel & 1 == 1 && !f.bundle.is_empty() => {
            let at = (sel as usize * 37) % f.bundle.len();
            let cut = (at + (sel as usize >> 1)).min(f.bundle.len());
            let mut b = f.bundle[..at].to_vec();
            b.extend_from_slice(rest);
            b.extend_from_slice(&f.bundle[cut..]);
            b
        }
        _ => data.to_vec(),
    };
    match verify_bundle(&input, &f.key.public()) {
        Ok(_) => assert!(
            input == f.bundle || f.bundle.starts_with(&input),
            "a changed bundle verified"
        ),
        Err(e) => assert!(e.line().is_some(), "{e} names no line"),
    }
});
