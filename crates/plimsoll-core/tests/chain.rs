//! Session record chains: a chain of stamped answers verifies link by link, a tampered
//! middle record breaks it, unanswered (version-3) records keep their place, and a session
//! call digests exactly like the same payload sent as a `RunRequest`.

use plimsoll_core::check::{check_session_answer, check_unanswered, CheckError};
use plimsoll_core::digest::{
    request_digest, session_call_as_run, session_fingerprint, stamp_linked, unanswered_record,
    ChainLink, SessionEvidence,
};
use plimsoll_core::pb::{self, session_run_request::Payload};

fn call(code: &str) -> pb::SessionRunRequest {
    pb::SessionRunRequest {
        protocol: 5,
        timeout_ms: 1000,
        session_id: "00112233445566778899aabbccddeeff".into(),
        trace_id: "t-1".into(),
        payload: Some(Payload::Cell(pb::CellRun {
            language: "python".into(),
            code: code.into(),
            files: vec![],
        })),
        ..Default::default()
    }
}

fn answer(req: &pb::SessionRunRequest, out: &str, link: &ChainLink) -> pb::RunResponse {
    let mut resp = pb::RunResponse {
        sandbox: "process".into(),
        isolation: "process".into(),
        result: Some(pb::run_response::Result::Cell(pb::CellResult {
            stdout: out.as_bytes().to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    };
    stamp_linked(&session_call_as_run(req), &mut resp, "", (1000, 1005), link);
    resp
}

fn link(fp: &str, seq: u64, prev: &str) -> ChainLink {
    ChainLink {
        session: fp.into(),
        sequence: seq,
        previous_sha256: prev.into(),
    }
}

#[test]
fn a_session_call_digests_like_the_same_run() {
    let req = call("x = 1");
    let as_run = session_call_as_run(&req);
    assert!(as_run.trace_id.is_empty());
    let direct = pb::RunRequest {
        protocol: 5,
        timeout_ms: 1000,
        payload: Some(pb::run_request::Payload::Cell(pb::CellRun {
            language: "python".into(),
            code: "x = 1".into(),
            files: vec![],
        })),
        ..Default::default()
    };
    assert_eq!(request_digest(&as_run), request_digest(&direct));
}

#[test]
fn a_chain_verifies_and_a_tampered_middle_record_breaks_it() {
    let fp = session_fingerprint("00112233445566778899aabbccddeeff");
    let reqs = [call("a"), call("b"), call("c")];
    let mut answers = Vec::new();
    let mut prev = String::new();
    for (i, r) in reqs.iter().enumerate() {
        let a = answer(r, "out", &link(&fp, i as u64 + 1, &prev));
        prev = a.record.as_ref().unwrap().record_sha256.clone();
        answers.push(a);
    }
    let verify = |answers: &[pb::RunResponse]| -> Result<(), CheckError> {
        let mut prev = String::new();
        for (i, (r, a)) in reqs.iter().zip(answers).enumerate() {
            check_session_answer(r, a, &link(&fp, i as u64 + 1, &prev))?;
            prev = a.record.as_ref().unwrap().record_sha256.clone();
        }
        Ok(())
    };
    verify(&answers).unwrap();

    // The middle answer's output changed: its result digest no longer matches.
    let mut tampered = answers.clone();
    if let Some(pb::run_response::Result::Cell(c)) = &mut tampered[1].result {
        c.stdout = b"forged".to_vec();
    }
    assert!(matches!(
        verify(&tampered),
        Err(CheckError::Mismatch {
            field: "result_sha256",
            ..
        })
    ));
    // The middle record re-stamped consistently with forged output: its own digest checks,
    // but the next record's previous_sha256 no longer names it.
    let mut restamped = answers.clone();
    let forged = answer(
        &reqs[1],
        "forged",
        &link(&fp, 2, &answers[0].record.as_ref().unwrap().record_sha256),
    );
    restamped[1] = forged;
    assert!(matches!(
        verify(&restamped),
        Err(CheckError::Chain {
            field: "previous_sha256",
            ..
        })
    ));
    // A record of another session, or out of order, is refused.
    assert!(matches!(
        check_session_answer(&reqs[0], &answers[0], &link("other", 1, "")),
        Err(CheckError::Chain {
            field: "session",
            ..
        })
    ));
    assert!(matches!(
        check_session_answer(&reqs[1], &answers[1], &link(&fp, 3, &prev)),
        Err(CheckError::Chain {
            field: "sequence",
            ..
        })
    ));
}

#[test]
fn unanswered_records_keep_their_place_and_are_checked() {
    let fp = session_fingerprint("00112233445566778899aabbccddeeff");
    let ev = SessionEvidence {
        provider: "process".into(),
        isolation: "process".into(),
        ..Default::default()
    };
    let req = call("while True: pass");
    let l = link(&fp, 4, "ab");
    let rec = unanswered_record(&session_call_as_run(&req), &ev, "internal", (10, 20), &l);
    assert_eq!(rec.version, 3);
    check_unanswered(&req, &rec, &l, &ev).unwrap();
    let mut bad = rec.clone();
    bad.unanswered = "exploded".into();
    assert!(matches!(
        check_unanswered(&req, &bad, &l, &ev),
        Err(CheckError::Unanswered(_))
    ));
    let mut bad = rec.clone();
    bad.result_sha256 = "00".into();
    assert!(check_unanswered(&req, &bad, &l, &ev).is_err());
    let other = SessionEvidence {
        isolation: "container".into(),
        ..ev.clone()
    };
    assert!(check_unanswered(&req, &rec, &l, &other).is_err());
    assert!(check_unanswered(&req, &rec, &link(&fp, 5, "ab"), &ev).is_err());
}

#[test]
fn the_bundle_form_checks_are_the_live_checks() {
    use plimsoll_core::check::{check_run_linked, check_unanswered_run};
    let fp = session_fingerprint("00112233445566778899aabbccddeeff");
    let req = call("a");
    let l = link(&fp, 1, "");
    let a = answer(&req, "out", &l);
    let as_run = session_call_as_run(&req);
    check_run_linked(&as_run, &a, &l).unwrap();
    assert_eq!(
        check_run_linked(&as_run, &a, &link(&fp, 2, "")),
        check_session_answer(&req, &a, &link(&fp, 2, ""))
    );
    // Without the open evidence the unanswered check still checks the rest; with it, the
    // evidence must match.
    let ev = SessionEvidence {
        provider: "process".into(),
        isolation: "process".into(),
        ..Default::default()
    };
    let rec = unanswered_record(&as_run, &ev, "unavailable", (1, 2), &l);
    check_unanswered_run(&as_run, &rec, &l, None).unwrap();
    let other = SessionEvidence {
        provider: "docker".into(),
        ..ev.clone()
    };
    assert!(check_unanswered_run(&as_run, &rec, &l, Some(&other)).is_err());
    assert!(check_unanswered(&req, &rec, &l, &other).is_err());
    assert!(matches!(
        check_unanswered_run(&as_run, &rec, &link(&fp, 2, ""), None),
        Err(CheckError::Chain {
            field: "sequence",
            ..
        })
    ));
    let mut bad = rec.clone();
    bad.record_sha256 = "0".repeat(64);
    assert!(check_unanswered_run(&as_run, &bad, &l, None).is_err());
}
