//! The client against a tiny in-test gRPC server that answers exactly what each test
//! tells it to: a stamped answer, a tampered one, a marked refusal, an unmarked error, an
//! answer below the floor. Over loopback, and once over real TLS with an rcgen CA.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use pb::sandbox_service_server::{SandboxService, SandboxServiceServer};
use plimsoll_client::{pb, Client, ClientError, ClientOptions};
use plimsoll_core::check::CheckError;
use plimsoll_core::digest::stamp;
use plimsoll_core::{Reason, Refusal};
use plimsoll_testkit::ca::{Ca, Leaf};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

const TOKEN: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[derive(Clone, Copy)]
enum Answer {
    Stamped,
    TamperedStdout,
    Refuse(Reason),
    Unmarked,
    Tier(&'static str),
}

struct Fake {
    answer: Answer,
    seen_auth: Arc<Mutex<Vec<String>>>,
}

fn answer_for(req: &pb::RunRequest, isolation: &str) -> pb::RunResponse {
    let mut resp = pb::RunResponse {
        sandbox: "process".into(),
        isolation: isolation.into(),
        duration_ms: 3,
        result: Some(pb::run_response::Result::Javascript(pb::JavaScriptResult {
            stdout: b"42\n".to_vec(),
            exit_code: 0,
            ..Default::default()
        })),
        ..Default::default()
    };
    stamp(req, &mut resp, "", 1_700_000_000_000, 1_700_000_000_003);
    resp
}

#[tonic::async_trait]
impl SandboxService for Fake {
    async fn run(
        &self,
        request: Request<pb::RunRequest>,
    ) -> Result<Response<pb::RunResponse>, Status> {
        let auth = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        self.seen_auth.lock().unwrap().push(auth);
        let req = request.into_inner();
        match self.answer {
            Answer::Stamped => Ok(Response::new(answer_for(&req, "process"))),
            Answer::TamperedStdout => {
                let mut resp = answer_for(&req, "process");
                if let Some(pb::run_response::Result::Javascript(j)) = &mut resp.result {
                    j.stdout[0] = b'3';
                }
                Ok(Response::new(resp))
            }
            Answer::Refuse(reason) => Err(Refusal::new(
                reason,
                tonic::Code::FailedPrecondition,
                "the provider's tier is process and the request's floor is vm",
            )
            .to_status()),
            Answer::Unmarked => Err(Status::internal("runner crashed")),
            Answer::Tier(t) => Ok(Response::new(answer_for(&req, t))),
        }
    }

    async fn describe(
        &self,
        _request: Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeResponse>, Status> {
        Ok(Response::new(pb::DescribeResponse {
            sandbox: "process".into(),
            isolation: "process".into(),
            protocol: 5,
            ..Default::default()
        }))
    }

    async fn open_session(
        &self,
        _request: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        Err(Refusal::unsupported("no sessions").to_status())
    }

    async fn session_run(
        &self,
        _request: Request<pb::SessionRunRequest>,
    ) -> Result<Response<pb::SessionRunResponse>, Status> {
        Err(Refusal::unsupported("no sessions").to_status())
    }

    async fn close_session(
        &self,
        _request: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        Err(Refusal::unsupported("no sessions").to_status())
    }
}

/// Starts a plain-HTTP/2 fake on a loopback port; returns its address and the
/// authorization headers it saw.
async fn serve(answer: Answer) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let fake = Fake {
        answer,
        seen_auth: seen.clone(),
    };
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(SandboxServiceServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (format!("http://{addr}"), seen)
}

fn js_request(floor: &str) -> pb::RunRequest {
    pb::RunRequest {
        protocol: 5,
        minimum_isolation: floor.into(),
        timeout_ms: 5000,
        payload: Some(pb::run_request::Payload::Javascript(pb::JavaScriptRun {
            code: "console.log(6*7)".into(),
            grant_profile: String::new(),
        })),
        ..Default::default()
    }
}

async fn client(addr: &str) -> Client {
    Client::connect(
        addr,
        ClientOptions {
            token: Some(TOKEN.into()),
            ca_file: None,
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn stamped_answer_passes_and_the_token_is_sent() {
    let (addr, seen) = serve(Answer::Stamped).await;
    let mut c = client(&addr).await;
    let resp = c.run(js_request("")).await.unwrap();
    assert_eq!(resp.isolation, "process");
    assert_eq!(resp.record.unwrap().record_sha256.len(), 64);
    assert_eq!(*seen.lock().unwrap(), vec![format!("Bearer {TOKEN}")]);
    let d = c.describe().await.unwrap();
    assert_eq!(d.protocol, 5);
}

#[tokio::test]
async fn tampered_stdout_fails_the_record_check() {
    let (addr, _) = serve(Answer::TamperedStdout).await;
    let mut c = client(&addr).await;
    let e = c.run(js_request("")).await.unwrap_err();
    match &e {
        ClientError::Check { error, answer } => {
            assert!(
                matches!(
                    error,
                    CheckError::Mismatch {
                        field: "result_sha256",
                        ..
                    }
                ),
                "{error}"
            );
            assert!(matches!(
                &answer.result,
                Some(pb::run_response::Result::Javascript(j)) if j.stdout == b"32\n"
            ));
        }
        other => panic!("expected a check failure, got {other}"),
    }
    assert_eq!(e.not_dispatched(), None);
    assert!(e.to_string().contains("may have run"), "{e}");
}

#[tokio::test]
async fn marked_refusal_is_refused_with_its_reason() {
    for reason in [Reason::Isolation, Reason::Capacity, Reason::Permission] {
        let (addr, _) = serve(Answer::Refuse(reason)).await;
        let mut c = client(&addr).await;
        let e = c.run(js_request("vm")).await.unwrap_err();
        assert!(
            matches!(e, ClientError::Refused { reason: r, .. } if r == reason),
            "{e}"
        );
        assert_eq!(e.not_dispatched(), Some(reason));
        assert!(
            e.to_string()
                .starts_with(&format!("not dispatched ({reason}): the provider's tier")),
            "{e}"
        );
    }
}

#[tokio::test]
async fn unmarked_error_may_have_run() {
    let (addr, _) = serve(Answer::Unmarked).await;
    let mut c = client(&addr).await;
    let e = c.run(js_request("")).await.unwrap_err();
    match &e {
        ClientError::MayHaveRun { status } => assert_eq!(status.code(), tonic::Code::Internal),
        other => panic!("expected MayHaveRun, got {other}"),
    }
    assert_eq!(e.not_dispatched(), None);
    assert!(e.to_string().contains("runner crashed"), "{e}");
}

#[tokio::test]
async fn tier_below_the_floor_fails_the_check() {
    let (addr, _) = serve(Answer::Tier("process")).await;
    let mut c = client(&addr).await;
    let e = c.run(js_request("vm")).await.unwrap_err();
    assert!(
        matches!(
            &e,
            ClientError::Check {
                error: CheckError::BelowFloor { .. },
                ..
            }
        ),
        "{e}"
    );
    // The same answer meets a floor of process.
    assert!(c.run(js_request("process")).await.is_ok());
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let e = Client::connect(&format!("http://{addr}"), ClientOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }), "{e}");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
}

// ---- TLS ----

/// A TLS stream tonic's server can serve (it needs `Connected`).
struct TlsIo(tokio_rustls::server::TlsStream<tokio::net::TcpStream>);

impl tonic::transport::server::Connected for TlsIo {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for TlsIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

struct Pki {
    ca_pem: String,
    leaf: Leaf,
}

fn pki() -> Pki {
    let ca = Ca::unique("client test CA");
    Pki {
        ca_pem: ca.pem(),
        leaf: ca.leaf(&["127.0.0.1"]),
    }
}

async fn serve_tls(p: &Pki) -> String {
    let acceptor = tokio_rustls::TlsAcceptor::from(p.leaf.server_config(&[b"h2"]));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<TlsIo>>(4);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            // A failed handshake (the wrong-CA test) just drops that connection.
            if let Ok(tls) = acceptor.accept(tcp).await {
                let _ = tx.send(Ok(TlsIo(tls))).await;
            }
        }
    });
    let fake = Fake {
        answer: Answer::Stamped,
        seen_auth: Arc::new(Mutex::new(Vec::new())),
    };
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(SandboxServiceServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap();
    });
    format!("https://{addr}")
}

#[tokio::test]
async fn https_with_the_right_ca_runs_and_checks() {
    let p = pki();
    let addr = serve_tls(&p).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &p.ca_pem).unwrap();
    let mut c = Client::connect(
        &addr,
        ClientOptions {
            token: Some(TOKEN.into()),
            ca_file: Some(ca),
        },
    )
    .await
    .unwrap();
    let resp = c.run(js_request("process")).await.unwrap();
    assert_eq!(resp.sandbox, "process");
}

#[tokio::test]
async fn https_with_another_ca_is_a_connect_error() {
    let p = pki();
    let addr = serve_tls(&p).await;
    let other = pki();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("other-ca.pem");
    std::fs::write(&ca, &other.ca_pem).unwrap();
    let e = Client::connect(
        &addr,
        ClientOptions {
            token: None,
            ca_file: Some(ca),
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }), "{e}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
}
