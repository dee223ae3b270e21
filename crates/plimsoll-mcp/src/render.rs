//! From plimsolld's answers to MCP tool results: a text block an agent reads (exit code,
//! stdout, stderr, and what ran where) and structured content for programs
//! (`run_code`'s follows [`crate::tools::run_code_output_schema`]).
//!
//! Errors are tool errors (`isError: true`) whose text says what happened and what to do;
//! a refusal keeps the client's wording, `not dispatched (<reason>): …`, so an agent can
//! tell a call that ran nothing (safe to fix and resend) from one that may have run.

use plimsoll_core::pb;
use rmcp::model::{CallToolResult, ContentBlock};
use serde::Serialize;
use serde_json::Value;

/// `run_code`'s structured content.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunOutput {
    /// The program's standard output (invalid UTF-8 replaced).
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
    /// Its exit code, -1 when it never started.
    pub exit_code: i32,
    /// Whether the deadline stopped it.
    pub timed_out: bool,
    /// Whether stdout was cut at the server's cap.
    pub stdout_truncated: bool,
    /// Whether stderr was cut at the server's cap.
    pub stderr_truncated: bool,
    /// `completed`, `timed_out`, `setup_failed` or `protocol_error`.
    pub outcome: &'static str,
    /// Why it did not complete, when it did not.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// The tier the run got.
    pub tier: String,
    /// The provider that ran it.
    pub provider: String,
    /// The daemon's measured duration.
    pub duration_ms: i64,
    /// The run record's digest.
    pub record_sha256: String,
    /// The session handle, for a session call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The call's position in the session's chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// The digest this call's record links to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_sha256: Option<String>,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

impl RunOutput {
    /// The output of a checked answer.
    pub fn from_response(resp: &pb::RunResponse) -> RunOutput {
        use pb::run_response::Result as R;
        use pb::ProjectOutcome as O;
        let record = resp.record.clone().unwrap_or_default();
        let mut out = RunOutput {
            stdout: String::new(),
            stderr: String::new(),
            exit_code: -1,
            timed_out: false,
            stdout_truncated: false,
            stderr_truncated: false,
            outcome: "completed",
            detail: String::new(),
            tier: resp.isolation.clone(),
            provider: resp.sandbox.clone(),
            duration_ms: resp.duration_ms,
            record_sha256: record.record_sha256.clone(),
            session: None,
            sequence: None,
            previous_sha256: None,
        };
        match &resp.result {
            Some(R::Javascript(j)) => {
                (out.stdout, out.stderr, out.exit_code, out.timed_out) =
                    (text(&j.stdout), text(&j.stderr), j.exit_code, j.timed_out);
                (out.stdout_truncated, out.stderr_truncated) =
                    (j.stdout_truncated, j.stderr_truncated);
            }
            Some(R::Cell(c)) => {
                (out.stdout, out.stderr, out.exit_code, out.timed_out) =
                    (text(&c.stdout), text(&c.stderr), c.exit_code, c.timed_out);
                (out.stdout_truncated, out.stderr_truncated) =
                    (c.stdout_truncated, c.stderr_truncated);
                if c.interpreter_ended {
                    out.detail =
                        "the interpreter ended: variables from earlier calls are gone".into();
                }
            }
            Some(R::Project(p)) => {
                if let Some(s) = p.steps.last() {
                    (out.stdout, out.stderr, out.exit_code, out.timed_out) =
                        (text(&s.stdout), text(&s.stderr), s.exit_code, s.timed_out);
                    (out.stdout_truncated, out.stderr_truncated) =
                        (s.stdout_truncated, s.stderr_truncated);
                }
                out.outcome = match O::try_from(p.outcome) {
                    Ok(O::Completed) => "completed",
                    Ok(O::TimedOut) => "timed_out",
                    Ok(O::SetupFailed) => "setup_failed",
                    _ => "protocol_error",
                };
                out.detail = p.outcome_detail.clone();
            }
            Some(R::Module(_)) | None => {
                out.outcome = "protocol_error";
                out.detail = "the answer carries no result this server can show".into();
            }
        }
        if out.timed_out {
            out.outcome = "timed_out";
        }
        if let Some(seq) = (record.sequence > 0).then_some(record.sequence) {
            out.sequence = Some(seq);
            out.previous_sha256 = Some(record.previous_sha256);
        }
        out
    }

    /// The text block an agent reads.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let status = match self.outcome {
            "completed" => format!("exit code {}", self.exit_code),
            "timed_out" => "timed out: the deadline stopped the program".to_owned(),
            "setup_failed" => "setup failed: the program did not start".to_owned(),
            _ => "protocol error: the sandbox's answer was incomplete".to_owned(),
        };
        s.push_str(&format!(
            "{status} ({} ms, tier {}, provider {})\n",
            self.duration_ms, self.tier, self.provider
        ));
        if !self.detail.is_empty() {
            s.push_str(&format!("detail: {}\n", self.detail));
        }
        if let Some(seq) = self.sequence {
            s.push_str(&format!("session call {seq}\n"));
        }
        // The record line comes before the program's output, and each output section has
        // an end marker, so nothing the program prints can pass for this server's lines.
        s.push_str(&format!("record sha256:{}\n", self.record_sha256));
        for (name, body, cut) in [
            ("stdout", &self.stdout, self.stdout_truncated),
            ("stderr", &self.stderr, self.stderr_truncated),
        ] {
            s.push_str(&format!(
                "--- {name}{} ---\n",
                if cut { " (truncated)" } else { "" }
            ));
            s.push_str(body);
            if !body.is_empty() && !body.ends_with('\n') {
                s.push('\n');
            }
            s.push_str(&format!("--- end of {name} ---\n"));
        }
        s
    }

    /// The tool result: the summary as text, the fields as structured content. A program
    /// that ran is never a tool error, whatever its exit code.
    pub fn into_result(self) -> CallToolResult {
        let summary = self.summary();
        let mut r = CallToolResult::success(vec![ContentBlock::text(summary)]);
        r.structured_content = Some(serde_json::to_value(&self).unwrap_or(Value::Null));
        r
    }
}

/// A tool error with `message` as its text.
pub fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}

/// A successful result with `summary` as text and `structured` as structured content.
pub fn structured(summary: String, structured: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(summary)]);
    r.structured_content = Some(structured);
    r
}

/// A short text for a `Describe` answer.
pub fn describe_summary(d: &pb::DescribeResponse) -> String {
    let mut langs: Vec<String> = Vec::new();
    if d.javascript_environment.is_some() {
        langs.push("javascript".into());
    }
    if d.supports_project {
        for l in ["python", "shell"] {
            langs.push(l.into());
        }
        if !langs.iter().any(|l| l == "javascript") {
            langs.insert(0, "javascript (node)".into());
        }
    }
    let mut s = format!(
        "provider {}, isolation tier {}, protocol {}\nlanguages: {}\n",
        d.sandbox,
        d.isolation,
        d.protocol,
        if langs.is_empty() {
            "none".into()
        } else {
            langs.join(", ")
        }
    );
    if d.supports_sessions {
        let cells = d
            .session_environment
            .as_ref()
            .map(|e| e.languages.join(", "))
            .unwrap_or_default();
        let cap = match d.max_sessions_per_caller {
            0 => "no cap per caller".to_owned(),
            n => format!("at most {n} per caller"),
        };
        s.push_str(&format!(
            "sessions: yes (kept languages: {}; lifetime up to {} ms, idle up to {} ms, {cap})\n",
            if cells.is_empty() { "none" } else { &cells },
            d.session_lifetime_ms,
            d.session_idle_timeout_ms,
        ));
    } else {
        s.push_str("sessions: no (run_code without `session` only)\n");
    }
    if let Some(r) = &d.resources {
        let mut limits = Vec::new();
        if r.memory_mb > 0 {
            limits.push(format!("{} MB memory", r.memory_mb));
        }
        if r.cpus > 0.0 {
            limits.push(format!("{} CPUs", r.cpus));
        }
        if r.pids > 0 {
            limits.push(format!("{} processes", r.pids));
        }
        if r.disk_mb > 0 {
            limits.push(format!("{} MB disk", r.disk_mb));
        }
        if !limits.is_empty() {
            s.push_str(&format!("limits per run: {}\n", limits.join(", ")));
        }
    }
    if let Some(js) = &d.javascript_environment {
        if js.max_timeout_ms > 0 {
            s.push_str(&format!("longest deadline: {} ms\n", js.max_timeout_ms));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(result: pb::run_response::Result) -> pb::RunResponse {
        pb::RunResponse {
            sandbox: "process".into(),
            isolation: "process".into(),
            duration_ms: 12,
            record: Some(pb::RunRecord {
                record_sha256: "ab".repeat(32),
                ..Default::default()
            }),
            result: Some(result),
            ..Default::default()
        }
    }

    #[test]
    fn javascript_answer() {
        let out = RunOutput::from_response(&answer(pb::run_response::Result::Javascript(
            pb::JavaScriptResult {
                stdout: b"hi\n".to_vec(),
                stderr: b"warn".to_vec(),
                exit_code: 3,
                ..Default::default()
            },
        )));
        assert_eq!((out.exit_code, out.outcome), (3, "completed"));
        let s = out.summary();
        assert!(
            s.starts_with("exit code 3 (12 ms, tier process, provider process)\n"),
            "{s}"
        );
        assert!(
            s.contains("--- stdout ---\nhi\n--- end of stdout ---\n--- stderr ---\nwarn\n--- end of stderr ---\n"),
            "{s}"
        );
        assert!(s.find("record sha256:") < s.find("--- stdout ---"), "{s}");
        let r = out.into_result();
        assert_eq!(r.is_error, Some(false));
        let v = r.structured_content.unwrap();
        assert_eq!(v["exit_code"], 3);
        assert!(v.get("session").is_none());
    }

    #[test]
    fn timeouts_and_setup_failures_say_so() {
        let out = RunOutput::from_response(&answer(pb::run_response::Result::Project(
            pb::ProjectResult {
                steps: vec![pb::StepResult {
                    timed_out: true,
                    exit_code: -1,
                    ..Default::default()
                }],
                outcome: pb::ProjectOutcome::TimedOut as i32,
                ..Default::default()
            },
        )));
        assert!(out.summary().starts_with("timed out"), "{}", out.summary());
        let out = RunOutput::from_response(&answer(pb::run_response::Result::Project(
            pb::ProjectResult {
                outcome: pb::ProjectOutcome::SetupFailed as i32,
                outcome_detail: "python3: not found".into(),
                ..Default::default()
            },
        )));
        assert_eq!(out.exit_code, -1);
        assert!(
            out.summary().contains("detail: python3: not found"),
            "{}",
            out.summary()
        );
    }
}
