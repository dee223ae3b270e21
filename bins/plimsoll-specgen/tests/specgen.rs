//! plimsoll-specgen as a program: stdin and files, JSON and YAML, whole profiles that the
//! broker loads, fragments, and the exit codes of bad documents and bad flags.

use std::io::Write;
use std::process::{Command, Output, Stdio};

const YAML: &str = "openapi: 3.1.0
info: {title: Memory Store, version: 1.2.0}
servers:
  - url: 'http://127.0.0.1:{port}/memory/v1'
    variables:
      port: {default: '4010'}
paths:
  /memories:
    post: {operationId: storeMemory, tags: [memory]}
  /memories/{key}:
    get: {operationId: recallMemory, tags: [memory]}
    delete: {operationId: forgetMemory, tags: [admin]}
";

fn specgen(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_plimsoll-specgen"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A run refused on its flags exits without reading stdin: a broken pipe is expected then.
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin) {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
    }
    child.wait_with_output().unwrap()
}

#[test]
fn writes_a_grants_file_the_broker_loads() {
    let out = specgen(
        &[
            "--tag",
            "memory",
            "--server-var",
            "port=5555",
            "--credential-env",
            "MEMORY_API_KEY",
            "--placement",
            "header:X-Api-Key",
            "--allowed-caller",
            "agent",
        ],
        YAML.as_bytes(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = plimsoll_grants::GrantsFile::parse(&out.stdout).unwrap();
    let p = &file.profiles["memory-store"];
    assert_eq!(p.origin.to_string(), "http://127.0.0.1:5555");
    let routes: Vec<String> = p.routes.routes().iter().map(|r| r.to_string()).collect();
    assert_eq!(
        routes,
        vec!["POST /memory/v1/memories", "GET /memory/v1/memories/{key}"]
    );
    assert_eq!(
        p.credential.as_ref().unwrap().placement,
        plimsoll_grants::Placement::Header {
            name: "x-api-key".into(),
            prefix: String::new()
        }
    );
}

#[test]
fn reads_a_json_file_and_writes_a_fragment() {
    let dir = tempfile::tempdir().unwrap();
    let doc = dir.path().join("api.json");
    std::fs::write(
        &doc,
        r#"{"openapi":"3.0.3","servers":[{"url":"https://api.example.com/client/v4"}],
            "paths":{"/zones/{zone_id}":{"get":{}}}}"#,
    )
    .unwrap();
    let out_path = dir.path().join("fragment.json");
    let out = specgen(
        &[
            "--fragment",
            "-o",
            out_path.to_str().unwrap(),
            doc.to_str().unwrap(),
        ],
        b"",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out_path).unwrap()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"base_url":"https://api.example.com","routes":["GET /client/v4/zones/{zone_id}"]})
    );
}

#[test]
fn bad_documents_exit_1_and_bad_flags_exit_2() {
    let out = specgen(&["--fragment"], b"openapi: [");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("malformed YAML"));
    let out = specgen(&["--fragment"], br#"{"openapi":"3.0.0","paths":{}}"#);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--origin"));
    let out = specgen(&[], YAML.as_bytes());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allowed-caller"));
    let out = specgen(&["--fragment", "--placement", "digest"], YAML.as_bytes());
    assert_eq!(out.status.code(), Some(2));
    let out = specgen(&["--no-such-flag"], b"");
    assert_eq!(out.status.code(), Some(2));
    let out = specgen(&["--version"], b"");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_megabyte_of_yaml_merge_keys_exits_1_naming_the_limit() {
    // 40,000 keys merged through 150,000 aliases: 6e9 entries to look at, and, merged by
    // scanning, 40,000 comparisons each.
    let mut doc =
        String::from("openapi: 3.1.0\nservers: [{url: 'https://a.example'}]\npaths: {}\nx-s: &S {");
    for i in 0..40_000 {
        doc.push_str(&format!("k{i}: 0, "));
    }
    doc.push_str("}\nx-l: &L [");
    doc.push_str(&"*S, ".repeat(150_000));
    doc.push_str("]\nx-m: {<<: *L}\n");
    assert!(doc.len() >= 1_000_000);
    let out = specgen(&["--fragment"], doc.as_bytes());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(
            "plimsoll-specgen: malformed YAML: merge keys (<<) bring in more than 1000000 entries at line 6"
        ),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}
