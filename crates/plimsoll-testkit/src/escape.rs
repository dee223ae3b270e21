//! The escape suite every provider passes: an attacker's programs run through a real daemon
//! (inherited descriptors, the wall's own processes, host paths, another run, egress,
//! process and memory bombs, the syscalls a wall must refuse), each verdict compared with
//! the provider's column of the table in `docs/walls.md`, read from the repository at test
//! time, so the documentation and the behaviour cannot drift apart.
//!
//! The attacker is `escape/probe.py` (python3 in the sandbox); quickjs has no OS API, so its
//! column is `n/a` except the memory bomb, and the suite asserts that the APIs are absent.
//! Bombs run only inside an outer bound the test makes ([`Bound`], a cgroup around the
//! daemon) or, for Docker, whose containers are not the daemon's children, inside the
//! engine's limits and the probe's own cap (it stops at [`PROCESS_CAP`] processes and
//! [`MEMORY_CAP_MIB`] MiB, and says `REACHED` when it got there).

use std::collections::BTreeMap;
use std::fmt;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plimsoll_client::Client;
use plimsoll_core::pb::{self, run_request::Payload, run_response::Result as R};

/// The attacker's program.
pub const PROBE: &str = include_str!("escape/probe.py");

/// How many processes the process bomb starts before it calls the wall open.
pub const PROCESS_CAP: u32 = 1000;
/// How much memory (MiB) the memory bomb takes before it calls the wall open.
pub const MEMORY_CAP_MIB: u32 = 2048;

/// The checks, in the table's order: each a row of `docs/walls.md`.
pub const CHECKS: &[&str] = &[
    "inherited-fd",
    "wall-processes",
    "host-paths",
    "state-dir",
    "neighbour-files",
    "neighbour-processes",
    "egress-loopback",
    "egress-host",
    "process-bomb",
    "memory-bomb",
    "personality",
    "socket-families",
    "tiocsti",
    "modify-ldt",
    "unshare-user",
    "mount",
    "ptrace",
    "memfd-exec",
];

/// The checks run one after another as steps of one project.
const ONE_RUN: &[&str] = &[
    "inherited-fd",
    "wall-processes",
    "host-paths",
    "state-dir",
    "egress-loopback",
    "egress-host",
    "personality",
    "socket-families",
    "tiocsti",
    "modify-ldt",
    "unshare-user",
    "mount",
    "ptrace",
    "memfd-exec",
];

/// A cell of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    /// The wall stops the attacker (or leaves it nothing to reach).
    Holds,
    /// The attacker gets through; the docs say so.
    DoesNotHold,
    /// The check cannot be asked of this provider (no OS API; or a wall the tests cannot
    /// stand up, such as a cluster's).
    NotApplicable,
}

impl Cell {
    fn parse(s: &str) -> Option<Cell> {
        match s.trim() {
            "holds" => Some(Cell::Holds),
            "does not hold" => Some(Cell::DoesNotHold),
            "n/a" => Some(Cell::NotApplicable),
            _ => None,
        }
    }
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Cell::Holds => "holds",
            Cell::DoesNotHold => "does not hold",
            Cell::NotApplicable => "n/a",
        })
    }
}

/// `docs/walls.md`, from the repository.
pub fn walls_md() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/walls.md")
}

/// The table of `docs/walls.md`: column name → check → cell. Panics, naming the line, on
/// a table that is not one row per check in [`CHECKS`] with a known cell in every column.
pub fn table() -> BTreeMap<String, BTreeMap<String, Cell>> {
    let path = walls_md();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    parse_table(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn cells(line: &str) -> Vec<String> {
    line.trim()
        .trim_matches('|')
        .split('|')
        .map(|c| c.trim().trim_matches('`').to_owned())
        .collect()
}

/// Parses the first Markdown table whose header starts with `check`.
pub fn parse_table(text: &str) -> Result<BTreeMap<String, BTreeMap<String, Cell>>, String> {
    let mut lines = text.lines().enumerate();
    let columns = loop {
        let Some((_, l)) = lines.next() else {
            return Err("no table whose header starts with `check`".into());
        };
        let c = cells(l);
        if l.trim_start().starts_with('|') && c.first().map(String::as_str) == Some("check") {
            break c[1..].to_vec();
        }
    };
    lines.next(); // the |---| line
    let mut out: BTreeMap<String, BTreeMap<String, Cell>> = columns
        .iter()
        .map(|c| (c.clone(), BTreeMap::new()))
        .collect();
    let mut rows = Vec::new();
    for (n, l) in lines {
        if !l.trim_start().starts_with('|') {
            break;
        }
        let c = cells(l);
        if c.len() != columns.len() + 1 {
            return Err(format!(
                "line {}: {} cells, want {}",
                n + 1,
                c.len(),
                columns.len() + 1
            ));
        }
        for (col, v) in columns.iter().zip(&c[1..]) {
            let cell = Cell::parse(v).ok_or_else(|| {
                format!(
                    "line {}: {v:?} is not `holds`, `does not hold` or `n/a`",
                    n + 1
                )
            })?;
            out.get_mut(col)
                .expect("a column")
                .insert(c[0].clone(), cell);
        }
        rows.push(c[0].clone());
    }
    if rows != CHECKS {
        return Err(format!(
            "the rows are {rows:?}, the suite's checks are {CHECKS:?}"
        ));
    }
    Ok(out)
}

/// One column of [`table`]; panics when the table has no such column.
pub fn column(name: &str) -> BTreeMap<String, Cell> {
    let mut t = table();
    let names: Vec<String> = t.keys().cloned().collect();
    t.remove(name)
        .unwrap_or_else(|| panic!("docs/walls.md has no column {name:?} (it has {names:?})"))
}

/// What the attacker is after, outside the wall: a 0600 file the daemon holds open at
/// [`INHERITED_FD`] without close-on-exec, a host file and folder, a listener on every
/// address of this host.
#[derive(Debug)]
pub struct Fixture {
    dir: tempfile::TempDir,
    secret: String,
    listener: TcpListener,
}

/// The descriptor the daemon holds the 0600 file at.
pub const INHERITED_FD: u32 = 7;

impl Fixture {
    /// Makes the files and the listener.
    pub fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("plimsoll-escape")
            .tempdir()
            .expect("a folder");
        let secret = format!("escape-secret-{}", hex::encode(rand::random::<[u8; 8]>()));
        let held = dir.path().join("held-by-the-daemon");
        std::fs::write(&held, &secret).expect("the held file");
        std::fs::set_permissions(&held, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        std::fs::write(dir.path().join("host-marker"), &secret).expect("the host marker");
        std::fs::set_permissions(
            dir.path().join("host-marker"),
            std::fs::Permissions::from_mode(0o644),
        )
        .expect("chmod");
        let listener = TcpListener::bind("0.0.0.0:0").expect("a listener");
        Fixture {
            dir,
            secret,
            listener,
        }
    }

    /// The 0600 file the daemon holds.
    pub fn held_file(&self) -> PathBuf {
        self.dir.path().join("held-by-the-daemon")
    }

    /// A command prefix for [`crate::plimsolld::Plimsolld::spawn_as`]: a shell that moves
    /// itself into `bound` (when given), opens the held file at [`INHERITED_FD`] without
    /// close-on-exec and execs the daemon.
    pub fn prefix(&self, bound: Option<&Bound>) -> Vec<String> {
        let enter = bound.map(Bound::enter_script).unwrap_or_default();
        vec![
            "sh".into(),
            "-c".into(),
            format!(
                "{enter}exec \"$0\" \"$@\" {INHERITED_FD}<>'{}'",
                self.held_file().display()
            ),
        ]
    }

    fn ctx(&self, state_dir: &Path, neighbour: &Neighbour, wait_s: f64) -> String {
        serde_json::json!({
            "inherited_name": "held-by-the-daemon",
            "inherited_secret": self.secret,
            "host_marker": self.dir.path().join("host-marker"),
            "host_secret": self.secret,
            "host_listed": [self.dir.path(), Path::new(env!("CARGO_MANIFEST_DIR")), Path::new("/root")],
            "state_dir": state_dir,
            "loopback_addr": "127.0.0.1",
            "host_addr": host_address().unwrap_or_default(),
            "listener_port": self.listener.local_addr().expect("an address").port(),
            "process_cap": PROCESS_CAP,
            "memory_cap_mib": MEMORY_CAP_MIB,
            "neighbour_sleep": neighbour.sleep,
            "neighbour_file": neighbour.file,
            "neighbour_secret": self.secret,
            "neighbour_wait_s": wait_s,
            "neighbour_roots": [state_dir, Path::new("/tmp"), Path::new("/work")],
        })
        .to_string()
    }
}

impl Default for Fixture {
    fn default() -> Self {
        Fixture::new()
    }
}

/// This host's first global IPv4 address (`ip -4 -o addr show scope global`).
pub fn host_address() -> Option<String> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let mut w = l.split_whitespace();
        w.find(|t| *t == "inet")?;
        Some(w.next()?.split('/').next()?.to_owned())
    })
}

/// An outer bound for bombs: a cgroup (v2, or v1's `pids` and `memory` hierarchies) the
/// daemon is started in, with a process and a memory limit above what the bombs reach, so
/// a wall that does not hold cannot take the machine down. Dropping it kills what is left
/// in it and removes it.
#[derive(Debug)]
pub struct Bound {
    dirs: Vec<PathBuf>,
}

impl Bound {
    /// A bound of `pids` processes and `memory_mib` MiB, or `None` (with the reason printed)
    /// where this process cannot make cgroups (not root, no controllers).
    pub fn new(pids: u32, memory_mib: u64) -> Option<Bound> {
        match Bound::make(pids, memory_mib) {
            Ok(b) => Some(b),
            Err(e) => {
                eprintln!("no outer bound for bombs: {e}");
                None
            }
        }
    }

    fn make(pids: u32, memory_mib: u64) -> Result<Bound, String> {
        let name = format!("plimsoll-escape-{}", std::process::id());
        let bytes = (memory_mib << 20).to_string();
        let w = |p: PathBuf, v: &str| {
            std::fs::write(&p, v).map_err(|e| format!("{}: {e}", p.display()))
        };
        let root = Path::new("/sys/fs/cgroup");
        if root.join("cgroup.controllers").exists() {
            // cgroup v2: a child of the root, which may hold processes beside children.
            w(root.join("cgroup.subtree_control"), "+pids +memory")?;
            let dir = root.join(&name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let b = Bound {
                dirs: vec![dir.clone()],
            };
            w(dir.join("pids.max"), &pids.to_string())?;
            w(dir.join("memory.max"), &bytes)?;
            let _ = w(dir.join("memory.swap.max"), "0");
            return Ok(b);
        }
        let pid_dir = root.join("pids").join(&name);
        let mem_parent = root.join("memory").join(
            own_cgroup("memory")
                .unwrap_or_default()
                .trim_start_matches('/'),
        );
        let mem_dir = mem_parent.join(&name);
        for d in [&pid_dir, &mem_dir] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let b = Bound {
            dirs: vec![pid_dir.clone(), mem_dir.clone()],
        };
        w(pid_dir.join("pids.max"), &pids.to_string())?;
        w(mem_dir.join("memory.limit_in_bytes"), &bytes)?;
        let _ = w(mem_dir.join("memory.memsw.limit_in_bytes"), &bytes);
        Ok(b)
    }

    /// Shell that moves the shell itself into the bound (its children follow).
    fn enter_script(&self) -> String {
        self.dirs
            .iter()
            .map(|d| format!("echo $$ > '{}' && ", d.join("cgroup.procs").display()))
            .collect()
    }
}

fn own_cgroup(controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (id, ctl, path) = (f.next()?, f.next()?, f.next()?);
        let _ = id;
        ctl.split(',')
            .any(|c| c == controller)
            .then(|| path.to_owned())
    })
}

impl Drop for Bound {
    fn drop(&mut self) {
        for d in &self.dirs {
            for _ in 0..50 {
                let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
                for p in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                if std::fs::remove_dir(d).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// The other run of the neighbour checks: its file's name and its sleeper's argument.
#[derive(Debug)]
struct Neighbour {
    file: String,
    sleep: String,
}

/// What one check showed.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The check (a row of the table).
    pub check: String,
    /// Whether the wall held.
    pub held: bool,
    /// What the probe said.
    pub detail: String,
}

/// Where the provider under test keeps things the attacker is after.
#[derive(Debug, Clone)]
pub struct Target {
    /// The column of `docs/walls.md`.
    pub column: String,
    /// The daemon's state directory.
    pub state_dir: PathBuf,
    /// Whether bombs may run: an outer bound holds the daemon, or the provider's sandboxes
    /// are not the daemon's children (Docker).
    pub bombs: bool,
}

fn project(files: &[(&str, &str)], steps: &[String], timeout_ms: i32) -> pb::RunRequest {
    pb::RunRequest {
        protocol: plimsoll_core::PROTOCOL,
        timeout_ms,
        payload: Some(Payload::Project(pb::ProjectRun {
            files: files
                .iter()
                .map(|(p, c)| pb::ProjectFile {
                    path: (*p).into(),
                    content: (*c).into(),
                })
                .collect(),
            steps: steps.to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn steps_of(r: &pb::RunResponse) -> Vec<pb::StepResult> {
    match &r.result {
        Some(R::Project(p)) => p.steps.clone(),
        other => panic!("not a project answer: {other:?}"),
    }
}

fn verdict(check: &str, out: &str) -> Result<Seen, String> {
    let line = out.lines().next().unwrap_or_default();
    let (held, detail) = if let Some(d) = line.strip_prefix("HELD ") {
        (true, d)
    } else if let Some(d) = line.strip_prefix("OPEN ") {
        (false, d)
    } else {
        return Err(format!("{check}: no verdict: {out:?}"));
    };
    Ok(Seen {
        check: check.to_owned(),
        held,
        detail: detail.to_owned(),
    })
}

/// Runs every check the target's column does not mark `n/a` through `c`, then asserts the
/// table: panics naming the provider and each check whose behaviour and cell differ.
pub async fn check(c: &mut Client, fx: &Fixture, target: &Target) -> Vec<Seen> {
    let want = column(&target.column);
    let seen = if target.column == "quickjs" {
        quickjs(c).await
    } else {
        sandboxed(c, fx, target, &want).await
    };
    assert_matches(&target.column, &want, &seen);
    seen
}

/// Compares what the checks showed with the column; panics listing every difference.
pub fn assert_matches(column: &str, want: &BTreeMap<String, Cell>, seen: &[Seen]) {
    let mut wrong = Vec::new();
    for s in seen {
        eprintln!(
            "escape suite on {column}: {}: {} ({})",
            s.check,
            if s.held { "held" } else { "OPEN" },
            s.detail
        );
    }
    for (check, cell) in want {
        let got = seen.iter().find(|s| &s.check == check);
        let ok = match (cell, got) {
            (Cell::NotApplicable, _) => true,
            (_, None) => false,
            (Cell::Holds, Some(s)) => s.held,
            (Cell::DoesNotHold, Some(s)) => !s.held,
        };
        if !ok {
            wrong.push(format!(
                "provider {column}, check {check}: docs/walls.md says `{cell}`, the run shows {}",
                match got {
                    None => "nothing (the check did not run)".to_owned(),
                    Some(s) if s.held => format!("it held ({})", s.detail),
                    Some(s) => format!("it did not hold ({})", s.detail),
                }
            ));
        }
    }
    assert!(wrong.is_empty(), "escape suite:\n{}", wrong.join("\n"));
}

/// quickjs: the snippet sees no OS API (which is why every OS check is `n/a`), and a memory
/// bomb ends the snippet.
async fn quickjs(c: &mut Client) -> Vec<Seen> {
    let js = |code: &str| pb::RunRequest {
        protocol: plimsoll_core::PROTOCOL,
        timeout_ms: 20_000,
        payload: Some(Payload::Javascript(pb::JavaScriptRun {
            code: code.into(),
            grant_profile: String::new(),
        })),
        ..Default::default()
    };
    let out = |r: &pb::RunResponse| match &r.result {
        Some(R::Javascript(j)) => String::from_utf8_lossy(&j.stdout).into_owned(),
        other => panic!("quickjs: not a snippet answer: {other:?}"),
    };
    let r = c
        .run(js("console.log([typeof require, typeof process, typeof std, typeof os, typeof fetch, typeof XMLHttpRequest, typeof WebSocket, typeof Deno, typeof Bun].join(' '))"))
        .await
        .expect("quickjs: the API probe is answered");
    let apis = out(&r);
    assert!(
        apis.split_whitespace().all(|t| t == "undefined") && apis.split_whitespace().count() == 9,
        "provider quickjs: an OS API is reachable ({apis:?}), so the n/a cells of docs/walls.md are wrong"
    );
    let t0 = Instant::now();
    let r = c
        .run(js(&format!(
            "let a = [], n = 0; while (n < {MEMORY_CAP_MIB}) {{ a.push(new Uint8Array(1 << 20).fill(1)); n++; }} console.log('REACHED ' + n + ' MiB');"
        )))
        .await
        .expect("provider quickjs, check memory-bomb: the run is answered");
    let o = out(&r);
    let err = match &r.result {
        Some(R::Javascript(j)) => String::from_utf8_lossy(&j.stderr).into_owned(),
        _ => String::new(),
    };
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "quickjs: the bomb's run did not end"
    );
    vec![Seen {
        check: "memory-bomb".into(),
        held: !o.contains("REACHED"),
        detail: if o.contains("REACHED") {
            o.trim().to_owned()
        } else {
            err.trim().chars().take(200).collect()
        },
    }]
}

async fn sandboxed(
    c: &mut Client,
    fx: &Fixture,
    target: &Target,
    want: &BTreeMap<String, Cell>,
) -> Vec<Seen> {
    let asked = |check: &str| want.get(check).is_some_and(|c| *c != Cell::NotApplicable);
    let col = &target.column;
    let tag = hex::encode(rand::random::<[u8; 3]>());
    let neighbour = Neighbour {
        file: format!("neighbour-{tag}"),
        sleep: format!("12.{}", u32::from_str_radix(&tag, 16).unwrap_or(1)),
    };
    let mut seen = Vec::new();

    let checks: Vec<&str> = ONE_RUN.iter().copied().filter(|c| asked(c)).collect();
    if !checks.is_empty() {
        let ctx = fx.ctx(&target.state_dir, &neighbour, 0.0);
        let steps: Vec<String> = checks
            .iter()
            .map(|c| format!("python3 probe.py {c}"))
            .collect();
        let r = c
            .run(project(
                &[("probe.py", PROBE), ("ctx.json", &ctx)],
                &steps,
                120_000,
            ))
            .await
            .unwrap_or_else(|e| panic!("provider {col}: the escape run is answered: {e}"));
        let got = steps_of(&r);
        for (i, check) in checks.iter().enumerate() {
            let s = got.get(i).unwrap_or_else(|| {
                panic!("provider {col}, check {check}: the step did not run: {r:?}")
            });
            seen.push(
                verdict(check, &String::from_utf8_lossy(&s.stdout)).unwrap_or_else(|e| {
                    panic!(
                        "provider {col}, check {e} (exit {}, stderr {:?})",
                        s.exit_code,
                        String::from_utf8_lossy(&s.stderr)
                    )
                }),
            );
        }
    }

    if asked("neighbour-files") || asked("neighbour-processes") {
        seen.extend(neighbours(c, fx, target, &neighbour).await);
    }

    for bomb in ["process-bomb", "memory-bomb"] {
        if !asked(bomb) {
            continue;
        }
        if !target.bombs {
            eprintln!("provider {col}, check {bomb}: SKIPPED: no outer bound (run as root)");
            continue;
        }
        let ctx = fx.ctx(&target.state_dir, &neighbour, 0.0);
        let t0 = Instant::now();
        let r = c
            .run(project(
                &[("probe.py", PROBE), ("ctx.json", &ctx)],
                &[format!("python3 probe.py {bomb}")],
                60_000,
            ))
            .await;
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "provider {col}, check {bomb}: the run did not end"
        );
        let r = match r {
            Ok(r) => r,
            // The bomb broke the provider's own channel: the wall did not keep the run's
            // answer (the daemon must still serve; checked below).
            Err(e) => {
                seen.push(Seen {
                    check: bomb.into(),
                    held: false,
                    detail: format!("the run's answer was lost: {e}"),
                });
                plain_run_still_answered(c, col, bomb).await;
                continue;
            }
        };
        let s = &steps_of(&r)[0];
        let out = String::from_utf8_lossy(&s.stdout);
        seen.push(match verdict(bomb, &out) {
            Ok(v) => v,
            // Killed before it could say anything (the OOM killer, a signal): stopped.
            Err(_) => Seen {
                check: bomb.into(),
                held: true,
                detail: format!(
                    "ended with exit {} before the cap ({})",
                    s.exit_code,
                    String::from_utf8_lossy(&s.stderr)
                        .chars()
                        .take(120)
                        .collect::<String>()
                ),
            },
        });
        plain_run_still_answered(c, col, bomb).await;
    }
    seen
}

/// After a bomb: the daemon answers a plain run and the host still starts a process.
async fn plain_run_still_answered(c: &mut Client, col: &str, bomb: &str) {
    let r = c
        .run(project(&[], &["true".into()], 30_000))
        .await
        .unwrap_or_else(|e| panic!("provider {col}, after {bomb}: a run is answered: {e}"));
    assert_eq!(
        steps_of(&r)[0].exit_code,
        0,
        "provider {col}, after {bomb}: a plain run fails"
    );
    let host = std::process::Command::new("true").status();
    assert!(
        host.is_ok_and(|s| s.success()),
        "provider {col}, after {bomb}: the host cannot start a process"
    );
}

/// Two runs at once: one writes a file and sleeps, the other looks for the file and the
/// process.
async fn neighbours(c: &mut Client, fx: &Fixture, target: &Target, n: &Neighbour) -> Vec<Seen> {
    let col = target.column.clone();
    let ctx = fx.ctx(&target.state_dir, n, 0.0);
    let mut other = c.clone();
    let sleeper_req = project(
        &[("probe.py", PROBE), ("ctx.json", &ctx)],
        &["python3 probe.py sleeper".into()],
        60_000,
    );
    let sleeper = tokio::spawn(async move { other.run(sleeper_req).await });
    // Wait until the sleeper runs, as the host sees it; where the host cannot see it (a
    // sandbox kernel of its own), give it time and let the probe look for a while.
    let mut wait_s = 1.0;
    let t0 = Instant::now();
    loop {
        if host_sees(&n.sleep) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(8) {
            wait_s = 4.0;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ctx = fx.ctx(&target.state_dir, n, wait_s);
    let r = c
        .run(project(
            &[("probe.py", PROBE), ("ctx.json", &ctx)],
            &["python3 probe.py neighbour".into()],
            60_000,
        ))
        .await
        .unwrap_or_else(|e| panic!("provider {col}, neighbour checks: the run is answered: {e}"));
    let s = &steps_of(&r)[0];
    let out = String::from_utf8_lossy(&s.stdout).into_owned();
    let line = |prefix: &str, check: &str| {
        let l = out
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| {
                panic!(
                    "provider {col}, check {check}: no verdict: {out:?} {:?}",
                    String::from_utf8_lossy(&s.stderr)
                )
            });
        verdict(check, l).unwrap_or_else(|e| panic!("provider {col}, check {e}"))
    };
    let seen = vec![
        line("FILES ", "neighbour-files"),
        line("PROCS ", "neighbour-processes"),
    ];
    let a = sleeper.await.expect("the sleeper's task");
    let a = a.unwrap_or_else(|e| panic!("provider {col}: the sleeper's run is answered: {e}"));
    assert_eq!(
        steps_of(&a)[0].exit_code,
        0,
        "provider {col}: the sleeper's run failed: {a:?}"
    );
    seen
}

/// plimsolld (`bin`) as a child process holding the fixture's file at [`INHERITED_FD`],
/// inside `bound` when given, with its state in `dir/state`, no callers file
/// (`PLIMSOLL_INSECURE`) and `vars`; and a client of it. Panics with its log if it does not
/// start serving.
pub fn daemon(
    bin: &str,
    dir: &Path,
    vars: &[(&str, &str)],
    fx: &Fixture,
    bound: Option<&Bound>,
) -> (crate::plimsolld::Plimsolld, String) {
    let prefix = fx.prefix(bound);
    let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
    let mut all = vec![("PLIMSOLL_INSECURE", "1"), ("SANDBOX_MAX_CONCURRENT", "4")];
    all.extend_from_slice(vars);
    let mut d = crate::plimsolld::Plimsolld::spawn_as(bin, dir, &all, &prefix);
    let addr = d
        .serving()
        .unwrap_or_else(|| panic!("plimsolld did not start serving:\n{}", d.log()));
    (d, addr)
}

/// A client of `addr` with no token.
pub async fn client(addr: &str) -> Client {
    Client::connect(addr, plimsoll_client::ClientOptions::default())
        .await
        .expect("connect to plimsolld")
}

/// Whether some process on the host has `arg` in its command line.
fn host_sees(arg: &str) -> bool {
    let Ok(d) = std::fs::read_dir("/proc") else {
        return false;
    };
    d.flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| c.split(|b| *b == 0).any(|w| w == arg.as_bytes()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_docs_table_parses_with_a_row_per_check() {
        let t = table();
        for col in [
            "quickjs",
            "process",
            "bwrap",
            "docker (runc)",
            "docker (runsc)",
            "agentsandbox (fake cluster)",
        ] {
            assert_eq!(t[col].len(), CHECKS.len(), "{col}");
        }
    }

    #[test]
    fn a_cell_that_is_not_a_verdict_is_refused() {
        let mut text = String::from("| check | p |\n|---|---|\n");
        for c in CHECKS {
            text.push_str(&format!("| `{c}` | holds |\n"));
        }
        assert!(parse_table(&text).is_ok());
        let bad = text.replacen("holds", "mostly", 1);
        assert!(parse_table(&bad).unwrap_err().contains("mostly"));
        let missing = text.replacen("| `mount` | holds |\n", "", 1);
        assert!(parse_table(&missing).unwrap_err().contains("rows"));
    }

    #[test]
    fn a_difference_from_the_table_fails_naming_provider_and_check() {
        let want: BTreeMap<String, Cell> = [("mount".to_owned(), Cell::Holds)].into();
        let seen = vec![Seen {
            check: "mount".into(),
            held: false,
            detail: "mounted".into(),
        }];
        let e = std::panic::catch_unwind(|| assert_matches("bwrap", &want, &seen)).unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(msg.contains("provider bwrap, check mount"), "{msg}");
    }
}
