//! plimsoll-mcp driven by an independent client, the official MCP Python SDK
//! (`mcp_sdk_client.py` beside this file), over stdio and over streamable HTTP, each time
//! on the embedded daemon (process provider) with call files.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_plimsoll-mcp");

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_sdk_client.py")
}

fn call_files() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("config")).unwrap();
    std::fs::write(
        d.path().join("config/greeting.txt"),
        "hello from the embedder\n",
    )
    .unwrap();
    d
}

fn python() -> Option<PathBuf> {
    plimsoll_testkit::python::interpreter(&["mcp"])
}

/// Runs the SDK scenario and asserts it passed, showing its output when it did not.
fn run_scenario(python: &Path, args: &[&str]) {
    let out = Command::new(python)
        .arg(script())
        .args(args)
        .output()
        .expect("start the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("all checks passed"),
        "the MCP SDK scenario failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}

#[test]
fn python_sdk_over_stdio() {
    let Some(python) = python() else { return };
    let files = call_files();
    run_scenario(
        &python,
        // The process provider named: the scenario checks the tier it states, the same on
        // every machine (unnamed, the embedded daemon takes bwrap where it passes).
        &[
            "stdio",
            BIN,
            "--provider",
            "process",
            "--call-files",
            files.path().to_str().unwrap(),
        ],
    );
}

#[test]
fn python_sdk_over_streamable_http_with_a_bearer_token() {
    let Some(python) = python() else { return };
    let files = call_files();
    let token = "mcp-bearer-7f3a9c1e5b";
    let mut child = Command::new(BIN)
        .args([
            "--provider",
            "process",
            "--listen",
            "127.0.0.1:0",
            "--call-files",
        ])
        .arg(files.path())
        .env("PLIMSOLL_MCP_TOKEN", token)
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A failed assertion below must not leave the server running (.ci/leftovers).
    let mut guard = KillOnDrop(Some(child.id()));
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let url = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "plimsoll-mcp ended: {log}"
        );
        log.push_str(&line);
        if let Some(u) = line.trim().strip_prefix("plimsoll-mcp: serving MCP at ") {
            assert!(u.ends_with(" (bearer token required)"), "{u}");
            break u.split_whitespace().next().unwrap().to_owned();
        }
    };
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    for auth in ["", "Authorization: Bearer wrong\r\n"] {
        let status = raw_post(&addr, auth);
        assert!(status.starts_with("HTTP/1.1 401"), "{auth:?}: {status}");
    }
    run_scenario(&python, &["http", &url, token]);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            guard.0 = None; // reaped: its pid is no longer ours to signal
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "plimsoll-mcp did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    log.push_str(&rest.join().unwrap());
    assert!(status.success(), "{status}: {log}");
    assert!(
        !log.contains(token),
        "the bearer token reached a log line:\n{log}"
    );
}

/// POSTs an initialize request with `auth` headers; the status line.
fn raw_post(addr: &str, auth: &str) -> String {
    use std::io::{Read, Write};
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.lines().next().unwrap_or_default().to_owned()
}

/// SIGKILLs the process it names when dropped (a test that failed before stopping it).
struct KillOnDrop(Option<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
