//! `plimsoll-attest` driven as a release pipeline would drive it: the real binary, an
//! in-process plimsolld (process provider, sessions on, real `node`, `python3` and `sh`),
//! real key and bundle files, OpenSSL for the key (`openssl genpkey`) and as a live
//! time-stamp authority (`openssl ts -reply`, `plimsoll_testkit::tsa`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use plimsoll_daemon::RunningDaemon;
use plimsoll_testkit::daemon::Setup;
use plimsoll_testkit::tsa::{OpensslTsa, TsaKey};

struct World {
    daemon: RunningDaemon,
    setup: Setup,
    dir: tempfile::TempDir,
}

impl World {
    async fn start() -> World {
        let setup = Setup::tester();
        let daemon = setup
            .start(&[
                ("SANDBOX_MAX_SESSIONS", "4"),
                ("SANDBOX_MAX_SESSIONS_PER_CALLER", "4"),
                ("SANDBOX_MAX_CONCURRENT", "4"),
            ])
            .await;
        World {
            daemon,
            setup,
            dir: tempfile::tempdir().expect("a temporary folder"),
        }
    }

    fn addr(&self) -> String {
        format!("http://{}", self.daemon.rpc_addr())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs plimsoll-attest in the test folder with the caller token in the environment.
    fn attest(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_plimsoll-attest"))
            .args(args)
            .current_dir(self.dir.path())
            .env("PLIMSOLL_CALLER_TOKEN", self.setup.token(0))
            .env_remove("PLIMSOLL_ATTEST_KEY")
            .output()
            .expect("plimsoll-attest runs")
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    async fn stop(self) {
        self.daemon.shutdown().await;
    }
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("an exit code")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert_eq!(code(o), 0, "stdout:\n{}\nstderr:\n{}", stdout(o), stderr(o));
    stdout(o)
}

/// keygen, two runs and a session with cells into one bundle.
fn record_some(w: &World) -> PathBuf {
    ok(&w.attest(&["keygen", "--out", "harness"]));
    w.write(
        "js.json",
        r#"{"protocol":5,"javascript":{"code":"console.log(6*7)"}}"#,
    );
    let addr = w.addr();
    let out = ok(&w.attest(&[
        "run",
        "--daemon",
        &addr,
        "--key",
        "harness.key",
        "--bundle",
        "b.jsonl",
        "js.json",
    ]));
    assert!(out.contains("recorded line 1"), "{out}");
    ok(&w.attest(&[
        "run",
        "--daemon",
        &addr,
        "--key",
        "harness.key",
        "--bundle",
        "b.jsonl",
        "js.json",
    ]));
    w.write(
        "c1.json",
        r#"{"cell":{"language":"python","code":"x = 41"}}"#,
    );
    w.write(
        "c2.json",
        r#"{"cell":{"language":"python","code":"print(x + 1)"}}"#,
    );
    w.write(
        "c3.json",
        r#"{"project":{"files":[{"path":"a.txt","content":"kept"}],"steps":["cat a.txt"]}}"#,
    );
    let out = ok(&w.attest(&[
        "session",
        "--daemon",
        &addr,
        "--key",
        "harness.key",
        "--bundle",
        "b.jsonl",
        "--json",
        "c1.json",
        "c2.json",
        "c3.json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["calls"], 3, "{v}");
    w.path("b.jsonl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_and_a_session_are_signed_chained_and_verify() {
    let w = World::start().await;
    let bundle = record_some(&w);
    let mode = std::fs::metadata(&bundle).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a new bundle is private");
    let lines = std::fs::read_to_string(&bundle).unwrap().lines().count();
    // run + checkpoint, run + checkpoint, 3 calls + close + checkpoint.
    assert_eq!(lines, 9);
    let out = ok(&w.attest(&["verify", "--pub", "harness.pub", "b.jsonl"]));
    assert!(
        out.contains("valid: 9 lines, 2 runs, 1 sessions (3 calls), 3 checkpoints"),
        "{out}"
    );
    ok(&w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--expect-count",
        "5",
        "b.jsonl",
    ]));
    let o = w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--expect-count",
        "4",
        "b.jsonl",
    ]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    // The JSON form, for scripts.
    let out = ok(&w.attest(&["verify", "--pub", "harness.pub", "--json", "b.jsonl"]));
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        (v["valid"].clone(), v["runs"].clone()),
        (true.into(), 2.into())
    );
    // Another key's public half does not verify it.
    ok(&w.attest(&["keygen", "--out", "other"]));
    let o = w.attest(&["verify", "--pub", "other.pub", "b.jsonl"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("line 1"), "{}", stderr(&o));
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_bundle_fails_naming_the_line() {
    let w = World::start().await;
    let bundle = record_some(&w);
    let good = std::fs::read_to_string(&bundle).unwrap();
    let lines: Vec<&str> = good.lines().collect();
    let check = |name: &str, text: String, line: usize| {
        let p = w.write(name, &text);
        let o = w.attest(&["verify", "--pub", "harness.pub", p.to_str().unwrap()]);
        assert_eq!(code(&o), 1, "{name}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("line {line}")),
            "{name}: expected line {line} named: {}",
            stderr(&o)
        );
    };
    let join = |ls: &[&str]| ls.iter().map(|l| format!("{l}\n")).collect::<String>();
    // A flipped byte in the middle of line 3 (the second run).
    let mut flipped: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let mid = flipped[2].len() / 2;
    let mut bytes = flipped[2].clone().into_bytes();
    bytes[mid] ^= 0x01;
    flipped[2] = String::from_utf8_lossy(&bytes).into_owned();
    check(
        "flipped.jsonl",
        flipped.iter().map(|l| format!("{l}\n")).collect(),
        3,
    );
    // A removed line (the second session call, line 6).
    let mut removed = lines.clone();
    removed.remove(5);
    check("removed.jsonl", join(&removed), 6);
    // Two lines swapped.
    let mut swapped = lines.clone();
    swapped.swap(0, 2);
    check("swapped.jsonl", join(&swapped), 1);
    // Cut before the last checkpoint: incomplete.
    check("cut.jsonl", join(&lines[..8]), 8);
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openssl_key_signs_with_the_seed_flags_and_a_refusal_appends_nothing() {
    let w = World::start().await;
    let gen = Command::new("openssl")
        .args(["genpkey", "-algorithm", "ed25519", "-out", "k.pem"])
        .current_dir(w.dir.path())
        .output()
        .expect("openssl (CI installs it) runs");
    assert!(
        gen.status.success(),
        "{}",
        String::from_utf8_lossy(&gen.stderr)
    );
    let pubout = Command::new("openssl")
        .args(["pkey", "-in", "k.pem", "-pubout", "-out", "k.pub"])
        .current_dir(w.dir.path())
        .output()
        .unwrap();
    assert!(pubout.status.success());
    w.write("js.json", r#"{"javascript":{"code":"console.log('<&>')"}}"#);
    let addr = w.addr();
    ok(&w.attest(&[
        "run", "-daemon", &addr, "-key", "k.pem", "-bundle", "b.jsonl", "js.json",
    ]));
    ok(&w.attest(&["verify", "-pub", "k.pub", "b.jsonl"]));
    // The key from the environment, as PEM text.
    let pem = std::fs::read_to_string(w.path("k.pem")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_plimsoll-attest"))
        .args(["run", "--daemon", &addr, "--bundle", "b.jsonl", "js.json"])
        .current_dir(w.dir.path())
        .env("PLIMSOLL_CALLER_TOKEN", w.setup.token(0))
        .env("PLIMSOLL_ATTEST_KEY", &pem)
        .output()
        .unwrap();
    ok(&o);
    assert!(!stderr(&o).contains("PRIVATE"), "a key is never printed");
    // A floor the process provider cannot meet: refused, nothing appended.
    let before = std::fs::read(w.path("b.jsonl")).unwrap();
    w.write(
        "vm.json",
        r#"{"minimumIsolation":"vm","javascript":{"code":"console.log(1)"}}"#,
    );
    let o = w.attest(&[
        "run", "--daemon", &addr, "--key", "k.pem", "--bundle", "b.jsonl", "vm.json",
    ]);
    assert_eq!(code(&o), 3, "{}", stderr(&o));
    assert_eq!(std::fs::read(w.path("b.jsonl")).unwrap(), before);
    // A world-readable bundle is refused unless it is declared shared.
    std::fs::set_permissions(w.path("b.jsonl"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = w.attest(&[
        "run", "--daemon", &addr, "--key", "k.pem", "--bundle", "b.jsonl", "js.json",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("shared"), "{}", stderr(&o));
    ok(&w.attest(&[
        "run",
        "--daemon",
        &addr,
        "--key",
        "k.pem",
        "--bundle",
        "b.jsonl",
        "--shared-bundle",
        "js.json",
    ]));
    ok(&w.attest(&["verify", "--pub", "k.pub", "--expect-count", "3", "b.jsonl"]));
    // Usage errors exit 2 and name what to fix.
    let o = w.attest(&["verify", "b.jsonl"]);
    assert_eq!(code(&o), 2);
    let o = w.attest(&["verify", "--pub", "k.pub", "missing.jsonl"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("missing.jsonl"), "{}", stderr(&o));
    w.stop().await;
}

fn digests_of(w: &World, bundle: &Path) -> String {
    // The request digests, one a line, from the verifier's own view of the JSON output of
    // `run --json` is not kept here; recompute them from the stored lines instead.
    let out = ok(&w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--json",
        bundle.to_str().unwrap(),
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["request_sha256"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|d| format!("{} from the release script\n", d.as_str().unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_files_and_time_witnesses_from_a_live_openssl_authority() {
    let w = World::start().await;
    let bundle = record_some(&w);
    // --expect: the digests the pipeline kept, with multiplicity.
    let digests = digests_of(&w, &bundle);
    assert_eq!(digests.lines().count(), 5, "{digests}");
    w.write("expect.txt", &digests);
    ok(&w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--expect",
        "expect.txt",
        "b.jsonl",
    ]));
    let fewer: String = digests.lines().skip(1).map(|l| format!("{l}\n")).collect();
    w.write("fewer.txt", &fewer);
    let o = w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--expect",
        "fewer.txt",
        "b.jsonl",
    ]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));

    // A witness for the last checkpoint from OpenSSL's TSA, verified offline.
    let tsa = OpensslTsa::start(TsaKey::EcdsaP384, true);
    let root = tsa.ca_file();
    let root = root.to_str().unwrap();
    let out = ok(&w.attest(&[
        "witness",
        "--tsa",
        tsa.url(),
        "--tsa-root",
        root,
        "--bundle",
        "b.jsonl",
    ]));
    assert!(out.contains("witnessed checkpoint line 9"), "{out}");
    let out = ok(&w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--tsa-root",
        root,
        "b.jsonl",
    ]));
    assert!(out.contains("witnessed: lines 1-9 existed by"), "{out}");
    // Pinned to another root, the token is refused.
    let other = OpensslTsa::start(TsaKey::Rsa, true);
    let o = w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--tsa-root",
        other.ca_file().to_str().unwrap(),
        "b.jsonl",
    ]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    // A public authority's name cannot be given another root.
    let o = w.attest(&[
        "witness",
        "--tsa",
        "freetsa",
        "--tsa-root",
        root,
        "--bundle",
        "b.jsonl",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    // More runs later: the old witness still holds for its checkpoint.
    w.write("js.json", r#"{"javascript":{"code":"console.log(2)"}}"#);
    let addr = w.addr();
    ok(&w.attest(&[
        "run",
        "--daemon",
        &addr,
        "--key",
        "harness.key",
        "--bundle",
        "b.jsonl",
        "js.json",
    ]));
    ok(&w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--tsa-root",
        root,
        "b.jsonl",
    ]));
    let kept = std::fs::read_to_string(w.path("b.jsonl.witnesses.jsonl")).unwrap();
    // A witness moved to another checkpoint (line 11, after the later run) is refused:
    // its token stamps line 9's digest, not line 11's.
    w.write(
        "b.jsonl.witnesses.jsonl",
        &kept.replace("\"line\":9,", "\"line\":11,"),
    );
    let o = w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--tsa-root",
        root,
        "b.jsonl",
    ]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("witness 11"), "{}", stderr(&o));
    // A witness whose line digest was changed is refused, naming the witness.
    let v: serde_json::Value = serde_json::from_str(kept.lines().next().unwrap()).unwrap();
    let changed = kept.replace(v["line_sha256"].as_str().unwrap(), &"0".repeat(64));
    w.write("b.jsonl.witnesses.jsonl", &changed);
    let o = w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--tsa-root",
        root,
        "b.jsonl",
    ]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("witness 9"), "{}", stderr(&o));
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_resends_single_runs_and_compares_results() {
    let w = World::start().await;
    record_some(&w);
    let addr = w.addr();
    let out = ok(&w.attest(&[
        "replay",
        "--daemon",
        &addr,
        "--pub",
        "harness.pub",
        "b.jsonl",
    ]));
    assert!(
        out.contains("replayed 2 single runs, 0 differ; 3 session calls not replayed"),
        "{out}"
    );
    // A run whose output changes between runs differs on replay.
    w.write(
        "now.json",
        r#"{"javascript":{"code":"console.log(process.hrtime.bigint())"}}"#,
    );
    ok(&w.attest(&[
        "run",
        "--daemon",
        &addr,
        "--key",
        "harness.key",
        "--bundle",
        "b.jsonl",
        "now.json",
    ]));
    let o = w.attest(&[
        "replay",
        "--daemon",
        &addr,
        "--pub",
        "harness.pub",
        "b.jsonl",
    ]);
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    assert!(stdout(&o).contains("line 10: DIFFERENT"), "{}", stdout(&o));
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keygen_force_replaces_a_symlink_never_writing_through_it() {
    let w = World::start().await;
    let victim = w.write("victim.txt", "precious\n");
    let victim_pub = w.write("victim-pub.txt", "also precious\n");
    std::os::unix::fs::symlink(&victim, w.path("harness.key")).unwrap();
    std::os::unix::fs::symlink(&victim_pub, w.path("harness.pub")).unwrap();
    // Without --force a symbolic link is an existing name: refused.
    let o = w.attest(&["keygen", "--out", "harness"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    // With --force the links are replaced, the files they pointed to untouched.
    ok(&w.attest(&["keygen", "--out", "harness", "--force"]));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(
        std::fs::read_to_string(&victim_pub).unwrap(),
        "also precious\n"
    );
    for (name, mode, text) in [
        ("harness.key", 0o600, "PRIVATE KEY"),
        ("harness.pub", 0o644, "PUBLIC KEY"),
    ] {
        let meta = std::fs::symlink_metadata(w.path(name)).unwrap();
        assert!(meta.file_type().is_file(), "{name} is a regular file");
        assert_eq!(meta.permissions().mode() & 0o777, mode, "{name}");
        let pem = std::fs::read_to_string(w.path(name)).unwrap();
        assert!(pem.contains(text), "{name}: {pem}");
    }
    // A key file that was world-readable is replaced by a private one; no temporary is left.
    std::fs::set_permissions(
        w.path("harness.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    ok(&w.attest(&["keygen", "--out", "harness", "--force"]));
    let mode = std::fs::metadata(w.path("harness.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let left: Vec<_> = std::fs::read_dir(w.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signing_key_others_may_read_is_refused_unless_allowed() {
    let w = World::start().await;
    ok(&w.attest(&["keygen", "--out", "harness"]));
    w.write("js.json", r#"{"javascript":{"code":"console.log(1)"}}"#);
    let addr = w.addr();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--daemon",
            addr.as_str(),
            "--key",
            "harness.key",
            "--bundle",
            "b.jsonl",
        ];
        args.extend_from_slice(extra);
        args.push("js.json");
        w.attest(&args)
    };
    for mode in [0o640, 0o604, 0o620] {
        std::fs::set_permissions(w.path("harness.key"), std::fs::Permissions::from_mode(mode))
            .unwrap();
        let o = run(&[]);
        assert_eq!(code(&o), 2, "{mode:o}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("--key harness.key"), "{e}");
        assert!(e.contains(&format!("mode {mode:04o}")), "{e}");
        assert!(e.contains("chmod 600 harness.key"), "{e}");
        assert!(e.contains("--allow-shared-key"), "{e}");
        assert!(!w.path("b.jsonl").exists(), "nothing was appended");
    }
    // The same file named by PLIMSOLL_ATTEST_KEY.
    let key_path = w.path("harness.key").display().to_string();
    let o = Command::new(env!("CARGO_BIN_EXE_plimsoll-attest"))
        .args(["run", "--daemon", &addr, "--bundle", "b.jsonl", "js.json"])
        .current_dir(w.dir.path())
        .env("PLIMSOLL_CALLER_TOKEN", w.setup.token(0))
        .env("PLIMSOLL_ATTEST_KEY", &key_path)
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("PLIMSOLL_ATTEST_KEY"), "{}", stderr(&o));
    assert!(stderr(&o).contains("chmod 600"), "{}", stderr(&o));
    // The flag says so; --help lists it.
    ok(&run(&["--allow-shared-key"]));
    let help = ok(&w.attest(&["run", "--help"]));
    assert!(help.contains("--allow-shared-key"), "{help}");
    let help = ok(&w.attest(&["session", "--help"]));
    assert!(help.contains("--allow-shared-key"), "{help}");
    // Back to 0600: signs without the flag.
    std::fs::set_permissions(
        w.path("harness.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    ok(&run(&[]));
    ok(&w.attest(&[
        "verify",
        "--pub",
        "harness.pub",
        "--expect-count",
        "2",
        "b.jsonl",
    ]));
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_mistakes_get_messages_that_say_what_to_fix_and_leak_nothing() {
    let w = World::start().await;
    ok(&w.attest(&["keygen", "--out", "harness"]));
    w.write("js.json", r#"{"javascript":{"code":"process.exit(3)"}}"#);
    let addr = w.addr();
    // A key variable holding only the PEM body (no BEGIN/END lines) works; one holding
    // garbage is refused without echoing the value.
    let pem = std::fs::read_to_string(w.path("harness.key")).unwrap();
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let with_key = |value: &str| {
        Command::new(env!("CARGO_BIN_EXE_plimsoll-attest"))
            .args(["run", "--daemon", &addr, "--bundle", "k.jsonl", "js.json"])
            .current_dir(w.dir.path())
            .env("PLIMSOLL_CALLER_TOKEN", w.setup.token(0))
            .env("PLIMSOLL_ATTEST_KEY", value)
            .output()
            .unwrap()
    };
    let out = ok(&with_key(&body));
    // The program's own exit code is reported (the run itself is recorded: exit 0).
    assert!(out.contains("the program's exit code 3"), "{out}");
    let garbage = format!("{}x", &body[..body.len() - 2]);
    let o = with_key(&garbage);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        !stderr(&o).contains(&garbage[..20]),
        "the value is echoed: {}",
        stderr(&o)
    );
    // Literal \n escapes, as CI secret stores keep PEM text.
    ok(&with_key(&pem.replace('\n', "\\n")));
    // A refused run leaves no empty bundle behind.
    let o = Command::new(env!("CARGO_BIN_EXE_plimsoll-attest"))
        .args([
            "run",
            "--daemon",
            &addr,
            "--key",
            "harness.key",
            "--bundle",
            "new.jsonl",
            "js.json",
        ])
        .current_dir(w.dir.path())
        .env_remove("PLIMSOLL_CALLER_TOKEN")
        .output()
        .unwrap();
    assert_eq!(code(&o), 3, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("PLIMSOLL_CALLER_TOKEN"),
        "{}",
        stderr(&o)
    );
    assert!(!w.path("new.jsonl").exists(), "an empty bundle was left");
    // Appending with another key is refused; verifying with another key names both keys.
    ok(&w.attest(&["keygen", "--out", "other"]));
    let o = w.attest(&[
        "run",
        "--daemon",
        &addr,
        "--key",
        "other.key",
        "--bundle",
        "k.jsonl",
        "js.json",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let o = w.attest(&["verify", "--pub", "other.pub", "k.jsonl"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("line 1 is signed by key"),
        "{}",
        stderr(&o)
    );
    // A scheme that is not HTTP is a usage error.
    let o = w.attest(&[
        "run",
        "--daemon",
        "ftp://x",
        "--key",
        "harness.key",
        "--bundle",
        "k.jsonl",
        "js.json",
    ]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    w.stop().await;
}
