//! Runs the agent-memory example end to end, as a user would, and checks what it shows:
//! the grant built from openapi.yaml, store and recall through the broker, two refusals,
//! a trace of route templates only, and the key nowhere but at the memory API.

use std::path::Path;
use std::process::Command;

const EXPECTED_TRACE: &str = "POST /v1/memories 201 x1; GET /v1/memories/{memoryId} 200 x1; \
     refused DELETE /v1/memories/{memoryId} 403 method_not_granted x1; \
     refused GET unmatched 403 not_granted x1";

/// Runs the example binary at `bin` with `--json`; returns its human output and report.
fn run(bin: &Path) -> (String, serde_json::Value) {
    let out = Command::new(bin).arg("--json").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the example failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let report = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .unwrap_or_else(|| panic!("no JSON report in:\n{stdout}"));
    (stdout, report)
}

fn check(stdout: &str, r: &serde_json::Value) {
    assert_eq!(r["failed"], serde_json::json!([]), "{stdout}");
    assert_eq!(
        r["routes"],
        serde_json::json!(["POST /v1/memories", "GET /v1/memories/{memoryId}"])
    );
    let steps = r["steps"].as_array().unwrap();
    let got: Vec<(&str, u64, bool)> = steps
        .iter()
        .map(|s| {
            (
                s["step"].as_str().unwrap(),
                s["status"].as_u64().unwrap(),
                s["refused"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("store", 201, false),
            ("recall", 200, false),
            ("forget", 403, true),
            ("export", 403, true)
        ]
    );
    let id = steps[0]["body"]["id"].as_str().unwrap();
    assert_eq!(steps[1]["body"]["id"], id);
    assert_eq!(
        steps[1]["body"]["text"],
        "The user wants answers in metric units."
    );
    assert_eq!(steps[2]["body"]["error"], "method_not_granted");
    assert_eq!(steps[3]["body"]["error"], "not_granted");
    // The trace names templates; the raw path with the memory's id is not in it.
    let trace = r["trace"].as_str().unwrap();
    assert_eq!(trace, EXPECTED_TRACE);
    assert!(!trace.contains(id) && !trace.contains("admin"), "{trace}");
    // Only the two granted calls reached the API, each with the key the broker attached.
    let up = r["upstream"].as_array().unwrap();
    assert_eq!(up.len(), 2, "{up:?}");
    assert_eq!(up[0]["target"], "/v1/memories");
    assert_eq!(up[1]["target"], format!("/v1/memories/{id}"));
    assert!(up.iter().all(|u| u["had_key"] == true));
    // The sandbox had the relay's variables, and the key was nowhere it could look.
    let env: Vec<&str> = r["sandbox_env_names"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for v in [
        "PLIMSOLL_GRANT_URL",
        "PLIMSOLL_GRANT_SECRET",
        "PLIMSOLL_GRANT_JS",
    ] {
        assert!(env.contains(&v), "{env:?}");
    }
    assert_eq!(r["key_found_in"], serde_json::json!([]));
    assert!(stdout.contains("--- the broker's trace (route templates only) ---"));
    assert!(stdout.contains("memory API: received it on 2 of 2 calls"));
    assert_eq!(r["record_sha256"].as_str().unwrap().len(), 64);
}

#[test]
fn the_example_runs_end_to_end() {
    let bin = Path::new(env!("CARGO_BIN_EXE_plimsoll-example-agent-memory"));
    let (stdout, report) = run(bin);
    check(&stdout, &report);
}

/// A copy of the example in a directory without plimsoll-specgen beside it builds the grant
/// with specgen's reader in process, to the same effect.
#[test]
fn without_the_specgen_binary_the_library_builds_the_same_grant() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("plimsoll-example-agent-memory");
    std::fs::copy(env!("CARGO_BIN_EXE_plimsoll-example-agent-memory"), &copy).unwrap();
    let (stdout, report) = run(&copy);
    assert_eq!(report["specgen"], "library", "{stdout}");
    check(&stdout, &report);
}
