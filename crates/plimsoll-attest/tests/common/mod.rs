//! Builders shared by the integration tests: real stamped records, session chains,
//! unanswered records, and a raw bundle writer that links any entries (to build bundles the
//! appender would refuse to write).

#![allow(dead_code)]

use plimsoll_attest::bundle::Entry;
use plimsoll_attest::dsse::Envelope;
use plimsoll_attest::statement::{link_statement, Link};
use plimsoll_attest::SigningKey;
use plimsoll_core::digest::{
    session_call_as_run, session_fingerprint, stamp, stamp_linked, unanswered_record, ChainLink,
    SessionEvidence,
};
use plimsoll_core::pb;

pub const SESSION_ID: &str = "00112233445566778899aabbccddeeff";

pub fn run(code: &str, out: &str) -> (pb::RunRequest, pb::RunResponse) {
    let req = pb::RunRequest {
        protocol: 5,
        minimum_isolation: "process".into(),
        timeout_ms: 5000,
        payload: Some(pb::run_request::Payload::Javascript(pb::JavaScriptRun {
            code: code.into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    let mut resp = pb::RunResponse {
        sandbox: "process".into(),
        isolation: "process".into(),
        environment: "env <&> \u{2028}".into(),
        result: Some(pb::run_response::Result::Javascript(pb::JavaScriptResult {
            stdout: out.as_bytes().to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    };
    stamp(&req, &mut resp, "", 1_000, 1_005);
    (req, resp)
}

pub fn call(code: &str) -> pb::SessionRunRequest {
    pb::SessionRunRequest {
        protocol: 5,
        timeout_ms: 1000,
        session_id: SESSION_ID.into(),
        trace_id: "t-1".into(),
        payload: Some(pb::session_run_request::Payload::Cell(pb::CellRun {
            language: "python".into(),
            code: code.into(),
            files: vec![],
        })),
        ..Default::default()
    }
}

pub fn answer(req: &pb::SessionRunRequest, out: &str, link: &ChainLink) -> pb::RunResponse {
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

pub fn evidence() -> SessionEvidence {
    SessionEvidence {
        provider: "process".into(),
        isolation: "process".into(),
        ..Default::default()
    }
}

pub fn fp() -> String {
    session_fingerprint(SESSION_ID)
}

/// A session step.
#[allow(clippy::large_enum_variant)]
pub enum Step {
    Answered(pb::SessionRunRequest, pb::RunResponse),
    Unanswered(pb::SessionRunRequest, pb::RunRecord),
}

impl Step {
    pub fn record(&self) -> &pb::RunRecord {
        match self {
            Step::Answered(_, r) => r.record.as_ref().unwrap(),
            Step::Unanswered(_, r) => r,
        }
    }
}

/// `n` session calls in one chain; call `unanswered_at` (1-based, 0 = none) is unanswered.
pub fn session(n: u64, unanswered_at: u64) -> Vec<Step> {
    let fp = fp();
    let mut prev = String::new();
    let mut out = Vec::new();
    for i in 1..=n {
        let req = call(&format!("x = {i}"));
        let link = ChainLink {
            session: fp.clone(),
            sequence: i,
            previous_sha256: prev.clone(),
        };
        let step = if i == unanswered_at {
            let rec = unanswered_record(
                &session_call_as_run(&req),
                &evidence(),
                "internal",
                (10, 20),
                &link,
            );
            Step::Unanswered(req, rec)
        } else {
            Step::Answered(req.clone(), answer(&req, &format!("out {i}"), &link))
        };
        prev = step.record().record_sha256.clone();
        out.push(step);
    }
    out
}

pub fn close_of(steps: &[Step]) -> pb::CloseSessionResponse {
    pb::CloseSessionResponse {
        session: fp(),
        calls: steps.len() as u64,
        last_record_sha256: steps
            .last()
            .map(|s| s.record().record_sha256.clone())
            .unwrap_or_default(),
        ended: 1,
    }
}

/// The stored entry of a step, signed with `key` (no checks).
pub fn step_entry(key: &SigningKey, s: &Step) -> Entry {
    let env = plimsoll_attest::sign_record(key, s.record()).unwrap();
    match s {
        Step::Answered(req, resp) => {
            Entry::exchange(&session_call_as_run(req), Some(resp), Some(env))
        }
        Step::Unanswered(req, _) => Entry::exchange(&session_call_as_run(req), None, Some(env)),
    }
}

pub fn run_entry(key: &SigningKey, req: &pb::RunRequest, resp: &pb::RunResponse) -> Entry {
    let env = plimsoll_attest::sign_record(key, resp.record.as_ref().unwrap()).unwrap();
    Entry::exchange(req, Some(resp), Some(env))
}

pub fn close_entry(key: &SigningKey, c: &pb::CloseSessionResponse) -> Entry {
    Entry {
        envelope: Some(plimsoll_attest::sign_close(key, c)),
        ..Default::default()
    }
}

/// Links `entries` (None = a checkpoint) into bundle bytes with `key`, bypassing every check
/// the appender makes.
pub fn seal(key: &SigningKey, entries: &[Option<Entry>]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut prev = String::new();
    for (i, e) in entries.iter().enumerate() {
        let index = i as u64 + 1;
        let (content, link) = match e {
            Some(e) => {
                let content = e.content_json();
                let link = Link {
                    index,
                    previous_sha256: prev.clone(),
                    entry_sha256: sha(content.as_bytes()),
                    ..Default::default()
                };
                (content, link)
            }
            None => (
                "{}".to_owned(),
                Link {
                    index,
                    previous_sha256: prev.clone(),
                    checkpoint: true,
                    lines: index - 1,
                    ..Default::default()
                },
            ),
        };
        let env = Envelope::sign(key, link_statement(&link));
        let line = Entry::line_json(&content, &env);
        prev = sha(line.as_bytes());
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out
}

pub fn sha(b: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, b))
}

/// The lines of a bundle (without newlines).
pub fn lines(b: &[u8]) -> Vec<Vec<u8>> {
    b.split(|&c| c == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

pub fn join(lines: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for l in lines {
        out.extend_from_slice(l);
        out.push(b'\n');
    }
    out
}
