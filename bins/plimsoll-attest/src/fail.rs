//! The one place that turns a failure into an exit code and a one-line message.

use plimsoll_client::ClientError;

/// Invalid bundle, or the code may have run without being recorded.
pub const INVALID: u8 = 1;
/// A usage error, or a bad key, request, bundle or certificate file.
pub const USAGE: u8 = 2;
/// Refused with the not-dispatched mark: nothing ran.
pub const REFUSED: u8 = 3;
/// Could not reach the daemon or the authority: nothing was sent.
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
    /// Exit 2.
    pub fn usage(message: impl Into<String>) -> Fail {
        Fail {
            code: USAGE,
            message: message.into(),
        }
    }
    /// Exit 4.
    pub fn connect(message: impl Into<String>) -> Fail {
        Fail {
            code: CONNECT,
            message: message.into(),
        }
    }
    /// Exit 1.
    pub fn invalid(message: impl Into<String>) -> Fail {
        Fail {
            code: INVALID,
            message: message.into(),
        }
    }
}

impl From<ClientError> for Fail {
    fn from(e: ClientError) -> Fail {
        let code = match &e {
            ClientError::Connect { .. } => CONNECT,
            e if e.not_dispatched().is_some() => REFUSED,
            _ => INVALID,
        };
        let message = if code == INVALID {
            format!("{e}; nothing was signed or appended for it")
        } else {
            e.to_string()
        };
        Fail { code, message }
    }
}

/// Writes one line to stderr, ignoring a closed stderr.
pub fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Writes `text` to stdout, ignoring a closed stdout (`… | head`).
pub fn print(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    if !text.ends_with('\n') {
        let _ = out.write_all(b"\n");
    }
}
