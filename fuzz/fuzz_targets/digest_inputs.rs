//! The digest encoder's inputs: requests and responses built from structured fuzz input,
//! decoded from protobuf bytes, or parsed as proto3 JSON. For each pair: the request,
//! result and record digests are deterministic; a freshly stamped answer passes the client
//! check exactly when its tier meets the request's floor, also after a protobuf and a proto3
//! JSON round trip; and flipping one byte of its output, or of a record field, fails it.

#![no_main]

use libfuzzer_sys::arbitrary::{Arbitrary, Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use plimsoll_core::check::{check_answer, CheckError};
use plimsoll_core::pb::run_request::Payload;
use plimsoll_core::pb::run_response::Result as RunResult;
use plimsoll_core::{digest, pb, Floor, Tier};
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut u = Unstructured::new(rest);
    let pair = match mode % 3 {
        0 => structured(&mut u).ok(),
        1 => {
            let (a, b) = split(rest);
            match (pb::RunRequest::decode(a), pb::RunResponse::decode(b)) {
                (Ok(req), Ok(resp)) => Some((req, resp)),
                _ => None,
            }
        }
        _ => {
            let (a, b) = split(rest);
            match (
                serde_json::from_slice::<pb::RunRequest>(a),
                serde_json::from_slice::<pb::RunResponse>(b),
            ) {
                (Ok(req), Ok(resp)) => Some((req, resp)),
                _ => None,
            }
        }
    };
    let Some((req, mut resp)) = pair else { return };
    let mut u = Unstructured::new(rest);
    let policy = String::arbitrary(&mut u).unwrap_or_default();
    let started = i64::arbitrary(&mut u).unwrap_or_default();
    let ended = i64::arbitrary(&mut u).unwrap_or_default();
    properties(&req, &mut resp, &policy, started, ended);
});

/// Splits at a position named by the first two bytes.
fn split(b: &[u8]) -> (&[u8], &[u8]) {
    if b.len() < 2 {
        return (b, &[]);
    }
    let at = usize::from(u16::from_le_bytes([b[0], b[1]])) % (b.len() - 1);
    b[2..].split_at(at.min(b.len() - 2))
}

fn properties(req: &pb::RunRequest, resp: &mut pb::RunResponse, policy: &str, started: i64, ended: i64) {
    let rd = digest::request_digest(req);
    assert_eq!(rd.len(), 64);
    assert_eq!(rd, digest::request_digest(req));
    let sd = digest::result_digest(resp);
    assert_eq!(sd, digest::result_digest(resp));

    digest::stamp(req, resp, policy, started, ended);
    let rec = resp.record.clone().expect("stamp sets a record");
    assert_eq!(rec.request_sha256, rd);
    assert_eq!(rec.result_sha256, sd);
    assert_eq!(rec.record_sha256, digest::record_digest(&rec));
    assert_eq!(digest::record_digest(&rec), digest::record_digest(&rec));
    assert!(rec.ended_unix_ms >= rec.started_unix_ms);

    let floor = Floor::parse(&req.minimum_isolation).unwrap_or(Floor::NONE);
    let meets = resp.isolation.parse::<Tier>().is_ok_and(|t| t.meets(floor));
    let verdict = check_answer(req, resp);
    if meets {
        verdict.clone().expect("a freshly stamped answer passes the client check");
    } else {
        assert!(matches!(verdict, Err(CheckError::BelowFloor { .. })), "{verdict:?}");
    }

    // The wire: what a client actually checks.
    let wire = pb::RunResponse::decode(&resp.encode_to_vec()[..]).expect("re-decodes");
    assert_eq!(check_answer(req, &wire).is_ok(), meets, "protobuf round trip changed the verdict");

    // Proto3 JSON: what `plimsoll record digest` and auditors in other languages read.
    if let Ok(json) = serde_json::to_string(&*resp) {
        let back: pb::RunResponse = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("own JSON does not parse: {e}: {json}"));
        assert_eq!(
            digest::result_digest(&back),
            sd,
            "proto3 JSON round trip changed the result digest: {json}"
        );
        assert_eq!(check_answer(req, &back).is_ok(), meets, "JSON round trip changed the verdict");
    }
    if let Ok(json) = serde_json::to_string(req) {
        let back: pb::RunRequest = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("own JSON does not parse: {e}: {json}"));
        assert_eq!(
            digest::request_digest(&back),
            rd,
            "proto3 JSON round trip changed the request digest: {json}"
        );
    }

    if !meets {
        return;
    }
    // One flipped output byte fails the check.
    let mut tampered = resp.clone();
    if let Some(b) = first_output_byte(&mut tampered) {
        *b ^= 0x01;
        assert!(check_answer(req, &tampered).is_err(), "a flipped output byte passed");
    }
    // So does any change to a record field the digest covers.
    let mut tampered = resp.clone();
    let r = tampered.record.as_mut().expect("stamped");
    r.ended_unix_ms = r.ended_unix_ms.wrapping_add(1);
    assert!(check_answer(req, &tampered).is_err(), "a changed end time passed");
    let mut tampered = resp.clone();
    tampered.record.as_mut().expect("stamped").policy.push('x');
    assert!(check_answer(req, &tampered).is_err(), "a changed policy passed");
}

fn first_output_byte(resp: &mut pb::RunResponse) -> Option<&mut u8> {
    match resp.result.as_mut()? {
        RunResult::Javascript(j) => j.stdout.first_mut().or(j.stderr.first_mut()),
        RunResult::Project(p) => p
            .steps
            .iter_mut()
            .flat_map(|s| s.stdout.iter_mut().chain(s.stderr.iter_mut()))
            .next()
            .or_else(|| p.artifacts.iter_mut().flat_map(|a| a.content.iter_mut()).next()),
        RunResult::Module(m) => m.stdout.first_mut().or(m.stderr.first_mut()),
        RunResult::Cell(c) => c.stdout.first_mut().or(c.stderr.first_mut()),
    }
}

/// A string that is often one a checker cares about.
fn pick(u: &mut Unstructured, known: &[&str]) -> Result<String> {
    if u.ratio(3, 4)? {
        Ok((*u.choose(known)?).to_owned())
    } else {
        String::arbitrary(u)
    }
}

fn small<T>(u: &mut Unstructured, f: impl Fn(&mut Unstructured) -> Result<T>) -> Result<Vec<T>> {
    let n = u.int_in_range(0..=3)?;
    (0..n).map(|_| f(u)).collect()
}

fn bytes(u: &mut Unstructured) -> Result<Vec<u8>> {
    Vec::<u8>::arbitrary(u)
}

fn files(u: &mut Unstructured) -> Result<Vec<pb::ProjectFile>> {
    small(u, |u| {
        Ok(pb::ProjectFile {
            path: String::arbitrary(u)?,
            content: String::arbitrary(u)?,
        })
    })
}

const TIERS: &[&str] = &["", "process", "container", "kernel", "vm"];

fn structured(u: &mut Unstructured) -> Result<(pb::RunRequest, pb::RunResponse)> {
    let software_rule = if u.arbitrary()? {
        Some(pb::SoftwareRule {
            mode: pick(u, &["", "exact", "approved"])?,
            identities: small(u, |u| String::arbitrary(u))?,
        })
    } else {
        None
    };
    let payload = match u.int_in_range(0..=4)? {
        0 => None,
        1 => Some(Payload::Javascript(pb::JavaScriptRun {
            code: String::arbitrary(u)?,
            grant_profile: String::arbitrary(u)?,
        })),
        2 => Some(Payload::Project(pb::ProjectRun {
            files: files(u)?,
            steps: small(u, |u| String::arbitrary(u))?,
            artifacts: small(u, |u| String::arbitrary(u))?,
            grant_profile: String::arbitrary(u)?,
        })),
        3 => Some(Payload::Module(pb::ModuleRun {
            model: String::arbitrary(u)?,
            rows: small(u, |u| {
                Ok(pb::ModuleRow {
                    values: small(u, |u| f64::arbitrary(u))?,
                })
            })?,
            end_time: f64::arbitrary(u)?,
            step: f64::arbitrary(u)?,
        })),
        _ => Some(Payload::Cell(pb::CellRun {
            language: String::arbitrary(u)?,
            code: String::arbitrary(u)?,
            files: files(u)?,
        })),
    };
    let req = pb::RunRequest {
        protocol: if u.arbitrary()? { 5 } else { u.arbitrary()? },
        minimum_isolation: pick(u, TIERS)?,
        trace_id: String::arbitrary(u)?,
        timeout_ms: u.arbitrary()?,
        software_rule,
        payload,
    };
    let result = match u.int_in_range(0..=4)? {
        0 => None,
        1 => Some(RunResult::Javascript(pb::JavaScriptResult {
            stdout: bytes(u)?,
            stderr: bytes(u)?,
            exit_code: u.arbitrary()?,
            timed_out: u.arbitrary()?,
            stdout_truncated: u.arbitrary()?,
            stderr_truncated: u.arbitrary()?,
            advice: Vec::new(),
        })),
        2 => Some(RunResult::Project(pb::ProjectResult {
            steps: small(u, |u| {
                Ok(pb::StepResult {
                    command: String::arbitrary(u)?,
                    stdout: bytes(u)?,
                    stderr: bytes(u)?,
                    exit_code: u.arbitrary()?,
                    timed_out: u.arbitrary()?,
                    duration_ms: u.arbitrary()?,
                    stdout_truncated: u.arbitrary()?,
                    stderr_truncated: u.arbitrary()?,
                })
            })?,
            outcome: u.int_in_range(0..=4)?,
            artifacts: small(u, |u| {
                Ok(pb::Artifact {
                    path: String::arbitrary(u)?,
                    content: bytes(u)?,
                })
            })?,
            outcome_detail: String::arbitrary(u)?,
            artifacts_truncated: u.arbitrary()?,
            advice: Vec::new(),
        })),
        3 => Some(RunResult::Module(pb::ModuleResult {
            runs: small(u, |u| {
                Ok(pb::ModuleRowResult {
                    status: u.arbitrary()?,
                    outputs: small(u, |u| f64::arbitrary(u))?,
                })
            })?,
            width: u.arbitrary()?,
            outcome: u.int_in_range(0..=4)?,
            outcome_detail: String::arbitrary(u)?,
            stdout: bytes(u)?,
            stderr: bytes(u)?,
        })),
        _ => Some(RunResult::Cell(pb::CellResult {
            stdout: bytes(u)?,
            stderr: bytes(u)?,
            exit_code: u.arbitrary()?,
            timed_out: u.arbitrary()?,
            stdout_truncated: u.arbitrary()?,
            stderr_truncated: u.arbitrary()?,
            interpreter_started: u.arbitrary()?,
            interpreter_ended: u.arbitrary()?,
        })),
    };
    let resp = pb::RunResponse {
        sandbox: pick(u, &["process", "docker", "agentsandbox"])?,
        isolation: pick(u, TIERS)?,
        duration_ms: u.arbitrary()?,
        record: None,
        software_identity: String::arbitrary(u)?,
        environment: String::arbitrary(u)?,
        result,
    };
    Ok((req, resp))
}
