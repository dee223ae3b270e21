//! The session conformance suite (`plimsoll_testkit::sessions`) on the agentsandbox
//! provider: an in-process plimsolld with sessions on, against the fake cluster whose pods
//! are real terminators and sandboxds started with `--session`; every session holds one
//! claim, and deletes it at its end. Also: with sessions on, a template without
//! `--session` is refused at startup.

use plimsoll_client::{Client, ClientOptions};
use plimsoll_core::Tier;
use plimsoll_daemon::{start, Config};
use plimsoll_testkit::daemon::{config_from, Setup as Callers};
use plimsoll_testkit::fake_cluster::{self as fake, FakeCluster, FakeClusterOptions};
use plimsoll_testkit::sessions as suite;

fn config(cluster: &FakeCluster, callers: &Callers) -> Config {
    let mut pairs = callers.pairs(&[]);
    pairs.extend(cluster.env_pairs());
    pairs.push(("SANDBOX_MAX_SESSIONS".into(), "8".into()));
    // The suite opens several sessions as one caller.
    pairs.push(("SANDBOX_MAX_SESSIONS_PER_CALLER".into(), "8".into()));
    let mut cfg = config_from(&pairs).expect("the test configuration");
    // Test hook: the fake pods listen on another port than 9090.
    let plimsoll_daemon::ProviderConfig::AgentSandbox(a) = &mut cfg.provider else {
        panic!("not the agentsandbox provider")
    };
    a.sandboxd_port = cluster.pod_port();
    cfg
}

/// Runs one check of the suite against a fresh fake cluster and daemon, then checks that
/// every claim the sessions made is gone.
async fn check(f: impl AsyncFnOnce(&mut Client)) {
    let mut opts = FakeClusterOptions::sessions(fake::sandboxd_binaries().unwrap());
    opts.warm = 2;
    let cluster = FakeCluster::start(opts).await.unwrap();
    let callers = Callers::tester();
    let daemon = start(config(&cluster, &callers))
        .await
        .expect("the daemon starts");
    let mut c = Client::connect(
        &format!("http://{}", daemon.rpc_addr()),
        ClientOptions {
            token: Some(callers.token(0).to_owned()),
            ca_file: None,
        },
    )
    .await
    .expect("connect");
    f(&mut c).await;
    daemon.shutdown().await;
    // Deletes are sent in the background by a dropped guard; give them a moment.
    for _ in 0..100 {
        if cluster.counts().live == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let counts = cluster.counts();
    assert_eq!(counts.live, 0, "claims left behind: {counts:?}");
}

#[tokio::test]
async fn files_persist_between_a_snippet_and_a_project() {
    check(suite::files_persist_between_a_snippet_and_a_project).await;
}

#[tokio::test]
async fn two_sessions_cannot_see_each_other() {
    // Each pod has its own root directory; with a user of its own per pod (tests run as
    // root), one session cannot read another's files by path either.
    let strict = fake::run_user().is_some();
    check(async |c| suite::two_sessions_cannot_see_each_other(c, strict).await).await;
}

#[tokio::test]
async fn no_leftover_process_reaches_the_next_call() {
    check(suite::no_leftover_process_reaches_the_next_call).await;
}

#[tokio::test]
async fn a_deadline_ends_the_call_not_the_session() {
    check(suite::a_deadline_ends_the_call_not_the_session).await;
}

#[tokio::test]
async fn held_open_output_still_returns() {
    check(suite::held_open_output_still_returns).await;
}

#[tokio::test]
async fn a_floor_above_the_tier_is_refused() {
    check(async |c| suite::a_floor_above_the_tier_is_refused(c, Tier::Kernel).await).await;
}

#[tokio::test]
async fn close_and_lifetime_end_the_session() {
    check(suite::close_and_lifetime_end_the_session).await;
}

#[tokio::test]
async fn cells_keep_state_in_both_languages() {
    check(suite::cells_keep_state_in_both_languages).await;
}

#[tokio::test]
async fn a_killed_interpreter_reports_fresh() {
    check(suite::a_killed_interpreter_reports_fresh).await;
}

#[tokio::test]
async fn with_sessions_on_a_template_without_session_is_refused() {
    let cluster = FakeCluster::start(FakeClusterOptions::conforming(
        fake::sandboxd_binaries().unwrap(),
    ))
    .await
    .unwrap();
    let callers = Callers::tester();
    let err = start(config(&cluster, &callers))
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    // The read-back names it, before any pod is claimed.
    assert!(text.contains("[session]"), "{text}");
    assert_eq!(cluster.counts().created, 0, "a claim was made: {text}");
}
