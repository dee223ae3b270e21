//! plimsolld under a low descriptor limit (`prlimit --nofile=256`) against more idle TCP
//! connections than it may open (issue 35, finding 2: 1,100 idle connections to a daemon
//! limited to 1,024 descriptors made a valid caller hang, and they stayed open).
//!
//! Now the RPC listener's cap is fitted below the limit (a warning says so), the connections
//! beyond it wait in the kernel's backlog, each idle one is closed at the header timeout, and
//! a valid caller queued behind all of them is answered; the log gets no flood of accept
//! errors.

use std::time::{Duration, Instant};

use plimsoll_client::{Client, ClientOptions};
use plimsoll_testkit::doors::until_closed;
use plimsoll_testkit::plimsolld::Plimsolld;

const BIN: &str = env!("CARGO_BIN_EXE_plimsolld");
/// More idle connections than plimsolld may hold descriptors.
const IDLE: usize = 600;

#[test]
fn idle_connections_beyond_the_descriptor_limit_lock_no_caller_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Plimsolld::spawn_as(
        BIN,
        dir.path(),
        &[
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_PROVIDER", "quickjs"),
            ("PLIMSOLL_HEADER_TIMEOUT_MS", "1000"),
        ],
        &["prlimit", "--nofile=256:256", "--"],
    );
    let url = d.serving().unwrap_or_else(|| panic!("{}", d.log()));
    let at: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (answered_after, leftover) = rt.block_on(async {
        let mut idle = tokio::task::JoinSet::new();
        for _ in 0..IDLE {
            let s = tokio::net::TcpStream::connect(at).await.unwrap();
            idle.spawn(until_closed(s));
        }
        // A valid caller behind all of them (its connection waits in the same backlog).
        let t0 = Instant::now();
        let answered = tokio::time::timeout(Duration::from_secs(60), async {
            let mut c = Client::connect(&url, ClientOptions::default()).await?;
            c.describe().await
        })
        .await
        .expect("the valid caller is answered within 60 s")
        .expect("describe");
        assert_eq!(answered.sandbox, "quickjs", "{answered:?}");
        let after = t0.elapsed();
        // Every idle connection is closed by the daemon (none is left open for good).
        let leftover = tokio::time::timeout(Duration::from_secs(60), async {
            while idle.join_next().await.is_some() {}
        })
        .await
        .map_or(idle.len(), |()| 0);
        (after, leftover)
    });
    assert_eq!(leftover, 0, "idle connections still open after 60 s");
    assert!(
        d.has_logged("connection cap lowered to fit the descriptor limit (RLIMIT_NOFILE)"),
        "no warning that the cap was fitted: {}",
        d.log()
    );
    assert_eq!(d.stop().code(), Some(0), "{}", d.log());
    let accept_errors = d
        .log()
        .lines()
        .filter(|l| l.contains("accept failed"))
        .count();
    // At most one line a second while the listener pauses.
    assert!(
        accept_errors <= 5 + answered_after.as_secs() as usize,
        "{accept_errors} accept-error lines in {answered_after:?}: {}",
        d.log()
    );
    eprintln!("answered after {answered_after:?}; accept-error lines: {accept_errors}");
}
