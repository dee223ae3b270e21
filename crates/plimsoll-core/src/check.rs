//! The check a client makes on every answer (`RECORDS.md`, "What a client checks").
//!
//! Any failure means the answer cannot be trusted and the code may have run.

use crate::digest::{record_digest, request_digest, result_digest, software_rule_id};
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
}

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
    let rec = answer.record.as_ref().ok_or(CheckError::NoRecord)?;
    if rec.version != 2 {
        return Err(CheckError::Version(rec.version));
    }
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
    same(
        "software_rule_id",
        &software_rule_id(sent.software_rule.as_ref()),
        &rec.software_rule_id,
    )?;
    let floor = Floor::parse(&sent.minimum_isolation).unwrap_or(Floor::NONE);
    let tier: Option<Tier> = rec.isolation.parse().ok();
    if !tier.is_some_and(|t| t.meets(floor)) {
        return Err(CheckError::BelowFloor {
            floor: sent.minimum_isolation.clone(),
            got: rec.isolation.clone(),
        });
    }
    same("record_sha256", &record_digest(rec), &rec.record_sha256)?;
    if !rec.session.is_empty() || rec.sequence != 0 || !rec.previous_sha256.is_empty() {
        return Err(CheckError::UnexpectedSession);
    }
    Ok(())
}
