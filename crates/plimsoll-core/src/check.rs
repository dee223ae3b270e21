//! The check a client makes on every answer (`RECORDS.md`, "What a client checks").
//!
//! Any failure means the answer cannot be trusted and the code may have run.

use crate::digest::{
    record_digest, request_digest, result_digest, session_call_as_run, software_rule_id, ChainLink,
    SessionEvidence, UNANSWERED_RECORD_VERSION,
};
use crate::pb;
use crate::tier::{Floor, Tier};

/// Why an answer failed the client check. Every variant means: the code may have run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// The answer carries no run record.
    #[error("the answer carries no run record; the code may have run")]
    NoRecord,
    /// A record version this client does not know.
    #[error("record version {0} is not one this client checks; the code may have run")]
    Version(u32),
    /// A recomputed digest or a repeated field differs.
    #[error(
        "record mismatch in {field}: expected {expected:?}, got {got:?}; the code may have run"
    )]
    Mismatch {
        /// The field that differs.
        field: &'static str,
        /// What the client computed or what the answer states elsewhere.
        expected: String,
        /// What the record says.
        got: String,
    },
    /// The answer's tier is unknown or below the floor the request asked for.
    #[error("the answer ran at isolation {got:?}, below the requested floor {floor:?}; the code may have run")]
    BelowFloor {
        /// The requested floor.
        floor: String,
        /// The tier the answer states.
        got: String,
    },
    /// A single run whose record carries session chain fields.
    #[error("a single run's record carries session fields; the code may have run")]
    UnexpectedSession,
    /// A session call's record is not the next link of the session's chain.
    #[error("the session chain breaks at {field}: expected {expected:?}, got {got:?}; the code may have run")]
    Chain {
        /// `session`, `sequence` or `previous_sha256`.
        field: &'static str,
        /// What the client's own chain says.
        expected: String,
        /// What the record says.
        got: String,
    },
    /// The request named a software rule and the record's software identity is not one of
    /// its identities (an empty identity satisfies no rule).
    #[error("the answer's software identity {identity:?} is not in the request's rule ({mode} of {allowed:?}); the code may have run")]
    SoftwareNotInRule {
        /// The identity the record states.
        identity: String,
        /// The rule's mode (`exact` or `approved`).
        mode: String,
        /// The identities the rule allows.
        allowed: Vec<String>,
    },
    /// An unanswered record's `unanswered` is not a gRPC code name, or it carries a result.
    #[error("the unanswered record is malformed: {0}; the code may have run")]
    Unanswered(String),
}

/// The gRPC code names an unanswered record may carry.
pub const UNANSWERED_CODES: [&str; 16] = [
    "canceled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
];

fn same(field: &'static str, expected: &str, got: &str) -> Result<(), CheckError> {
    if expected == got {
        Ok(())
    } else {
        Err(CheckError::Mismatch {
            field,
            expected: expected.to_owned(),
            got: got.to_owned(),
        })
    }
}

/// Checks a single run's answer against what was sent.
pub fn check_answer(sent: &pb::RunRequest, answer: &pb::RunResponse) -> Result<(), CheckError> {
    check_linked(sent, answer, &ChainLink::default())
}

/// Checks a session call's answer: everything [`check_answer`] checks, against the call as
/// the `RunRequest` it digests like, and that the record is `expected`, the next link of
/// the client's own chain.
pub fn check_session_answer(
    sent: &pb::SessionRunRequest,
    answer: &pb::RunResponse,
    expected: &ChainLink,
) -> Result<(), CheckError> {
    check_linked(&session_call_as_run(sent), answer, expected)
}

/// Checks a stored exchange in bundle form: the request as a `RunRequest` (a session call
/// through [`session_call_as_run`]) and its answer, against `expected` (the default
/// [`ChainLink`] for a single run, which must then carry no chain fields). This is exactly
/// the check [`check_answer`] and [`check_session_answer`] make.
pub fn check_run_linked(
    sent: &pb::RunRequest,
    answer: &pb::RunResponse,
    expected: &ChainLink,
) -> Result<(), CheckError> {
    check_linked(sent, answer, expected)
}

fn check_linked(
    sent: &pb::RunRequest,
    answer: &pb::RunResponse,
    expected: &ChainLink,
) -> Result<(), CheckError> {
    let rec = answer.record.as_ref().ok_or(CheckError::NoRecord)?;
    if rec.version != 2 {
        return Err(CheckError::Version(rec.version));
    }
    // The request first, as a client reports what it sent before what it got.
    same("request_sha256", &request_digest(sent), &rec.request_sha256)?;
    same("result_sha256", &result_digest(answer), &rec.result_sha256)?;
    same("provider", &answer.sandbox, &rec.provider)?;
    same("isolation", &answer.isolation, &rec.isolation)?;
    same("environment", &answer.environment, &rec.environment)?;
    same(
        "software_identity",
        &answer.software_identity,
        &rec.software_identity,
    )?;
    check_record(sent, rec, expected)
}

/// Checks a version-3 record of a session call that may have run but has no answer: no
/// result, a known code, the request digest, the rule, the floor, its own digest, its
/// place in the chain, and that its provider, tier and software identity are what the
/// session stated when it opened.
pub fn check_unanswered(
    sent: &pb::SessionRunRequest,
    rec: &pb::RunRecord,
    expected: &ChainLink,
    opened: &SessionEvidence,
) -> Result<(), CheckError> {
    check_unanswered_run(&session_call_as_run(sent), rec, expected, Some(opened))
}

/// Checks a version-3 record against the call in `RunRequest` form (bundle form): what
/// [`check_unanswered`] checks. Without `opened` (a bundle does not keep what the session
/// stated at open) the provider, tier and software identity are not compared with it; the
/// rest (no result, a known code, request digest, rule, floor, own digest, chain) is.
pub fn check_unanswered_run(
    sent: &pb::RunRequest,
    rec: &pb::RunRecord,
    expected: &ChainLink,
    opened: Option<&SessionEvidence>,
) -> Result<(), CheckError> {
    if rec.version != UNANSWERED_RECORD_VERSION {
        return Err(CheckError::Version(rec.version));
    }
    if !rec.result_sha256.is_empty() {
        return Err(CheckError::Unanswered("it carries a result digest".into()));
    }
    if !UNANSWERED_CODES.contains(&rec.unanswered.as_str()) {
        return Err(CheckError::Unanswered(format!(
            "{:?} is not a gRPC code name",
            rec.unanswered
        )));
    }
    if let Some(opened) = opened {
        same("provider", &opened.provider, &rec.provider)?;
        same("isolation", &opened.isolation, &rec.isolation)?;
        // The open answer states no environment, so that one field is not compared.
        same(
            "software_identity",
            &opened.software_identity,
            &rec.software_identity,
        )?;
    }
    check_record(sent, rec, expected)
}

/// What every record check shares: request digest, rule id, the identity within the rule,
/// floor, own digest, chain link.
fn check_record(
    sent: &pb::RunRequest,
    rec: &pb::RunRecord,
    expected: &ChainLink,
) -> Result<(), CheckError> {
    same("request_sha256", &request_digest(sent), &rec.request_sha256)?;
    same(
        "software_rule_id",
        &software_rule_id(sent.software_rule.as_ref()),
        &rec.software_rule_id,
    )?;
    // The identity the run had is one the rule allows (the reference's step 6): a daemon
    // that ran under another identity and recorded the rule it was sent is caught here.
    if let Some(rule) = sent.software_rule.as_ref().filter(|r| !r.mode.is_empty()) {
        if rec.software_identity.is_empty() || !rule.identities.contains(&rec.software_identity) {
            return Err(CheckError::SoftwareNotInRule {
                identity: rec.software_identity.clone(),
                mode: rule.mode.clone(),
                allowed: rule.identities.clone(),
            });
        }
    }
    let floor = Floor::parse(&sent.minimum_isolation).unwrap_or(Floor::NONE);
    let tier: Option<Tier> = rec.isolation.parse().ok();
    if !tier.is_some_and(|t| t.meets(floor)) {
        return Err(CheckError::BelowFloor {
            floor: sent.minimum_isolation.clone(),
            got: rec.isolation.clone(),
        });
    }
    same("record_sha256", &record_digest(rec), &rec.record_sha256)?;
    if expected.session.is_empty() {
        if !rec.session.is_empty() || rec.sequence != 0 || !rec.previous_sha256.is_empty() {
            return Err(CheckError::UnexpectedSession);
        }
        return Ok(());
    }
    let link = |field, e: String, g: String| {
        if e == g {
            Ok(())
        } else {
            Err(CheckError::Chain {
                field,
                expected: e,
                got: g,
            })
        }
    };
    link("session", expected.session.clone(), rec.session.clone())?;
    link(
        "sequence",
        expected.sequence.to_string(),
        rec.sequence.to_string(),
    )?;
    link(
        "previous_sha256",
        expected.previous_sha256.clone(),
        rec.previous_sha256.clone(),
    )
}
