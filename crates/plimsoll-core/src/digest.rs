//! Run-record digests, exactly as `RECORDS.md` fixes them: length-prefixed fields,
//! SHA-256, lowercase hex. The one place in the project that encodes digests.

use ring::digest::{Context, SHA256};

use crate::pb;
use crate::pb::run_request::Payload;
use crate::pb::run_response::Result as RunResult;

/// Domain of request digests for protocol 2 and later.
pub const REQUEST_DOMAIN_V2: &str = "plimsoll.run-request.v2";
/// Domain of request digests for protocol 1 (no software rule fields).
pub const REQUEST_DOMAIN_V1: &str = "plimsoll.run-request.v1";
/// Domain of result digests.
pub const RESULT_DOMAIN: &str = "plimsoll.run-result.v1";
/// The record version this daemon stamps on every answered call.
pub const RECORD_VERSION: u32 = 2;

/// A digest under construction: `value(domain)` then `field(name, content)`s.
pub struct Encoder(Context);

impl Encoder {
    /// Starts a digest in `domain`.
    pub fn new(domain: &str) -> Self {
        let mut e = Encoder(Context::new(&SHA256));
        e.value(domain.as_bytes());
        e
    }
    fn value(&mut self, b: &[u8]) {
        self.0.update(&(b.len() as u64).to_be_bytes());
        self.0.update(b);
    }
    /// A raw field.
    pub fn bytes(&mut self, name: &str, content: &[u8]) -> &mut Self {
        self.value(name.as_bytes());
        self.value(content);
        self
    }
    /// A string field (UTF-8 bytes).
    pub fn str(&mut self, name: &str, s: &str) -> &mut Self {
        self.bytes(name, s.as_bytes())
    }
    /// An integer field of any width, as ASCII decimal.
    pub fn int(&mut self, name: &str, v: impl Into<i128>) -> &mut Self {
        self.bytes(name, v.into().to_string().as_bytes())
    }
    /// A boolean field: `true` / `false`.
    pub fn flag(&mut self, name: &str, v: bool) -> &mut Self {
        self.bytes(name, if v { b"true" } else { b"false" })
    }
    /// Doubles as concatenated big-endian IEEE-754 binary64.
    pub fn doubles(&mut self, name: &str, vs: &[f64]) -> &mut Self {
        let buf: Vec<u8> = vs.iter().flat_map(|v| v.to_bits().to_be_bytes()).collect();
        self.bytes(name, &buf)
    }
    /// The count that opens a repeated group.
    pub fn count(&mut self, name: &str, n: usize) -> &mut Self {
        self.int(name, n as i128)
    }
    /// Lowercase hex of the SHA-256.
    pub fn finish(self) -> String {
        hex::encode(self.0.finish().as_ref())
    }
}

/// Lowercase hex SHA-256 of `b`.
pub fn sha256_hex(b: &[u8]) -> String {
    hex::encode(ring::digest::digest(&SHA256, b).as_ref())
}

/// The fingerprint of a session id (the id itself is a capability and never recorded).
pub fn session_fingerprint(session_id: &str) -> String {
    sha256_hex(session_id.as_bytes())
}

/// The software rule id: `""` with no rule, `exact:<id>` for one identity, else
/// `approved:sha256:<hex of the sorted identities joined by 0x00>`.
pub fn software_rule_id(rule: Option<&pb::SoftwareRule>) -> String {
    let Some(rule) = rule else {
        return String::new();
    };
    if rule.mode.is_empty() && rule.identities.is_empty() {
        return String::new();
    }
    if rule.identities.len() == 1 {
        return format!("exact:{}", rule.identities[0]);
    }
    let mut ids: Vec<&[u8]> = rule.identities.iter().map(|s| s.as_bytes()).collect();
    ids.sort();
    format!("approved:sha256:{}", sha256_hex(&ids.join(&0u8)))
}

/// The payload kind name used in digests and logs.
pub fn payload_kind(p: Option<&Payload>) -> &'static str {
    match p {
        Some(Payload::Javascript(_)) => "javascript",
        Some(Payload::Project(_)) => "project",
        Some(Payload::Module(_)) => "module",
        Some(Payload::Cell(_)) => "cell",
        None => "",
    }
}

fn files(e: &mut Encoder, files: &[pb::ProjectFile]) {
    e.count("files", files.len());
    for f in files {
        e.str("file_path", &f.path).str("file_content", &f.content);
    }
}

/// Digest of a request as sent (`timeout_ms` as sent, never the trace or session id).
pub fn request_digest(r: &pb::RunRequest) -> String {
    let v2 = r.protocol >= 2;
    let mut e = Encoder::new(if v2 {
        REQUEST_DOMAIN_V2
    } else {
        REQUEST_DOMAIN_V1
    });
    e.int("protocol", r.protocol)
        .str("minimum_isolation", &r.minimum_isolation)
        .int("timeout_ms", r.timeout_ms);
    if v2 {
        let (mode, ids) = r.software_rule.as_ref().map_or(("", &[][..]), |s| {
            (s.mode.as_str(), s.identities.as_slice())
        });
        e.str("software_mode", mode)
            .count("software_identities", ids.len());
        for id in ids {
            e.str("software_identity", id);
        }
    }
    e.str("kind", payload_kind(r.payload.as_ref()));
    match &r.payload {
        Some(Payload::Javascript(js)) => {
            e.str("code", &js.code)
                .str("grant_profile", &js.grant_profile);
        }
        Some(Payload::Project(p)) => {
            e.str("grant_profile", &p.grant_profile);
            files(&mut e, &p.files);
            e.count("steps", p.steps.len());
            for s in &p.steps {
                e.str("step_command", s);
            }
            e.count("artifacts", p.artifacts.len());
            for a in &p.artifacts {
                e.str("artifact_path", a);
            }
        }
        Some(Payload::Module(m)) => {
            e.str("model", &m.model)
                .doubles("end_time", &[m.end_time])
                .doubles("step", &[m.step]);
            e.count("rows", m.rows.len());
            for row in &m.rows {
                e.doubles("row_values", &row.values);
            }
        }
        Some(Payload::Cell(c)) => {
            e.str("language", &c.language).str("code", &c.code);
            files(&mut e, &c.files);
        }
        None => {}
    }
    e.finish()
}

/// A session call as the `RunRequest` it digests like (trace and session id dropped).
pub fn session_call_as_run(r: &pb::SessionRunRequest) -> pb::RunRequest {
    use pb::session_run_request::Payload as S;
    pb::RunRequest {
        protocol: r.protocol,
        minimum_isolation: r.minimum_isolation.clone(),
        trace_id: String::new(),
        timeout_ms: r.timeout_ms,
        software_rule: r.software_rule.clone(),
        payload: r.payload.clone().map(|p| match p {
            S::Javascript(j) => Payload::Javascript(j),
            S::Project(p) => Payload::Project(p),
            S::Cell(c) => Payload::Cell(c),
        }),
    }
}

/// Digest of a result as received (durations, provider and tier excluded).
pub fn result_digest(r: &pb::RunResponse) -> String {
    let mut e = Encoder::new(RESULT_DOMAIN);
    match &r.result {
        Some(RunResult::Javascript(j)) => {
            e.str("kind", "javascript")
                .int("exit_code", j.exit_code)
                .flag("timed_out", j.timed_out)
                .bytes("stdout", &j.stdout)
                .bytes("stderr", &j.stderr)
                .flag("stdout_truncated", j.stdout_truncated)
                .flag("stderr_truncated", j.stderr_truncated);
        }
        Some(RunResult::Project(p)) => {
            e.str("kind", "project")
                .int("outcome", p.outcome)
                .str("outcome_detail", &p.outcome_detail)
                .flag("artifacts_truncated", p.artifacts_truncated)
                .count("steps", p.steps.len());
            for s in &p.steps {
                e.str("step_command", &s.command)
                    .int("step_exit_code", s.exit_code)
                    .flag("step_timed_out", s.timed_out)
                    .bytes("step_stdout", &s.stdout)
                    .bytes("step_stderr", &s.stderr)
                    .flag("step_stdout_truncated", s.stdout_truncated)
                    .flag("step_stderr_truncated", s.stderr_truncated);
            }
            e.count("artifacts", p.artifacts.len());
            for a in &p.artifacts {
                e.str("artifact_path", &a.path)
                    .bytes("artifact_content", &a.content);
            }
        }
        Some(RunResult::Module(m)) => {
            e.str("kind", "module")
                .int("outcome", m.outcome)
                .str("outcome_detail", &m.outcome_detail)
                .int("width", m.width)
                .bytes("stdout", &m.stdout)
                .bytes("stderr", &m.stderr)
                .count("runs", m.runs.len());
            for row in &m.runs {
                e.int("run_status", row.status)
                    .doubles("run_outputs", &row.outputs);
            }
        }
        Some(RunResult::Cell(c)) => {
            e.str("kind", "cell")
                .int("exit_code", c.exit_code)
                .flag("timed_out", c.timed_out)
                .bytes("stdout", &c.stdout)
                .bytes("stderr", &c.stderr)
                .flag("stdout_truncated", c.stdout_truncated)
                .flag("stderr_truncated", c.stderr_truncated)
                .flag("interpreter_started", c.interpreter_started)
                .flag("interpreter_ended", c.interpreter_ended);
        }
        None => {
            e.str("kind", "");
        }
    }
    e.finish()
}

/// Digest of a record's own fields, in the domain of its version.
pub fn record_digest(r: &pb::RunRecord) -> String {
    let mut e = Encoder::new(&format!("plimsoll.run-record.v{}", r.version));
    e.str("request_sha256", &r.request_sha256)
        .str("result_sha256", &r.result_sha256);
    if r.version >= 3 {
        e.str("unanswered", &r.unanswered);
    }
    e.str("provider", &r.provider)
        .str("isolation", &r.isolation)
        .str("environment", &r.environment)
        .str("policy", &r.policy);
    if r.version >= 2 {
        e.str("software_identity", &r.software_identity)
            .str("software_rule_id", &r.software_rule_id);
    }
    e.int("started_unix_ms", r.started_unix_ms)
        .int("ended_unix_ms", r.ended_unix_ms)
        .str("session", &r.session)
        .int("sequence", r.sequence)
        .str("previous_sha256", &r.previous_sha256);
    e.finish()
}

/// A session call's place in its session's chain (all empty for a single run).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainLink {
    /// The session's fingerprint.
    pub session: String,
    /// The 1-based number of this call among the session's executed calls.
    pub sequence: u64,
    /// The previous call's `record_sha256`, empty for the first call.
    pub previous_sha256: String,
}

/// The record version of a session call that may have run but has no answer.
pub const UNANSWERED_RECORD_VERSION: u32 = 3;

/// Stamps a version-2 record for a single run onto `resp`: evidence from the answer,
/// both digests, and the record digest. `ended_unix_ms` must come from the monotonic
/// elapsed time added to `started_unix_ms`.
pub fn stamp(
    req: &pb::RunRequest,
    resp: &mut pb::RunResponse,
    policy: &str,
    started_unix_ms: i64,
    ended_unix_ms: i64,
) {
    stamp_linked(
        req,
        resp,
        policy,
        (started_unix_ms, ended_unix_ms),
        &ChainLink::default(),
    );
}

/// Stamps a version-2 record carrying `link` (a session call's chain fields) onto `resp`;
/// `req` is the call as the `RunRequest` it digests like ([`session_call_as_run`]).
/// `times` is (`started_unix_ms`, `ended_unix_ms`).
pub fn stamp_linked(
    req: &pb::RunRequest,
    resp: &mut pb::RunResponse,
    policy: &str,
    times: (i64, i64),
    link: &ChainLink,
) {
    let mut rec = pb::RunRecord {
        version: RECORD_VERSION,
        request_sha256: request_digest(req),
        result_sha256: result_digest(resp),
        provider: resp.sandbox.clone(),
        isolation: resp.isolation.clone(),
        environment: resp.environment.clone(),
        policy: policy.to_owned(),
        started_unix_ms: times.0,
        ended_unix_ms: times.1.max(times.0),
        software_identity: resp.software_identity.clone(),
        software_rule_id: software_rule_id(req.software_rule.as_ref()),
        session: link.session.clone(),
        sequence: link.sequence,
        previous_sha256: link.previous_sha256.clone(),
        ..Default::default()
    };
    rec.record_sha256 = record_digest(&rec);
    resp.record = Some(rec);
}

/// Where a session runs, as stated when it was opened: the evidence an unanswered call's
/// record carries, since no answer states it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionEvidence {
    /// The provider (`OpenSessionResponse.sandbox`).
    pub provider: String,
    /// The tier at open.
    pub isolation: String,
    /// The outer environment identity.
    pub environment: String,
    /// The software identity at open.
    pub software_identity: String,
    /// The verified policy digest, or empty.
    pub policy: String,
}

/// The version-3 record of a session call that may have run but has no answer: empty
/// result digest, `unanswered` = the gRPC code's name (`internal`, `unavailable`, ...).
pub fn unanswered_record(
    req: &pb::RunRequest,
    evidence: &SessionEvidence,
    code: &str,
    times: (i64, i64),
    link: &ChainLink,
) -> pb::RunRecord {
    let mut rec = pb::RunRecord {
        version: UNANSWERED_RECORD_VERSION,
        request_sha256: request_digest(req),
        result_sha256: String::new(),
        unanswered: code.to_owned(),
        provider: evidence.provider.clone(),
        isolation: evidence.isolation.clone(),
        environment: evidence.environment.clone(),
        policy: evidence.policy.clone(),
        started_unix_ms: times.0,
        ended_unix_ms: times.1.max(times.0),
        software_identity: evidence.software_identity.clone(),
        software_rule_id: software_rule_id(req.software_rule.as_ref()),
        session: link.session.clone(),
        sequence: link.sequence,
        previous_sha256: link.previous_sha256.clone(),
        ..Default::default()
    };
    rec.record_sha256 = record_digest(&rec);
    rec
}
