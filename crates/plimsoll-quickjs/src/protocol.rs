//! What plimsolld and its QuickJS worker say to each other over the worker's stdin and
//! stdout: one JSON request in, one JSON answer out. Bytes travel in base64.

use serde::{Deserialize, Serialize};

/// The most a request may be (the snippet is bounded by the daemon's request limit, 8 MiB).
pub const MAX_REQUEST_BYTES: u64 = 16 * 1024 * 1024;

/// One run, as the worker receives it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Request {
    /// The snippet, evaluated as a script.
    pub code: String,
    /// The engine's heap limit in bytes (`SANDBOX_MEMORY_MB`).
    pub memory_bytes: u64,
    /// The engine's stack limit in bytes.
    pub stack_bytes: u64,
    /// The run's deadline, in milliseconds from when the worker reads the request.
    pub timeout_ms: u64,
    /// Bytes kept of each of stdout and stderr; the rest is dropped and marked truncated.
    pub output_bytes: u64,
    /// List the worker's open descriptors in the answer (the startup smoke test's check
    /// that the worker holds nothing beyond its three pipes).
    #[serde(default)]
    pub list_descriptors: bool,
}

/// How a run ended, as the worker reports it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Answer {
    /// What `console.log` and friends wrote (base64).
    pub stdout: String,
    /// What `console.error` and `console.warn` wrote, then the uncaught error if any and a
    /// line starting `plimsoll:` saying why the run ended when it was the deadline, the
    /// memory limit or the stack limit (base64).
    pub stderr: String,
    /// 0 when the snippet and its promise jobs ran to the end, 1 on an uncaught error,
    /// 124 at the deadline (as the process provider reports it).
    pub exit_code: i32,
    /// The deadline interrupted the snippet.
    pub timed_out: bool,
    /// stdout was cut at the cap.
    pub stdout_truncated: bool,
    /// stderr was cut at the cap.
    pub stderr_truncated: bool,
    /// With [`Request::list_descriptors`]: each descriptor the worker held before it locked
    /// itself down, with its `readlink` target (the listing's own left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descriptors: Vec<(i32, String)>,
}
