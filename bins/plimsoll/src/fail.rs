//! The one place that turns a failure into an exit code and a one-line message.

use plimsoll_client::ClientError;

/// The answer failed the record check, or an unmarked error: the code may have run.
pub const MAY_HAVE_RUN: u8 = 1;
/// A usage or configuration error.
pub const USAGE: u8 = 2;
/// Refused with the not-dispatched mark: nothing ran.
pub const REFUSED: u8 = 3;
/// Could not connect (or start the embedded daemon): nothing was sent.
pub const CONNECT: u8 = 4;

/// A failure: the exit code and the line printed on stderr.
#[derive(Debug)]
pub struct Fail {
    /// The process exit code.
    pub code: u8,
    /// One line for stderr.
    pub message: String,
}

impl Fail {
    /// Exit 2: a usage or configuration error naming the bad flag or file.
    pub fn usage(message: impl Into<String>) -> Fail {
        Fail {
            code: USAGE,
            message: message.into(),
        }
    }

    /// Exit 4: nothing was sent.
    pub fn connect(message: impl Into<String>) -> Fail {
        Fail {
            code: CONNECT,
            message: message.into(),
        }
    }

    /// Exit 1: the code may have run.
    pub fn may_have_run(message: impl Into<String>) -> Fail {
        Fail {
            code: MAY_HAVE_RUN,
            message: message.into(),
        }
    }

    /// A usage error from an `anyhow` chain, all causes on one line.
    pub fn usage_from(e: anyhow::Error) -> Fail {
        Fail::usage(format!("{e:#}"))
    }
}

impl From<ClientError> for Fail {
    fn from(e: ClientError) -> Fail {
        let code = match &e {
            ClientError::Connect { .. } => CONNECT,
            // Refused by the daemon, or here before sending (a lost session chain).
            e if e.not_dispatched().is_some() => REFUSED,
            // MayHaveRun, Check, Unanswered, CloseMismatch, and anything added later:
            // assume the code may have run.
            _ => MAY_HAVE_RUN,
        };
        Fail {
            code,
            message: e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_client::pb;
    use plimsoll_core::check::CheckError;
    use plimsoll_core::Refusal;

    #[test]
    fn client_errors_map_to_the_documented_exit_codes() {
        let refused: Fail = ClientError::Refused {
            reason: plimsoll_core::Reason::Isolation,
            status: Refusal::isolation("floor vm").to_status(),
        }
        .into();
        assert_eq!(refused.code, REFUSED);
        assert_eq!(refused.message, "not dispatched (isolation): floor vm");

        let unmarked: Fail = ClientError::MayHaveRun {
            status: tonic::Status::internal("boom"),
        }
        .into();
        assert_eq!(unmarked.code, MAY_HAVE_RUN);

        let check: Fail = ClientError::Check {
            error: CheckError::NoRecord,
            answer: Box::new(pb::RunResponse::default()),
        }
        .into();
        assert_eq!(check.code, MAY_HAVE_RUN);
        assert!(check.message.contains("may have run"), "{}", check.message);

        let connect: Fail = ClientError::Connect {
            addr: "http://127.0.0.1:1".into(),
            detail: "refused".into(),
        }
        .into();
        assert_eq!(connect.code, CONNECT);

        let lost: Fail = ClientError::ChainLost {
            why: "call 3: sequence".into(),
        }
        .into();
        assert_eq!(lost.code, REFUSED);
        assert!(
            lost.message.starts_with("not dispatched"),
            "{}",
            lost.message
        );

        let unanswered: Fail = ClientError::Unanswered {
            status: tonic::Status::deadline_exceeded("late"),
            record: Box::default(),
        }
        .into();
        assert_eq!(unanswered.code, MAY_HAVE_RUN);
        let mismatch: Fail = ClientError::CloseMismatch("calls".into()).into();
        assert_eq!(mismatch.code, MAY_HAVE_RUN);
    }
}
