//! The plimsoll-sandboxd binary: refusals at startup, serving on a Unix socket and on TCP,
//! and stopping on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use plimsoll_core::Reason;
use plimsoll_sandboxd::{SandboxdClient, Token};

const TOKEN: &str = "cli-token-0123456789abcdef";

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_plimsoll-sandboxd"))
}

/// A started sandboxd that is killed when the test ends, even by a failed assertion.
struct Started(std::process::Child);

impl std::ops::Deref for Started {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Started {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn refuses_to_start_without_a_token() {
    let out = bin().output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--token-file"), "{err}");
    assert!(err.contains("--insecure-no-token"), "{err}");
}

#[test]
fn an_unusable_token_file_is_a_usage_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("token");
    std::fs::write(&f, "\n").unwrap();
    let out = bin().arg("--token-file").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--token-file") && err.contains(&f.display().to_string()),
        "{err}"
    );
}

#[test]
fn a_named_supervisor_that_is_not_the_parent_stops_startup() {
    // PID 1 is never this test's pid, so sandboxd's parent is not the named supervisor: it must
    // refuse before serving anything (it would otherwise outlive a dead terminator).
    let out = bin()
        .arg("--insecure-no-token")
        .arg("--grpc-port=0")
        .env("PLIMSOLL_SANDBOXD_PARENT_PID", "1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("supervisor (pid 1) is gone"), "{err}");
    assert!(!err.contains("listening on"), "{err}");

    let out = bin()
        .arg("--insecure-no-token")
        .env("PLIMSOLL_SANDBOXD_PARENT_PID", "not-a-pid")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a process id"));
}

#[test]
fn run_as_refuses_user_zero_and_a_token_the_code_could_read() {
    use std::os::unix::fs::PermissionsExt;
    for bad in ["0:65532", "65532:0", "nobody", "65532"] {
        let out = bin()
            .args(["--insecure-no-token", "--run-as", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--run-as"),
            "{bad}"
        );
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped the token checks: --run-as needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).unwrap();
    for (mode, owner, why) in [
        (0o644, None, "lets every user read it"),
        (0o440, Some((0, 65532)), "lets group 65532"),
        (0o400, Some((65532, 0)), "owned by the run's user"),
    ] {
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(mode)).unwrap();
        let (u, g) = owner.unwrap_or((0, 0));
        std::os::unix::fs::chown(&token, Some(u), Some(g)).unwrap();
        let out = bin()
            .arg("--token-file")
            .arg(&token)
            .args(["--run-as=65532:65532", "--grpc-port=0"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{mode:o}: {err}");
        assert!(
            err.contains("--token-file") && err.contains(why),
            "{mode:o}: {err}"
        );
        assert!(!err.contains(TOKEN), "{err}");
    }
}

#[test]
fn conflicting_flags_are_usage_errors() {
    for args in [
        &["--unix-socket", "/tmp/x.sock", "--grpc-port", "1"][..],
        &["--insecure-no-token", "--token-file", "/t"][..],
        &["--grpc-port", "seventy"][..],
        &["--insecure-no-token", "--languages", "javascript,cobol"][..],
    ] {
        let out = bin().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

/// sandboxd's stderr, line by line (echoed to the test's own stderr as they come).
fn log_lines(child: &mut Started) -> std::sync::mpsc::Receiver<String> {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[sandboxd] {line}");
            let _ = tx.send(line);
        }
    });
    rx
}

/// sandboxd on the Unix socket `sock`, with the token in `dir/token` and its runs in
/// `dir/runs`, `args` added, its stderr piped.
fn serve_on(dir: &std::path::Path, sock: &std::path::Path, args: &[&str]) -> Started {
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    bin()
        .arg("--unix-socket")
        .arg(sock)
        .arg("--token-file")
        .arg(&token_file)
        .arg("--root-dir")
        .arg(dir.join("runs"))
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .map(Started)
        .unwrap()
}

#[test]
fn serves_on_a_unix_socket_with_the_token_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("sandboxd.sock");
    let mut child = serve_on(dir.path(), &sock, &["--log-format=json"]);
    let rx = log_lines(&mut child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.contains("listening on unix:"))
    {
        let l = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("sandboxd never said it was listening");
        lines.push(l);
    }
    assert!(
        lines.iter().all(|l| l.starts_with('{')),
        "not JSON lines: {lines:?}"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = SandboxdClient::connect_unix(&sock, &Token::new(TOKEN).unwrap())
            .await
            .unwrap();
        let h = c.health().await.unwrap();
        assert!(h.languages.iter().any(|l| l == "shell"), "{h:?}");
        let wrong = SandboxdClient::connect_unix(&sock, &Token::new(format!("{TOKEN}x")).unwrap())
            .await
            .unwrap();
        assert_eq!(
            wrong.health().await.unwrap_err().not_dispatched(),
            Some(Reason::Permission)
        );
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "sandboxd did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let all: Vec<String> = rx.try_iter().collect();
    assert!(
        all.iter().chain(lines.iter()).all(|l| !l.contains(TOKEN)),
        "the token appeared in the log"
    );
}

#[test]
fn given_languages_are_reported_without_a_proof() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("sd.sock");
    let mut child = serve_on(
        dir.path(),
        &sock,
        &["--languages", "shell,python", "--log-format=json"],
    );
    let rx = log_lines(&mut child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lines: Vec<String> = Vec::new();
    while !lines.iter().any(|l| l.contains("listening on unix:")) {
        let l = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("sandboxd never said it was listening");
        lines.push(l);
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("languages given by the caller")),
        "{lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("languages proven")),
        "{lines:?}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = SandboxdClient::connect_unix(&sock, &Token::new(TOKEN).unwrap())
            .await
            .unwrap();
        assert_eq!(c.health().await.unwrap().languages, ["shell", "python"]);
    });
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn session_mode_is_documented_and_reported_by_health() {
    let help = bin().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--session"), "{help}");
    assert!(help.contains("kept interpreters of cells"), "{help}");

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("sd.sock");
    let _child = serve_on(dir.path(), &sock, &["--languages", "shell", "--session"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        let c = loop {
            match SandboxdClient::connect_unix(&sock, &Token::new(TOKEN).unwrap()).await {
                Ok(c) => break c,
                Err(e) if Instant::now() > deadline => panic!("{e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        assert!(c.health().await.unwrap().session);
    });
    // The session's directory was opened at startup.
    let runs: Vec<_> = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(runs.iter().any(|n| n.starts_with("session-")), "{runs:?}");
}

/// sandboxd started with `--terminator-socket sock` and nothing else: it must exit 2; its
/// stderr.
fn terminator_socket_refused(sock: &std::path::Path) -> String {
    let out = bin()
        .arg("--terminator-socket")
        .arg(sock)
        .args(["--languages", "none"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn the_terminator_socket_takes_calls_without_a_token_and_tcp_refuses_every_call() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // Not private: refused before anything listens, naming the flag.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = terminator_socket_refused(&open.join("s.sock"));
    assert!(
        err.contains("--terminator-socket") && err.contains("0700"),
        "{err}"
    );

    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sock = private.join("s.sock");
    // Without a user of its own for the code, the socket's one user would be the code's.
    let err = terminator_socket_refused(&sock);
    assert!(
        err.contains("--terminator-socket") && err.contains("--run-as"),
        "{err}"
    );
    if !nix::unistd::geteuid().is_root() {
        println!("SKIPPED: serving on the terminator socket needs --run-as, which needs root");
        return;
    }
    let mut child = bin()
        .args([
            "--listen-host=127.0.0.1",
            "--grpc-port=0",
            "--languages",
            "shell",
            "--run-as",
            "61999:61999",
        ])
        .arg("--terminator-socket")
        .arg(&sock)
        .arg("--root-dir")
        .arg(dir.path().join("runs"))
        .arg("--log-format=text")
        .stderr(Stdio::piped())
        .spawn()
        .map(Started)
        .unwrap();
    let rx = log_lines(&mut child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let tcp: std::net::SocketAddr = loop {
        let l = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("sandboxd never said it was listening on TCP");
        if let Some(rest) = l.split("listening on 127.0.0.1:").nth(1) {
            let port: String = rest.chars().take_while(char::is_ascii_digit).collect();
            break format!("127.0.0.1:{port}").parse().unwrap();
        }
    };
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket is for sandboxd's own user only");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Through the socket: no token is checked (any token, or none, gets through).
        let any = Token::new("not-a-token-of-this-sandboxd").unwrap();
        let c = SandboxdClient::connect_unix(&sock, &any).await.unwrap();
        let h = c.health().await.unwrap();
        assert!(h.languages.iter().any(|l| l == "shell"), "{h:?}");
        // On TCP, where the code in the pod could connect: every call is refused.
        let t = SandboxdClient::connect_plain(tcp, &any).await.unwrap();
        assert_eq!(
            t.health().await.unwrap_err().not_dispatched(),
            Some(Reason::Permission)
        );
    });
}
