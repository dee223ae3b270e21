//! The five programs of `what-a-sandbox-is.md`, run for real through
//! `plimsoll run --provider process` (tier `process`), and the page blocks made from them.
//!
//! The programs are JavaScript for node (the `process` provider's snippet language) and are
//! written so that what they print does not depend on the machine: variable *names*, not
//! values; "`/` holds etc, proc, tmp and usr", not the whole listing; no ports, paths or
//! process IDs. The script fills two placeholders before each run and the page shows them
//! as they are: `__PORT__`, a TCP listener the script opens on the host's loopback, and
//! `__OUTSIDE__`, a folder outside the run's working directory (mode 1777) that the script
//! looks into after the run. What the script finds there is printed after the program's
//! own output, marked as seen from outside. A process that outlived its run is killed by
//! the script once it has been seen, and nothing else is ever started: no fork bombs, no
//! memory hogs.

use std::io::Write as _;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::{io_err, LearnError};

/// One program of the page.
#[derive(Debug, Clone, Copy)]
pub struct Program {
    /// Its block names are `NAME-code` and `NAME-output`.
    pub name: &'static str,
    /// The code, with `__PORT__` and `__OUTSIDE__` where the script fills them in.
    pub code: &'static str,
}

/// The five programs, in page order.
pub const PROGRAMS: [Program; 5] = [
    Program {
        name: "environment",
        code: r#"const names = Object.keys(process.env).sort();
console.log("variables I was given: " + names.join(", "));
console.log("PATH=" + process.env.PATH);
console.log("HOME is my working directory: " + (process.env.HOME === process.cwd()));"#,
    },
    Program {
        name: "root",
        code: r#"const fs = require("fs");
const top = fs.readdirSync("/");
const seen = ["etc", "proc", "tmp", "usr"].filter((n) => top.includes(n));
console.log("I can list /: it holds " + seen.join(", ") + ", among others");
const first = fs.readFileSync("/etc/passwd", "utf8").split("\n")[0].split(":")[0];
console.log("I can read /etc/passwd: its first account is " + first);"#,
    },
    Program {
        name: "network",
        code: r#"const net = require("net");
const socket = net.connect(__PORT__, "127.0.0.1");
socket.on("data", (d) => {
  console.log("a service on the host's loopback answered: " + d.toString().trim());
  socket.end();
});
socket.on("error", (e) => console.log("could not connect: " + e.code));"#,
    },
    Program {
        name: "outlive",
        code: r#"const { spawn } = require("child_process");
const fs = require("fs");
// A new session, the root directory, an empty environment: nothing ties it to this run.
const child = spawn("/bin/sh", ["-c", "echo $$ > __OUTSIDE__/survivor.pid; exec /bin/sleep 300"],
  { detached: true, cwd: "/", env: {}, stdio: "ignore" });
child.unref();
const wait = setInterval(() => {
  if (fs.existsSync("__OUTSIDE__/survivor.pid")) {
    clearInterval(wait);
    console.log("started a process that left my process group, my directory and my environment");
  }
}, 10);"#,
    },
    Program {
        name: "outside",
        code: r#"const fs = require("fs");
fs.writeFileSync("__OUTSIDE__/left-behind.txt", "written by the sandboxed program\n");
console.log("wrote a file outside my working directory, and my run is over");"#,
    },
];

/// The command line the page shows for each program.
pub const SHOWN_COMMAND: &str = "plimsoll run --provider process -e \"$CODE\"";

/// What one run gave, as the page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    /// The program's name.
    pub name: &'static str,
    /// `isolation` from the answer.
    pub isolation: String,
    /// The program's exit code.
    pub exit_code: i64,
    /// Its stdout, as text.
    pub stdout: String,
    /// Its stderr, as text.
    pub stderr: String,
    /// What the script saw from outside after the run (one line each).
    pub after: Vec<String>,
}

struct Stage {
    dir: tempfile::TempDir,
    port: u16,
}

impl Stage {
    fn new() -> Result<Stage, LearnError> {
        let dir = tempfile::Builder::new()
            .prefix("plimsoll-learn-")
            .tempdir()
            .map_err(io_err("a folder for the programs"))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
            .map_err(io_err("open the folder to the programs"))?;
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(io_err("a listener on 127.0.0.1"))?;
        let port = listener.local_addr().map_err(io_err("its address"))?.port();
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                let _ = s.write_all(b"hello from the host\n");
            }
        });
        Ok(Stage { dir, port })
    }

    fn code(&self, p: &Program) -> String {
        p.code
            .replace("__PORT__", &self.port.to_string())
            .replace("__OUTSIDE__", &self.dir.path().display().to_string())
    }
}

fn field<'a>(v: &'a serde_json::Value, path: &[&str]) -> Option<&'a serde_json::Value> {
    path.iter().try_fold(v, |v, k| v.get(k))
}

fn text_of(v: Option<&serde_json::Value>) -> Result<String, LearnError> {
    let b64 = v.and_then(|v| v.as_str()).unwrap_or("");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| LearnError::Run(format!("the answer's output is not base64: {e}")))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Runs `p` through the `plimsoll` binary at `plimsoll` and looks outside afterwards.
fn run_one(plimsoll: &Path, stage: &Stage, p: &Program) -> Result<Ran, LearnError> {
    let out = Command::new(plimsoll)
        .args([
            "run",
            "--provider",
            "process",
            "--json",
            "--timeout",
            "20s",
            "-e",
        ])
        .arg(stage.code(p))
        .output()
        .map_err(io_err(format!("run {}", plimsoll.display())))?;
    if !out.status.success() {
        return Err(LearnError::Run(format!(
            "plimsoll run ({}) failed: {}",
            p.name,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| LearnError::Run(format!("plimsoll run --json printed no JSON: {e}")))?;
    let js = field(&v, &["javascript"]);
    let mut ran = Ran {
        name: p.name,
        isolation: v["isolation"].as_str().unwrap_or("").to_owned(),
        exit_code: js
            .and_then(|j| j.get("exitCode"))
            .and_then(|c| c.as_i64())
            .unwrap_or(0),
        stdout: text_of(js.and_then(|j| j.get("stdout")))?,
        stderr: text_of(js.and_then(|j| j.get("stderr")))?,
        after: Vec::new(),
    };
    let outside = stage.dir.path();
    match p.name {
        "outlive" => ran.after.push(survivor(&outside.join("survivor.pid"))),
        "outside" => ran.after.push(
            match std::fs::read_to_string(outside.join("left-behind.txt")) {
                Ok(t) => format!("the file is there, holding {:?}", t.trim_end()),
                Err(_) => "no file was left behind".to_owned(),
            },
        ),
        _ => {}
    }
    Ok(ran)
}

/// Whether the process whose PID is in `pid_file` still runs; it is killed if it does.
fn survivor(pid_file: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(2);
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        {
            break Some(pid);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let Some(pid) = pid.filter(|p| *p > 1) else {
        return "no process was started".to_owned();
    };
    let pid = nix::unistd::Pid::from_raw(pid);
    // Give the run's sweep the time it takes (it has already finished when `run` returns).
    std::thread::sleep(Duration::from_millis(200));
    if nix::sys::signal::kill(pid, None).is_ok() {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        "the process is still running (this script killed it)".to_owned()
    } else {
        "the process is gone".to_owned()
    }
}

/// Runs the five programs through the `plimsoll` binary at `plimsoll`.
pub fn run_all(plimsoll: &Path) -> Result<Vec<Ran>, LearnError> {
    PROGRAMS
        .iter()
        .map(|p| {
            let stage = Stage::new()?;
            run_one(plimsoll, &stage, p)
        })
        .collect()
}

/// The page block showing a program's code.
pub fn code_block(p: &Program) -> String {
    format!("```js\n{}\n```\n", p.code)
}

/// The page block showing what a run printed, and what the script saw after it.
pub fn output_block(r: &Ran) -> String {
    let mut s = format!(
        "```console\n$ {SHOWN_COMMAND}\nisolation: {}\nexit code: {}\n",
        r.isolation, r.exit_code
    );
    s.push_str("--- stdout ---\n");
    s.push_str(&r.stdout);
    if !r.stdout.is_empty() && !r.stdout.ends_with('\n') {
        s.push('\n');
    }
    if !r.stderr.is_empty() {
        s.push_str("--- stderr ---\n");
        s.push_str(&r.stderr);
        if !r.stderr.ends_with('\n') {
            s.push('\n');
        }
    }
    for a in &r.after {
        s.push_str("--- after the run, seen from outside ---\n");
        s.push_str(a);
        s.push('\n');
    }
    s.push_str("```\n");
    s
}

/// `page` with every program's code and output blocks replaced by `ran`'s.
pub fn render(page: &str, ran: &[Ran]) -> Result<String, LearnError> {
    let mut page = page.to_owned();
    for (p, r) in PROGRAMS.iter().zip(ran) {
        page = crate::blocks::replace(&page, &format!("{}-code", p.name), &code_block(p))?;
        page = crate::blocks::replace(&page, &format!("{}-output", p.name), &output_block(r))?;
    }
    Ok(page)
}
