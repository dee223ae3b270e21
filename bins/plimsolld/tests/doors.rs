//! The finding of issue 35, against the real `plimsolld` process: with its descriptors
//! limited to 128 (`prlimit`), 300 idle TCP connections once filled its descriptor table and
//! left a caller with a valid token hanging while they stayed open. Now the connection cap
//! fits below the limit (the rest wait in the listen backlog), the header timeout closes the
//! idle ones, and the valid caller is answered.

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use plimsoll_client::{Client, ClientOptions};
use plimsoll_testkit::plimsolld::Plimsolld;

const BIN: &str = env!("CARGO_BIN_EXE_plimsolld");

/// Far above every timeout set here: waiting for a condition, never a speed claim.
const CEILING: Duration = Duration::from_secs(60);

#[test]
fn idle_connections_past_the_descriptor_limit_do_not_stop_a_valid_caller() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = plimsoll_callers::CallersFile::default();
    let token = file.add("tester", &[]).unwrap();
    let callers = dir.path().join("callers.json");
    file.save(&callers).unwrap();
    let mut p = Plimsolld::spawn_as(
        BIN,
        dir.path(),
        &[
            ("PLIMSOLL_CLIENTS_FILE", callers.to_str().unwrap()),
            ("PLIMSOLL_HEADER_TIMEOUT_MS", "1000"),
            ("PLIMSOLL_IDLE_TIMEOUT_MS", "1500"),
        ],
        &["prlimit", "--nofile=128:128"],
    );
    let url = p
        .serving()
        .unwrap_or_else(|| panic!("plimsolld did not serve:\n{}", p.log()));
    let addr = url.trim_start_matches("http://").to_owned();

    // More idle connections than plimsolld has descriptors.
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(&addr).expect("connect"))
        .collect();

    let answered = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(CEILING, async {
                let mut c = Client::connect(
                    &url,
                    ClientOptions {
                        token: Some(token.clone()),
                        ca_file: None,
                    },
                )
                .await
                .expect("connect");
                c.describe().await.expect("the valid caller is answered")
            })
            .await
        });
    assert!(
        answered.is_ok(),
        "the valid caller was not answered within {CEILING:?}:\n{}",
        p.log()
    );

    // Every idle connection is closed by plimsolld (EOF after the server's own HTTP/2
    // settings), none is left open.
    let deadline = Instant::now() + CEILING;
    for mut s in idle {
        let mut buf = [0u8; 256];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match s.read(&mut buf) {
                Ok(0) => break,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Ok(_) => {}
                Err(e) => panic!("an idle connection was not closed: {e}"),
            }
        }
    }
    p.stop();
}
