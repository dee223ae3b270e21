//! The session conformance suite (`plimsoll_testkit::sessions`) on the Docker provider:
//! one in-process plimsolld with sessions on (its startup session smoke test included), the
//! real engine and the sandbox image, every check of the suite in turn, under runc and
//! under runsc (`PLIMSOLL_TEST_DOCKER_RUNTIME=runsc`). With a wall (`container` or
//! `kernel`), two sessions must not reach each other's files by path.

#[macro_use]
mod support;

use plimsoll_client::{Client, ClientOptions};
use plimsoll_testkit::daemon::Setup;
use plimsoll_testkit::sessions as suite;
use support::IMAGE;

#[tokio::test]
async fn the_conformance_suite_passes_on_docker() {
    let _engine = need_engine!();
    let setup = Setup::tester();
    let runtime = support::runtime();
    let daemon = setup
        .start(&[
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_IMAGE", IMAGE),
            ("SANDBOX_DOCKER_RUNTIME", runtime.as_str()),
            ("SANDBOX_MAX_SESSIONS", "4"),
            ("SANDBOX_MAX_SESSIONS_PER_CALLER", "4"),
            ("SANDBOX_MAX_CONCURRENT", "4"),
        ])
        .await;
    let mut c = Client::connect(
        &format!("http://{}", daemon.rpc_addr()),
        ClientOptions {
            token: Some(setup.token(0).to_owned()),
            ca_file: None,
        },
    )
    .await
    .expect("connect");
    suite::files_persist_between_a_snippet_and_a_project(&mut c).await;
    suite::two_sessions_cannot_see_each_other(&mut c, true).await;
    suite::no_leftover_process_reaches_the_next_call(&mut c).await;
    suite::a_deadline_ends_the_call_not_the_session(&mut c).await;
    suite::held_open_output_still_returns(&mut c).await;
    suite::a_floor_above_the_tier_is_refused(&mut c, support::tier()).await;
    suite::close_and_lifetime_end_the_session(&mut c).await;
    suite::cells_keep_state_in_both_languages(&mut c).await;
    suite::a_killed_interpreter_reports_fresh(&mut c).await;
    daemon.shutdown().await;
}
