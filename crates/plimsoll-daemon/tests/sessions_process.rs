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

macro_rules! conformance {
    ($($name:ident => $check:path $(, $arg:expr)*;)*) => {$(
        #[tokio::test]
        async fn $name() {
            let (daemon, mut c, _setup) = daemon().await;
            $check(&mut c $(, $arg)*).await;
            daemon.shutdown().await;
        }
    )*};
}

conformance! {
    files_persist_between_a_snippet_and_a_project => suite::files_persist_between_a_snippet_and_a_project;
    two_sessions_do_not_share_a_working_directory => suite::two_sessions_cannot_see_each_other, false;
    no_leftover_process_reaches_the_next_call => suite::no_leftover_process_reaches_the_next_call;
    a_deadline_ends_the_call_not_the_session => suite::a_deadline_ends_the_call_not_the_session;
    held_open_output_still_returns => suite::held_open_output_still_returns;
    a_floor_above_the_tier_is_refused => suite::a_floor_above_the_tier_is_refused, Tier::Process;
    close_and_lifetime_end_the_session => suite::close_and_lifetime_end_the_session;
    cells_keep_state_in_both_languages => suite::cells_keep_state_in_both_languages;
    a_killed_interpreter_reports_fresh => suite::a_killed_interpreter_reports_fresh;
    a_lost_answer_is_unanswered_and_the_session_goes_on => suite::a_lost_answer_is_unanswered_and_the_session_goes_on;
}
