//! The tool list: names, descriptions, input schemas (written by hand so they say exactly
//! what [`crate::args`] accepts, with no `null` types that some function-calling front ends
//! mishandle) and `run_code`'s output schema.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::{json, Value};

fn object(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => unreachable!("schemas are objects"),
    }
}

const TIERS: [&str; 4] = ["process", "container", "kernel", "vm"];

fn floor_schema(what: &str) -> Value {
    json!({"type": "string", "enum": TIERS,
        "description": format!("The weakest isolation tier acceptable for {what} (process < container < kernel < vm). A server that cannot meet it runs nothing and says \"not dispatched\".")})
}

fn handle_schema() -> Value {
    json!({"type": "string", "pattern": "^s-[0-9a-f]{32}$",
        "description": "The `session` handle open_session answered."})
}

/// `run_code`'s output schema (its structured content).
pub fn run_code_output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "stdout": {"type": "string"},
            "stderr": {"type": "string"},
            "exit_code": {"type": "integer", "description": "The program's exit code (-1 when it never started)."},
            "timed_out": {"type": "boolean"},
            "stdout_truncated": {"type": "boolean"},
            "stderr_truncated": {"type": "boolean"},
            "outcome": {"type": "string", "enum": ["completed", "timed_out", "setup_failed", "protocol_error"]},
            "detail": {"type": "string", "description": "Why the program did not complete, when it did not."},
            "tier": {"type": "string", "enum": TIERS, "description": "The isolation tier the run actually got."},
            "provider": {"type": "string"},
            "duration_ms": {"type": "integer"},
            "record_sha256": {"type": "string", "description": "The run record's digest (recomputable from the request and result)."},
            "session": {"type": "string", "description": "The session handle, for a call in a session."},
            "sequence": {"type": "integer", "description": "The call's position in the session's record chain (1 for the first)."},
            "previous_sha256": {"type": "string", "description": "The record digest this call's record links to (empty for the first)."}
        },
        "required": ["stdout", "stderr", "exit_code", "timed_out", "stdout_truncated", "stderr_truncated",
                     "outcome", "tier", "provider", "duration_ms", "record_sha256"]
    })
}

/// Every tool this server offers.
pub fn list() -> Vec<Tool> {
    let run_code = Tool::new(
        "run_code",
        "Run code in a sandbox and return its stdout, stderr and exit code. `language` is \
         javascript, python or shell. Without `session` every call starts clean; with a \
         `session` from open_session, Python and JavaScript variables persist between calls \
         and files stay. The answer states the isolation tier the code got and the digest of \
         its run record. A refusal says \"not dispatched\": nothing ran.",
        object(json!({
            "type": "object",
            "properties": {
                "language": {"type": "string", "enum": ["javascript", "python", "shell"],
                    "description": "The language of `code`."},
                "code": {"type": "string", "minLength": 1, "description": "The program to run."},
                "files": {"type": "object", "additionalProperties": {"type": "string"},
                    "description": "Text files to write first: relative path -> content."},
                "session": handle_schema(),
                "timeout_ms": {"type": "integer", "minimum": 1, "maximum": plimsoll_core::validate::MAX_TIMEOUT_MS,
                    "description": "Deadline in milliseconds (default: the server's)."},
                "minimum_isolation": floor_schema("this run")
            },
            "required": ["language", "code"],
            "additionalProperties": false
        })),
    )
    .with_raw_output_schema(object(run_code_output_schema()))
    // Code may write files, reach whatever its tier lets it reach and change the
    // sandbox's state: only `read_only` is stated; the defaults (destructive, open world)
    // are the honest hints for code an agent wrote.
    .annotate(ToolAnnotations::new().read_only(false));
    let open_session = Tool::new(
        "open_session",
        "Open a sandbox session: one sandbox kept across run_code calls, whose run records \
         form a chain. Answers the `session` handle to pass to run_code and close_session.",
        object(json!({
            "type": "object",
            "properties": {
                "languages": {"type": "array", "items": {"type": "string", "enum": ["javascript", "python", "shell"]},
                    "description": "The languages the session will run (default: all the server offers)."},
                "minimum_isolation": floor_schema("the session"),
                "lifetime_ms": {"type": "integer", "minimum": 1, "description": "The session's lifetime (the server's maximum applies)."},
                "idle_timeout_ms": {"type": "integer", "minimum": 1000, "description": "After this long without a call the sandbox is suspended and the next call resumes it (on providers that can pause); a session no call ever used ends then."}
            },
            "additionalProperties": false
        })),
    );
    let close_session = Tool::new(
        "close_session",
        "Close a session. Answers its fingerprint, how many calls ran and the last record \
         digest of its chain.",
        object(json!({
            "type": "object",
            "properties": {"session": handle_schema()},
            "required": ["session"],
            "additionalProperties": false
        })),
    );
    let describe = Tool::new(
        "describe",
        "Describe the sandbox: provider, isolation tier, languages, limits and whether \
         sessions are available.",
        object(json!({"type": "object", "properties": {}, "additionalProperties": false})),
    )
    .annotate(ToolAnnotations::new().read_only(true).open_world(false));
    vec![run_code, open_session, close_session, describe]
}
