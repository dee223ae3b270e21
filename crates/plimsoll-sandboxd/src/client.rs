//! The client plimsolld's providers reach sandboxd with: over TLS 1.3 to a pod
//! (`plimsoll-tls`), over plain TCP on loopback, or over a Unix socket (the Docker provider).
//!
//! Every error says whether the payload may have run: a connection that could not be opened
//! or confirmed, and an answer carrying the not-dispatched mark, ran nothing; anything else
//! may have, and must never be retried automatically.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use plimsoll_core::sandboxd_pb::sandboxd_client::SandboxdClient as GenClient;
use plimsoll_core::sandboxd_pb::{ExecuteRequest, ExecuteResponse, HealthRequest, HealthResponse};
use plimsoll_core::validate::MAX_TIMEOUT_MS;
use plimsoll_core::{not_dispatched_reason, Reason, Refusal};
use plimsoll_tls::{ClientTls, ConnectError};
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Request, Status};

use crate::token::Token;

/// Largest answer accepted: every program's capped output plus the artifacts.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Time allowed beyond a payload's own deadline for sandboxd to answer.
pub const ANSWER_GRACE: Duration = Duration::from_secs(30);

/// HTTP/2 keepalive pings: they keep an idle channel alive through the terminator's idle
/// timeout and detect a dead pod during a long run.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);

/// Why a sandboxd channel could not be opened. Nothing was sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectFailure {
    /// The TLS channel to a pod could not be confirmed (it names the CA file, the server
    /// name and the TLS alert).
    #[error(transparent)]
    Tls(#[from] ConnectError),
    /// A TCP or Unix socket connection failed.
    #[error("cannot connect to sandboxd at {target}: {source}")]
    Dial {
        /// Address or socket path.
        target: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP/2 channel could not be set up over the connection.
    #[error("cannot open an HTTP/2 channel to sandboxd at {target}: {reason}")]
    Channel {
        /// Address or socket path.
        target: String,
        /// Why.
        reason: String,
    },
}

/// A failed sandboxd call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The channel could not be opened or confirmed; nothing was sent.
    #[error("{0}")]
    Connect(#[source] ConnectFailure),
    /// sandboxd answered with a refusal carrying the not-dispatched mark; nothing ran.
    #[error("sandboxd refused the call: {0}")]
    Refused(Refusal),
    /// Any other failure: the payload may have run.
    #[error("sandboxd call failed and the payload may have run: {}: {}", .0.code(), .0.message())]
    MayHaveRun(Status),
    /// sandboxd answered the call without a result: the payload may have run.
    #[error("sandboxd answered without a result; the payload may have run")]
    NoResult,
    /// A session call was answered by a sandboxd not started with `--session`: the payload
    /// ran, but in a fresh directory of its own, not in the session's.
    #[error("sandboxd answered a session call outside any session (it was not started with --session); the payload may have run")]
    NotSession,
}

impl CallError {
    /// Sorts a status from sandboxd: marked means refused, anything else may have run.
    pub fn from_status(status: Status) -> CallError {
        match not_dispatched_reason(&status) {
            Some(reason) => CallError::Refused(Refusal::new(
                reason,
                status.code(),
                status.message().to_owned(),
            )),
            None => CallError::MayHaveRun(status),
        }
    }

    /// The not-dispatched reason, or `None` when the payload may have run. A channel that
    /// could not be opened is `environment`: the sandbox could not be confirmed.
    pub fn not_dispatched(&self) -> Option<Reason> {
        match self {
            CallError::Connect(_) => Some(Reason::Environment),
            CallError::Refused(r) => Some(r.reason),
            CallError::MayHaveRun(_) | CallError::NoResult | CallError::NotSession => None,
        }
    }

    /// The refusal to answer with, when nothing ran.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            CallError::Connect(ConnectFailure::Tls(e)) => Some(e.to_refusal()),
            CallError::Connect(e) => Some(Refusal::environment(format!(
                "the sandbox could not be reached: {e}"
            ))),
            CallError::Refused(r) => Some(r.clone()),
            CallError::MayHaveRun(_) | CallError::NoResult | CallError::NotSession => None,
        }
    }

    /// The gRPC status to pass on: marked when nothing ran, the original status otherwise.
    pub fn to_status(&self) -> Status {
        match (self.refusal(), self) {
            (Some(r), _) => r.to_status(),
            (None, CallError::MayHaveRun(s)) => Status::new(s.code(), s.message()),
            (None, other) => Status::internal(other.to_string()),
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
type BoxIo = Box<dyn Io>;

enum Target {
    Tls(ClientTls, SocketAddr),
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl Target {
    fn describe(&self) -> String {
        match self {
            Target::Tls(_, a) => format!("{a} (TLS)"),
            Target::Tcp(a) => a.to_string(),
            Target::Unix(p) => format!("unix:{}", p.display()),
        }
    }

    async fn dial(&self) -> Result<BoxIo, ConnectFailure> {
        match self {
            Target::Tls(tls, addr) => Ok(Box::new(tls.connect(*addr).await?)),
            Target::Tcp(addr) => {
                let s = tokio::time::timeout(
                    plimsoll_tls::client::DEFAULT_HANDSHAKE_TIMEOUT,
                    tokio::net::TcpStream::connect(addr),
                )
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
                .map_err(|source| ConnectFailure::Dial {
                    target: addr.to_string(),
                    source,
                })?;
                let _ = s.set_nodelay(true);
                Ok(Box::new(s))
            }
            Target::Unix(path) => {
                let s = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|source| ConnectFailure::Dial {
                        target: format!("unix:{}", path.display()),
                        source,
                    })?;
                Ok(Box::new(s))
            }
        }
    }
}

/// Hands tonic the connection dialed up front (so its failure is typed and nothing was
/// sent), then dials afresh if tonic ever reconnects.
#[derive(Clone)]
struct Dialer {
    target: Arc<Target>,
    first: Arc<Mutex<Option<BoxIo>>>,
    dials: Arc<AtomicU64>,
    /// Whether a lost connection may be dialed again (never for a socket in a directory the
    /// sandbox's code could write to).
    redial: bool,
}

impl tower::Service<Uri> for Dialer {
    type Response = TokioIo<BoxIo>;
    type Error = ConnectFailure;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let first = self.first.lock().unwrap_or_else(|p| p.into_inner()).take();
        let target = self.target.clone();
        let dials = self.dials.clone();
        let redial = self.redial;
        Box::pin(async move {
            let io = match first {
                Some(io) => io,
                None if !redial => {
                    return Err(ConnectFailure::Channel {
                        target: target.describe(),
                        reason: "the connection was lost, and this channel never dials again"
                            .into(),
                    })
                }
                None => {
                    let io = target.dial().await?;
                    dials.fetch_add(1, Ordering::Relaxed);
                    io
                }
            };
            Ok(TokioIo::new(io))
        })
    }
}

/// Puts `authorization: Bearer <token>` on every call (marked sensitive, so never logged).
#[derive(Clone)]
struct BearerHeader(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for BearerHeader {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(h) = &self.0 {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

/// What a session call ([`SandboxdClient::session_call`]) answered, with the session's
/// facts sandboxd stated.
#[cfg(feature = "provider")]
#[derive(Debug)]
pub struct SessionReply {
    /// The answer, or why there is none ([`CallError::refusal`] is `Some` when nothing ran).
    pub answer: Result<plimsoll_provider::SessionAnswer, CallError>,
    /// Bytes the session's files take after the call, when sandboxd stated it.
    pub disk_bytes: Option<u64>,
    /// The sweep after the call could not prove that no process of it is left.
    pub boundary_failed: bool,
    /// The read-back before the call found the session's directory changed (what differs);
    /// nothing ran.
    pub changed: Option<String>,
}

#[cfg(feature = "provider")]
impl SessionReply {
    /// The end this reply states, in this order: the session's directory changed (nothing
    /// ran), the sweep could not prove the call left nothing, or the session's files take
    /// more than `disk_limit` bytes. A lost channel is the provider's to judge.
    pub fn stated_end(&self, disk_limit: Option<u64>) -> Option<plimsoll_provider::SessionEnded> {
        use plimsoll_provider::{SessionEndCause, SessionEnded};
        let end = |cause, detail: String| Some(SessionEnded { cause, detail });
        if let Some(changed) = &self.changed {
            return end(
                SessionEndCause::SandboxChanged,
                format!("the session's directory changed: {changed}"),
            );
        }
        if self.boundary_failed {
            return end(
                SessionEndCause::BoundaryFailed,
                "the sweep after the call could not prove that no process of it is left".into(),
            );
        }
        match (disk_limit, self.disk_bytes) {
            (Some(limit), Some(used)) if used > limit => end(
                SessionEndCause::DiskExceeded,
                format!("the session's files take {used} bytes, more than its {limit}"),
            ),
            _ => None,
        }
    }
}

/// The request for one payload: the deadline `timeout`, kept within 1 ms and the
/// protocol's maximum, and `env` for its programs.
#[cfg(feature = "provider")]
fn request(
    payload: plimsoll_core::sandboxd_pb::execute_request::Payload,
    timeout: Duration,
    env: Vec<(String, String)>,
) -> ExecuteRequest {
    ExecuteRequest {
        timeout_ms: u32::try_from(timeout.as_millis())
            .unwrap_or(MAX_TIMEOUT_MS)
            .clamp(1, MAX_TIMEOUT_MS),
        env: env
            .into_iter()
            .map(|(name, value)| plimsoll_core::sandboxd_pb::EnvVar { name, value })
            .collect(),
        trace_id: String::new(),
        payload: Some(payload),
    }
}

/// A channel to one sandboxd, authenticated with its token.
#[derive(Clone)]
pub struct SandboxdClient {
    inner: GenClient<InterceptedService<Channel, BearerHeader>>,
    dials: Arc<AtomicU64>,
    target: String,
}

impl std::fmt::Debug for SandboxdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxdClient")
            .field("target", &self.target)
            .field("dials", &self.dials())
            .finish()
    }
}

impl SandboxdClient {
    /// Dials a pod at `addr` over TLS 1.3 (`tls` trusts only its CA file) and opens the
    /// channel. A failed handshake is `CallError::Connect`: nothing was sent.
    pub async fn connect_tls(
        tls: &ClientTls,
        addr: SocketAddr,
        token: &Token,
    ) -> Result<SandboxdClient, CallError> {
        Self::open(Target::Tls(tls.clone(), addr), Some(token)).await
    }

    /// [`connect_tls`](Self::connect_tls) where the token is optional: with mutual TLS the
    /// client certificate is what the pod's terminator checks, and a call without a token
    /// carries no `authorization` header at all.
    pub async fn connect_tls_with(
        tls: &ClientTls,
        addr: SocketAddr,
        token: Option<&Token>,
    ) -> Result<SandboxdClient, CallError> {
        Self::open(Target::Tls(tls.clone(), addr), token).await
    }

    /// Dials sandboxd over plain TCP (loopback only: the process provider and tests).
    pub async fn connect_plain(
        addr: SocketAddr,
        token: &Token,
    ) -> Result<SandboxdClient, CallError> {
        Self::open(Target::Tcp(addr), Some(token)).await
    }

    /// Dials sandboxd over a Unix socket (the Docker provider's per-run directory).
    pub async fn connect_unix(path: &Path, token: &Token) -> Result<SandboxdClient, CallError> {
        Self::open(Target::Unix(path.to_owned()), Some(token)).await
    }

    /// [`connect_unix`](Self::connect_unix) for one connection only: once it is lost the
    /// channel fails instead of dialing the path again (the bwrap provider's sandboxes,
    /// where the code could put another socket at that path once it runs).
    pub async fn connect_unix_once(
        path: &Path,
        token: &Token,
    ) -> Result<SandboxdClient, CallError> {
        Self::open_with(Target::Unix(path.to_owned()), Some(token), false).await
    }

    async fn open(target: Target, token: Option<&Token>) -> Result<SandboxdClient, CallError> {
        Self::open_with(target, token, true).await
    }

    async fn open_with(
        target: Target,
        token: Option<&Token>,
        redial: bool,
    ) -> Result<SandboxdClient, CallError> {
        let header = match token {
            None => None,
            Some(token) => {
                let mut header: MetadataValue<Ascii> =
                    format!("Bearer {}", token.expose()).parse().map_err(|_| {
                        CallError::Connect(ConnectFailure::Channel {
                            target: target.describe(),
                            reason: "the token cannot travel in a header".into(),
                        })
                    })?;
                header.set_sensitive(true);
                Some(header)
            }
        };
        let describe = target.describe();
        let io = target.dial().await.map_err(CallError::Connect)?;
        let dials = Arc::new(AtomicU64::new(1));
        let dialer = Dialer {
            target: Arc::new(target),
            first: Arc::new(Mutex::new(Some(io))),
            dials: dials.clone(),
            redial,
        };
        let channel = Endpoint::from_static("http://sandboxd.plimsoll.invalid")
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_INTERVAL)
            .keep_alive_while_idle(true)
            .connect_with_connector(dialer)
            .await
            .map_err(|e| {
                CallError::Connect(ConnectFailure::Channel {
                    target: describe.clone(),
                    reason: error_chain(&e),
                })
            })?;
        let inner = GenClient::with_interceptor(channel, BearerHeader(header))
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        Ok(SandboxdClient {
            inner,
            dials,
            target: describe,
        })
    }

    /// Executes one payload. The call's deadline is the payload's (or the protocol's
    /// maximum when it leaves it to sandboxd) plus [`ANSWER_GRACE`].
    pub async fn execute(&self, req: ExecuteRequest) -> Result<ExecuteResponse, CallError> {
        self.execute_status(req)
            .await
            .map_err(CallError::from_status)
    }

    /// [`execute`](Self::execute), with sandboxd's status as it came (its metadata too).
    async fn execute_status(&self, req: ExecuteRequest) -> Result<ExecuteResponse, Status> {
        let run_ms = match req.timeout_ms {
            0 => MAX_TIMEOUT_MS,
            ms => ms.min(MAX_TIMEOUT_MS),
        };
        let mut request = Request::new(req);
        request.set_timeout(Duration::from_millis(u64::from(run_ms)) + ANSWER_GRACE);
        self.inner
            .clone()
            .execute(request)
            .await
            .map(|r| r.into_inner())
    }

    /// Runs one admitted payload: `work` and `env` become the request (the deadline
    /// `timeout`, kept within 1 ms and the protocol's maximum), the call is
    /// [`execute`](Self::execute), and the response becomes the provider's answer. An answer
    /// without a result is [`CallError::NoResult`] (it may have run).
    #[cfg(feature = "provider")]
    pub async fn run(
        &self,
        work: plimsoll_provider::Work,
        timeout: Duration,
        env: Vec<(String, String)>,
    ) -> Result<plimsoll_provider::Answer, CallError> {
        use plimsoll_core::sandboxd_pb::{execute_request::Payload, execute_response};
        use plimsoll_provider::{Answer, Work};
        let payload = match work {
            Work::Javascript(js) => Payload::Javascript(js),
            Work::Project(p) => Payload::Project(p),
        };
        match self.execute(request(payload, timeout, env)).await?.result {
            Some(execute_response::Result::Javascript(j)) => Ok(Answer::Javascript(j)),
            Some(execute_response::Result::Project(p)) => Ok(Answer::Project(p)),
            Some(execute_response::Result::Cell(_)) | None => Err(CallError::NoResult),
        }
    }

    /// Runs one session call on a sandboxd started with `--session`: the request is built
    /// as [`run`](Self::run) builds it (a cell carries no environment), and the reply
    /// carries the session's facts sandboxd stated, also when the call failed. An answer
    /// from a sandboxd outside any session is [`CallError::NotSession`].
    #[cfg(feature = "provider")]
    pub async fn session_call(
        &self,
        work: plimsoll_provider::SessionWork,
        timeout: Duration,
        env: Vec<(String, String)>,
    ) -> SessionReply {
        use crate::service::{SESSION_BOUNDARY_FAILED_KEY, SESSION_DISK_BYTES_KEY};
        use plimsoll_core::sandboxd_pb::{execute_request::Payload, execute_response::Result as R};
        use plimsoll_provider::{Answer, SessionAnswer, SessionWork, Work};
        let payload = match work {
            SessionWork::Run(Work::Javascript(js)) => Payload::Javascript(js),
            SessionWork::Run(Work::Project(p)) => Payload::Project(p),
            SessionWork::Cell(c) => Payload::Cell(c),
        };
        let resp = match self.execute_status(request(payload, timeout, env)).await {
            Ok(r) => r,
            Err(status) => {
                let meta = status.metadata();
                let disk_bytes = meta
                    .get(SESSION_DISK_BYTES_KEY)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok());
                let boundary_failed = meta
                    .get(SESSION_BOUNDARY_FAILED_KEY)
                    .is_some_and(|v| v.as_bytes() == b"1");
                return SessionReply {
                    answer: Err(CallError::from_status(status)),
                    disk_bytes,
                    boundary_failed,
                    changed: None,
                };
            }
        };
        if !resp.session {
            return SessionReply {
                answer: Err(CallError::NotSession),
                disk_bytes: None,
                boundary_failed: false,
                changed: None,
            };
        }
        let answer = match resp.result {
            Some(R::Javascript(j)) => Ok(SessionAnswer::Run(Answer::Javascript(j))),
            Some(R::Project(p)) => Ok(SessionAnswer::Run(Answer::Project(p))),
            Some(R::Cell(c)) => Ok(SessionAnswer::Cell(c)),
            None if !resp.session_changed.is_empty() => {
                Err(CallError::Refused(Refusal::environment(format!(
                    "the session's sandbox changed: {}; nothing ran",
                    resp.session_changed
                ))))
            }
            None => Err(CallError::NoResult),
        };
        SessionReply {
            answer,
            disk_bytes: Some(resp.session_disk_bytes),
            boundary_failed: resp.session_boundary_failed,
            changed: (!resp.session_changed.is_empty()).then_some(resp.session_changed),
        }
    }

    /// Asks which languages sandboxd proved and its version.
    pub async fn health(&self) -> Result<HealthResponse, CallError> {
        let mut request = Request::new(HealthRequest {});
        request.set_timeout(ANSWER_GRACE);
        self.inner
            .clone()
            .health(request)
            .await
            .map(|r| r.into_inner())
            .map_err(CallError::from_status)
    }

    /// How many connections this client has opened (1 unless the channel had to reconnect).
    pub fn dials(&self) -> u64 {
        self.dials.load(Ordering::Relaxed)
    }

    /// Where it connects, for logs.
    pub fn target(&self) -> &str {
        &self.target
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_sort_into_refused_and_may_have_run() {
        let marked = Refusal::capacity("busy").to_status();
        let e = CallError::from_status(marked);
        assert_eq!(e.not_dispatched(), Some(Reason::Capacity));
        assert_eq!(
            not_dispatched_reason(&e.to_status()),
            Some(Reason::Capacity)
        );

        let plain = CallError::from_status(Status::unavailable("connection reset"));
        assert_eq!(plain.not_dispatched(), None);
        assert_eq!(not_dispatched_reason(&plain.to_status()), None);
        assert_eq!(plain.to_status().code(), tonic::Code::Unavailable);
    }

    #[test]
    fn an_answer_without_a_result_may_have_run() {
        let e = CallError::NoResult;
        assert_eq!(e.not_dispatched(), None);
        assert!(e.refusal().is_none());
        assert_eq!(not_dispatched_reason(&e.to_status()), None);
        assert!(e.to_string().contains("may have run"), "{e}");
    }

    #[tokio::test]
    async fn a_closed_port_is_not_dispatched_environment() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let token = Token::new("x".repeat(20)).unwrap();
        let e = SandboxdClient::connect_plain(addr, &token)
            .await
            .unwrap_err();
        assert_eq!(e.not_dispatched(), Some(Reason::Environment));
        assert!(e.to_string().contains(&addr.to_string()), "{e}");
    }
}
