//! The escape suite (`plimsoll_testkit::escape`) on the agentsandbox provider against the
//! fake cluster, whose pods' terminators start holding a 0600 file at descriptor 7: the
//! `agentsandbox (fake cluster)` column of `docs/walls.md`. The fake's pods are processes
//! on the test host, so only what sandboxd and its terminator hold themselves is asserted
//! (the other cells are `n/a`: the real cluster's runtime and NetworkPolicy hold them).

use plimsoll_client::{Client, ClientOptions};
use plimsoll_testkit::daemon::{config_from, Setup};
use plimsoll_testkit::escape::{self, Fixture, Target};
use plimsoll_testkit::fake_cluster::{self as fake, FakeCluster, FakeClusterOptions};

#[tokio::test]
async fn the_escape_suite_holds_the_agentsandbox_column_of_the_walls_table() {
    let fx = Fixture::new();
    let opts = FakeClusterOptions {
        pods_hold: Some(fx.held_file()),
        ..FakeClusterOptions::conforming(fake::sandboxd_binaries().unwrap())
    };
    let cluster = FakeCluster::start(opts).await.unwrap();
    let setup = Setup::tester();
    let mut pairs = setup.pairs(&[]);
    pairs.extend(cluster.env_pairs());
    let mut cfg = config_from(&pairs).expect("the configuration");
    // Test hook: the fake pods listen on another port than 9090.
    let plimsoll_daemon::ProviderConfig::AgentSandbox(a) = &mut cfg.provider else {
        panic!("not the agentsandbox provider: {:?}", cfg.provider)
    };
    a.sandboxd_port = cluster.pod_port();
    let daemon = plimsoll_daemon::start(cfg)
        .await
        .expect("the daemon starts");
    let mut c = Client::connect(
        &format!("http://{}", daemon.rpc_addr()),
        ClientOptions {
            token: Some(setup.token(0).to_owned()),
            ca_file: None,
        },
    )
    .await
    .expect("connect");
    let target = Target {
        column: "agentsandbox (fake cluster)".into(),
        state_dir: setup.path().join("state"),
        bombs: false,
    };
    escape::check(&mut c, &fx, &target).await;
    daemon.shutdown().await;
    cluster.shutdown().await;
}
