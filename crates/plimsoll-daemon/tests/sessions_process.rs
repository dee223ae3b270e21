//! The session conformance suite (`plimsoll_testkit::sessions`) on the process provider:
//! an in-process daemon with `SANDBOX_MAX_SESSIONS` on, real `sh`, `node` and `python3`.

use plimsoll_client::{Client, ClientOptions};
use plimsoll_core::Tier;
use plimsoll_daemon::RunningDaemon;
use plimsoll_testkit::daemon::Setup;
use plimsoll_testkit::sessions as suite;

async fn daemon() -> (RunningDaemon, Client, Setup) {
    let setup = Setup::tester();
    let daemon = setup
        .start(&[
            ("SANDBOX_MAX_SESSIONS", "8"),
            ("SANDBOX_MAX_SESSIONS_PER_CALLER", "8"),
            ("SANDBOX_MAX_CONCURRENT", "8"),
        ])
        .await;
    let client = Client::connect(
        &format!("http://{}", daemon.rpc_addr()),
        ClientOptions {
            token: Some(setup.token(0).to_owned()),
            ca_file: None,
        },
    )
    .await
    .expect("connect");
    (daemon, client, setup)
}

/// Runs one check of the suite against a fresh daemon, then stops it.
async fn check(f: impl AsyncFnOnce(&mut Client)) {
    let (daemon, mut c, _setup) = daemon().await;
    f(&mut c).await;
    daemon.shutdown().await;
}

#[tokio::test]
async fn files_persist_between_a_snippet_and_a_project() {
    check(suite::files_persist_between_a_snippet_and_a_project).await;
}

#[tokio::test]
async fn two_sessions_do_not_share_a_working_directory() {
    check(async |c| suite::two_sessions_cannot_see_each_other(c, false).await).await;
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
    check(async |c| suite::a_floor_above_the_tier_is_refused(c, Tier::Process).await).await;
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
async fn a_lost_answer_is_unanswered_and_the_session_goes_on() {
    check(suite::a_lost_answer_is_unanswered_and_the_session_goes_on).await;
}
