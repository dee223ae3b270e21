//! The real `plimsolld` binary as a child process: started with a clean environment (the
//! process provider unless the test names another), its JSON log lines read on a thread of
//! their own, its RPC address taken from the `serving` line, killed on drop if a test fails
//! with it alive. The binary's path comes from the test (`env!("CARGO_BIN_EXE_plimsolld")`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, OnceLock};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The `plimsolld` binary for tests outside its package (which cannot name it with
/// `CARGO_BIN_EXE_plimsolld`): built like [`crate::fake_cluster::sandboxd_binaries`], for
/// the same profile and target directory (a no-op when it is fresh).
pub fn binary() -> String {
    static BIN: OnceLock<Result<String, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        crate::fake_cluster::built(&["plimsolld"], &["plimsolld"])
            .map(|d| d.join("plimsolld").display().to_string())
    })
    .clone()
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A `plimsolld` process with its stderr lines (JSON log lines, or the plain line of a
/// configuration error) read on a thread of their own.
#[derive(Debug)]
pub struct Plimsolld {
    /// The process.
    pub child: Child,
    lines: mpsc::Receiver<serde_json::Value>,
    /// The log lines read so far.
    pub seen: Vec<serde_json::Value>,
}

impl Plimsolld {
    /// Starts `bin` with its state in `dir/state` and `vars` added to its environment.
    pub fn spawn(bin: &str, dir: &Path, vars: &[(&str, &str)]) -> Plimsolld {
        Plimsolld::spawn_as(bin, dir, vars, &[])
    }

    /// Runs it through `prefix` (for example `setpriv --reuid=…`), which must exec it.
    pub fn spawn_as(bin: &str, dir: &Path, vars: &[(&str, &str)], prefix: &[&str]) -> Plimsolld {
        let mut cmd = match prefix {
            [] => Command::new(bin),
            [first, rest @ ..] => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
        };
        cmd.args(["--log-format", "json"])
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("RUST_LOG", "info")
            .env("PLIMSOLL_ADDR", "127.0.0.1:0")
            .env("PLIMSOLL_METRICS_ADDR", "off")
            .env("PLIMSOLL_STATE_DIR", dir.join("state"))
            .env("SANDBOX_PROVIDER", "process");
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { return };
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|_| serde_json::json!({ "message": line }));
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        Plimsolld {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The RPC address once the daemon logs `serving`, or `None` if it closed its stderr
    /// (exited) first.
    pub fn serving(&mut self) -> Option<String> {
        while let Ok(v) = self.lines.recv() {
            self.seen.push(v.clone());
            if v["message"] == "serving" {
                return Some(format!("http://{}", v["addr"].as_str().unwrap()));
            }
        }
        None
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next log line whose message is `message` (or one already read), or `None` once
    /// the process closed its stderr (it exited) without one.
    pub fn wait_message(&mut self, message: &str) -> Option<serde_json::Value> {
        if let Some(v) = self.seen.iter().find(|v| v["message"] == message) {
            return Some(v.clone());
        }
        while let Ok(v) = self.lines.recv() {
            self.seen.push(v.clone());
            if v["message"] == message {
                return Some(v);
            }
        }
        None
    }

    /// The next log line not read before whose message is `message`, waiting at most
    /// `within`; `None` when none comes in time or the process closed its stderr.
    pub fn next_message_within(
        &mut self,
        message: &str,
        within: std::time::Duration,
    ) -> Option<serde_json::Value> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let v = self.lines.recv_timeout(left).ok()?;
            self.seen.push(v.clone());
            if v["message"] == message {
                return Some(v);
            }
        }
    }

    /// Reads the lines logged so far without waiting; whether one says `message`.
    pub fn has_logged(&mut self, message: &str) -> bool {
        while let Ok(v) = self.lines.try_recv() {
            self.seen.push(v);
        }
        self.seen.iter().any(|v| v["message"] == message)
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
    }

    /// Waits for the process to exit, then reads the rest of its stderr.
    pub fn wait(&mut self) -> ExitStatus {
        let status = self.child.wait().unwrap();
        while let Ok(v) = self.lines.recv() {
            self.seen.push(v);
        }
        status
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub fn stop(&mut self) -> ExitStatus {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
        self.wait()
    }

    /// The log lines read so far, one JSON object a line.
    pub fn log(&self) -> String {
        self.seen
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Plimsolld {
    fn drop(&mut self) {
        // Only a failed test gets here with the process alive.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
