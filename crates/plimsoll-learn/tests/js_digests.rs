//! The page's JavaScript digests (`docs/learn/check/verify.js`, run under node) agree with
//! the Rust ones on every vector of `golden.json` (plimsoll-core's fixture, the vectors of
//! `RECORDS.md`), given as the binary protobuf the page reads, and on extra vectors made
//! here to reach every field: software rules, projects with files and artifacts, modules
//! with NaN and -0.0, cells, version 1 and 3 records, strings outside ASCII, negative
//! numbers. The same node run checks the page's SHA-256, SHA-512, base64 and pure-JS
//! Ed25519 against node's own crypto. Needs node (CI installs it).

use std::process::Command;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use plimsoll_core::digest::{record_digest, request_digest, result_digest};
use plimsoll_core::pb;
use prost::Message as _;
use serde_json::{json, Value};

fn golden() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../plimsoll-core/tests/fixtures/golden.json");
    serde_json::from_str(&std::fs::read_to_string(&path).expect("golden.json")).unwrap()
}

fn vector(kind: &str, name: &str, bytes: Vec<u8>, sha256: String) -> Value {
    json!({ "kind": kind, "name": name, "protobuf": STANDARD.encode(bytes), "sha256": sha256 })
}

fn extra_requests() -> Vec<(String, pb::RunRequest)> {
    use pb::run_request::Payload;
    let rule = |ids: &[&str]| {
        Some(pb::SoftwareRule {
            mode: if ids.len() == 1 { "exact" } else { "approved" }.into(),
            identities: ids.iter().map(|s| s.to_string()).collect(),
        })
    };
    vec![
        (
            "javascript, approved rule, unicode".into(),
            pb::RunRequest {
                protocol: 5,
                minimum_isolation: "kernel".into(),
                trace_id: "not hashed".into(),
                timeout_ms: -7,
                software_rule: rule(&["zeta:sha256:1", "alpha:sha256:2", "Ωmega"]),
                payload: Some(Payload::Javascript(pb::JavaScriptRun {
                    code: "console.log('é ✓ \u{2028} <&>')".into(),
                    grant_profile: "github".into(),
                })),
            },
        ),
        (
            "project with files, steps and artifacts".into(),
            pb::RunRequest {
                protocol: 3,
                software_rule: rule(&["one"]),
                payload: Some(Payload::Project(pb::ProjectRun {
                    files: vec![
                        pb::ProjectFile {
                            path: "a/b.txt".into(),
                            content: "x\n".into(),
                        },
                        pb::ProjectFile {
                            path: "c".into(),
                            content: String::new(),
                        },
                    ],
                    steps: vec!["sh -c 'echo 1'".into(), "true".into()],
                    artifacts: vec!["out.txt".into()],
                    grant_profile: String::new(),
                })),
                ..Default::default()
            },
        ),
        (
            "module with NaN, -0.0 and infinities".into(),
            pb::RunRequest {
                protocol: 5,
                payload: Some(Payload::Module(pb::ModuleRun {
                    model: "m".into(),
                    rows: vec![
                        pb::ModuleRow {
                            values: vec![f64::NAN, -0.0, 1.5e300],
                        },
                        pb::ModuleRow { values: vec![] },
                        pb::ModuleRow {
                            values: vec![f64::NEG_INFINITY],
                        },
                    ],
                    end_time: 10.25,
                    step: -0.0,
                })),
                ..Default::default()
            },
        ),
        (
            "cell with files".into(),
            pb::RunRequest {
                protocol: 5,
                payload: Some(Payload::Cell(pb::CellRun {
                    language: "python".into(),
                    code: "print(1)".into(),
                    files: vec![pb::ProjectFile {
                        path: "d.csv".into(),
                        content: "1,2".into(),
                    }],
                })),
                ..Default::default()
            },
        ),
        (
            "no payload, protocol 1".into(),
            pb::RunRequest {
                protocol: 1,
                ..Default::default()
            },
        ),
        ("empty".into(), pb::RunRequest::default()),
    ]
}

fn extra_results() -> Vec<(String, pb::RunResponse)> {
    use pb::run_response::Result as R;
    vec![
        (
            "javascript, negative exit, every flag".into(),
            pb::RunResponse {
                sandbox: "docker".into(),
                duration_ms: 5,
                result: Some(R::Javascript(pb::JavaScriptResult {
                    stdout: vec![0, 255, 10],
                    stderr: b"err".to_vec(),
                    exit_code: -2,
                    timed_out: true,
                    stdout_truncated: true,
                    stderr_truncated: true,
                    advice: vec![pb::AdviceFinding {
                        pattern: "p".into(),
                        extra_calls: -1,
                        bytes_moved: 1 << 40,
                        ..Default::default()
                    }],
                })),
                ..Default::default()
            },
        ),
        (
            "project with steps and artifacts".into(),
            pb::RunResponse {
                result: Some(R::Project(pb::ProjectResult {
                    steps: vec![
                        pb::StepResult {
                            command: "a".into(),
                            stdout: b"1".to_vec(),
                            exit_code: 3,
                            duration_ms: 9,
                            ..Default::default()
                        },
                        pb::StepResult {
                            command: "b".into(),
                            timed_out: true,
                            stderr_truncated: true,
                            ..Default::default()
                        },
                    ],
                    outcome: 3,
                    artifacts: vec![pb::Artifact {
                        path: "o".into(),
                        content: vec![1, 2, 3],
                    }],
                    outcome_detail: "timed out".into(),
                    artifacts_truncated: true,
                    advice: vec![],
                })),
                ..Default::default()
            },
        ),
        (
            "module runs".into(),
            pb::RunResponse {
                result: Some(R::Module(pb::ModuleResult {
                    runs: vec![
                        pb::ModuleRowResult {
                            status: 0,
                            outputs: vec![1.0, f64::NAN],
                        },
                        pb::ModuleRowResult {
                            status: -1,
                            outputs: vec![],
                        },
                    ],
                    width: 2,
                    outcome: 1,
                    outcome_detail: String::new(),
                    stdout: b"o".to_vec(),
                    stderr: vec![],
                })),
                ..Default::default()
            },
        ),
        (
            "cell".into(),
            pb::RunResponse {
                result: Some(R::Cell(pb::CellResult {
                    stdout: b"42\n".to_vec(),
                    exit_code: 1,
                    interpreter_started: true,
                    interpreter_ended: true,
                    ..Default::default()
                })),
                ..Default::default()
            },
        ),
        ("no result".into(), pb::RunResponse::default()),
    ]
}

fn extra_records() -> Vec<(String, pb::RunRecord)> {
    let base = pb::RunRecord {
        version: 2,
        request_sha256: "a".repeat(64),
        result_sha256: "b".repeat(64),
        provider: "process".into(),
        isolation: "process".into(),
        started_unix_ms: -1,
        ended_unix_ms: i64::MAX,
        sequence: u64::MAX,
        software_identity: "node:sha256:ff".into(),
        software_rule_id: "exact:node".into(),
        ..Default::default()
    };
    vec![
        ("version 2, extreme numbers".into(), base.clone()),
        (
            "version 1".into(),
            pb::RunRecord {
                version: 1,
                software_identity: String::new(),
                software_rule_id: String::new(),
                ..base.clone()
            },
        ),
        (
            "version 3, unanswered".into(),
            pb::RunRecord {
                version: 3,
                result_sha256: String::new(),
                unanswered: "deadline_exceeded".into(),
                ..base
            },
        ),
    ]
}

/// Each golden vector of `list` (its message under `member`), checked in Rust first, as the
/// binary protobuf the page reads.
fn golden_vectors<M>(
    list: &Value,
    member: &str,
    kind: &str,
    digest: fn(&M) -> String,
    out: &mut Vec<Value>,
) where
    M: prost::Message + serde::de::DeserializeOwned,
{
    for v in list.as_array().unwrap() {
        let m: M = serde_json::from_value(v[member].clone()).unwrap();
        let sha = v["sha256"].as_str().unwrap();
        assert_eq!(digest(&m), sha, "{}", v["name"]);
        out.push(vector(
            kind,
            v["name"].as_str().unwrap(),
            m.encode_to_vec(),
            sha.into(),
        ));
    }
}

/// `m` on the wire, with the Rust digest of what those bytes decode to.
fn wire_vector<M: prost::Message + Default>(
    kind: &str,
    name: &str,
    m: &M,
    digest: fn(&M) -> String,
) -> Value {
    let b = m.encode_to_vec();
    let sha = digest(&M::decode(b.as_slice()).unwrap());
    vector(kind, name, b, sha)
}

#[test]
fn javascript_digests_agree_with_rust_on_every_vector() {
    let g = golden();
    let mut vectors = Vec::new();
    golden_vectors::<pb::RunRequest>(
        &g["requests"],
        "request",
        "request",
        request_digest,
        &mut vectors,
    );
    golden_vectors::<pb::RunResponse>(
        &g["results"],
        "response",
        "result",
        result_digest,
        &mut vectors,
    );
    golden_vectors::<pb::RunRecord>(
        &g["records"],
        "record",
        "record",
        record_digest,
        &mut vectors,
    );
    let golden_count = vectors.len();
    assert!(golden_count >= 10, "only {golden_count} golden vectors");
    // Expected digests are of what the bytes say (proto3 drops a singular -0.0 on the wire).
    for (name, r) in extra_requests() {
        vectors.push(wire_vector("request", &name, &r, request_digest));
    }
    for (name, r) in extra_results() {
        vectors.push(wire_vector("result", &name, &r, result_digest));
    }
    for (name, r) in extra_records() {
        vectors.push(wire_vector("record", &name, &r, record_digest));
    }
    // Non-canonical wire forms the page must read as prost does: unpacked doubles, a
    // oneof given twice (the last wins), a message field split in two (merged), unknown fields.
    let mut split = Vec::new();
    split.extend([0x08, 0x05]); // protocol 5
    split.extend([0x52, 0x03, 0x0a, 0x01, b'a']); // javascript {code "a"}
    split.extend([0x6a, 0x04, 0x0a, 0x02, b'p', b'y']); // cell {language "py"}
    split.extend([0x6a, 0x03, 0x12, 0x01, b'x']); // cell {code "x"}, merged into the cell
    split.extend([0xf8, 0x3e, 0x01]); // field 999 varint: unknown
    let decoded = pb::RunRequest::decode(split.as_slice()).unwrap();
    vectors.push(vector(
        "request",
        "oneof twice, merged cell, unknown field",
        split,
        request_digest(&decoded),
    ));
    let mut unpacked = vec![0x08, 0x05, 0x62, 0x14, 0x12, 0x12];
    unpacked.extend([0x09]);
    unpacked.extend(1.0f64.to_le_bytes());
    unpacked.extend([0x09]);
    unpacked.extend((-2.5f64).to_le_bytes());
    let decoded = pb::RunRequest::decode(unpacked.as_slice()).unwrap();
    assert_eq!(decoded.payload.as_ref().map(|_| ()), Some(()));
    vectors.push(vector(
        "request",
        "module row with unpacked doubles",
        unpacked,
        request_digest(&decoded),
    ));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("vectors.json");
    std::fs::write(&file, serde_json::to_string(&vectors).unwrap()).unwrap();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/js/digests.js");
    let out = Command::new("node")
        .arg(&script)
        .arg(&file)
        .output()
        .expect("node runs (CI installs nodejs)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the JavaScript disagrees:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checked: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("checked "))
        .and_then(|n| n.parse().ok())
        .expect("a count");
    assert!(
        checked >= vectors.len(),
        "{checked} checks for {} vectors",
        vectors.len()
    );
}
