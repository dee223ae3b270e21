//! plimsoll-attest: signed run records and chained bundles (reference §3.10–3.11).
//!
//! A harness that sent a request and checked the answer signs the answer's run record
//! (a DSSE envelope around an in-toto statement, Ed25519) and appends it with the exchange
//! to a bundle, a JSON Lines file in which every line carries a signed link to the previous
//! line and every invocation ends with a signed checkpoint. [`bundle::verify_bundle`]
//! re-checks everything offline with the public key alone. The bytes follow the Go tools
//! exactly, so bundles verify in either implementation.
//!
//! The library does no I/O beyond the bundle file (and `unsealed` file) its caller names.

pub mod bundle;
pub mod dsse;
pub mod gojson;
pub mod keys;
pub mod statement;
mod verify;

pub use bundle::{
    verify_bundle, verify_expected, write_unsealed, Appender, BundleError, Checkpoint, Entry,
    Expect, OpenReport, StoredRun, Summary,
};
pub use keys::{PublicKey, SigningKey};
pub use statement::SessionClose;

use plimsoll_core::check::CheckError;
use plimsoll_core::digest::record_digest;
use plimsoll_core::pb;

/// Why a key, envelope, statement or record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AttestError {
    /// A key could not be read or made.
    #[error("key: {0}")]
    Key(String),
    /// An envelope is malformed.
    #[error("envelope: {0}")]
    Envelope(String),
    /// No signature verifies.
    #[error("signature: {0}")]
    Signature(String),
    /// A statement is malformed or its digests do not agree.
    #[error("statement: {0}")]
    Statement(String),
    /// A record this crate does not sign.
    #[error("not signed: {0}")]
    NotSigned(String),
    /// The client check failed (the code may have run).
    #[error(transparent)]
    Check(#[from] CheckError),
}

/// Signs a run record: only a version-2 record without `unanswered` or a version-3 record
/// with it, and only if its own digest recomputes. (The caller must have run the client
/// check on its own copy of the exchange first; [`Appender`] does.)
pub fn sign_record(key: &SigningKey, rec: &pb::RunRecord) -> Result<dsse::Envelope, AttestError> {
    match (rec.version, rec.unanswered.is_empty()) {
        (2, true) | (3, false) => {}
        (v, _) => {
            return Err(AttestError::NotSigned(format!(
                "version {v} with unanswered {:?}: only version 2 (answered) and 3 (unanswered) records are signed",
                rec.unanswered
            )))
        }
    }
    let own = record_digest(rec);
    if own != rec.record_sha256 {
        return Err(AttestError::NotSigned(format!(
            "record_sha256 {:?} does not recompute ({own:?})",
            rec.record_sha256
        )));
    }
    Ok(dsse::Envelope::sign(key, statement::record_statement(rec)))
}

/// Verifies a run-record envelope and hands back the record: payload type, a signature by
/// `key`, the statement's shape, version rules, subject = `record_sha256` = recomputed.
pub fn verify_record(env: &dsse::Envelope, key: &PublicKey) -> Result<pb::RunRecord, AttestError> {
    match statement::decode_statement(env.verify(key)?)? {
        statement::Statement::Record(r) => Ok(*r),
        _ => Err(AttestError::Statement(
            "the envelope holds no run-record statement".into(),
        )),
    }
}

/// Signs a session-close statement from the daemon's close answer. (The caller must have
/// compared it with the chain it saw; [`Appender::append_close`] does.)
pub fn sign_close(key: &SigningKey, close: &pb::CloseSessionResponse) -> dsse::Envelope {
    dsse::Envelope::sign(
        key,
        statement::close_statement(&SessionClose {
            session: close.session.clone(),
            calls: close.calls,
            last_record_sha256: close.last_record_sha256.clone(),
        }),
    )
}

/// Verifies a session-close envelope and hands back what it states.
pub fn verify_close(env: &dsse::Envelope, key: &PublicKey) -> Result<SessionClose, AttestError> {
    match statement::decode_statement(env.verify(key)?)? {
        statement::Statement::Close(c) => Ok(c),
        _ => Err(AttestError::Statement(
            "the envelope holds no session-close statement".into(),
        )),
    }
}
