//! The quickjs provider with real worker processes (the `plimsoll-quickjs-worker` binary):
//! output, the deadline, the memory and stack limits, absent APIs, output caps, the worker's
//! lock-down seen from outside, and a worker killed mid-run.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use plimsoll_core::{pb, Reason, Tier};
use plimsoll_provider::{Provider, ProviderError, Work};
use plimsoll_quickjs::protocol::Request;
use plimsoll_quickjs::{QuickJsConfig, QuickJsProvider, WorkerCommand};

fn worker() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_plimsoll-quickjs-worker"))
}

fn provider_with(f: impl FnOnce(&mut QuickJsConfig)) -> QuickJsProvider {
    let mut cfg = QuickJsConfig::new(WorkerCommand::binary(worker()));
    f(&mut cfg);
    QuickJsProvider::new(cfg)
}

fn provider() -> QuickJsProvider {
    provider_with(|_| {})
}

async fn js(p: &QuickJsProvider, code: &str, timeout: Duration) -> pb::JavaScriptResult {
    p.run_snippet(code, timeout).await.expect("an answer")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const T: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_snippet_prints_and_the_provider_states_process_and_its_engine() {
    let p = provider();
    p.start().await.expect("smoke test");
    let f = p.facts();
    assert_eq!(f.name, "quickjs");
    assert_eq!(f.tier, Some(Tier::Process));
    assert_eq!(f.languages, vec!["javascript".to_owned()]);
    assert!(!f.supports_project && !f.supports_grants);
    let (head, digest) = f.environment.rsplit_once(":sha256:").expect(&f.environment);
    assert!(head.starts_with("quickjs:quickjs-ng-"), "{}", f.environment);
    assert_eq!(digest.len(), 64, "{}", f.environment);
    assert!(
        digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{}",
        f.environment
    );

    let r = js(
        &p,
        "console.log('hello', 6 * 7, {a: [1]}); console.error('to stderr')",
        T,
    )
    .await;
    assert_eq!(text(&r.stdout), "hello 42 {\"a\":[1]}\n");
    assert_eq!(text(&r.stderr), "to stderr\n");
    assert_eq!((r.exit_code, r.timed_out), (0, false));

    let r = js(
        &p,
        "Promise.resolve(5).then(v => console.log('later', v))",
        T,
    )
    .await;
    assert_eq!(text(&r.stdout), "later 5\n");

    let r = js(&p, "throw new TypeError('boom')", T).await;
    assert_eq!(r.exit_code, 1);
    assert!(
        text(&r.stderr).starts_with("Uncaught TypeError: boom"),
        "{}",
        text(&r.stderr)
    );
}

#[tokio::test]
async fn an_endless_loop_ends_at_the_deadline() {
    let r = js(&provider(), "for (;;) {}", Duration::from_millis(300)).await;
    assert!(r.timed_out);
    assert_eq!(r.exit_code, 124);
    assert!(
        text(&r.stderr).contains("deadline (300 ms)"),
        "{}",
        text(&r.stderr)
    );
}

#[tokio::test]
async fn memory_and_stack_limits_end_the_snippet_with_a_clear_error() {
    let p = provider_with(|c| c.memory_mb = 16);
    let r = js(
        &p,
        "const a = []; for (;;) a.push(new Array(100000).fill(1));",
        T,
    )
    .await;
    assert_eq!(r.exit_code, 1);
    let err = text(&r.stderr);
    assert!(err.contains("out of memory"), "{err}");
    assert!(err.contains("limit is 16 MiB (SANDBOX_MEMORY_MB)"), "{err}");

    let r = js(&p, "function f(n) { return f(n + 1) + 1 } f(0)", T).await;
    assert_eq!(r.exit_code, 1);
    let err = text(&r.stderr);
    assert!(err.contains("recursion too deep"), "{err}");
    // The provider goes on serving.
    let r = js(&p, "console.log('still here')", T).await;
    assert_eq!(text(&r.stdout), "still here\n");
}

#[tokio::test]
async fn no_host_api_is_reachable() {
    let r = js(
        &provider(),
        "console.log([typeof require, typeof process, typeof fetch, typeof std, typeof os, \
         typeof setTimeout, typeof XMLHttpRequest, typeof WebAssembly].join(' '));\
         import('os').then(() => console.log('IMPORTED'), e => console.log('import refused:', e.message));",
        T,
    )
    .await;
    let out = text(&r.stdout);
    assert!(out.starts_with(&"undefined ".repeat(7)), "{out}");
    assert!(out.contains("import refused:"), "{out}");
    assert!(!out.contains("IMPORTED"), "{out}");
}

#[tokio::test]
async fn output_is_capped_per_stream() {
    let p = provider_with(|c| c.output_bytes = 1000);
    let r = js(
        &p,
        "for (let i = 0; i < 100; i++) { console.log('x'.repeat(99)); console.error('y'.repeat(99)); }",
        T,
    )
    .await;
    assert_eq!(r.stdout.len(), 1000);
    assert!(r.stdout_truncated && r.stderr_truncated);
    assert_eq!(r.stderr.len(), 1000);
    let r = js(&p, "console.log('short')", T).await;
    assert!(!r.stdout_truncated);
}

#[tokio::test]
async fn projects_are_refused_as_unsupported() {
    let e = provider()
        .run(Work::Project(pb::ProjectRun::default()), T)
        .await
        .unwrap_err();
    let ProviderError::Refused(r) = e else {
        panic!("{e:?}")
    };
    assert_eq!(r.reason, Reason::Unsupported);
}

/// The `Seccomp:` and `NoNewPrivs:` lines of a process, once the filter is in place.
fn lock_down_lines(pid: u32) -> Option<(String, String)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_owned())
    };
    Some((line("Seccomp:")?, line("NoNewPrivs:")?))
}

#[test]
fn the_worker_runs_under_seccomp_with_no_new_privileges() {
    let mut child = Command::new(worker())
        .env_clear()
        .env("TZ", "UTC")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let req = Request {
        code: "for (;;) {}".into(),
        memory_bytes: 64 << 20,
        stack_bytes: 1 << 20,
        timeout_ms: 30_000,
        output_bytes: 1024,
        list_descriptors: false,
    };
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&serde_json::to_vec(&req).unwrap()).unwrap();
    drop(stdin);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = None;
    while Instant::now() < deadline {
        match lock_down_lines(child.id()) {
            Some((mode, nnp)) if mode == "2" => {
                seen = Some((mode, nnp));
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let (mode, nnp) = seen.expect("the worker never showed a seccomp filter (Seccomp: 2)");
    assert_eq!(mode, "2");
    assert_eq!(nnp, "1");
}

/// Workers started with `marker` as their argument (the worker binary ignores arguments),
/// so tests running beside this one are never mistaken for it.
fn workers_marked(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            cmdline
                .split(|b| *b == 0)
                .any(|a| a == marker.as_bytes())
                .then_some(pid)
        })
        .collect()
}

#[tokio::test]
async fn a_worker_killed_mid_run_is_an_error_that_may_have_run() {
    let marker = format!("--test-marker-{}", std::process::id());
    let p = std::sync::Arc::new(provider_with(|c| {
        c.worker.args = vec![marker.clone().into()]
    }));
    let run = {
        let p = p.clone();
        tokio::spawn(async move {
            p.run(
                Work::Javascript(pb::JavaScriptRun {
                    code: "for (;;) {}".into(),
                    grant_profile: String::new(),
                }),
                Duration::from_secs(20),
            )
            .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid = loop {
        if let Some(pid) = workers_marked(&marker).first() {
            break *pid;
        }
        assert!(Instant::now() < deadline, "no worker started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = run.await.unwrap();
    match out {
        Err(ProviderError::Failed(m)) => {
            assert!(m.contains("signal 9") && m.contains("may have run"), "{m}")
        }
        other => panic!("expected an unmarked failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_long_builtin_past_the_deadline_is_still_timed_out() {
    // One built-in call runs long between two interrupt checks; whether the worker comes
    // back by itself or is killed, the answer is a timeout, never an error or a success.
    let r = js(
        &provider(),
        "console.log('a'.repeat(3e7).indexOf('a'.repeat(1e4) + 'b'))",
        Duration::from_millis(300),
    )
    .await;
    assert!(r.timed_out, "{}", text(&r.stderr));
    assert_eq!(r.exit_code, 124);
}

#[tokio::test]
async fn thrown_values_rejections_and_lone_surrogates_are_reported_plainly() {
    let p = provider();
    for (code, want) in [
        ("throw 42", "Uncaught 42"),
        ("throw null", "Uncaught null"),
        ("throw Symbol('s')", "Uncaught Symbol(s)"),
        ("throw {toString() { return 'custom' }}", "Uncaught custom"),
        (
            "Promise.reject(new Error('rej'))",
            "Uncaught (in promise) Error: rej",
        ),
        (
            "(async () => { await null; throw new Error('later') })()",
            "Uncaught (in promise) Error: later",
        ),
    ] {
        let r = js(&p, code, T).await;
        assert_eq!(r.exit_code, 1, "{code}: {}", text(&r.stderr));
        assert!(
            text(&r.stderr).starts_with(want),
            "{code}: {}",
            text(&r.stderr)
        );
    }
    // A rejection handled later is not reported.
    let r = js(
        &p,
        "const q = Promise.reject(1); q.catch(() => console.log('caught'))",
        T,
    )
    .await;
    assert_eq!(
        (r.exit_code, text(&r.stdout)),
        (0, "caught\n".to_owned()),
        "{}",
        text(&r.stderr)
    );
    let r = js(&p, "console.log('a\\uD800b')", T).await;
    assert_eq!(r.exit_code, 0, "{}", text(&r.stderr));
    assert_eq!(text(&r.stdout), "a\u{FFFD}b\n");
}
