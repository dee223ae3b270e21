//! The runner against real processes: node, sh, python3, real files under a temp root.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;

use common::is_dead;
use plimsoll_core::pb;
use plimsoll_runner::{
    processes_with_tag, EnvRefused, Limits, RunEnv, Runner, RunnerConfig, TIMED_OUT_DETAIL,
};

const COMPLETED: i32 = pb::ProjectOutcome::Completed as i32;
const SETUP_FAILED: i32 = pb::ProjectOutcome::SetupFailed as i32;
const TIMED_OUT: i32 = pb::ProjectOutcome::TimedOut as i32;

fn runner_with(limits: Limits) -> (tempfile::TempDir, Runner) {
    let root = tempfile::tempdir().unwrap();
    let runner = Runner::new(RunnerConfig {
        root_dir: root.path().join("runs"),
        limits,
        default_timeout: Duration::from_secs(30),
    })
    .unwrap();
    (root, runner)
}

fn runner() -> (tempfile::TempDir, Runner) {
    runner_with(Limits::default())
}

fn js(code: &str) -> pb::JavaScriptRun {
    pb::JavaScriptRun {
        code: code.into(),
        grant_profile: String::new(),
    }
}

fn project(files: &[(&str, &str)], steps: &[&str], artifacts: &[&str]) -> pb::ProjectRun {
    pb::ProjectRun {
        files: files
            .iter()
            .map(|(p, c)| pb::ProjectFile {
                path: (*p).into(),
                content: (*c).into(),
            })
            .collect(),
        steps: steps.iter().map(|s| (*s).into()).collect(),
        artifacts: artifacts.iter().map(|s| (*s).into()).collect(),
        grant_profile: String::new(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn runs_dir_is_empty(r: &Runner) -> bool {
    std::fs::read_dir(&r.config().root_dir).unwrap().count() == 0
}

/// Waits (bounded) until `path` holds a line, and returns it.
async fn wait_for_line(path: &Path) -> String {
    for _ in 0..1000 {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s.trim().to_owned();
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never got a line", path.display());
}

#[tokio::test]
async fn javascript_hello() {
    let (_root, r) = runner();
    let res = r
        .javascript(
            &js("console.log('hello'); console.error('to stderr')"),
            Duration::from_secs(20),
            &RunEnv::default(),
        )
        .await
        .unwrap();
    assert_eq!(text(&res.stdout), "hello\n");
    assert_eq!(text(&res.stderr), "to stderr\n");
    assert_eq!(res.exit_code, 0);
    assert!(!res.timed_out && !res.stdout_truncated && !res.stderr_truncated);
    assert!(runs_dir_is_empty(&r));
}

#[tokio::test]
async fn javascript_nonzero_exit_is_a_result() {
    let (_root, r) = runner();
    let res = r
        .javascript(
            &js("process.stdout.write('before'); process.exit(3)"),
            Duration::from_secs(20),
            &RunEnv::default(),
        )
        .await
        .unwrap();
    assert_eq!(res.exit_code, 3);
    assert_eq!(text(&res.stdout), "before");
    assert!(!res.timed_out);

    let thrown = r
        .javascript(
            &js("throw new Error('boom')"),
            Duration::from_secs(20),
            &RunEnv::default(),
        )
        .await
        .unwrap();
    assert_eq!(thrown.exit_code, 1);
    assert!(text(&thrown.stderr).contains("boom"));
}

#[tokio::test]
async fn javascript_deadline_gives_124_and_kills_it() {
    let (_root, r) = runner();
    let res = r
        .javascript(
            &js("console.log(process.env.PLIMSOLL_RUN_TAG); for (;;) {}"),
            Duration::from_millis(1500),
            &RunEnv::default(),
        )
        .await
        .unwrap();
    assert!(res.timed_out);
    assert_eq!(res.exit_code, 124);
    let tag = text(&res.stdout).trim().to_owned();
    assert_eq!(tag.len(), 32, "the tag reached the program: {tag:?}");
    assert!(processes_with_tag(&tag).is_empty());
    assert!(runs_dir_is_empty(&r));
}

#[tokio::test]
async fn project_files_steps_and_artifact() {
    let (_root, r) = runner();
    let p = project(
        &[("src/a.txt", "alpha"), ("tools/b.sh", "echo beta-$1\n")],
        &[
            "cat src/a.txt",
            "mkdir -p out && sh tools/b.sh 7 > out/result.txt && echo built >&2",
        ],
        &["out/result.txt", "src/a.txt"],
    );
    let res = r
        .project(&p, Duration::from_secs(20), &RunEnv::default())
        .await
        .unwrap();
    assert_eq!(res.outcome, COMPLETED, "{}", res.outcome_detail);
    assert_eq!(res.steps.len(), 2);
    assert_eq!(res.steps[0].command, "cat src/a.txt");
    assert_eq!(text(&res.steps[0].stdout), "alpha");
    assert_eq!(res.steps[0].exit_code, 0);
    assert_eq!(text(&res.steps[1].stderr), "built\n");
    assert_eq!(res.steps[1].exit_code, 0);
    assert!(res.steps.iter().all(|s| !s.timed_out && s.duration_ms >= 0));
    let arts: Vec<(&str, String)> = res
        .artifacts
        .iter()
        .map(|a| (a.path.as_str(), text(&a.content)))
        .collect();
    assert_eq!(
        arts,
        [
            ("out/result.txt", "beta-7\n".to_owned()),
            ("src/a.txt", "alpha".to_owned())
        ]
    );
    assert!(!res.artifacts_truncated);
    assert!(runs_dir_is_empty(&r));
}

#[tokio::test]
async fn stops_at_the_first_failing_step() {
    let (_root, r) = runner();
    let p = project(
        &[],
        &["echo one", "echo two; exit 7", "touch ran-third"],
        &["ran-third"],
    );
    let res = r
        .project(&p, Duration::from_secs(20), &RunEnv::default())
        .await
        .unwrap();
    assert_eq!(res.outcome, COMPLETED);
    assert_eq!(res.steps.len(), 2);
    assert_eq!(res.steps[1].exit_code, 7);
    assert_eq!(text(&res.steps[1].stdout), "two\n");
    // The third step never ran, so its artifact is missing and skipped.
    assert!(res.artifacts.is_empty());
    assert!(!res.artifacts_truncated);
}

#[tokio::test]
async fn the_deadline_is_shared_by_all_steps() {
    let (_root, r) = runner();
    let p = project(&[], &["sleep 0.8", "sleep 0.8", "sleep 0.8"], &[]);
    let res = r
        .project(&p, Duration::from_millis(1200), &RunEnv::default())
        .await
        .unwrap();
    assert_eq!(res.outcome, TIMED_OUT);
    assert_eq!(res.outcome_detail, TIMED_OUT_DETAIL);
    assert!(
        res.steps.len() < 3,
        "each step alone fits; together they do not"
    );
    let last = res.steps.last().unwrap();
    assert!(last.timed_out);
    assert_eq!(last.exit_code, 124);
}

/// Runs a project in the background whose first step writes its tag to `marker`; returns the
/// tag once processes carrying it are seen alive, and the finished result.
async fn run_and_watch(
    r: std::sync::Arc<Runner>,
    step: String,
    marker: PathBuf,
    timeout: Duration,
    min_alive: usize,
) -> (String, pb::ProjectResult) {
    let p = project(&[], &[&step], &[]);
    let task =
        tokio::spawn(async move { r.project(&p, timeout, &RunEnv::default()).await.unwrap() });
    let tag = wait_for_line(&marker).await;
    // The scan sees the run's processes while they live (so the final check can fail).
    let mut seen = 0;
    for _ in 0..500 {
        seen = processes_with_tag(&tag).len();
        if seen >= min_alive {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        seen >= min_alive,
        "saw {seen} tagged processes, wanted {min_alive}"
    );
    let res = task.await.unwrap();
    (tag, res)
}

#[tokio::test]
async fn deadline_kills_a_step_with_its_sleeping_child() {
    let (root, r) = runner();
    let r = std::sync::Arc::new(r);
    let marker = root.path().join("tag");
    let step = format!(
        "echo $PLIMSOLL_RUN_TAG > {}; sleep 300 & sleep 300",
        marker.display()
    );
    let (tag, res) = run_and_watch(r.clone(), step, marker, Duration::from_secs(2), 3).await;
    assert_eq!(res.outcome, TIMED_OUT);
    assert_eq!(res.outcome_detail, TIMED_OUT_DETAIL);
    assert!(res.steps[0].timed_out);
    assert_eq!(res.steps[0].exit_code, 124);
    assert!(processes_with_tag(&tag).is_empty());
    assert!(runs_dir_is_empty(&r));
}

#[tokio::test]
async fn deadline_kills_a_setsid_double_fork() {
    let (root, r) = runner();
    let r = std::sync::Arc::new(r);
    let marker = root.path().join("tag");
    let grandchild = root.path().join("grandchild");
    let step_pid = root.path().join("step");
    // A real double fork: the subshell starts `setsid` in the background and exits at once,
    // so the grandchild leads a new session and its parent is gone (it is reparented away
    // from the step's tree). It writes its pid, then becomes `sleep`.
    let step = format!(
        "echo $$ > {step}; (setsid sh -c 'echo $$ > {gc}; exec sleep 300' &); \
         echo $PLIMSOLL_RUN_TAG > {tag}; sleep 300",
        step = step_pid.display(),
        gc = grandchild.display(),
        tag = marker.display(),
    );
    let watch = tokio::spawn(run_and_watch(
        r.clone(),
        step,
        marker,
        Duration::from_secs(3),
        3,
    ));
    let gc: i32 = wait_for_line(&grandchild).await.parse().unwrap();
    let step: i32 = wait_for_line(&step_pid).await.parse().unwrap();
    // What makes it a double fork, seen while it lives: its own session and group, and a
    // parent that is not the step (the subshell between them has exited).
    let mut stat = None;
    for _ in 0..500 {
        let s = std::fs::read_to_string(format!("/proc/{gc}/stat")).unwrap();
        let fields: Vec<i32> = s[s.rfind(')').unwrap() + 2..]
            .split_whitespace()
            .skip(1)
            .take(3)
            .map(|f| f.parse().unwrap())
            .collect();
        // ppid, pgrp, session; the subshell may still be exiting on the first reads.
        if fields[0] != step
            && std::fs::read_to_string(format!("/proc/{gc}/comm")).unwrap() == "sleep\n"
        {
            stat = Some(fields);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stat = stat.expect("the grandchild was never orphaned into sleep");
    assert_eq!(
        (stat[1], stat[2]),
        (gc, gc),
        "not its own session: {stat:?}"
    );
    assert!(!is_dead(gc));

    let (tag, res) = watch.await.unwrap();
    assert_eq!(res.outcome, TIMED_OUT);
    assert!(res.steps[0].timed_out);
    assert!(
        is_dead(gc),
        "the double-forked grandchild {gc} survived the run"
    );
    assert!(processes_with_tag(&tag).is_empty());
    assert!(runs_dir_is_empty(&r));
}

#[tokio::test]
async fn background_children_do_not_survive_a_successful_run() {
    let (_root, r) = runner();
    let p = project(
        &[],
        &[
            // A plain background child holding the pipes, one in a new session with its
            // output elsewhere, and one that drops the tag from its environment.
            "sleep 300 & echo $! > plain.pid; \
             setsid sh -c 'sleep 300' >/dev/null 2>&1 & \
             env -i /bin/sleep 300 >/dev/null 2>&1 & echo $! > untagged.pid; \
             echo $PLIMSOLL_RUN_TAG",
            "kill -0 $(cat plain.pid) && kill -0 $(cat untagged.pid) && echo alive",
        ],
        &["plain.pid", "untagged.pid"],
    );
    let res = r
        .project(&p, Duration::from_secs(20), &RunEnv::default())
        .await
        .unwrap();
    assert_eq!(res.outcome, COMPLETED, "{}", res.outcome_detail);
    assert_eq!(res.steps.len(), 2);
    assert_eq!(res.steps[0].exit_code, 0);
    assert!(!res.steps[0].timed_out);
    // The background children outlived their step.
    assert_eq!(text(&res.steps[1].stdout), "alive\n");
    let tag = text(&res.steps[0].stdout).trim().to_owned();
    assert_eq!(tag.len(), 32);
    assert!(processes_with_tag(&tag).is_empty());
    for a in &res.artifacts {
        let pid: i32 = text(&a.content).trim().parse().unwrap();
        assert!(is_dead(pid), "{} {pid} survived the run", a.path);
    }
    assert_eq!(res.artifacts.len(), 2);
    assert!(runs_dir_is_empty(&r));
}

#[tokio::test]
async fn a_dropped_run_still_kills_and_cleans_up() {
    let (root, r) = runner();
    let r = std::sync::Arc::new(r);
    let marker = root.path().join("tag");
    let p = project(
        &[],
        &[&format!(
            "echo $PLIMSOLL_RUN_TAG > {}; sleep 300 & sleep 300",
            marker.display()
        )],
        &[],
    );
    let r2 = r.clone();
    let task = tokio::spawn(async move {
        r2.project(&p, Duration::from_secs(60), &RunEnv::default())
            .await
    });
    let tag = wait_for_line(&marker).await;
    for _ in 0..500 {
        if processes_with_tag(&tag).len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!processes_with_tag(&tag).is_empty());
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert!(processes_with_tag(&tag).is_empty());
    assert!(runs_dir_is_empty(&r));
}

#[tokio::test]
async fn output_caps_truncate_without_hanging() {
    let mib = 1024 * 1024;
    let (_root, r) = runner_with(Limits {
        output_bytes: mib,
        artifact_bytes: mib,
    });
    let p = project(
        &[],
        &["head -c 5242880 /dev/zero; head -c 10 /dev/zero >&2"],
        &[],
    );
    let res = r
        .project(&p, Duration::from_secs(60), &RunEnv::default())
        .await
        .unwrap();
    let s = &res.steps[0];
    assert_eq!(s.exit_code, 0);
    assert!(!s.timed_out);
    assert_eq!(s.stdout.len(), mib);
    assert!(s.stdout_truncated);
    assert_eq!(s.stderr.len(), 10);
    assert!(!s.stderr_truncated);

    let res = r
        .javascript(
            &js("process.stdout.write('x'.repeat(5 * 1024 * 1024)); process.stderr.write('y'.repeat(5 * 1024 * 1024))"),
            Duration::from_secs(60),
            &RunEnv::default(),
        )
        .await
        .unwrap();
    assert_eq!(res.exit_code, 0);
    assert!(!res.timed_out);
    assert_eq!(res.stdout.len(), mib);
    assert!(res.stdout.iter().all(|b| *b == b'x'));
    assert!(res.stdout_truncated);
    assert_eq!(res.stderr.len(), mib);
    assert!(res.stderr_truncated);
}

#[tokio::test]
async fn file_path_escapes_are_refused_and_nothing_runs() {
    let (root, r) = runner();
    let marker = root.path().join("ran");
    let step = format!("touch {}", marker.display());
    for bad in [
        "/tmp/plimsoll-escape",
        "../escape",
        "a/../../escape",
        "a//b",
    ] {
        let p = project(&[("ok.txt", "fine"), (bad, "x")], &[&step], &[]);
        let res = r
            .project(&p, Duration::from_secs(20), &RunEnv::default())
            .await
            .unwrap();
        assert_eq!(res.outcome, SETUP_FAILED, "{bad}");
        assert!(
            res.outcome_detail.contains(&format!("{bad:?}")),
            "{bad}: {}",
            res.outcome_detail
        );
        assert!(res.steps.is_empty());
    }
    assert!(!marker.exists(), "a step ran after a refused path");
    assert!(!root.path().join("escape").exists());
    assert!(runs_dir_is_empty(&r));
}

#[tokio::test]
async fn artifact_escapes_are_refused_and_steps_kept() {
    let (_root, r) = runner();
    for (step, artifact) in [
        ("ln -s /etc/hostname out", "out"),
        ("ln -s /etc d", "d/hostname"),
        ("ln -s /nonexistent/file dangling", "dangling"),
        ("ln -s ../../.. up", "up/etc/hostname"),
        ("true", "../x"),
        ("true", "/etc/hostname"),
    ] {
        let p = project(&[("keep.txt", "k")], &[step], &["keep.txt", artifact]);
        let res = r
            .project(&p, Duration::from_secs(20), &RunEnv::default())
            .await
            .unwrap();
        assert_eq!(res.outcome, SETUP_FAILED, "{artifact}");
        assert!(
            res.outcome_detail.contains(&format!("{artifact:?}")),
            "{artifact}: {}",
            res.outcome_detail
        );
        assert_eq!(res.steps.len(), 1);
        assert_eq!(res.steps[0].exit_code, 0, "{step}");
        assert!(res.artifacts.is_empty());
    }
    // A link that stays inside the working directory is followed.
    let p = project(&[("real.txt", "r")], &["ln -s real.txt inner"], &["inner"]);
    let res = r
        .project(&p, Duration::from_secs(20), &RunEnv::default())
        .await
        .unwrap();
    assert_eq!(res.outcome, COMPLETED, "{}", res.outcome_detail);
    assert_eq!(res.artifacts[0].content, b"r");
}

#[tokio::test]
async fn artifact_cap_sets_truncated() {
    let (_root, r) = runner_with(Limits {
        output_bytes: 1024,
        artifact_bytes: 10,
    });
    let p = project(
        &[("a", "12345678"), ("b", "12345678"), ("c", "12")],
        &["true"],
        &["a", "b", "c"],
    );
    let res = r
        .project(&p, Duration::from_secs(20), &RunEnv::default())
        .await
        .unwrap();
    assert_eq!(res.outcome, COMPLETED);
    assert!(res.artifacts_truncated);
    let names: Vec<&str> = res.artifacts.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(names, ["a", "c"]);
    let total: usize = res.artifacts.iter().map(|a| a.content.len()).sum();
    assert!(total <= 10);
}

#[test]
fn run_env_refuses_each_dangerous_name() {
    for name in [
        "PATH",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "LD_AUDIT",
        "ld_preload",
        "NODE_OPTIONS",
        "NODE_PATH",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONHOME",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "PERL5LIB",
        "PERL5OPT",
        "RUBYOPT",
        "RUBYLIB",
        "GCONV_PATH",
        "DYLD_INSERT_LIBRARIES",
        "DYLD_LIBRARY_PATH",
        "BASH_FUNC_ls%%",
        "npm_config_script_shell",
        "PLIMSOLL_RUN_TAG",
        "HOME",
        "",
        "A=B",
        "A\0B",
    ] {
        let got = RunEnv::new(vec![
            ("HARMLESS".into(), "1".into()),
            (name.into(), "x".into()),
        ]);
        assert_eq!(
            got,
            Err(EnvRefused {
                name: name.to_owned()
            }),
            "{name:?}"
        );
    }
    assert!(RunEnv::new(vec![("GOOD".into(), "nul\0inside".into())]).is_err());
    let ok = RunEnv::new(vec![("PLIMSOLL_GRANT_RELAY".into(), "127.0.0.1:1".into())]).unwrap();
    assert_eq!(ok.vars()[0].0, "PLIMSOLL_GRANT_RELAY");
}

#[tokio::test]
async fn programs_get_the_clean_environment_only() {
    // The test process itself runs under cargo, which sets CARGO_PKG_NAME, and has a HOME.
    assert!(std::env::var_os("CARGO_PKG_NAME").is_some());
    let my_home = std::env::var("HOME").ok();
    let (_root, r) = runner();
    let env = RunEnv::new(vec![("PLIMSOLL_EXTRA".into(), "from-runenv".into())]).unwrap();
    let p = project(&[], &["env"], &[]);
    let res = r.project(&p, Duration::from_secs(20), &env).await.unwrap();
    let out = text(&res.steps[0].stdout);
    let vars: Vec<(&str, &str)> = out.lines().filter_map(|l| l.split_once('=')).collect();
    let names: std::collections::BTreeSet<&str> = vars.iter().map(|(n, _)| *n).collect();
    let expected: std::collections::BTreeSet<&str> = [
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "PLIMSOLL_RUN_TAG",
        "PLIMSOLL_EXTRA",
        "PWD", // set by sh itself
    ]
    .into_iter()
    .collect();
    assert_eq!(names, expected, "{out}");
    let get = |n: &str| vars.iter().find(|(k, _)| *k == n).unwrap().1;
    assert_eq!(get("PATH"), plimsoll_runner::FIXED_PATH);
    assert_eq!(get("LANG"), "C.UTF-8");
    assert_eq!(get("PLIMSOLL_EXTRA"), "from-runenv");
    let home = get("HOME");
    assert_ne!(Some(home), my_home.as_deref());
    assert!(home.starts_with(
        r.config()
            .root_dir
            .canonicalize()
            .unwrap()
            .to_str()
            .unwrap()
    ));
    assert_eq!(get("TMPDIR"), format!("{home}/.tmp"));
    assert!(!out.contains("CARGO"));
}

#[tokio::test]
async fn the_working_dir_is_removed_after_the_run() {
    let (_root, r) = runner();
    let p = project(
        &[("f", "x")],
        &["pwd", "mkdir -p deep/er && chmod 000 deep"],
        &[],
    );
    let res = r
        .project(&p, Duration::from_secs(20), &RunEnv::default())
        .await
        .unwrap();
    let wd = PathBuf::from(text(&res.steps[0].stdout).trim());
    assert!(wd.starts_with(r.config().root_dir.canonicalize().unwrap()));
    assert!(!wd.exists());
    assert!(runs_dir_is_empty(&r));

    let res = r
        .javascript(
            &js("console.log(process.cwd())"),
            Duration::from_secs(20),
            &RunEnv::default(),
        )
        .await
        .unwrap();
    let wd = PathBuf::from(text(&res.stdout).trim());
    assert!(wd.starts_with(r.config().root_dir.canonicalize().unwrap()));
    assert!(!wd.exists());
}

#[tokio::test]
async fn prove_languages_finds_node_python_and_sh() {
    let (_root, r) = runner();
    assert_eq!(r.prove_languages().await, ["javascript", "python", "shell"]);
    assert!(runs_dir_is_empty(&r));
}
