//! plimsoll-mcp's embedded daemon picks the strongest wall that proves itself on this
//! machine (bwrap, else process), says which and why on its first stderr line, and
//! `describe` states the same provider and tier; `--provider bwrap` where bwrap cannot run
//! is a configuration error (exit 2) naming the cause.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_plimsoll-mcp");

/// Starts plimsoll-mcp with `envs`, calls `describe`, closes stdin: the describe text, the
/// exit code and stderr.
fn describe_with(args: &[&str], envs: &[(&str, &Path)]) -> (String, Option<i32>, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("SANDBOX_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut err = child.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let mut text = String::new();
    let mut send = |v: Value| {
        // A server that refused to start has closed its stdin: nothing to answer then.
        writeln!(stdin, "{v}").and_then(|()| stdin.flush()).is_ok()
    };
    let sent = send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "wall-test", "version": "1"}}}),
    ) && send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        && send(
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "describe", "arguments": {}}}),
        );
    if sent {
        let mut line = String::new();
        while stdout.read_line(&mut line).unwrap_or(0) > 0 {
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["id"] == 2 {
                text = v["result"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                break;
            }
            line.clear();
        }
    }
    drop(stdin);
    let status = child.wait().unwrap();
    (text, status.code(), stderr.join().unwrap())
}

#[test]
fn the_embedded_daemon_takes_the_strongest_wall_and_says_which() {
    if !plimsoll_testkit::bwrap::installed() {
        return;
    }
    let folder = plimsoll_testkit::bwrap::folder();
    let sandboxd = plimsoll_testkit::bwrap::sandboxd_in(folder.path());

    let (text, code, err) = describe_with(&[], &[("SANDBOX_BWRAP_SANDBOXD", &sandboxd)]);
    assert_eq!(code, Some(0), "{err}");
    let first = err.lines().next().unwrap_or("");
    assert!(
        first.starts_with("plimsoll-mcp: provider bwrap (tier container): bwrap ")
            && first.ends_with("passed its smoke test"),
        "{err}"
    );
    assert!(
        text.starts_with("provider bwrap, isolation tier container"),
        "{text}"
    );

    let missing = folder.path().join("no-such-bwrap");
    let unavailable = [
        ("SANDBOX_BWRAP_SANDBOXD", sandboxd.as_path()),
        ("SANDBOX_BWRAP_PATH", missing.as_path()),
    ];
    let (text, code, err) = describe_with(&[], &unavailable);
    assert_eq!(code, Some(0), "{err}");
    let first = err.lines().next().unwrap_or("");
    assert!(
        first.starts_with("plimsoll-mcp: provider process (no wall): bwrap unavailable: ")
            && first.contains("SANDBOX_BWRAP_PATH")
            && first.ends_with("install bubblewrap for a container wall"),
        "{err}"
    );
    assert!(
        text.starts_with("provider process, isolation tier process"),
        "{text}"
    );

    let (_, code, err) = describe_with(&["--provider", "bwrap"], &unavailable);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--provider bwrap") && err.contains("SANDBOX_BWRAP_PATH"),
        "{err}"
    );
}
