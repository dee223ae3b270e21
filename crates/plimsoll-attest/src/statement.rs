//! in-toto v1 statements: a run record, a session close, a bundle link (reference
//! §3.10–3.11), written with Go's member order and decoded strictly (unknown members,
//! wrong types, a wrong `_type`, predicate type or subject shape are refused).

use std::collections::BTreeMap;

use plimsoll_core::digest::record_digest;
use plimsoll_core::pb;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::gojson::{self, Object};
use crate::AttestError;

/// The in-toto statement type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// Predicate type of a signed run record.
pub const RUN_RECORD_PREDICATE: &str = "https://plimsollmark.github.io/plimsoll/run-record/v1";
/// Predicate type of a signed session close.
pub const SESSION_CLOSE_PREDICATE: &str =
    "https://plimsollmark.github.io/plimsoll/session-close/v1";
/// Predicate type of a bundle link.
pub const BUNDLE_LINK_PREDICATE: &str = "https://plimsollmark.github.io/plimsoll/bundle-link/v1";

/// Subject name of a run-record statement.
pub const RUN_RECORD_SUBJECT: &str = "run-record";
/// Subject name of a session-close statement.
pub const SESSION_SUBJECT: &str = "session";
/// Subject name of a bundle-link statement.
pub const BUNDLE_LINE_SUBJECT: &str = "bundle-line";

/// What a session-close statement states (from `CloseSessionResponse`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionClose {
    /// The session fingerprint (also the subject digest).
    pub session: String,
    /// Executed calls the daemon counted (answered and unanswered).
    pub calls: u64,
    /// The last call's record digest, empty for a session without calls.
    pub last_record_sha256: String,
}

/// What a bundle-link statement states about its line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Link {
    /// The 1-based line number.
    pub index: u64,
    /// The previous line's line digest, empty on line 1.
    pub previous_sha256: String,
    /// The content digest of the entry (empty on a checkpoint).
    pub entry_sha256: String,
    /// Whether the line is a checkpoint.
    pub checkpoint: bool,
    /// On a checkpoint, the number of lines before it.
    pub lines: u64,
}

impl Link {
    /// The subject digest the statement names: the entry digest, or for a checkpoint the
    /// previous line digest.
    pub fn subject(&self) -> &str {
        if self.checkpoint {
            &self.previous_sha256
        } else {
            &self.entry_sha256
        }
    }
}

/// A decoded statement of one of the three kinds.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    /// A run record whose digests were checked (subject = `record_sha256` = recomputed).
    Record(Box<pb::RunRecord>),
    /// A session close (subject = its fingerprint).
    Close(SessionClose),
    /// A bundle link and the subject digest it names.
    Link(Link, String),
}

fn head(out: &mut String, subject_name: &str, digest: &str, predicate_type: &str) {
    // `{"_type":…,"subject":[{"name":…,"digest":{"sha256":…}}],"predicateType":…,"predicate":`
    out.push('{');
    out.push_str("\"_type\":");
    gojson::string(out, STATEMENT_TYPE);
    out.push_str(",\"subject\":[{\"name\":");
    gojson::string(out, subject_name);
    out.push_str(",\"digest\":{\"sha256\":");
    gojson::string(out, digest);
    out.push_str("}}],\"predicateType\":");
    gojson::string(out, predicate_type);
    out.push_str(",\"predicate\":");
}

/// The run-record statement JSON, predicate members in the order of §3.10.
pub fn record_statement(r: &pb::RunRecord) -> Vec<u8> {
    let mut out = String::with_capacity(1024);
    head(
        &mut out,
        RUN_RECORD_SUBJECT,
        &r.record_sha256,
        RUN_RECORD_PREDICATE,
    );
    let mut o = Object::new(&mut out);
    o.int("version", r.version)
        .str("request_sha256", &r.request_sha256)
        .str("result_sha256", &r.result_sha256)
        .str("provider", &r.provider)
        .str("isolation", &r.isolation)
        .str("environment", &r.environment)
        .str_omitempty("software_identity", &r.software_identity)
        .str_omitempty("software_rule_id", &r.software_rule_id)
        .str("policy", &r.policy)
        .int("started_unix_ms", r.started_unix_ms)
        .int("ended_unix_ms", r.ended_unix_ms)
        .str("session", &r.session)
        .int("sequence", r.sequence)
        .str("previous_sha256", &r.previous_sha256)
        .str_omitempty("unanswered", &r.unanswered)
        .str("record_sha256", &r.record_sha256);
    o.end();
    out.push('}');
    out.into_bytes()
}

/// The session-close statement JSON.
pub fn close_statement(c: &SessionClose) -> Vec<u8> {
    let mut out = String::with_capacity(512);
    head(
        &mut out,
        SESSION_SUBJECT,
        &c.session,
        SESSION_CLOSE_PREDICATE,
    );
    let mut o = Object::new(&mut out);
    o.str("session", &c.session)
        .int("calls", c.calls)
        .str("last_record_sha256", &c.last_record_sha256);
    o.end();
    out.push('}');
    out.into_bytes()
}

/// The bundle-link statement JSON (`entry_sha256`, `checkpoint`, `lines` omitted when empty).
pub fn link_statement(l: &Link) -> Vec<u8> {
    let mut out = String::with_capacity(512);
    head(
        &mut out,
        BUNDLE_LINE_SUBJECT,
        l.subject(),
        BUNDLE_LINK_PREDICATE,
    );
    let mut o = Object::new(&mut out);
    o.int("index", l.index)
        .str("previous_sha256", &l.previous_sha256)
        .str_omitempty("entry_sha256", &l.entry_sha256);
    if l.checkpoint {
        gojson::boolean(o.key("checkpoint"), true);
    }
    if l.lines != 0 {
        o.int("lines", l.lines);
    }
    o.end();
    out.push('}');
    out.into_bytes()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubject {
    name: String,
    digest: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStatement<'a> {
    #[serde(rename = "_type")]
    type_: String,
    subject: Vec<RawSubject>,
    #[serde(rename = "predicateType")]
    predicate_type: String,
    #[serde(borrow)]
    predicate: &'a RawValue,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordPredicate {
    version: u32,
    request_sha256: String,
    result_sha256: String,
    provider: String,
    isolation: String,
    environment: String,
    #[serde(default)]
    software_identity: String,
    #[serde(default)]
    software_rule_id: String,
    policy: String,
    started_unix_ms: i64,
    ended_unix_ms: i64,
    session: String,
    sequence: u64,
    previous_sha256: String,
    #[serde(default)]
    unanswered: String,
    record_sha256: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClosePredicate {
    session: String,
    calls: u64,
    last_record_sha256: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LinkPredicate {
    index: u64,
    previous_sha256: String,
    #[serde(default)]
    entry_sha256: String,
    #[serde(default)]
    checkpoint: bool,
    #[serde(default)]
    lines: u64,
}

fn bad(what: impl Into<String>) -> AttestError {
    AttestError::Statement(what.into())
}

/// Decodes any of the three statements, with every check of §3.10 on a record.
pub fn decode_statement(payload: &[u8]) -> Result<Statement, AttestError> {
    let raw: RawStatement<'_> = serde_json::from_slice(payload)
        .map_err(|e| bad(format!("not an in-toto statement: {e}")))?;
    if raw.type_ != STATEMENT_TYPE {
        return Err(bad(format!("_type is {:?}", raw.type_)));
    }
    let [subject] = raw.subject.as_slice() else {
        return Err(bad(format!(
            "{} subjects, expected exactly one",
            raw.subject.len()
        )));
    };
    let digest = match (subject.digest.len(), subject.digest.get("sha256")) {
        (1, Some(d)) => d.clone(),
        _ => return Err(bad("the subject digest must be exactly one sha256")),
    };
    let want_name = match raw.predicate_type.as_str() {
        RUN_RECORD_PREDICATE => RUN_RECORD_SUBJECT,
        SESSION_CLOSE_PREDICATE => SESSION_SUBJECT,
        BUNDLE_LINK_PREDICATE => BUNDLE_LINE_SUBJECT,
        other => return Err(bad(format!("unknown predicateType {other:?}"))),
    };
    if subject.name != want_name {
        return Err(bad(format!(
            "subject name is {:?}, expected {want_name:?}",
            subject.name
        )));
    }
    let pred = raw.predicate.get();
    let predicate_err = |e: serde_json::Error| bad(format!("predicate: {e}"));
    match raw.predicate_type.as_str() {
        RUN_RECORD_PREDICATE => {
            let p: RecordPredicate = serde_json::from_str(pred).map_err(predicate_err)?;
            let rec = pb::RunRecord {
                version: p.version,
                request_sha256: p.request_sha256,
                result_sha256: p.result_sha256,
                provider: p.provider,
                isolation: p.isolation,
                environment: p.environment,
                policy: p.policy,
                started_unix_ms: p.started_unix_ms,
                ended_unix_ms: p.ended_unix_ms,
                session: p.session,
                sequence: p.sequence,
                previous_sha256: p.previous_sha256,
                record_sha256: p.record_sha256,
                software_identity: p.software_identity,
                software_rule_id: p.software_rule_id,
                unanswered: p.unanswered,
            };
            check_record_fields(&rec)?;
            if digest != rec.record_sha256 {
                return Err(bad(format!(
                    "subject digest {digest:?} is not record_sha256 {:?}",
                    rec.record_sha256
                )));
            }
            Ok(Statement::Record(Box::new(rec)))
        }
        SESSION_CLOSE_PREDICATE => {
            let p: ClosePredicate = serde_json::from_str(pred).map_err(predicate_err)?;
            if digest != p.session {
                return Err(bad("the subject digest is not the session fingerprint"));
            }
            Ok(Statement::Close(SessionClose {
                session: p.session,
                calls: p.calls,
                last_record_sha256: p.last_record_sha256,
            }))
        }
        _ => {
            let p: LinkPredicate = serde_json::from_str(pred).map_err(predicate_err)?;
            let link = Link {
                index: p.index,
                previous_sha256: p.previous_sha256,
                entry_sha256: p.entry_sha256,
                checkpoint: p.checkpoint,
                lines: p.lines,
            };
            Ok(Statement::Link(link, digest))
        }
    }
}

/// The version rules and the own digest of a record (not its subject).
pub(crate) fn check_record_fields(rec: &pb::RunRecord) -> Result<(), AttestError> {
    match rec.version {
        1 | 2 if !rec.unanswered.is_empty() => {
            return Err(bad(format!(
                "a version {} record carries unanswered {:?}",
                rec.version, rec.unanswered
            )))
        }
        1 if !rec.software_identity.is_empty() || !rec.software_rule_id.is_empty() => {
            return Err(bad("a version 1 record carries software fields"))
        }
        1 | 2 => {}
        3 if rec.unanswered.is_empty() => return Err(bad("a version 3 record without unanswered")),
        3 => {}
        v => return Err(bad(format!("record version {v} is not 1, 2 or 3"))),
    }
    let own = record_digest(rec);
    if own != rec.record_sha256 {
        return Err(bad(format!(
            "record_sha256 {:?} does not recompute (the record's fields give {own:?})",
            rec.record_sha256
        )));
    }
    Ok(())
}
