//! What the real `plimsolld` process exposes, and to whom (issue 10): bearer tokens over
//! plaintext gRPC on an address other hosts can reach (a loud warning; hardened mode refuses
//! to start), and the grant credentials it holds in its environment and memory, which code
//! in a process-tier run under the same user must not be able to read (`set_dumpable(false)`).

use std::path::Path;
use std::process::{Child, Command, Stdio};

use plimsoll_client::{Client, ClientOptions};
use plimsoll_core::pb::{self, run_request::Payload, run_response::Result as R};

use plimsoll_testkit::plimsolld::Plimsolld;

const BIN: &str = env!("CARGO_BIN_EXE_plimsolld");

/// Lines `p` logged so far at WARN that mention `needle`.
fn warnings_with(p: &Plimsolld, needle: &str) -> Vec<String> {
    p.seen
        .iter()
        .filter(|v| v["level"] == "WARN")
        .map(|v| {
            v["fields"]["message"]
                .as_str()
                .map_or_else(|| v.to_string(), str::to_owned)
        })
        .filter(|m| m.contains(needle))
        .collect()
}

fn callers(dir: &Path) -> (String, String) {
    let mut file = plimsoll_callers::CallersFile::default();
    let token = file.add("tester", &[]).unwrap();
    let path = dir.join("callers.json");
    file.save(&path).unwrap();
    (path.to_str().unwrap().to_owned(), token)
}

#[test]
fn bearer_tokens_over_plaintext_on_a_network_address_warn_and_hardened_mode_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (callers, _) = callers(dir.path());
    let warning = "is not a loopback address and PLIMSOLL_TLS_CERT/PLIMSOLL_TLS_KEY are not set";

    // Every interface, no TLS, tokens from a callers file: it serves, after a warning that
    // names the variable and what to do.
    let mut p = Plimsolld::spawn(
        BIN,
        dir.path(),
        &[
            ("PLIMSOLL_CLIENTS_FILE", &callers),
            ("PLIMSOLL_ADDR", "0.0.0.0:0"),
        ],
    );
    assert!(
        p.serving().is_some(),
        "plimsolld did not serve:\n{}",
        p.log()
    );
    let w = warnings_with(&p, warning);
    assert_eq!(w.len(), 1, "no warning:\n{}", p.log());
    for needle in [
        "PLIMSOLL_ADDR 0.0.0.0:",
        "bearer tokens",
        "plaintext",
        "Set PLIMSOLL_TLS_CERT",
    ] {
        assert!(w[0].contains(needle), "{needle:?} missing: {}", w[0]);
    }
    assert!(p.stop().success(), "{}", p.log());

    // Loopback: no warning.
    let mut p = Plimsolld::spawn(
        BIN,
        dir.path(),
        &[
            ("PLIMSOLL_CLIENTS_FILE", &callers),
            ("PLIMSOLL_ADDR", "127.0.0.1:0"),
        ],
    );
    assert!(
        p.serving().is_some(),
        "plimsolld did not serve:\n{}",
        p.log()
    );
    assert!(warnings_with(&p, warning).is_empty(), "{}", p.log());
    assert!(p.stop().success(), "{}", p.log());

    // Hardened mode refuses to start (exit 2, nothing served), listing the plaintext
    // listener among the missing safeguards.
    let mut p = Plimsolld::spawn(
        BIN,
        dir.path(),
        &[
            ("PLIMSOLL_CLIENTS_FILE", &callers),
            ("PLIMSOLL_ADDR", "0.0.0.0:0"),
            ("PLIMSOLL_HARDENED", "1"),
        ],
    );
    assert!(p.serving().is_none(), "hardened mode served:\n{}", p.log());
    assert_eq!(p.wait().code(), Some(2), "{}", p.log());
    let log = p.log();
    assert!(
        log.contains("PLIMSOLL_HARDENED: refusing to start"),
        "{log}"
    );
    assert!(
        log.contains("PLIMSOLL_TLS_CERT/PLIMSOLL_TLS_KEY are not set and PLIMSOLL_ADDR 0.0.0.0:0 is not loopback: callers' bearer tokens would cross the network in plaintext"),
        "{log}"
    );
}

const KEY: &str = "sk-live-5e0c9a7d13f24b86";

/// Reads `/proc/<pid>/environ`, `maps` and `mem` of each pid given, and prints one JSON line
/// per pid: what could be read, whether the environment names `API_KEY`, and how many
/// credential-shaped strings (`sk-live-`) the readable memory holds. It never prints a value.
const PROBE: &str = r#"
import json, os, sys
def probe(pid):
    out = {"pid": pid}
    try:
        env = open(f"/proc/{pid}/environ", "rb").read()
        out["environ"] = "read"
        out["environ_names_api_key"] = b"API_KEY=" in env
        out["environ_names_control"] = b"PLIMSOLL_PROBE_CONTROL=" in env
    except OSError as e:
        out["environ"] = f"denied errno {e.errno}"
    maps = []
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        out["maps"] = "read"
    except OSError as e:
        out["maps"] = f"denied errno {e.errno}"
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        read = found = 0
        for line in maps:
            addr, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            a, b = (int(x, 16) for x in addr.split("-"))
            if b - a > (256 << 20):
                continue
            try:
                data = os.pread(fd, b - a, a)
            except OSError:
                continue
            read += len(data)
            found += data.count(b"sk-live-")
        os.close(fd)
        out["mem"] = f"read {read} bytes"
        out["credential_shaped_strings"] = found
    except OSError as e:
        out["mem"] = f"denied errno {e.errno}"
    return out
for pid in sys.argv[1:]:
    print(json.dumps(probe(pid)))
"#;

const NOBODY: u32 = 65534;

/// `dir` and everything under it.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![dir.to_owned()];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Kills a helper process on every way out of the test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_process_tier_run_cannot_read_plimsollds_environment_or_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (callers, token) = callers(dir.path());
    let grants = dir.path().join("grants.json");
    std::fs::write(
        &grants,
        r#"{"version":1,"profiles":{"items":{"base_url":"http://127.0.0.1:9",
            "routes":["GET /v1/items/{id}"],"credential":{"env":"API_KEY"},"allowed_callers":["tester"]}}}"#,
    )
    .unwrap();
    // plimsolld runs as an unprivileged user, as it should in production. Root could read
    // any process whatever its dumpable flag, and the process tier cannot keep a root run
    // out (docs/grants.md), so a test running as root starts it as `nobody`; the run, its
    // child, then has that user too.
    let as_user: &[&str] = if nix::unistd::geteuid().is_root() {
        for entry in walk(dir.path()) {
            std::os::unix::fs::chown(&entry, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ]
    } else {
        &[]
    };
    // The control: a process of the same user that did not make itself non-dumpable. The
    // probe must be able to read its environment, or a denial below would prove nothing.
    let mut control_cmd = match as_user {
        [] => Command::new("sleep"),
        [first, rest @ ..] => {
            let mut c = Command::new(first);
            c.args(rest).arg("sleep");
            c
        }
    };
    let control = KillOnDrop(
        control_cmd
            .arg("600")
            .env("PLIMSOLL_PROBE_CONTROL", "1")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut p = Plimsolld::spawn_as(
        BIN,
        dir.path(),
        &[
            ("PLIMSOLL_CLIENTS_FILE", &callers),
            ("PLIMSOLL_ADDR", "127.0.0.1:0"),
            ("PLIMSOLL_GRANTS_FILE", grants.to_str().unwrap()),
            ("SANDBOX_PROVIDER", "process"),
            ("API_KEY", KEY),
        ],
        as_user,
    );
    let addr = p
        .serving()
        .unwrap_or_else(|| panic!("not serving:\n{}", p.log()));

    let step = format!("python3 probe.py {} {}", p.pid(), control.0.id());
    let req = pb::RunRequest {
        protocol: 5,
        timeout_ms: 60_000,
        payload: Some(Payload::Project(pb::ProjectRun {
            files: vec![pb::ProjectFile {
                path: "probe.py".into(),
                content: PROBE.into(),
            }],
            steps: vec![step],
            ..Default::default()
        })),
        ..Default::default()
    };
    let resp = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut c = Client::connect(
                &addr,
                ClientOptions {
                    token: Some(token),
                    ca_file: None,
                },
            )
            .await
            .unwrap();
            c.run(req).await.unwrap()
        });
    let Some(R::Project(run)) = &resp.result else {
        panic!("no project result: {resp:?}")
    };
    let step = &run.steps[0];
    let out = String::from_utf8_lossy(&step.stdout).into_owned();
    assert_eq!(
        step.exit_code,
        0,
        "{out}{}",
        String::from_utf8_lossy(&step.stderr)
    );
    assert!(!out.contains(KEY));
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    let (daemon, control) = (&lines[0], &lines[1]);

    // The probe can read a same-user process that stays dumpable...
    assert_eq!(control["environ"], "read", "{out}");
    assert_eq!(control["environ_names_control"], true, "{out}");
    // ...and not plimsolld: its environment (which holds API_KEY), its map and its memory
    // (which holds the credential) are refused.
    for part in ["environ", "maps", "mem"] {
        assert!(
            daemon[part].as_str().unwrap().starts_with("denied"),
            "a run read plimsolld's {part}: {out}"
        );
    }
    assert!(p.stop().success(), "{}", p.log());
}
