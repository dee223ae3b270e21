//! An in-process daemon (the real service and session table, no authentication) whose
//! provider keeps fake sessions: a snippet answers `js: <code>`, a cell `cell: <code>`, a
//! project step `step`, and the snippet `fail` fails after it may have run.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::pb::sandbox_service_server::SandboxServiceServer;
use plimsoll_core::{pb, Tier};
use plimsoll_daemon::auth::Principal;
use plimsoll_daemon::metrics::Metrics;
use plimsoll_daemon::service::Service;
use plimsoll_daemon::sessions::{SessionSettings, SessionTable};
use plimsoll_provider::{
    Answer, Facts, Provider, ProviderError, ProviderSession, ProviderStartError, SessionAnswer,
    SessionCallOutcome, SessionProvider, SessionSpec, SessionWork, Work,
};

struct Fake;

#[async_trait::async_trait]
impl Provider for Fake {
    fn facts(&self) -> Facts {
        Facts {
            name: "fake".into(),
            tier: Some(Tier::Process),
            languages: vec!["javascript".into(), "python".into()],
            supports_project: true,
            max_timeout_ms: 60_000,
            ..Default::default()
        }
    }
    async fn start(&self) -> Result<(), ProviderStartError> {
        Ok(())
    }
    async fn ready(&self) -> bool {
        true
    }
    fn sessions(&self) -> Option<&dyn SessionProvider> {
        Some(self)
    }
    async fn run(&self, _work: Work, _timeout: Duration) -> Result<Answer, ProviderError> {
        Err(ProviderError::Failed("the fake runs sessions only".into()))
    }
}

#[async_trait::async_trait]
impl SessionProvider for Fake {
    async fn open(&self, _spec: SessionSpec) -> Result<Box<dyn ProviderSession>, ProviderError> {
        Ok(Box::new(FakeSession))
    }
}

struct FakeSession;

#[async_trait::async_trait]
impl ProviderSession for FakeSession {
    async fn call(&self, work: SessionWork, _timeout: Duration) -> SessionCallOutcome {
        let answer = match work {
            SessionWork::Run(Work::Javascript(j)) if j.code == "fail" => Err(
                ProviderError::Failed("the fake failed after starting".into()),
            ),
            SessionWork::Run(Work::Javascript(j)) => Ok(SessionAnswer::Run(Answer::Javascript(
                pb::JavaScriptResult {
                    stdout: format!("js: {}\n", j.code).into_bytes(),
                    ..Default::default()
                },
            ))),
            SessionWork::Run(Work::Project(p)) => {
                Ok(SessionAnswer::Run(Answer::Project(pb::ProjectResult {
                    outcome: pb::ProjectOutcome::Completed as i32,
                    steps: p
                        .steps
                        .iter()
                        .map(|s| pb::StepResult {
                            command: s.clone(),
                            stdout: b"step\n".to_vec(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })))
            }
            SessionWork::Cell(c) => Ok(SessionAnswer::Cell(pb::CellResult {
                stdout: format!("cell: {}\n", c.code).into_bytes(),
                ..Default::default()
            })),
        };
        SessionCallOutcome {
            answer,
            ended: None,
        }
    }
    async fn close(&self) {}
}

/// The daemon, served on a runtime of its own until dropped.
pub struct Daemon {
    /// `http://127.0.0.1:<port>`.
    pub addr: String,
    _rt: tokio::runtime::Runtime,
}

impl Daemon {
    pub fn start() -> Daemon {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let table = Arc::new(SessionTable::new(SessionSettings {
            max_sessions: 4,
            ..Default::default()
        }));
        let service = Service::new(
            Arc::new(Fake),
            4,
            Duration::from_secs(30),
            Default::default(),
            Arc::new(AtomicBool::new(false)),
            Arc::new(Metrics::default()),
        )
        .with_sessions(table);
        let svc = tonic::service::interceptor::InterceptedService::new(
            SandboxServiceServer::new(service),
            |mut req: tonic::Request<()>| {
                req.extensions_mut().insert(Principal { id: "anon".into() });
                Ok(req)
            },
        );
        let _guard = rt.enter();
        rt.spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        drop(_guard);
        Daemon { addr, _rt: rt }
    }
}
