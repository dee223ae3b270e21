//! The bwrap provider against the real bubblewrap: startup proof, languages, and the
//! hardening suite the Docker provider passes, from inside a run.

mod support;

use plimsoll_core::Tier;
use plimsoll_provider::Provider;
use support::*;

#[tokio::test]
async fn javascript_python_and_shell_run_in_a_sandbox_proven_container() {
    let Some(_) = bwrap() else { return };
    let (_d, state) = state_dir();
    let p = started(config(&state)).await;
    let f = p.facts();
    assert_eq!(f.tier, Some(Tier::Container));
    assert_eq!(f.languages, ["javascript", "python", "shell"]);
    assert!(f.environment.starts_with("bwrap:0."), "{}", f.environment);
    assert!(
        f.environment.contains(";seccomp=sha256:"),
        "{}",
        f.environment
    );
    let j = as_js(p.run(js("console.log(6 * 7)"), T).await.unwrap());
    assert_eq!(j.stdout, b"42\n", "{j:?}");
    let r = as_project(
        p.run(
            project(&["python3 -c 'print(6*7)'", "echo $((6*7))", "hostname"]),
            T,
        )
        .await
        .unwrap(),
    );
    assert_eq!(stdout(&r, 0), "42");
    assert_eq!(stdout(&r, 1), "42");
    assert_eq!(stdout(&r, 2), "plimsoll");
    p.shutdown().await;
}
