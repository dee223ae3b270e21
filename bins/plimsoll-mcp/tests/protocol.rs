//! plimsoll-mcp at the protocol level: JSON-RPC lines written to its stdin and read from its
//! stdout, as an MCP client sends them; and the operator's mistakes (flags, tokens,
//! addresses), each a one-line error with its exit code.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_plimsoll-mcp");

struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// stderr, drained as it comes (a full pipe would block the server's logging).
    stderr: Option<std::thread::JoinHandle<String>>,
    next_id: u64,
}

impl Server {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.args(args).envs(env.iter().copied());
        Server::start_cmd(cmd)
    }

    /// Starts `cmd`, which runs plimsoll-mcp on stdio.
    fn start_cmd(mut cmd: Command) -> Server {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut err = child.stderr.take().unwrap();
        let stderr = Some(std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut s);
            s
        }));
        let mut s = Server {
            child,
            stdin,
            stdout,
            stderr,
            next_id: 0,
        };
        let init = s.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "protocol-test", "version": "1"}}),
        );
        assert_eq!(
            init["result"]["serverInfo"]["name"], "plimsoll-mcp",
            "{init}"
        );
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    fn send(&mut self, v: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "stdout closed before answer {id}"
            );
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not JSON on stdout ({e}): {line}"));
            if v["id"] == id {
                return v;
            }
        }
    }

    fn call(&mut self, tool: &str, args: Value) -> Value {
        let v = self.request("tools/call", json!({"name": tool, "arguments": args}));
        v["result"].clone()
    }

    /// Closes stdin and returns the exit status and stderr.
    fn finish(mut self) -> (std::process::ExitStatus, String) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        (status, self.stderr.take().unwrap().join().unwrap())
    }
}

fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn stdio_json_rpc_on_the_embedded_quickjs_daemon() {
    let mut s = Server::start(&["--provider", "quickjs"], &[]);
    let tools = s.request("tools/list", json!({}));
    let names: Vec<_> = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        ["run_code", "open_session", "close_session", "describe"]
    );
    assert_eq!(
        tools["result"]["tools"][0]["inputSchema"]["required"],
        json!(["language", "code"])
    );

    let r = s.call(
        "run_code",
        json!({"language": "javascript", "code": "console.log('quick' + 'js')"}),
    );
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(r["structuredContent"]["stdout"], "quickjs\n", "{r}");
    assert_eq!(r["structuredContent"]["provider"], "quickjs", "{r}");
    assert_eq!(
        r["structuredContent"]["record_sha256"]
            .as_str()
            .unwrap()
            .len(),
        64
    );

    // QuickJS runs snippets only: Python needs a project, which it refuses before running.
    let r = s.call(
        "run_code",
        json!({"language": "python", "code": "print(1)"}),
    );
    assert_eq!(r["isError"], true, "{r}");
    assert!(text(&r).starts_with("not dispatched (unsupported):"), "{r}");
    let r = s.call("open_session", json!({}));
    assert_eq!(r["isError"], true, "{r}");
    assert!(text(&r).starts_with("not dispatched ("), "{r}");

    let r = s.call("run_code", json!({"language": "javascript"}));
    assert_eq!(r["isError"], true);
    assert_eq!(
        text(&r),
        "not dispatched (request): invalid arguments for run_code: missing field `code`"
    );
    let r = s.call(
        "run_code",
        json!({"language": "javascript", "code": "1", "timeout_ms": "5s"}),
    );
    assert!(
        text(&r).contains("invalid type: string \"5s\", expected u32"),
        "{r}"
    );

    let v = s.request("tools/call", json!({"name": "nope", "arguments": {}}));
    assert_eq!(v["error"]["code"], -32602, "{v}");
    let v = s.request("resources/read", json!({"uri": "plimsoll://describe"}));
    let body: Value =
        serde_json::from_str(v["result"]["contents"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(body["sandbox"], "quickjs", "{body}");

    let (status, stderr) = s.finish();
    assert!(
        status.success(),
        "closing stdin ends the server with 0: {status} {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn through_a_daemon_with_a_caller_token_that_is_never_logged() {
    let setup = plimsoll_testkit::daemon::Setup::tester();
    // The process provider: an in-process quickjs provider would re-execute this test
    // binary as its worker.
    let daemon = setup.start(&[]).await;
    let url = format!("http://{}", daemon.rpc_addr());
    let token = setup.token(0).to_owned();
    let (url2, token2) = (url.clone(), token.clone());
    let stderr = tokio::task::spawn_blocking(move || {
        let mut s = Server::start(
            &["--daemon", &url2],
            &[("PLIMSOLL_CALLER_TOKEN", &token2), ("RUST_LOG", "trace")],
        );
        let r = s.call(
            "run_code",
            json!({"language": "javascript", "code": "console.log(2 + 2)"}),
        );
        assert_eq!(r["structuredContent"]["stdout"], "4\n", "{r}");
        let r = s.call("describe", json!({}));
        assert!(text(&r).starts_with("provider process"), "{r}");
        let (status, stderr) = s.finish();
        assert!(status.success(), "{status}: {stderr}");
        stderr
    })
    .await
    .unwrap();
    assert!(
        !stderr.contains(&token),
        "the caller token reached a log line"
    );

    // A wrong token: the daemon refuses every call, marked not dispatched.
    let stderr = tokio::task::spawn_blocking(move || {
        let mut s = Server::start(
            &["--daemon", &url],
            &[("PLIMSOLL_CALLER_TOKEN", "wrong-token")],
        );
        let r = s.call("run_code", json!({"language": "javascript", "code": "1"}));
        assert!(text(&r).starts_with("not dispatched (permission):"), "{r}");
        s.finish().1
    })
    .await
    .unwrap();
    assert!(!stderr.contains("wrong-token"), "{stderr}");
    daemon.shutdown().await;
}

fn fails(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

/// Arguments, environment, the exit code and a part of the one-line message.
type Mistake<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, i32, &'a str);

#[test]
fn operator_mistakes_are_one_line_errors() {
    let d = tempfile::tempdir().unwrap();
    let bad_token = d.path().join("token");
    std::fs::write(&bad_token, "two words\n").unwrap();
    let bad_token = bad_token.to_str().unwrap();
    let cases: Vec<Mistake> = vec![
        (
            vec!["--listen", "0.0.0.0:0"],
            vec![],
            2,
            "--listen 0.0.0.0:0 needs a bearer token: give --http-token-file FILE or set PLIMSOLL_MCP_TOKEN",
        ),
        // Loopback too: any local user reaches a loopback port.
        (
            vec!["--listen", "127.0.0.1:0"],
            vec![],
            2,
            "--listen 127.0.0.1:0 needs a bearer token: give --http-token-file FILE or set PLIMSOLL_MCP_TOKEN (or serve only this user with --listen unix:PATH)",
        ),
        (
            vec!["--listen", "localhost:8750"],
            vec![],
            2,
            "--listen localhost:8750: give HOST:PORT (for example 127.0.0.1:8750) or unix:PATH",
        ),
        (
            vec!["--listen", "unix:/nonexistent-dir/mcp.sock"],
            vec![],
            2,
            "--listen unix:/nonexistent-dir/mcp.sock: ",
        ),
        (
            vec!["--call-files", "/nonexistent/call-files"],
            vec![],
            2,
            "--call-files /nonexistent/call-files: cannot open",
        ),
        (
            vec!["--provider", "docker"],
            vec![],
            2,
            "invalid value 'docker' for '--provider <NAME>'",
        ),
        (
            vec!["--daemon", "http://127.0.0.1:1"],
            vec![],
            4,
            "--daemon http://127.0.0.1:1: ",
        ),
        (
            vec!["--daemon", "http://127.0.0.1:1", "--token-file", bad_token],
            vec![],
            2,
            "a token is one run of visible ASCII characters (the value is not shown)",
        ),
        (
            vec!["--daemon", "http://127.0.0.1:1", "--provider", "process"],
            vec![],
            2,
            "cannot be used with",
        ),
        (
            vec!["--listen", "127.0.0.1:0"],
            vec![("PLIMSOLL_MCP_TOKEN", "tab\tinside")],
            2,
            "PLIMSOLL_MCP_TOKEN: a token is one run",
        ),
        (
            vec!["--listen", "127.0.0.1:0"],
            vec![("PLIMSOLL_MCP_TOKEN", "   ")],
            2,
            "PLIMSOLL_MCP_TOKEN is empty: give the token, or leave PLIMSOLL_MCP_TOKEN out",
        ),
        (
            vec!["--listen", "127.0.0.1:0"],
            vec![("PLIMSOLL_MCP_TOKEN", "short-token")],
            2,
            "shorter than 16 characters (the value is not shown)",
        ),
        (
            vec!["--daemon", "ftp://127.0.0.1:1"],
            vec![],
            2,
            "not a daemon address: give http://HOST:PORT",
        ),
        (
            vec!["--daemon", "https://127.0.0.1:1"],
            vec![],
            2,
            "an https:// daemon needs --ca-file",
        ),
        (
            vec![
                "--daemon",
                "http://127.0.0.1:1",
                "--ca-file",
                "/nonexistent/ca.pem",
            ],
            vec![],
            2,
            "--ca-file is for an https:// daemon",
        ),
        (
            vec![
                "--daemon",
                "https://127.0.0.1:1",
                "--ca-file",
                "/nonexistent/ca.pem",
            ],
            vec![],
            2,
            "--ca-file /nonexistent/ca.pem: ",
        ),
    ];
    for (args, env, code, want) in cases {
        let (got, stderr) = fails(&args, &env);
        assert_eq!(got, code, "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(
            stderr.starts_with("plimsoll-mcp: ") && stderr.contains(want),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("two words")
                && !stderr.contains("tab\tinside")
                && !stderr.contains("short-token"),
            "{stderr}"
        );
    }
    // A client that closes stdin before it initializes: nothing to serve, exit 0.
    let (code, stderr) = fails(&["--provider", "quickjs"], &[]);
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn help_names_the_exit_codes_and_variables() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for want in [
        "--daemon",
        "--call-files",
        "--listen",
        "--http-token-file",
        "unix:PATH",
        "--allowed-origin",
        "--max-connections <N>",
        "[default: 128]",
        "--header-timeout-ms <MS>",
        "[default: 10000]",
        "--idle-timeout-ms <MS>",
        "[default: 60000]",
        "PLIMSOLL_CALLER_TOKEN",
        "PLIMSOLL_MCP_TOKEN",
        "Exit codes:",
    ] {
        assert!(help.contains(want), "--help lacks {want}:\n{help}");
    }
}

/// Started by a supervisor that left fd 7 open on a 0600 file, the embedded process
/// provider's run lists its descriptors and tries to read and write fd 7: it sees nothing,
/// and the file is unchanged.
#[test]
fn a_run_does_not_inherit_the_servers_descriptors() {
    use plimsoll_testkit::inherited::{Secret, PROBE};
    let dir = tempfile::tempdir().unwrap();
    let secret = Secret::new(dir.path());
    let mut cmd = secret.command(BIN);
    cmd.args(["--provider", "process"]);
    let mut s = Server::start_cmd(cmd);
    let r = s.call("run_code", json!({"language": "shell", "code": PROBE}));
    assert_eq!(r["isError"], false, "{r}");
    secret.assert_unreached(&format!(
        "{}\n{}",
        r["structuredContent"]["stdout"]
            .as_str()
            .unwrap_or_default(),
        r["structuredContent"]["stderr"]
            .as_str()
            .unwrap_or_default()
    ));
    let (status, _) = s.finish();
    assert!(status.success());
}
