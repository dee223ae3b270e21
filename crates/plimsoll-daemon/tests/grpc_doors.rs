//! The standard gRPC doors of the daemon's RPC listener, through tonic-health's and
//! tonic-reflection's own clients against an in-process daemon: health answers without a
//! token while `SandboxService` still refuses one-less calls; reflection lists what is
//! served and is off in hardened mode unless named; the drain says `NOT_SERVING` and ends
//! `Watch` streams; TLS listeners serve both doors too.

use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::pb;
use plimsoll_core::Tier;
use plimsoll_daemon::provider::{Answer, Facts, Provider, ProviderError, ProviderStartError, Work};
use plimsoll_daemon::server::start_with;
use plimsoll_daemon::RunningDaemon;
use plimsoll_testkit::daemon::{authed, client, Setup};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1 as refl;
use tonic_reflection::pb::v1alpha as refl_alpha;

const SANDBOX: &str = "plimsoll.v1.SandboxService";

async fn channel(daemon: &RunningDaemon) -> Channel {
    Endpoint::from_shared(format!("http://{}", daemon.rpc_addr()))
        .unwrap()
        .connect()
        .await
        .expect("connect to the daemon")
}

/// `Check` for `service`, sent without any metadata (no token).
async fn check(ch: &Channel, service: &str) -> Result<ServingStatus, tonic::Status> {
    let r = HealthClient::new(ch.clone())
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await?;
    Ok(r.into_inner().status())
}

/// One `v1` reflection request, answered on its own stream (no token).
async fn reflect(
    ch: &Channel,
    req: refl::server_reflection_request::MessageRequest,
) -> Result<refl::server_reflection_response::MessageResponse, tonic::Status> {
    let mut c = refl::server_reflection_client::ServerReflectionClient::new(ch.clone());
    let req = refl::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(req),
    };
    let mut answers = c
        .server_reflection_info(tokio_stream::iter([req]))
        .await?
        .into_inner();
    let answer = answers.message().await?.expect("one answer");
    Ok(answer.message_response.expect("an answer body"))
}

async fn listed(ch: &Channel) -> Result<Vec<String>, tonic::Status> {
    use refl::server_reflection_request::MessageRequest as Q;
    use refl::server_reflection_response::MessageResponse as A;
    match reflect(ch, Q::ListServices(String::new())).await? {
        A::ListServicesResponse(l) => {
            let mut names: Vec<String> = l.service.into_iter().map(|s| s.name).collect();
            names.sort();
            Ok(names)
        }
        other => panic!("not a service list: {other:?}"),
    }
}

#[tokio::test]
async fn health_answers_serving_without_a_token_and_the_sandbox_service_still_refuses() {
    let s = Setup::tester();
    let daemon = s.start(&[]).await;
    let ch = channel(&daemon).await;
    assert_eq!(check(&ch, "").await.unwrap(), ServingStatus::Serving);
    assert_eq!(check(&ch, SANDBOX).await.unwrap(), ServingStatus::Serving);
    let e = check(&ch, "plimsoll.v1.NoSuchService").await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // The same listener still wants a token for SandboxService, as before.
    let mut c = client(&daemon).await;
    let e = c.describe(pb::DescribeRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = c
        .describe(authed(pb::DescribeRequest {}, "not-a-token"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    c.describe(authed(pb::DescribeRequest {}, s.token(0)))
        .await
        .expect("a caller's token is accepted");
    daemon.shutdown().await;
}

#[tokio::test]
async fn reflection_lists_the_served_services_and_describes_run_in_v1_and_v1alpha() {
    let s = Setup::tester();
    let daemon = s.start(&[]).await;
    let ch = channel(&daemon).await;
    assert_eq!(
        listed(&ch).await.unwrap(),
        [
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
            SANDBOX,
        ]
    );

    use refl::server_reflection_request::MessageRequest as Q;
    use refl::server_reflection_response::MessageResponse as A;
    let A::FileDescriptorResponse(files) = reflect(&ch, Q::FileContainingSymbol(SANDBOX.into()))
        .await
        .unwrap()
    else {
        panic!("not a file answer")
    };
    let file = <prost_types::FileDescriptorProto as prost::Message>::decode(
        files.file_descriptor_proto[0].as_slice(),
    )
    .unwrap();
    assert_eq!(file.package(), "plimsoll.v1");
    let svc = file
        .service
        .iter()
        .find(|s| s.name() == "SandboxService")
        .unwrap();
    let methods: Vec<&str> = svc.method.iter().map(|m| m.name()).collect();
    for m in [
        "Run",
        "Describe",
        "OpenSession",
        "SessionRun",
        "CloseSession",
    ] {
        assert!(methods.contains(&m), "{m} missing from {methods:?}");
    }
    // plimsolld does not serve the sandboxd channel, so reflection does not describe it.
    // (tonic-reflection answers an unknown symbol with the stream's status, not a message.)
    let e = reflect(
        &ch,
        Q::FileContainingSymbol("plimsoll.sandboxd.v1.Sandboxd".into()),
    )
    .await
    .expect_err("the sandboxd service must not be described");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // v1alpha, which older grpcurl and grpcio releases ask, lists the same.
    let mut alpha = refl_alpha::server_reflection_client::ServerReflectionClient::new(ch.clone());
    let req = refl_alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            refl_alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let answer = alpha
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner()
        .message()
        .await
        .unwrap()
        .unwrap();
    let Some(refl_alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) =
        answer.message_response
    else {
        panic!("not a v1alpha service list")
    };
    assert!(l.service.iter().any(|s| s.name == SANDBOX), "{l:?}");

    // Turned off, the reflection services are not there at all; health still is.
    daemon.shutdown().await;
    let daemon = s.start(&[("PLIMSOLL_REFLECTION", "0")]).await;
    let ch = channel(&daemon).await;
    let e = listed(&ch).await.unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    assert_eq!(check(&ch, "").await.unwrap(), ServingStatus::Serving);
    daemon.shutdown().await;
}

/// A provider that proves the kernel tier, so hardened mode can start in a test.
struct Kernel;

#[async_trait::async_trait]
impl Provider for Kernel {
    fn facts(&self) -> Facts {
        Facts {
            name: "kernel-fake".into(),
            tier: Some(Tier::Kernel),
            max_timeout_ms: 1000,
            ..Default::default()
        }
    }
    async fn start(&self) -> Result<(), ProviderStartError> {
        Ok(())
    }
    async fn ready(&self) -> bool {
        true
    }
    async fn run(&self, _: Work, _: Duration) -> Result<Answer, ProviderError> {
        panic!("no run reaches this provider")
    }
}

#[tokio::test]
async fn hardened_mode_turns_reflection_off_unless_it_is_named() {
    let s = Setup::tester();
    let hardened = [
        ("PLIMSOLL_HARDENED", "1"),
        ("SANDBOX_MEMORY_MB", "512"),
        ("SANDBOX_CPUS", "1"),
        ("SANDBOX_PIDS", "64"),
        ("SANDBOX_DISK_MB", "256"),
    ];
    let start = |extra: &[(&str, &str)]| {
        let mut pairs = hardened.to_vec();
        pairs.extend_from_slice(extra);
        let cfg = s.config(&pairs).unwrap();
        async move {
            start_with(cfg, Arc::new(Kernel))
                .await
                .expect("hardened mode starts with every safeguard")
        }
    };
    for off in [&[][..], &[("PLIMSOLL_REFLECTION", "0")][..]] {
        let daemon = start(off).await;
        let ch = channel(&daemon).await;
        let e = listed(&ch).await.unwrap_err();
        assert_eq!(e.code(), Code::Unimplemented, "{off:?}: {e:?}");
        // Health does not depend on reflection, nor on a token.
        assert_eq!(check(&ch, SANDBOX).await.unwrap(), ServingStatus::Serving);
        daemon.shutdown().await;
    }
    let daemon = start(&[("PLIMSOLL_REFLECTION", "1")]).await;
    let ch = channel(&daemon).await;
    assert!(listed(&ch).await.unwrap().contains(&SANDBOX.to_owned()));
    daemon.shutdown().await;
}

#[tokio::test]
async fn the_drain_says_not_serving_and_ends_watch_streams() {
    let s = Setup::tester();
    let daemon = s.start(&[]).await;
    let ch = channel(&daemon).await;
    let mut watches = Vec::new();
    for service in ["", SANDBOX] {
        let mut w = HealthClient::new(ch.clone())
            .watch(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let first = w.message().await.unwrap().unwrap();
        assert_eq!(first.status(), ServingStatus::Serving);
        watches.push(w);
    }
    // The grace period is 310 s: a Watch left open would hold the drain that long.
    tokio::time::timeout(Duration::from_secs(20), daemon.shutdown())
        .await
        .expect("an open Watch does not hold the drain");
    for mut w in watches {
        let next = w.message().await.unwrap().unwrap();
        assert_eq!(next.status(), ServingStatus::NotServing);
        assert!(
            matches!(w.message().await, Ok(None) | Err(_)),
            "the Watch stream ends"
        );
    }
}

#[tokio::test]
async fn a_tls_listener_serves_health_and_reflection() {
    let s = Setup::tester();
    let ca = plimsoll_testkit::ca::Ca::unique("doors test CA");
    let leaf = ca.leaf(&["localhost"]);
    let (cert, key) = (s.path().join("tls.crt"), s.path().join("tls.key"));
    std::fs::write(&cert, &leaf.cert_pem).unwrap();
    std::fs::write(&key, &leaf.key_pem).unwrap();
    let daemon = s
        .start(&[
            ("PLIMSOLL_TLS_CERT", cert.to_str().unwrap()),
            ("PLIMSOLL_TLS_KEY", key.to_str().unwrap()),
        ])
        .await;
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    let ch = Endpoint::from_shared(format!("https://{}", daemon.rpc_addr()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .expect("a TLS connection to the daemon");
    assert_eq!(check(&ch, "").await.unwrap(), ServingStatus::Serving);
    assert!(listed(&ch).await.unwrap().contains(&SANDBOX.to_owned()));
    // A plaintext client gets nothing from the TLS listener.
    let plain = Endpoint::from_shared(format!("http://{}", daemon.rpc_addr()))
        .unwrap()
        .connect()
        .await;
    if let Ok(plain) = plain {
        assert!(check(&plain, "").await.is_err());
    }
    daemon.shutdown().await;
}
