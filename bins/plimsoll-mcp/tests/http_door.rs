//! The HTTP door against an attacker: real `plimsoll-mcp` processes on loopback TCP or a
//! Unix socket, driven by a small HTTP/1.1 MCP client written here (raw bytes, so a test
//! can also send what no SDK would: no token, a foreign `Origin`, idle connections).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_plimsoll-mcp");
const TOKEN: &str = "door-test-token-5f1c9a7e3b";

/// Where a server listens.
#[derive(Clone, Debug)]
enum At {
    Tcp(String),
    Unix(PathBuf),
}

trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

impl At {
    fn connect(&self) -> Box<dyn Stream> {
        match self {
            At::Tcp(a) => {
                let s = std::net::TcpStream::connect(a).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                Box::new(s)
            }
            At::Unix(p) => {
                let s = std::os::unix::net::UnixStream::connect(p).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                Box::new(s)
            }
        }
    }
}

/// A running `plimsoll-mcp --listen …`; SIGTERM and reaped on drop.
struct Door {
    child: Child,
    at: At,
}

impl Door {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Door {
        let mut child = Command::new(BIN)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut log = String::new();
        let at = loop {
            let mut line = String::new();
            if err.read_line(&mut line).unwrap() == 0 {
                let _ = child.wait();
                panic!("plimsoll-mcp ended before serving: {log}");
            }
            log.push_str(&line);
            if let Some(u) = line.trim().strip_prefix("plimsoll-mcp: serving MCP at ") {
                let u = u.split_whitespace().next().unwrap();
                break match u.strip_prefix("unix:") {
                    Some(p) => At::Unix(PathBuf::from(p)),
                    None => At::Tcp(
                        u.trim_start_matches("http://")
                            .trim_end_matches("/mcp")
                            .to_owned(),
                    ),
                };
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut err, &mut std::io::sink());
        });
        Door { child, at }
    }

    fn client(&self, token: Option<&str>) -> Mcp {
        Mcp {
            at: self.at.clone(),
            token: token.map(str::to_owned),
            session: None,
            next_id: 0,
        }
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC message in the body (plain JSON, or the last SSE `data:` event).
    fn message(&self) -> Value {
        if let Ok(v) = serde_json::from_str(&self.body) {
            return v;
        }
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .next_back()
            .unwrap_or_else(|| panic!("no JSON-RPC message in {self:?}"))
    }
}

/// Sends one request on a fresh connection (`Connection: close`) and reads the answer.
fn exchange(at: &At, extra_headers: &[(&str, &str)], body: &str) -> Answer {
    let mut s = at.connect();
    let mut head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra_headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    parse(&raw)
}

fn parse(raw: &[u8]) -> Answer {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut rest = &raw[split + 4..];
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let body = if chunked {
        let mut out = Vec::new();
        while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
            let size =
                usize::from_str_radix(String::from_utf8_lossy(&rest[..end]).trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[end + 2..end + 2 + size]);
            rest = &rest[end + 2 + size + 2..];
        }
        out
    } else {
        rest.to_vec()
    };
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"door-test","version":"1"}}}"#;

/// An MCP client over HTTP: its own MCP session, one connection per request.
struct Mcp {
    at: At,
    token: Option<String>,
    session: Option<String>,
    next_id: u64,
}

impl Mcp {
    fn post(&self, body: &str, extra: &[(&str, &str)]) -> Answer {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = extra.to_vec();
        if let Some(a) = &auth {
            headers.push(("Authorization", a));
        }
        if let Some(s) = &self.session {
            headers.push(("Mcp-Session-Id", s));
            headers.push(("Mcp-Protocol-Version", "2025-06-18"));
        }
        exchange(&self.at, &headers, body)
    }

    fn initialize(&mut self) {
        let a = self.post(INITIALIZE, &[]);
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(a.message()["result"]["serverInfo"]["name"], "plimsoll-mcp");
        self.session = a.header("mcp-session-id").map(str::to_owned);
        let n = self.post(
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            &[],
        );
        assert_eq!(n.status, 202, "{n:?}");
    }

    /// Calls a tool; the result object.
    fn call(&mut self, tool: &str, args: Value) -> Value {
        self.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
            "params": {"name": tool, "arguments": args}});
        let a = self.post(&body.to_string(), &[]);
        assert_eq!(a.status, 200, "{a:?}");
        a.message()["result"].clone()
    }
}

fn text(result: &Value) -> String {
    result["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn tcp_needs_the_bearer_token() {
    let door = Door::start(
        &["--listen", "127.0.0.1:0", "--provider", "quickjs"],
        &[("PLIMSOLL_MCP_TOKEN", TOKEN)],
    );
    for token in [None, Some("wrong-token-0000000000")] {
        let a = door.client(token).post(INITIALIZE, &[]);
        assert_eq!(a.status, 401, "{token:?}: {a:?}");
        assert_eq!(a.header("www-authenticate"), Some("Bearer"));
    }
    let mut c = door.client(Some(TOKEN));
    c.initialize();
    let r = c.call(
        "run_code",
        json!({"language": "javascript", "code": "console.log(6 * 7)"}),
    );
    assert_eq!(r["structuredContent"]["stdout"], "42\n", "{r}");
}

#[test]
fn listen_without_a_token_exits_2_even_on_loopback() {
    let mut child = Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--provider", "quickjs"])
        .env_remove("PLIMSOLL_MCP_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a server that starts anyway is killed and the test fails.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = status.unwrap_or_else(|| panic!("it served without a token: {stderr}"));
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("needs a bearer token") && stderr.contains("PLIMSOLL_MCP_TOKEN"),
        "{stderr}"
    );
}

#[test]
fn a_foreign_origin_is_refused_and_an_allowed_one_served() {
    let door = Door::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--provider",
            "quickjs",
            "--allowed-origin",
            "https://app.example:443",
        ],
        &[("PLIMSOLL_MCP_TOKEN", TOKEN)],
    );
    let c = door.client(Some(TOKEN));
    for origin in [
        "https://evil.example",
        "http://app.example",
        "https://app.example:8443",
        "null",
    ] {
        let a = c.post(INITIALIZE, &[("Origin", origin)]);
        assert_eq!(a.status, 403, "{origin}: {a:?}");
    }
    for origin in ["https://app.example", "https://app.example:443"] {
        let a = c.post(INITIALIZE, &[("Origin", origin)]);
        assert_eq!(a.status, 200, "{origin}: {a:?}");
    }
    // Without Origin (a non-browser client): served.
    assert_eq!(c.post(INITIALIZE, &[]).status, 200);

    // With no --allowed-origin, every Origin is refused.
    let door = Door::start(
        &["--listen", "127.0.0.1:0", "--provider", "quickjs"],
        &[("PLIMSOLL_MCP_TOKEN", TOKEN)],
    );
    let c = door.client(Some(TOKEN));
    let a = c.post(INITIALIZE, &[("Origin", "https://evil.example")]);
    assert_eq!(a.status, 403, "{a:?}");
    assert_eq!(c.post(INITIALIZE, &[]).status, 200);
}

/// A directory that user 65534 may enter and list, so only the socket's own mode decides.
fn open_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Whether user 65534 can connect to the socket at `path` (through `setpriv`).
fn nobody_connects(path: &Path) -> bool {
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "--",
            // The system's, which user 65534 may run (not a per-user install).
            "/usr/bin/python3",
            "-c",
            "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    sys.exit(3)\n",
        ])
        .arg(path)
        .output()
        .unwrap();
    match out.status.code() {
        Some(0) => true,
        Some(3) => false,
        _ => panic!(
            "the probe as uid 65534 failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[test]
fn a_unix_socket_is_its_owners_only() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if !nix::unistd::Uid::effective().is_root() {
        println!("SKIPPED: needs root to try the socket as another user");
        return;
    }
    let dir = open_dir();
    let path = dir.path().join("mcp.sock");
    // A stale socket (nobody answers on it) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let listen = format!("unix:{}", path.display());
    let door = Door::start(&["--listen", &listen, "--provider", "quickjs"], &[]);
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{meta:?}");
    assert!(
        !nobody_connects(&path),
        "user 65534 connected to the socket"
    );
    // Its owner needs no token.
    let mut c = door.client(None);
    c.initialize();
    let r = c.call(
        "run_code",
        json!({"language": "javascript", "code": "console.log('unix')"}),
    );
    assert_eq!(r["structuredContent"]["stdout"], "unix\n", "{r}");
    // A second server on the live socket is refused; nothing is replaced.
    let (code, stderr) = fails(&["--listen", &listen, "--provider", "quickjs"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("another server is listening"), "{stderr}");
    drop(door);
    assert!(!path.exists(), "the socket is removed at shutdown");

    // A path that is not a socket is never replaced.
    let file = dir.path().join("file");
    std::fs::write(&file, "keep me").unwrap();
    let (code, stderr) = fails(&[
        "--listen",
        &format!("unix:{}", file.display()),
        "--provider",
        "quickjs",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("exists and is not a socket"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

fn fails(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

/// A plimsolld (process provider, sessions on) and a `plimsoll-mcp --daemon` door to it.
async fn door_to_a_daemon(
    sessions: &str,
) -> (
    plimsoll_testkit::daemon::Setup,
    plimsoll_daemon::server::RunningDaemon,
    Door,
) {
    let setup = plimsoll_testkit::daemon::Setup::tester();
    // plimsoll-mcp is one caller of the daemon: it may hold every session.
    let daemon = setup
        .start(&[
            ("SANDBOX_MAX_SESSIONS", sessions),
            ("SANDBOX_MAX_SESSIONS_PER_CALLER", sessions),
        ])
        .await;
    let url = format!("http://{}", daemon.rpc_addr());
    let token = setup.token(0).to_owned();
    let door = tokio::task::spawn_blocking(move || {
        Door::start(
            &["--listen", "127.0.0.1:0", "--daemon", &url],
            &[
                ("PLIMSOLL_MCP_TOKEN", TOKEN),
                ("PLIMSOLL_CALLER_TOKEN", &token),
            ],
        )
    })
    .await
    .unwrap();
    (setup, daemon, door)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sessions_queue_is_bounded_and_its_wait_counts_in_the_deadline() {
    let (_setup, daemon, door) = door_to_a_daemon("4").await;
    let at = door.at.clone();
    tokio::task::spawn_blocking(move || {
        let client = || {
            let mut c = Mcp {
                at: at.clone(),
                token: Some(TOKEN.into()),
                session: None,
                next_id: 0,
            };
            c.initialize();
            c
        };
        let mut c = client();
        let opened = c.call("open_session", json!({}));
        let handle = opened["structuredContent"]["session"]
            .as_str()
            .unwrap_or_else(|| panic!("{opened}"))
            .to_owned();
        // A call that holds the session for six seconds.
        let h = handle.clone();
        let mut holder = client();
        let long = std::thread::spawn(move || {
            holder.call(
                "run_code",
                json!({"language": "shell", "code": "sleep 6; echo held", "session": h}),
            )
        });
        std::thread::sleep(Duration::from_millis(700));

        // Its wait counts in its deadline: refused when the deadline passes, never run.
        let r = client().call(
            "run_code",
            json!({"language": "shell", "code": "echo ran > ran.txt", "timeout_ms": 1000, "session": handle}),
        );
        assert_eq!(r["isError"], true, "{r}");
        assert!(
            text(&r).starts_with("not dispatched (capacity): ") && text(&r).contains("deadline"),
            "{r}"
        );
        assert!(
            !long.is_finished(),
            "the refusal came at the deadline, while the session was still busy"
        );

        // Six more at once: four wait their turn, two are refused.
        let waiting: Vec<_> = (0..6)
            .map(|i| {
                let mut c = client();
                let h = handle.clone();
                std::thread::spawn(move || {
                    c.call(
                        "run_code",
                        json!({"language": "shell", "code": format!("echo {i}"), "session": h}),
                    )
                })
            })
            .collect();
        let answers: Vec<Value> = waiting.into_iter().map(|t| t.join().unwrap()).collect();
        let refused: Vec<&Value> = answers
            .iter()
            .filter(|r| text(r).starts_with("not dispatched (capacity): "))
            .collect();
        let ran = answers
            .iter()
            .filter(|r| r["isError"] == false && r["structuredContent"]["exit_code"] == 0)
            .count();
        assert_eq!((ran, refused.len()), (4, 2), "{answers:#?}");
        assert!(text(refused[0]).contains("4 calls waiting"), "{refused:?}");
        let held = long.join().unwrap();
        assert_eq!(held["structuredContent"]["stdout"], "held\n", "{held}");
        // The refused call never ran.
        let r = c.call(
            "run_code",
            json!({"language": "shell", "code": "test -e ran.txt && echo ran || echo never", "session": handle}),
        );
        assert_eq!(r["structuredContent"]["stdout"], "never\n", "{r}");
        drop(door);
    })
    .await
    .unwrap();
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn racing_open_sessions_never_exceed_the_cap() {
    // The daemon allows more than plimsoll-mcp's 64, so only plimsoll-mcp's cap holds.
    let (_setup, daemon, door) = door_to_a_daemon("200").await;
    let at = door.at.clone();
    tokio::task::spawn_blocking(move || {
        let tries = 96;
        let clients: Vec<Mcp> = (0..tries)
            .map(|_| {
                let mut c = Mcp {
                    at: at.clone(),
                    token: Some(TOKEN.into()),
                    session: None,
                    next_id: 0,
                };
                c.initialize();
                c
            })
            .collect();
        let start = std::sync::Arc::new(std::sync::Barrier::new(tries));
        let racers: Vec<_> = clients
            .into_iter()
            .map(|mut c| {
                let start = start.clone();
                std::thread::spawn(move || {
                    start.wait();
                    c.call("open_session", json!({}))
                })
            })
            .collect();
        let answers: Vec<Value> = racers.into_iter().map(|t| t.join().unwrap()).collect();
        let opened = answers
            .iter()
            .filter(|r| r["structuredContent"]["session"].is_string())
            .count();
        let refused = answers
            .iter()
            .filter(|r| {
                text(r).starts_with("not dispatched (capacity): this server already holds 64")
            })
            .count();
        assert_eq!(
            (opened, refused),
            (64, tries - 64),
            "{:#?}",
            answers
                .iter()
                .filter(|r| r["isError"] == true)
                .take(3)
                .collect::<Vec<_>>()
        );
        drop(door);
    })
    .await
    .unwrap();
    daemon.shutdown().await;
}

/// Reads from `s` until it closes; `Some(elapsed)` when it closed within `within`.
fn closed_within(s: &mut std::net::TcpStream, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(t0.elapsed()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Some(t0.elapsed()),
            Err(_) => return None,
        }
    }
}

#[test]
fn idle_connections_over_the_cap_do_not_lock_out_a_client_and_are_closed() {
    let door = Door::start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--provider",
            "quickjs",
            "--max-connections",
            "4",
            "--header-timeout-ms",
            "3000",
            "--idle-timeout-ms",
            "1500",
        ],
        &[("PLIMSOLL_MCP_TOKEN", TOKEN)],
    );
    let At::Tcp(addr) = door.at.clone() else {
        unreachable!()
    };
    // Four silent connections (the header timeout's) and four that sent a request's
    // headers and part of its body, then stalled (the idle timeout's): twice the cap.
    let mut idle: Vec<std::net::TcpStream> = (0..8)
        .map(|i| {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            if i % 2 == 1 {
                write!(
                    s,
                    "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{\"jsonrpc\""
                )
                .unwrap();
            }
            s
        })
        .collect();
    // One that trickles a header byte every 400 ms: never idle, never done.
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    let trickle = {
        let mut s = slow.try_clone().unwrap();
        std::thread::spawn(move || {
            for b in
                b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            {
                if s.write_all(&[*b]).is_err() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(400));
            }
            false
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    // A valid client behind them is served (after the idle ones are closed).
    let mut c = door.client(Some(TOKEN));
    c.initialize();
    let r = c.call(
        "run_code",
        json!({"language": "javascript", "code": "console.log('in')"}),
    );
    assert_eq!(r["structuredContent"]["stdout"], "in\n", "{r}");
    for (i, s) in idle.iter_mut().enumerate() {
        assert!(
            closed_within(s, Duration::from_secs(15)).is_some(),
            "idle connection {i} was not closed ({})",
            if i % 2 == 1 {
                "a stalled body"
            } else {
                "silent"
            }
        );
    }
    assert!(
        closed_within(&mut slow, Duration::from_secs(15)).is_some(),
        "the trickling connection was not closed by the header timeout"
    );
    assert!(trickle.join().unwrap(), "the server closed the trickle");
}
