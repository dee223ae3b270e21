//! Refusals that provably ran nothing, and the not-dispatched mark they carry.
//!
//! The mark travels as a `plimsoll.v1.NotDispatched` detail inside the standard
//! `google.rpc.Status` envelope (`grpc-status-details-bin`). An error without the
//! mark may have run code and must never be retried automatically.

use std::fmt;
use std::str::FromStr;

use prost::Message;

use crate::pb;
use crate::rpc_status;

/// Type URL of the not-dispatched detail.
pub const NOT_DISPATCHED_TYPE_URL: &str = "type.googleapis.com/plimsoll.v1.NotDispatched";
/// Type URL of the detail saying a session has ended, and why.
pub const SESSION_ENDED_TYPE_URL: &str = "type.googleapis.com/plimsoll.v1.SessionEnded";
/// Type URL of the detail carrying an unanswered session call's version-3 record.
pub const UNANSWERED_CALL_TYPE_URL: &str = "type.googleapis.com/plimsoll.v1.UnansweredCall";

/// Why a call was refused before anything ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Malformed or out-of-bounds request. Retrying elsewhere does not help.
    Request,
    /// Missing or wrong credentials, or a grant the caller may not use.
    Permission,
    /// The request states no protocol, or another one than the daemon serves.
    Protocol,
    /// The provider cannot do this (including the disabled provider).
    Unsupported,
    /// The provider's tier is below the request's floor.
    Isolation,
    /// The software environment is unknown or outside the caller's rule.
    Environment,
    /// Over the concurrency limit or draining; try later or elsewhere.
    Capacity,
}

impl Reason {
    /// Every reason, in wire-enum order.
    pub const ALL: [Reason; 7] = [
        Reason::Request,
        Reason::Permission,
        Reason::Protocol,
        Reason::Unsupported,
        Reason::Isolation,
        Reason::Capacity,
        Reason::Environment,
    ];

    /// The name shown to people and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Request => "request",
            Reason::Permission => "permission",
            Reason::Protocol => "protocol",
            Reason::Unsupported => "unsupported",
            Reason::Isolation => "isolation",
            Reason::Environment => "environment",
            Reason::Capacity => "capacity",
        }
    }

    fn to_wire(self) -> pb::NotDispatchedReason {
        use pb::NotDispatchedReason as W;
        match self {
            Reason::Request => W::Request,
            Reason::Permission => W::Permission,
            Reason::Protocol => W::Protocol,
            Reason::Unsupported => W::Unsupported,
            Reason::Isolation => W::Isolation,
            Reason::Environment => W::Environment,
            Reason::Capacity => W::Capacity,
        }
    }

    fn from_wire(w: pb::NotDispatchedReason) -> Option<Reason> {
        use pb::NotDispatchedReason as W;
        Some(match w {
            W::Unspecified => return None,
            W::Request => Reason::Request,
            W::Permission => Reason::Permission,
            W::Protocol => Reason::Protocol,
            W::Unsupported => Reason::Unsupported,
            W::Isolation => Reason::Isolation,
            W::Environment => Reason::Environment,
            W::Capacity => Reason::Capacity,
        })
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Reason {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Reason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| format!("unknown refusal reason {s:?}"))
    }
}

/// A refusal: nothing ran. The one place that builds marked gRPC errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not dispatched ({reason}): {message}")]
pub struct Refusal {
    /// Why nothing ran.
    pub reason: Reason,
    /// The gRPC code the caller sees.
    pub code: tonic::Code,
    /// What to fix, in one sentence.
    pub message: String,
}

impl Refusal {
    /// A refusal with an explicit code.
    pub fn new(reason: Reason, code: tonic::Code, message: impl Into<String>) -> Self {
        Refusal {
            reason,
            code,
            message: message.into(),
        }
    }
    /// Malformed request (`InvalidArgument`).
    pub fn request(message: impl Into<String>) -> Self {
        Self::new(Reason::Request, tonic::Code::InvalidArgument, message)
    }
    /// No usable credential (`Unauthenticated`).
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(Reason::Permission, tonic::Code::Unauthenticated, message)
    }
    /// Credential without the right (`PermissionDenied`).
    pub fn permission(message: impl Into<String>) -> Self {
        Self::new(Reason::Permission, tonic::Code::PermissionDenied, message)
    }
    /// The provider cannot do this (`Unimplemented`).
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(Reason::Unsupported, tonic::Code::Unimplemented, message)
    }
    /// The disabled provider (`FailedPrecondition`, marked `unsupported`).
    pub fn disabled(message: impl Into<String>) -> Self {
        Self::new(
            Reason::Unsupported,
            tonic::Code::FailedPrecondition,
            message,
        )
    }
    /// Tier below the floor (`FailedPrecondition`).
    pub fn isolation(message: impl Into<String>) -> Self {
        Self::new(Reason::Isolation, tonic::Code::FailedPrecondition, message)
    }
    /// Software environment outside the rule (`FailedPrecondition`).
    pub fn environment(message: impl Into<String>) -> Self {
        Self::new(
            Reason::Environment,
            tonic::Code::FailedPrecondition,
            message,
        )
    }
    /// Over capacity or draining (`ResourceExhausted`).
    pub fn capacity(message: impl Into<String>) -> Self {
        Self::new(Reason::Capacity, tonic::Code::ResourceExhausted, message)
    }
    /// The protocol check, in the one order the contract fixes: 0 → `InvalidArgument`,
    /// anything but `served` → `Unimplemented`, both marked `protocol`.
    pub fn check_protocol(stated: u32, served: u32) -> Result<(), Refusal> {
        if stated == 0 {
            return Err(Self::new(
                Reason::Protocol,
                tonic::Code::InvalidArgument,
                format!("protocol must be stated; this daemon serves protocol {served}"),
            ));
        }
        if stated != served {
            return Err(Self::new(
                Reason::Protocol,
                tonic::Code::Unimplemented,
                format!("this daemon serves protocol {served} and the request states {stated}; nothing ran"),
            ));
        }
        Ok(())
    }

    /// The gRPC status carrying the not-dispatched detail.
    pub fn to_status(&self) -> tonic::Status {
        self.to_status_with(None)
    }

    /// The gRPC status carrying the not-dispatched detail and, for a session call or close
    /// on a session that has ended (or is unknown), the `SessionEnded` detail.
    pub fn to_status_with(&self, ended: Option<(pb::SessionEnd, &str)>) -> tonic::Status {
        let detail = pb::NotDispatched {
            reason: self.reason.to_wire() as i32,
        };
        let mut details = vec![prost_types::Any {
            type_url: NOT_DISPATCHED_TYPE_URL.to_owned(),
            value: detail.encode_to_vec(),
        }];
        if let Some((reason, detail)) = ended {
            details.push(session_ended_any(reason, detail));
        }
        status_with(self.code, &self.message, details)
    }
}

fn status_with(code: tonic::Code, message: &str, details: Vec<prost_types::Any>) -> tonic::Status {
    let envelope = rpc_status::Status {
        code: code as i32,
        message: message.to_owned(),
        details,
    };
    tonic::Status::with_details(code, message.to_owned(), envelope.encode_to_vec().into())
}

fn session_ended_any(reason: pb::SessionEnd, detail: &str) -> prost_types::Any {
    prost_types::Any {
        type_url: SESSION_ENDED_TYPE_URL.to_owned(),
        value: pb::SessionEnded {
            reason: reason as i32,
            detail: detail.to_owned(),
        }
        .encode_to_vec(),
    }
}

/// The error of a session call that may have run but has no answer: no not-dispatched
/// mark, the call's version-3 record as the `UnansweredCall` detail, and `SessionEnded`
/// when the session ended with it.
pub fn unanswered_status(
    code: tonic::Code,
    message: &str,
    record: pb::RunRecord,
    ended: Option<(pb::SessionEnd, &str)>,
) -> tonic::Status {
    let mut details = vec![prost_types::Any {
        type_url: UNANSWERED_CALL_TYPE_URL.to_owned(),
        value: pb::UnansweredCall {
            record: Some(record),
        }
        .encode_to_vec(),
    }];
    if let Some((reason, detail)) = ended {
        details.push(session_ended_any(reason, detail));
    }
    status_with(code, message, details)
}

fn find_detail<M: Message + Default>(status: &tonic::Status, type_url: &str) -> Option<M> {
    let envelope = rpc_status::Status::decode(status.details()).ok()?;
    envelope
        .details
        .iter()
        .filter(|any| any.type_url == type_url)
        .find_map(|any| M::decode(any.value.as_slice()).ok())
}

/// The `SessionEnded` detail a status carries, if any.
pub fn session_ended(status: &tonic::Status) -> Option<pb::SessionEnded> {
    find_detail(status, SESSION_ENDED_TYPE_URL)
}

/// The record of an unanswered session call a status carries, if any.
pub fn unanswered_call(status: &tonic::Status) -> Option<pb::RunRecord> {
    find_detail::<pb::UnansweredCall>(status, UNANSWERED_CALL_TYPE_URL).and_then(|u| u.record)
}

impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> Self {
        r.to_status()
    }
}

/// The not-dispatched reason a status carries, if any. `None` means the call may have run.
pub fn not_dispatched_reason(status: &tonic::Status) -> Option<Reason> {
    find_detail::<pb::NotDispatched>(status, NOT_DISPATCHED_TYPE_URL)
        .and_then(|d| pb::NotDispatchedReason::try_from(d.reason).ok())
        .and_then(Reason::from_wire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mark_round_trips_for_every_reason() {
        for r in Reason::ALL {
            let status = Refusal::new(r, tonic::Code::FailedPrecondition, "x").to_status();
            assert_eq!(not_dispatched_reason(&status), Some(r));
            assert_eq!(r.as_str().parse::<Reason>().unwrap(), r);
        }
    }

    #[test]
    fn unmarked_status_has_no_reason() {
        assert_eq!(
            not_dispatched_reason(&tonic::Status::internal("boom")),
            None
        );
        let garbage = tonic::Status::with_details(tonic::Code::Internal, "x", vec![1, 2, 3].into());
        assert_eq!(not_dispatched_reason(&garbage), None);
    }

    #[test]
    fn protocol_check_order() {
        let zero = Refusal::check_protocol(0, 5).unwrap_err();
        assert_eq!(
            (zero.code, zero.reason),
            (tonic::Code::InvalidArgument, Reason::Protocol)
        );
        for p in [4, 6] {
            let other = Refusal::check_protocol(p, 5).unwrap_err();
            assert_eq!(
                (other.code, other.reason),
                (tonic::Code::Unimplemented, Reason::Protocol)
            );
        }
        assert!(Refusal::check_protocol(5, 5).is_ok());
    }
}
