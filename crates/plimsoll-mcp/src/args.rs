//! Decoding tool arguments: the JSON object an agent sent for a tool, into typed arguments.
//!
//! Pure and bounded (no I/O; the object is already parsed, and nothing here grows beyond
//! it), so it is fuzzed directly (`fuzz/fuzz_targets/mcp_tool_args.rs`). Every failure is an
//! [`ArgError`] whose message says what to send instead; unknown fields are refused rather
//! than ignored, so a misspelt `timeout_ms` is never silently dropped.

use std::collections::BTreeMap;

use plimsoll_core::validate::MAX_TIMEOUT_MS;
pub use plimsoll_core::Tier;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The tools this server offers.
pub const TOOLS: [&str; 4] = ["run_code", "open_session", "close_session", "describe"];

/// A language `run_code` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// JavaScript: QuickJS or node for a fresh snippet, a node cell in a session.
    Javascript,
    /// Python 3 (`python3`), a kept interpreter cell in a session.
    Python,
    /// A POSIX shell script (`sh`).
    Shell,
}

impl Language {
    /// The name agents send.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Javascript => "javascript",
            Language::Python => "python",
            Language::Shell => "shell",
        }
    }
}

/// An optional floor, read as a tier name (`plimsoll_core::Tier`); serde's "unknown
/// variant" message lists the names.
fn floor<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Tier>, D::Error> {
    let Some(name) = Option::<String>::deserialize(d)? else {
        return Ok(None);
    };
    Tier::ALL
        .into_iter()
        .find(|t| t.as_str() == name)
        .map(Some)
        .ok_or_else(|| {
            serde::de::Error::unknown_variant(&name, &["process", "container", "kernel", "vm"])
        })
}

/// `run_code`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    /// The language of `code`.
    pub language: Language,
    /// The program.
    pub code: String,
    /// Files (relative path → text) written into the working directory before the code
    /// runs, after the server's call files.
    #[serde(default)]
    pub files: Option<BTreeMap<String, String>>,
    /// A handle `open_session` answered: run in that kept sandbox.
    #[serde(default)]
    pub session: Option<String>,
    /// The deadline, 1 to 300000 ms (without it the daemon's default applies).
    #[serde(default)]
    pub timeout_ms: Option<u32>,
    /// The weakest tier acceptable; a daemon that cannot meet it runs nothing.
    #[serde(default, deserialize_with = "floor")]
    pub minimum_isolation: Option<Tier>,
}

/// `open_session`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct OpenSession {
    /// The languages the session will run (hints; default: whatever the daemon offers).
    #[serde(default)]
    pub languages: Option<Vec<Language>>,
    /// The weakest tier acceptable for the session.
    #[serde(default, deserialize_with = "floor")]
    pub minimum_isolation: Option<Tier>,
    /// The session's lifetime in milliseconds (the daemon's maximum applies).
    #[serde(default)]
    pub lifetime_ms: Option<u32>,
    /// Suspend the sandbox after this many milliseconds without a call (at least 1000); a
    /// session no call ever used ends then.
    #[serde(default)]
    pub idle_timeout_ms: Option<u32>,
}

/// `close_session`'s arguments.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloseSession {
    /// The handle `open_session` answered.
    pub session: String,
}

/// `describe` takes no argument.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Describe {}

/// One decoded tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCall {
    /// `run_code`.
    RunCode(RunCode),
    /// `open_session`.
    OpenSession(OpenSession),
    /// `close_session`.
    CloseSession(CloseSession),
    /// `describe`.
    Describe,
}

/// Why a tool call's arguments were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// No such tool (a protocol error, not a tool error: the client asked for a tool the
    /// list never offered).
    #[error(
        "unknown tool {0:?}; the tools are run_code, open_session, close_session and describe"
    )]
    UnknownTool(String),
    /// The arguments do not fit the tool's schema.
    #[error("invalid arguments for {tool}: {detail}")]
    Invalid {
        /// The tool.
        tool: &'static str,
        /// What is wrong and what to send instead.
        detail: String,
    },
}

impl ArgError {
    fn invalid(tool: &'static str, detail: impl Into<String>) -> ArgError {
        ArgError::Invalid {
            tool,
            detail: detail.into(),
        }
    }
}

/// Decodes the arguments of tool `name` (absent arguments are an empty object).
pub fn decode(name: &str, arguments: Option<&Map<String, Value>>) -> Result<ToolCall, ArgError> {
    let Some(&tool) = TOOLS.iter().find(|t| **t == name) else {
        return Err(ArgError::UnknownTool(truncate(name, 64)));
    };
    let value = Value::Object(arguments.cloned().unwrap_or_default());
    let fail = |e: serde_json::Error| ArgError::invalid(tool, explain(&e));
    match tool {
        "run_code" => {
            let a: RunCode = serde_json::from_value(value).map_err(fail)?;
            if a.code.trim().is_empty() {
                return Err(ArgError::invalid(
                    tool,
                    "`code` is empty; send the program to run",
                ));
            }
            if let Some(t) = a.timeout_ms {
                check_timeout(tool, "timeout_ms", t)?;
            }
            if let Some(s) = &a.session {
                check_handle(tool, s)?;
            }
            Ok(ToolCall::RunCode(a))
        }
        "open_session" => {
            let a: OpenSession = serde_json::from_value(value).map_err(fail)?;
            if let Some(t) = a.idle_timeout_ms {
                if t != 0 && t < 1000 {
                    return Err(ArgError::invalid(
                        tool,
                        "`idle_timeout_ms` must be at least 1000 (or left out for the daemon's)",
                    ));
                }
            }
            Ok(ToolCall::OpenSession(a))
        }
        "close_session" => {
            let a: CloseSession = serde_json::from_value(value).map_err(fail)?;
            check_handle(tool, &a.session)?;
            Ok(ToolCall::CloseSession(a))
        }
        _ => {
            let _: Describe = serde_json::from_value(value).map_err(fail)?;
            Ok(ToolCall::Describe)
        }
    }
}

fn check_timeout(tool: &'static str, field: &str, t: u32) -> Result<(), ArgError> {
    if t == 0 || t > MAX_TIMEOUT_MS {
        return Err(ArgError::invalid(
            tool,
            format!("`{field}` must be 1 to {MAX_TIMEOUT_MS} milliseconds (leave it out for the daemon's default)"),
        ));
    }
    Ok(())
}

/// A session handle is `s-` and 32 lower-case hex digits ([`crate::server`] makes them).
fn check_handle(tool: &'static str, s: &str) -> Result<(), ArgError> {
    let ok = s.len() == 34
        && s.starts_with("s-")
        && s[2..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ArgError::invalid(
            tool,
            format!(
                "`session` {:?} is not a session handle; send the `session` value open_session answered",
                truncate(s, 64)
            ),
        ))
    }
}

/// serde's message, with the JSON position (meaningless to an agent: the object was
/// already parsed) left out.
fn explain(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_owned(),
        None => s,
    }
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(v: Value) -> Result<ToolCall, ArgError> {
        decode("run_code", v.as_object())
    }

    #[test]
    fn run_code_decodes_every_field() {
        let c = run(json!({"language": "python", "code": "print(1)", "files": {"a.txt": "x"},
            "session": format!("s-{}", "ab".repeat(16)), "timeout_ms": 5000, "minimum_isolation": "kernel"}))
        .unwrap();
        let ToolCall::RunCode(a) = c else { panic!() };
        assert_eq!(a.language, Language::Python);
        assert_eq!(a.files.unwrap()["a.txt"], "x");
        assert_eq!(a.minimum_isolation, Some(Tier::Kernel));
        assert!(
            run(json!({"language": "shell", "code": "ls", "session": null, "files": null})).is_ok()
        );
    }

    #[test]
    fn run_code_errors_say_what_to_send() {
        let cases = [
            (json!({"language": "python"}), "missing field `code`"),
            (json!({"code": "1"}), "missing field `language`"),
            (
                json!({"language": "ruby", "code": "1"}),
                "unknown variant `ruby`, expected one of `javascript`, `python`, `shell`",
            ),
            (
                json!({"language": "python", "code": "  "}),
                "`code` is empty",
            ),
            (
                json!({"language": "python", "code": "1", "timeout": 5}),
                "unknown field `timeout`",
            ),
            (
                json!({"language": "python", "code": "1", "timeout_ms": 0}),
                "1 to 300000",
            ),
            (
                json!({"language": "python", "code": "1", "timeout_ms": -5}),
                "invalid value",
            ),
            (
                json!({"language": "python", "code": "1", "minimum_isolation": "steel"}),
                "unknown variant `steel`",
            ),
            (
                json!({"language": "python", "code": "1", "session": "abc"}),
                "not a session handle",
            ),
            (
                json!({"language": "python", "code": "1", "files": {"a": 3}}),
                "invalid type",
            ),
        ];
        for (args, want) in cases {
            let e = run(args.clone()).unwrap_err().to_string();
            assert!(e.starts_with("invalid arguments for run_code: "), "{e}");
            assert!(e.contains(want), "{args}: {e}");
            assert!(!e.contains(" at line "), "{e}");
        }
    }

    #[test]
    fn other_tools() {
        assert_eq!(decode("describe", None), Ok(ToolCall::Describe));
        assert!(decode("describe", json!({"x": 1}).as_object()).is_err());
        assert!(matches!(
            decode("open_session", None),
            Ok(ToolCall::OpenSession(_))
        ));
        let e = decode("open_session", json!({"idle_timeout_ms": 5}).as_object()).unwrap_err();
        assert!(e.to_string().contains("at least 1000"), "{e}");
        let e = decode("close_session", None).unwrap_err();
        assert!(e.to_string().contains("missing field `session`"), "{e}");
        let e = decode("rm_rf", None).unwrap_err();
        assert!(matches!(e, ArgError::UnknownTool(_)), "{e}");
    }
}
