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
        let detail = pb::NotDispatched {
            reason: self.reason.to_wire() as i32,
        };
        let envelope = rpc_status::Status {
            code: self.code as i32,
            message: self.message.clone(),
            details: vec![prost_types::Any {
                type_url: NOT_DISPATCHED_TYPE_URL.to_owned(),
                value: detail.encode_to_vec(),
            }],
        };
        tonic::Status::with_details(
            self.code,
            self.message.clone(),
            envelope.encode_to_vec().into(),
        )
    }
}

impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> Self {
        r.to_status()
    }
}

/// The not-dispatched reason a status carries, if any. `None` means the call may have run.
pub fn not_dispatched_reason(status: &tonic::Status) -> Option<Reason> {
    let envelope = rpc_status::Status::decode(status.details()).ok()?;
    envelope
        .details
        .iter()
        .filter(|any| any.type_url == NOT_DISPATCHED_TYPE_URL)
        .find_map(|any| pb::NotDispatched::decode(any.value.as_slice()).ok())
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
