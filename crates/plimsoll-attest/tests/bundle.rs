//! Bundles end to end: written by the appender to real files, verified, tampered with in
//! every way §3.11 names (each failure named at the right line), reopened after a crash,
//! and checked against `-expect` lists.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;

use common::*;
use plimsoll_attest::bundle::{verify_bundle, verify_expected, Appender, BundleError, Expect};
use plimsoll_attest::dsse::Envelope;
use plimsoll_attest::statement::record_statement;
use plimsoll_attest::SigningKey;
use plimsoll_core::pb;
use prost::Message as _;

/// Two runs and a checkpoint, then a session (3 answered calls and one unanswered), its
/// close, an empty session's close, another run and a checkpoint.
fn write_full(path: &std::path::Path, key: &SigningKey) -> Vec<String> {
    let (mut a, report) = Appender::open(path, key.clone(), false).unwrap();
    assert!(report.created);
    let mut digests = Vec::new();
    for i in 0..2 {
        let (req, resp) = run(&format!("console.log({i})"), &format!("{i}\n"));
        a.append_run(&req, &resp).unwrap();
        digests.push(resp.record.unwrap().request_sha256);
    }
    a.checkpoint().unwrap();
    let steps = session(4, 3);
    for s in &steps {
        match s {
            Step::Answered(req, resp) => a.append_session_call(req, resp).unwrap(),
            Step::Unanswered(req, rec) => a.append_unanswered(req, rec, &evidence()).unwrap(),
        };
        digests.push(s.record().request_sha256.clone());
    }
    a.append_close(&close_of(&steps)).unwrap();
    a.append_close(&pb::CloseSessionResponse {
        session: "f".repeat(64),
        ..Default::default()
    })
    .unwrap();
    let (req, resp) = run("console.log('<&>')", "<&>\n");
    a.append_run(&req, &resp).unwrap();
    digests.push(resp.record.unwrap().request_sha256);
    let cp = a.checkpoint().unwrap();
    assert_eq!(cp.index, 11);
    digests
}

fn setup() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    SigningKey,
    Vec<u8>,
    Vec<String>,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    let key = SigningKey::generate().unwrap();
    let digests = write_full(&path, &key);
    let bytes = fs::read(&path).unwrap();
    (dir, path, key, bytes, digests)
}

fn line_of(r: Result<plimsoll_attest::Summary, BundleError>) -> (u64, String) {
    let e = r.expect_err("must not verify");
    (e.line().expect("names a line"), e.to_string())
}

#[test]
fn a_written_bundle_verifies_and_counts_right() {
    let (_d, path, key, bytes, digests) = setup();
    let s = verify_bundle(&bytes, &key.public()).unwrap();
    assert_eq!(s.lines, 11);
    assert_eq!(s.runs, 3);
    assert_eq!(s.session_calls, 4);
    assert_eq!(s.unanswered, 1);
    assert_eq!(s.sessions, 2);
    assert_eq!(
        s.checkpoints.iter().map(|c| c.index).collect::<Vec<_>>(),
        vec![3, 11]
    );
    let ls = lines(&bytes);
    assert_eq!(s.checkpoints[1].line_sha256, sha(&ls[10]));
    assert_eq!(s.request_digests, digests);
    assert_eq!(s.single_runs.len(), 3);
    assert_eq!(s.single_runs[2].line, 10);
    assert_eq!(
        s.single_runs[0].request_sha256,
        plimsoll_core::digest::request_digest(&s.single_runs[0].request)
    );
    // Go escapes in the stored envelopes' payloads are inside base64; the checkpoint line
    // is link only.
    assert!(ls[2].starts_with(b"{\"link\":{\"payloadType\":\"application/vnd.in-toto+json\""));
    assert!(ls[0].starts_with(b"{\"request\":\""));
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Another key verifies nothing.
    let other = SigningKey::generate().unwrap();
    let (line, msg) = line_of(verify_bundle(&bytes, &other.public()));
    assert_eq!(line, 1, "{msg}");
}

#[test]
fn a_flipped_byte_anywhere_is_named_at_its_line() {
    let (_d, _p, key, bytes, _) = setup();
    let ls = lines(&bytes);
    let mut tried = 0;
    for (i, l) in ls.iter().enumerate() {
        for pos in (0..l.len()).step_by(41).chain([l.len() - 1]) {
            let mut m = ls.clone();
            m[i][pos] ^= 0x01;
            let (line, msg) = line_of(verify_bundle(&join(&m), &key.public()));
            assert_eq!(line, i as u64 + 1, "byte {pos} of line {}: {msg}", i + 1);
            tried += 1;
        }
    }
    assert!(tried > 200, "{tried}");
}

#[test]
fn removed_and_swapped_lines_are_named() {
    let (_d, _p, key, bytes, _) = setup();
    let ls = lines(&bytes);
    for k in 0..ls.len() - 1 {
        let mut m = ls.clone();
        m.remove(k);
        let (line, msg) = line_of(verify_bundle(&join(&m), &key.public()));
        assert_eq!(line, k as u64 + 1, "removed line {}: {msg}", k + 1);
        let mut m = ls.clone();
        m.swap(k, k + 1);
        let (line, msg) = line_of(verify_bundle(&join(&m), &key.public()));
        assert_eq!(
            line,
            k as u64 + 1,
            "swapped lines {} and {}: {msg}",
            k + 1,
            k + 2
        );
    }
    // The last line (a checkpoint) removed: the bundle ends in a run line.
    let mut m = ls.clone();
    m.pop();
    let e = verify_bundle(&join(&m), &key.public()).unwrap_err();
    assert!(matches!(e, BundleError::Incomplete { line: 10, .. }), "{e}");
}

#[test]
fn a_truncated_last_line_is_incomplete() {
    let (_d, _p, key, bytes, _) = setup();
    for cut in [1, 2, 100] {
        let e = verify_bundle(&bytes[..bytes.len() - cut], &key.public()).unwrap_err();
        assert!(matches!(e, BundleError::Incomplete { line: 11, .. }), "{e}");
        assert!(e.to_string().contains("incomplete"), "{e}");
    }
    let e = verify_bundle(b"", &key.public()).unwrap_err();
    assert!(matches!(e, BundleError::Incomplete { line: 1, .. }), "{e}");
}

#[test]
fn non_canonical_json_is_refused() {
    let (_d, _p, key, bytes, _) = setup();
    let mut ls = lines(&bytes);
    ls[1].insert(1, b' ');
    let (line, msg) = line_of(verify_bundle(&join(&ls), &key.public()));
    assert_eq!(line, 2);
    assert!(msg.contains("canonical"), "{msg}");
    // A member name escaped where Go writes it plainly: the same JSON value, other bytes.
    let mut ls = lines(&bytes);
    let s = String::from_utf8(ls[0].clone()).unwrap();
    ls[0] = s
        .replace(
            "\"link\":{\"payloadType\"",
            "\"link\":{\"payload\\u0054ype\"",
        )
        .into_bytes();
    let (line, msg) = line_of(verify_bundle(&join(&ls), &key.public()));
    assert_eq!(line, 1);
    assert!(msg.contains("canonical"), "{msg}");
}

#[test]
fn a_changed_stdout_is_found_with_or_without_a_new_link() {
    let (_d, _p, key, bytes, _) = setup();
    let ls = lines(&bytes);
    // Line 2 is the second single run. Change its stdout, keep envelope and link.
    let v: serde_json::Value = serde_json::from_slice(&ls[1]).unwrap();
    let resp_b64 = v["response"].as_str().unwrap();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut resp = pb::RunResponse::decode(b64.decode(resp_b64).unwrap().as_slice()).unwrap();
    if let Some(pb::run_response::Result::Javascript(j)) = &mut resp.result {
        j.stdout = b"forged\n".to_vec();
    }
    let forged_b64 = b64.encode(resp.encode_to_vec());
    let mut m = ls.clone();
    m[1] = String::from_utf8(ls[1].clone())
        .unwrap()
        .replace(resp_b64, &forged_b64)
        .into_bytes();
    let (line, msg) = line_of(verify_bundle(&join(&m), &key.public()));
    assert_eq!(line, 2);
    assert!(msg.contains("entry_sha256"), "{msg}");

    // Even re-linked by the harness key (a harness that signs what it should not), the
    // stored exchange fails the client check at that line.
    let (req, resp_ok) = run("console.log(1)", "1\n");
    let env = plimsoll_attest::sign_record(&key, resp_ok.record.as_ref().unwrap()).unwrap();
    let mut forged = resp_ok.clone();
    if let Some(pb::run_response::Result::Javascript(j)) = &mut forged.result {
        j.stdout = b"forged\n".to_vec();
    }
    let entries = vec![
        Some(run_entry(&key, &req, &resp_ok)),
        Some(plimsoll_attest::bundle::Entry::exchange(
            &req,
            Some(&forged),
            Some(env),
        )),
        None,
    ];
    let b = seal(&key, &entries);
    let (line, msg) = line_of(verify_bundle(&b, &key.public()));
    assert_eq!(line, 2);
    assert!(msg.contains("result_sha256"), "{msg}");
    // And the unchanged pair seals and verifies (the sealer itself is sound).
    let ok = seal(&key, &[entries[0].clone(), None]);
    verify_bundle(&ok, &key.public()).unwrap();
}

#[test]
fn session_rules_are_enforced_at_the_right_line() {
    let key = SigningKey::generate().unwrap();
    let steps = session(3, 0);
    let e = |s: &Step| Some(step_entry(&key, s));
    let close = Some(close_entry(&key, &close_of(&steps)));
    let pk = key.public();

    let good = seal(
        &key,
        &[
            e(&steps[0]),
            e(&steps[1]),
            e(&steps[2]),
            close.clone(),
            None,
        ],
    );
    assert_eq!(verify_bundle(&good, &pk).unwrap().sessions, 1);

    // A missing call: call 3 follows call 1.
    let b = seal(&key, &[e(&steps[0]), e(&steps[2]), close.clone(), None]);
    let (line, msg) = line_of(verify_bundle(&b, &pk));
    assert_eq!(line, 2, "{msg}");
    assert!(msg.contains("sequence"), "{msg}");

    // A second close.
    let b = seal(
        &key,
        &[
            e(&steps[0]),
            e(&steps[1]),
            e(&steps[2]),
            close.clone(),
            close.clone(),
            None,
        ],
    );
    let (line, msg) = line_of(verify_bundle(&b, &pk));
    assert_eq!(line, 5, "{msg}");
    assert!(msg.contains("second close"), "{msg}");

    // A call after the close (the close counts 2 calls).
    let early = Some(close_entry(&key, &close_of(&steps[..2])));
    let b = seal(
        &key,
        &[e(&steps[0]), e(&steps[1]), early, e(&steps[2]), None],
    );
    let (line, msg) = line_of(verify_bundle(&b, &pk));
    assert_eq!(line, 4, "{msg}");
    assert!(msg.contains("after its close"), "{msg}");

    // A close whose count is wrong.
    let b = seal(&key, &[e(&steps[0]), e(&steps[1]), close.clone(), None]);
    let (line, msg) = line_of(verify_bundle(&b, &pk));
    assert_eq!(line, 3, "{msg}");

    // A session never closed: named at its first call.
    let b = seal(&key, &[None, e(&steps[0]), None]);
    let (line, msg) = line_of(verify_bundle(&b, &pk));
    assert_eq!(line, 2, "{msg}");
    assert!(msg.contains("never closed"), "{msg}");

    // An unanswered record outside a session, and a v1 record, are refused.
    let (req, resp) = run("1", "1");
    let mut rec = resp.record.clone().unwrap();
    rec.version = 3;
    rec.result_sha256.clear();
    rec.unanswered = "internal".into();
    rec.record_sha256 = plimsoll_core::digest::record_digest(&rec);
    let env = plimsoll_attest::sign_record(&key, &rec).unwrap();
    let b = seal(
        &key,
        &[
            Some(plimsoll_attest::bundle::Entry::exchange(
                &req,
                None,
                Some(env),
            )),
            None,
        ],
    );
    let (line, msg) = line_of(verify_bundle(&b, &pk));
    assert_eq!(line, 1, "{msg}");
    assert!(msg.contains("outside a session"), "{msg}");

    let mut v1 = resp.record.clone().unwrap();
    v1.version = 1;
    v1.record_sha256 = plimsoll_core::digest::record_digest(&v1);
    let mut resp1 = resp.clone();
    resp1.record = Some(v1.clone());
    let env = Envelope::sign(&key, record_statement(&v1));
    let b = seal(
        &key,
        &[
            Some(plimsoll_attest::bundle::Entry::exchange(
                &req,
                Some(&resp1),
                Some(env),
            )),
            None,
        ],
    );
    let (line, msg) = line_of(verify_bundle(&b, &pk));
    assert_eq!(line, 1, "{msg}");
    assert!(msg.contains("version 1"), "{msg}");

    // A single run whose record carries chain fields.
    let (req, mut resp) = run("2", "2");
    let mut rec = resp.record.clone().unwrap();
    rec.sequence = 1;
    rec.record_sha256 = plimsoll_core::digest::record_digest(&rec);
    resp.record = Some(rec);
    let b = seal(&key, &[Some(run_entry(&key, &req, &resp)), None]);
    let (line, msg) = line_of(verify_bundle(&b, &pk));
    assert_eq!(line, 1, "{msg}");
    assert!(msg.contains("session fields"), "{msg}");
}

#[test]
fn a_link_signed_by_another_key_is_named() {
    let key = SigningKey::generate().unwrap();
    let other = SigningKey::generate().unwrap();
    let (r1, p1) = run("1", "1");
    let (r2, p2) = run("2", "2");
    let entries = [
        Some(run_entry(&key, &r1, &p1)),
        Some(run_entry(&key, &r2, &p2)),
        None,
    ];
    let good = lines(&seal(&key, &entries));
    let by_other = lines(&seal(&other, &entries));
    // Line 2's link re-signed by another key over the very same statement.
    let mut m = good.clone();
    let s = String::from_utf8(good[1].clone()).unwrap();
    let o = String::from_utf8(by_other[1].clone()).unwrap();
    let link_at = s.find("\"link\":").unwrap();
    m[1] = format!("{}{}", &s[..link_at], &o[o.find("\"link\":").unwrap()..]).into_bytes();
    let (line, msg) = line_of(verify_bundle(&join(&m), &key.public()));
    assert_eq!(line, 2, "{msg}");
    assert!(msg.contains("link does not verify"), "{msg}");
    // A record envelope signed by another key, linked by the right one.
    let bad = [
        Some(run_entry(&key, &r1, &p1)),
        Some(run_entry(&other, &r2, &p2)),
        None,
    ];
    let (line, msg) = line_of(verify_bundle(&seal(&key, &bad), &key.public()));
    assert_eq!(line, 2, "{msg}");
    assert!(msg.contains("envelope does not verify"), "{msg}");
}

#[test]
fn a_partial_append_is_truncated_on_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    let key = SigningKey::generate().unwrap();
    {
        let (mut a, _) = Appender::open(&path, key.clone(), false).unwrap();
        let (req, resp) = run("1", "1");
        a.append_run(&req, &resp).unwrap();
        a.checkpoint().unwrap();
    }
    let whole = fs::read(&path).unwrap();
    // Half of a real line, written by hand, as a crash mid-write leaves it.
    let extra = lines(&whole)[0].clone();
    let half = &extra[..extra.len() / 2];
    let mut partial = whole.clone();
    partial.extend_from_slice(half);
    fs::write(&path, &partial).unwrap();
    assert!(verify_bundle(&partial, &key.public()).is_err());

    let (mut a, report) = Appender::open(&path, key.clone(), false).unwrap();
    assert!(!report.created);
    assert_eq!(report.lines, 2);
    assert_eq!(report.truncated_bytes, half.len() as u64);
    assert_eq!(fs::read(&path).unwrap(), whole);
    let (req, resp) = run("2", "2");
    a.append_run(&req, &resp).unwrap();
    a.checkpoint().unwrap();
    drop(a);
    let s = verify_bundle(&fs::read(&path).unwrap(), &key.public()).unwrap();
    assert_eq!((s.lines, s.runs, s.checkpoints.len()), (4, 2, 2));

    // A complete last line that does not decode is cut too.
    let mut f = fs::read(&path).unwrap();
    let before = f.len();
    f.extend_from_slice(b"{\"req\n");
    fs::write(&path, &f).unwrap();
    let (_a, report) = Appender::open(&path, key.clone(), false).unwrap();
    assert_eq!(report.truncated_bytes, 6);
    drop(_a);
    assert_eq!(fs::read(&path).unwrap().len(), before);

    // A broken line that is not the last one is refused, not cut.
    let mut ls = lines(&fs::read(&path).unwrap());
    ls[1][5] ^= 1;
    fs::write(&path, join(&ls)).unwrap();
    let e = Appender::open(&path, key.clone(), false).unwrap_err();
    assert_eq!(e.line(), Some(2), "{e}");
}

#[test]
fn file_modes_are_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    let key = SigningKey::generate().unwrap();
    drop(Appender::open(&path, key.clone(), false).unwrap());
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    let e = Appender::open(&path, key.clone(), false).unwrap_err();
    assert!(matches!(e, BundleError::Refused(_)), "{e}");
    assert!(e.to_string().contains("0644"), "{e}");
    let (_a, r) = Appender::open(&path, key.clone(), true).unwrap();
    assert!(!r.created);
}

#[test]
fn the_appender_signs_only_what_checks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    let key = SigningKey::generate().unwrap();
    let (mut a, _) = Appender::open(&path, key.clone(), false).unwrap();

    // Below the floor: never signed.
    let (mut req, resp) = run("1", "1");
    req.minimum_isolation = "vm".into();
    let mut resp = resp;
    plimsoll_core::digest::stamp(&req, &mut resp, "", 1, 2);
    let e = a.append_run(&req, &resp).unwrap_err();
    assert!(e.to_string().contains("below the requested floor"), "{e}");
    // A changed output: the client check fails.
    let (req, mut resp) = run("1", "1");
    if let Some(pb::run_response::Result::Javascript(j)) = &mut resp.result {
        j.stdout = b"2".to_vec();
    }
    assert!(matches!(
        a.append_run(&req, &resp),
        Err(BundleError::Check(_))
    ));
    assert_eq!(fs::metadata(&path).unwrap().len(), 0, "nothing written");

    // A session: out-of-order calls, a wrong close, calls after close are refused.
    let steps = session(3, 2);
    let Step::Answered(r1, p1) = &steps[0] else {
        panic!()
    };
    let Step::Unanswered(r2, rec2) = &steps[1] else {
        panic!()
    };
    let Step::Answered(r3, p3) = &steps[2] else {
        panic!()
    };
    assert!(
        a.append_session_call(r3, p3).is_err(),
        "call 3 before call 1"
    );
    a.append_session_call(r1, p1).unwrap();
    let mut wrong_evidence = evidence();
    wrong_evidence.isolation = "container".into();
    assert!(a.append_unanswered(r2, rec2, &wrong_evidence).is_err());
    a.append_unanswered(r2, rec2, &evidence()).unwrap();
    let e = a.append_close(&close_of(&steps)).unwrap_err();
    assert!(e.to_string().contains("the bundle holds 2"), "{e}");
    a.append_session_call(r3, p3).unwrap();
    a.append_close(&close_of(&steps)).unwrap();
    let e = a.append_session_call(r3, p3).unwrap_err();
    assert!(e.to_string().contains("closed at line 4"), "{e}");
    assert!(a.append_close(&close_of(&steps)).is_err());
    a.checkpoint().unwrap();
    drop(a);
    let s = verify_bundle(&fs::read(&path).unwrap(), &key.public()).unwrap();
    assert_eq!(
        (s.lines, s.session_calls, s.unanswered, s.sessions),
        (5, 3, 1, 1)
    );

    // Reopened, the appender still knows the session is closed.
    let (mut a, _) = Appender::open(&path, key.clone(), false).unwrap();
    assert!(a.append_session_call(r3, p3).is_err());
    assert!(a.append_close(&close_of(&steps)).is_err());
}

#[test]
fn unsealed_records_get_their_own_file() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("b.jsonl");
    let key = SigningKey::generate().unwrap();
    let (req, resp) = run("1", "1");
    let entry = run_entry(&key, &req, &resp);
    let p = plimsoll_attest::bundle::write_unsealed(&bundle, &entry).unwrap();
    let name = p.file_name().unwrap().to_str().unwrap().to_owned();
    assert!(name.starts_with("b.jsonl.unsealed-2"), "{name}");
    assert!(name.ends_with(".jsonl") && name.contains("Z-"), "{name}");
    assert_eq!(
        fs::metadata(&p).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let text = fs::read_to_string(&p).unwrap();
    assert_eq!(text, format!("{}\n", entry.content_json()));
    let again = plimsoll_attest::bundle::write_unsealed(&bundle, &entry).unwrap();
    assert_ne!(again, p);

    // The convenience form signs only an exchange that checks.
    assert_eq!(
        plimsoll_attest::Entry::unsealed_run(&key, &req, &resp),
        entry
    );
    let mut forged = resp.clone();
    if let Some(pb::run_response::Result::Javascript(j)) = &mut forged.result {
        j.stdout = b"2".to_vec();
    }
    let unsigned = plimsoll_attest::Entry::unsealed_run(&key, &req, &forged);
    assert!(unsigned.envelope.is_none());
    assert!(!unsigned.response.is_empty());
}

#[test]
fn expect_lists_and_counts() {
    let (_d, _p, key, bytes, digests) = setup();
    let s = verify_bundle(&bytes, &key.public()).unwrap();
    verify_expected(&s, &Expect::Count(7)).unwrap();
    let e = verify_expected(&s, &Expect::Count(6)).unwrap_err();
    assert!(e.to_string().contains("expected 6"), "{e}");

    let mut file = String::new();
    for (i, d) in digests.iter().rev().enumerate() {
        file.push_str(&format!("{d} run {i}\n\n"));
    }
    verify_expected(&s, &Expect::parse_digests(&file).unwrap()).unwrap();

    // One missing from the bundle (expected twice).
    let extra_expected = format!("{file}{}\n", digests[0]);
    let e = verify_expected(&s, &Expect::parse_digests(&extra_expected).unwrap()).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("request {} is expected but missing", digests[0])),
        "{e}"
    );
    // One in the bundle but not expected.
    let fewer: String = digests[1..].iter().map(|d| format!("{d}\n")).collect();
    let e = verify_expected(&s, &Expect::parse_digests(&fewer).unwrap()).unwrap_err();
    assert!(
        e.to_string().contains(&format!(
            "request {} is in the bundle more often",
            digests[0]
        )),
        "{e}"
    );
}

/// A small xorshift generator: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn random_mutations_never_panic_and_always_name_a_line() {
    let (_d, _p, key, bytes, _) = setup();
    let pk = key.public();
    // Prefixes ending right after a checkpoint line verify (the acknowledged residual gap).
    let mut checkpoint_ends = vec![];
    let mut at = 0;
    for l in lines(&bytes) {
        at += l.len() + 1;
        if l.starts_with(b"{\"link\"") {
            checkpoint_ends.push(at);
        }
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..3000 {
        let mut m = bytes.clone();
        for _ in 0..1 + rng.below(3) {
            let len = m.len().max(1);
            match rng.below(6) {
                0 => {
                    let i = rng.below(len);
                    if i < m.len() {
                        m[i] ^= 1 << rng.below(8);
                    }
                }
                1 => {
                    let i = rng.below(len);
                    if i < m.len() {
                        m.remove(i);
                    }
                }
                2 => {
                    let i = rng.below(len + 1).min(m.len());
                    m.insert(i, b"{}\n\":,\\ a0=[]"[rng.below(13)]);
                }
                3 => m.truncate(rng.below(len)),
                4 => {
                    // Duplicate a random range.
                    let a = rng.below(len).min(m.len());
                    let b = (a + rng.below(3000)).min(m.len());
                    let chunk = m[a..b].to_vec();
                    let at = rng.below(m.len() + 1);
                    m.splice(at..at, chunk);
                }
                _ => {
                    let i = rng.below(len).min(m.len());
                    let j = rng.below(len).min(m.len());
                    if i < m.len() && j < m.len() {
                        m.swap(i, j);
                    }
                }
            }
        }
        match verify_bundle(&m, &pk) {
            Ok(_) => assert!(
                m == bytes || checkpoint_ends.iter().any(|&e| m[..] == bytes[..e]),
                "round {round}: a mutated bundle verified"
            ),
            Err(e) => assert!(e.line().is_some(), "round {round}: {e} names no line"),
        }
    }
}

#[test]
fn a_valid_line_from_another_bundle_is_named() {
    // Two bundles by the same key: line 2 of one spliced into the other has the right
    // index and a good signature, but not the right previous_sha256.
    let key = SigningKey::generate().unwrap();
    let (r1, p1) = run("1", "1");
    let (r2, p2) = run("2", "2");
    let (r3, p3) = run("3", "3");
    let a = lines(&seal(
        &key,
        &[
            Some(run_entry(&key, &r1, &p1)),
            Some(run_entry(&key, &r2, &p2)),
            None,
        ],
    ));
    let b = lines(&seal(
        &key,
        &[
            Some(run_entry(&key, &r3, &p3)),
            Some(run_entry(&key, &r2, &p2)),
            None,
        ],
    ));
    assert_ne!(a[1], b[1]);
    let mut m = a.clone();
    m[1] = b[1].clone();
    let (line, msg) = line_of(verify_bundle(&join(&m), &key.public()));
    assert_eq!(line, 2, "{msg}");
    assert!(
        msg.contains("previous_sha256 does not match line 1"),
        "{msg}"
    );
}

#[test]
fn the_stored_record_must_be_the_signed_one() {
    // The envelope signs one valid record, the stored response carries another valid one
    // (different start time): each checks on its own, together they must not.
    let key = SigningKey::generate().unwrap();
    let (req, resp) = run("1", "1");
    let mut other = resp.clone();
    plimsoll_core::digest::stamp(&req, &mut other, "", 999, 1_005);
    let env = plimsoll_attest::sign_record(&key, resp.record.as_ref().unwrap()).unwrap();
    let entry = plimsoll_attest::bundle::Entry::exchange(&req, Some(&other), Some(env));
    let (line, msg) = line_of(verify_bundle(
        &seal(&key, &[Some(entry), None]),
        &key.public(),
    ));
    assert_eq!(line, 1, "{msg}");
    assert!(
        msg.contains("differs from the signed record in started_unix_ms"),
        "{msg}"
    );
}

#[test]
fn a_link_with_two_signatures_is_refused() {
    // A second signature (another key's) added to a link: the statement and the harness
    // signature are intact, but a link carries exactly one signature.
    let key = SigningKey::generate().unwrap();
    let other = SigningKey::generate().unwrap();
    let (r1, p1) = run("1", "1");
    let entries = [Some(run_entry(&key, &r1, &p1)), None];
    let good = lines(&seal(&key, &entries));
    let by_other = lines(&seal(&other, &entries));
    let sig_of = |l: &[u8]| {
        let s = String::from_utf8(l.to_vec()).unwrap();
        let at = s.rfind("{\"keyid\":").unwrap();
        s[at..s.len() - 3].to_owned()
    };
    let s = String::from_utf8(good[0].clone()).unwrap();
    let two = format!("{},{}]}}}}", &s[..s.len() - 3], sig_of(&by_other[0]));
    let mut m = good.clone();
    m[0] = two.into_bytes();
    let (line, msg) = line_of(verify_bundle(&join(&m), &key.public()));
    assert_eq!(line, 1, "{msg}");
    assert!(msg.contains("exactly one"), "{msg}");
}

#[test]
fn a_bundle_of_one_checkpoint_verifies_and_oversized_lines_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    let key = SigningKey::generate().unwrap();
    let (mut a, _) = Appender::open(&path, key.clone(), false).unwrap();
    let cp = a.checkpoint().unwrap();
    drop(a);
    let bytes = fs::read(&path).unwrap();
    assert_eq!(cp.line_sha256, sha(&bytes[..bytes.len() - 1]));
    let s = verify_bundle(&bytes, &key.public()).unwrap();
    assert_eq!((s.lines, s.runs, s.checkpoints.len()), (1, 0, 1));

    // A line over the cap is refused before it is parsed, with or without a newline.
    let mut big = bytes.clone();
    big.extend(std::iter::repeat_n(
        b'a',
        plimsoll_attest::bundle::MAX_LINE + 1,
    ));
    let e = verify_bundle(&big, &key.public()).unwrap_err();
    assert_eq!(e.line(), Some(2), "{e}");
    assert!(e.to_string().contains("longer than"), "{e}");
    big.push(b'\n');
    let e = verify_bundle(&big, &key.public()).unwrap_err();
    assert!(e.to_string().contains("line 2: longer than"), "{e}");
}

#[test]
fn a_second_appender_waits_for_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.jsonl");
    let key = SigningKey::generate().unwrap();
    let (mut first, _) = Appender::open(&path, key.clone(), false).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    let k = key.clone();
    let waiter = std::thread::spawn(move || {
        let (mut second, report) = Appender::open(&p, k, false).unwrap();
        // It sees what the first appender wrote before it let go.
        tx.send(report.lines).unwrap();
        second.checkpoint().unwrap();
    });
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(300))
            .is_err(),
        "the second appender got in while the first held the lock"
    );
    let (req, resp) = run("1", "1");
    first.append_run(&req, &resp).unwrap();
    first.checkpoint().unwrap();
    drop(first);
    assert_eq!(
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap(),
        2
    );
    waiter.join().unwrap();
    let s = verify_bundle(&fs::read(&path).unwrap(), &key.public()).unwrap();
    assert_eq!((s.lines, s.runs), (3, 1));
}

/// Replaces the `which`th (0 = first, usize::MAX = last) `"sig"` value of `line` with a
/// valid signature by `key` over other bytes: still canonical, no longer verifying.
fn resign(line: &str, key: &SigningKey, last: bool) -> String {
    use base64::Engine as _;
    let at = if last {
        line.rfind("\"sig\":\"")
    } else {
        line.find("\"sig\":\"")
    }
    .unwrap()
        + 7;
    let end = at + line[at..].find('"').unwrap();
    let other = base64::engine::general_purpose::STANDARD.encode(key.sign(b"something else"));
    format!("{}{other}{}", &line[..at], &line[end..])
}

#[test]
fn a_large_bundle_checks_signatures_in_parallel_and_still_names_the_first_broken_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.jsonl");
    let key = SigningKey::generate().unwrap();
    let (mut a, _) = Appender::open(&path, key.clone(), false).unwrap();
    let out = "x".repeat(4096);
    for i in 0..300 {
        let (req, resp) = run(&format!("console.log({i})"), &out);
        a.append_run(&req, &resp).unwrap();
    }
    a.checkpoint().unwrap();
    drop(a);
    let good = fs::read_to_string(&path).unwrap();
    assert!(good.len() > 1 << 20, "big enough for the parallel pass");
    let summary = verify_bundle(good.as_bytes(), &key.public()).unwrap();
    assert_eq!(summary.runs, 300);
    let lines: Vec<&str> = good.lines().collect();
    let with = |changes: &[(usize, String)]| -> Vec<u8> {
        let mut ls: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        for (i, l) in changes {
            ls[*i] = l.clone();
        }
        ls.iter()
            .flat_map(|l| format!("{l}\n").into_bytes())
            .collect()
    };
    // A link signature at line 200 (the chain itself is intact).
    let b = with(&[(199, resign(lines[199], &key, true))]);
    let (line, msg) = line_of(verify_bundle(&b, &key.public()));
    assert_eq!(line, 200, "{msg}");
    assert!(msg.contains("the link does not verify"), "{msg}");
    // A record envelope's signature at line 250 (its link no longer matches the entry
    // either; the line is what counts).
    let b = with(&[(249, resign(lines[249], &key, false))]);
    let (line, msg) = line_of(verify_bundle(&b, &key.public()));
    assert_eq!(line, 250, "{msg}");
    // The last checkpoint's signature: nothing after it links to it, so only the
    // signature pass can find it.
    let b = with(&[(300, resign(lines[300], &key, true))]);
    let (line, msg) = line_of(verify_bundle(&b, &key.public()));
    assert_eq!(line, 301, "{msg}");
    assert!(msg.contains("the link does not verify"), "{msg}");
    // An earlier break of another kind wins over a later bad signature.
    let b = with(&[
        (49, lines[48].to_string()),
        (199, resign(lines[199], &key, true)),
    ]);
    let (line, msg) = line_of(verify_bundle(&b, &key.public()));
    assert_eq!(line, 50, "{msg}");
    // And an earlier bad signature wins over a later break.
    let b = with(&[
        (29, resign(lines[29], &key, true)),
        (199, lines[198].to_string()),
    ]);
    let (line, msg) = line_of(verify_bundle(&b, &key.public()));
    assert_eq!(line, 30, "{msg}");
}

#[test]
fn another_key_cannot_append() {
    let (_dir, path, _key, bytes, _) = setup();
    let other = SigningKey::generate().unwrap();
    let e = Appender::open(&path, other.clone(), false).expect_err("another key is refused");
    assert!(e.to_string().contains(&other.key_id()), "{e}");
    assert_eq!(fs::read(&path).unwrap(), bytes, "nothing changed");
}
