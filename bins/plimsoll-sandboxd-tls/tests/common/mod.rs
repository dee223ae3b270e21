//! Test harness: certificates from the workspace's test CA (`plimsoll_testkit::ca`), Secret
//! directories laid out the kubelet's way, and real terminator + sandboxd processes whose
//! logs the tests read.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use plimsoll_testkit::ca::{Ca, Leaf};
pub use plimsoll_testkit::net::free_port;

pub const SERVER_NAME: &str = "sandboxd.plimsoll.invalid";
pub const TOKEN: &str = "test-token-0123456789abcdef";

/// Generous bound for things that happen "soon" (rotation polls, process start); tests
/// never assert on how fast they happen, only that they do.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Writes the pair the way the kubelet updates a Secret volume: files in a fresh
/// `..<timestamp>` directory, a `..data` symlink swapped atomically by rename, and
/// `tls.crt`/`tls.key` symlinks through `..data`.
pub fn kubelet_write(dir: &Path, cert_pem: &str, key_pem: &str) {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ts = format!("..2026_01_01_00_00_{n:02}.{}", std::process::id());
    let tsdir = dir.join(&ts);
    std::fs::create_dir_all(&tsdir).unwrap();
    std::fs::write(tsdir.join("tls.crt"), cert_pem).unwrap();
    std::fs::write(tsdir.join("tls.key"), key_pem).unwrap();
    let old = std::fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&ts, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        let link = dir.join(f);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{f}"), &link).unwrap();
        }
    }
    if let Some(old) = old {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
}

/// The sandboxd binary, built once per test run in the same profile as this test.
pub fn sandboxd_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let me = PathBuf::from(env!("CARGO_BIN_EXE_plimsoll-sandboxd-tls"));
        let dir = me.parent().unwrap().to_owned();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "plimsoll-sandboxd-bin"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("cargo runs");
        assert!(st.success(), "building plimsoll-sandboxd failed");
        let bin = dir.join("plimsoll-sandboxd");
        assert!(bin.exists(), "{} missing", bin.display());
        bin
    })
    .clone()
}

pub fn terminator_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_plimsoll-sandboxd-tls"))
}

/// A running process whose stderr is collected line by line.
pub struct Proc {
    pub child: Child,
    log: Arc<Mutex<Vec<String>>>,
    pub name: &'static str,
}

impl Proc {
    pub fn spawn(name: &'static str, mut cmd: Command) -> Proc {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let err = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                eprintln!("[{name}] {line}");
                sink.lock().unwrap().push(line);
            }
        });
        Proc { child, log, name }
    }

    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    pub fn count(&self, needle: &str) -> usize {
        self.log().iter().filter(|l| l.contains(needle)).count()
    }

    /// Waits until a log line contains `needle`; returns it.
    pub fn wait_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(l) = self.log().into_iter().find(|l| l.contains(needle)) {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "{}: no log line with {needle:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                // Let the reader thread catch up with the last lines.
                std::thread::sleep(Duration::from_millis(100));
                return st;
            }
            assert!(Instant::now() < deadline, "{} did not exit", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if self.child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A pod: a terminator (with its sandboxd) serving one certificate directory.
pub struct Pod {
    pub proc: Proc,
    pub addr: SocketAddr,
    /// sandboxd's own TCP address behind the terminator (loopback).
    pub upstream: SocketAddr,
    pub cert_dir: PathBuf,
    pub work: tempfile::TempDir,
}

/// Options for [`Pod::start_with`].
#[derive(Default)]
pub struct PodOpts {
    pub env: Vec<(&'static str, String)>,
    /// More sandboxd flags.
    pub args: Vec<String>,
}

impl Pod {
    pub fn start(leaf: &Leaf) -> Pod {
        Pod::start_with(leaf, PodOpts::default())
    }

    pub fn start_with(leaf: &Leaf, opts: PodOpts) -> Pod {
        Pod::start_through(leaf, opts, &[])
    }

    /// Started through `prefix`, a command that execs the terminator (its path appended),
    /// such as `plimsoll_testkit::inherited::Secret::prefix`.
    pub fn start_through(leaf: &Leaf, opts: PodOpts, prefix: &[String]) -> Pod {
        let work = tempfile::tempdir().unwrap();
        let cert_dir = work.path().join("sandboxd-tls");
        std::fs::create_dir_all(&cert_dir).unwrap();
        kubelet_write(&cert_dir, &leaf.cert_pem, &leaf.key_pem);
        let token_file = work.path().join("token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        let root = work.path().join("runs");
        let upstream: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let mut cmd = match prefix.split_first() {
            None => Command::new(terminator_bin()),
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(terminator_bin());
                c
            }
        };
        cmd.args(&opts.args);
        cmd.args([
            "--listen-host=127.0.0.1",
            "--grpc-port=9091",
            "--log-format=text",
        ])
        .arg(format!("--root-dir={}", root.display()))
        .arg(format!("--token-file={}", token_file.display()))
        .env("RUST_LOG", "info")
        .env("PLIMSOLL_SANDBOXD_BIN", sandboxd_bin())
        .env("PLIMSOLL_SANDBOXD_TLS_DIR", &cert_dir)
        .env("PLIMSOLL_SANDBOXD_TLS_LISTEN", "127.0.0.1:0")
        .env("PLIMSOLL_SANDBOXD_TLS_UPSTREAM", upstream.to_string())
        .env("PLIMSOLL_SANDBOXD_TLS_RELOAD_INTERVAL_MS", "100");
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        let proc = Proc::spawn("pod", cmd);
        // sandboxd logs its own "listening on" line into the same stream.
        let line = proc.wait_line("forwarding TLS 1.3");
        let addr = parse_addr_after(&line, "listening on ");
        Pod {
            proc,
            addr,
            upstream,
            cert_dir,
            work,
        }
    }

    /// How many calls reached sandboxd's token check.
    pub fn sandboxd_calls(&self) -> usize {
        self.proc.count("sandboxd call received")
    }

    /// Waits until sandboxd has logged `n` calls (its log is read by another thread, so a
    /// line may trail the answer), then checks there are exactly `n`.
    pub fn expect_sandboxd_calls(&self, n: usize) {
        let deadline = Instant::now() + PATIENCE;
        while self.sandboxd_calls() < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(self.sandboxd_calls(), n, "{:?}", self.proc.log());
    }

    pub fn sandboxd_pid(&self) -> i32 {
        let line = self.proc.wait_line("started sandboxd (pid ");
        let rest = &line[line.find("started sandboxd (pid ").unwrap() + 22..];
        rest[..rest.find(')').unwrap()].parse().unwrap()
    }
}

pub fn parse_addr_after(line: &str, marker: &str) -> SocketAddr {
    let rest = &line[line.find(marker).unwrap() + marker.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
        .unwrap_or(rest.len());
    rest[..end].parse().unwrap()
}

/// Writes a CA file holding `cas` into `dir`.
pub fn ca_file(dir: &Path, cas: &[&Ca]) -> PathBuf {
    let p = dir.join(format!("ca-{}.pem", cas.len()));
    let text: String = cas.iter().map(|c| c.pem()).collect();
    std::fs::write(&p, text).unwrap();
    p
}

pub fn token() -> plimsoll_sandboxd::Token {
    plimsoll_sandboxd::Token::new(TOKEN).unwrap()
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
