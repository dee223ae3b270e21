//! plimsoll-client: a small async client for `plimsoll.v1.SandboxService` that checks every
//! answer's run record (`RECORDS.md`, "What a client checks") before handing it back.
//!
//! It must never return an unchecked answer as a success, and never call an error "not
//! dispatched" unless the daemon marked it so: any other failure is reported as "the code
//! may have run", so nobody retries it automatically. It never logs the bearer token.
//!
//! `https://` addresses are served by rustls (ring provider) trusting only the PEM CA file
//! the caller names; the system's roots are never consulted.

pub mod files;

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use plimsoll_core::check::{check_answer, check_session_answer, check_unanswered, CheckError};
use plimsoll_core::digest::{session_fingerprint, ChainLink, SessionEvidence};
use plimsoll_core::pb::sandbox_service_client::SandboxServiceClient;
use plimsoll_core::{not_dispatched_reason, unanswered_call, Reason};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint, Uri};

pub use plimsoll_core::pb;

/// Largest answer the client decodes (outputs and artifacts included).
pub const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;

/// How long the client waits for a TCP (and TLS) connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the client reaches and authenticates to a daemon.
#[derive(Clone, Default)]
pub struct ClientOptions {
    /// Sent as `authorization: Bearer <token>` on every call.
    pub token: Option<String>,
    /// PEM CA certificates an `https://` daemon's certificate must chain to.
    pub ca_file: Option<PathBuf>,
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a credential: never print it.
        f.debug_struct("ClientOptions")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

/// Why a call did not produce a checked answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The client could not reach the daemon (or its options are unusable): nothing was sent.
    #[error("could not connect to {addr}: {detail}")]
    Connect {
        /// The address as given.
        addr: String,
        /// What went wrong, with its causes.
        detail: String,
    },
    /// The daemon refused the call with the not-dispatched mark: nothing ran.
    #[error("not dispatched ({reason}): {}", status.message())]
    Refused {
        /// Why nothing ran.
        reason: Reason,
        /// The status as received.
        status: tonic::Status,
    },
    /// An error without the not-dispatched mark: the code may have run. Never retry it
    /// automatically.
    #[error("the call failed without a not-dispatched mark, so the code may have run: {}: {}", code_name(status.code()), status.message())]
    MayHaveRun {
        /// The status as received.
        status: tonic::Status,
    },
    /// The answer failed the record check: it cannot be trusted and the code may have run.
    #[error("the answer failed the record check: {error}")]
    Check {
        /// What did not match.
        error: CheckError,
        /// The answer as received, for inspection.
        answer: Box<pb::RunResponse>,
    },
    /// A session call that may have run has no answer; its version-3 record checked and
    /// kept in the session's chain, so the session goes on.
    #[error("the session call has no answer and the code may have run ({}: {}); its unanswered record is kept in the chain", code_name(status.code()), status.message())]
    Unanswered {
        /// The daemon's error.
        status: tonic::Status,
        /// The checked version-3 record.
        record: Box<pb::RunRecord>,
    },
    /// Refused here, before sending: the session's chain can no longer be followed (an
    /// earlier call came back without an answer or a record this client could check).
    #[error("not dispatched (request): the session's record chain cannot be followed ({why}); nothing was sent, open a new session")]
    ChainLost {
        /// What broke the chain.
        why: String,
    },
    /// The close answer's counts differ from the client's own chain.
    #[error("the session's close answer differs from this client's chain: {0}")]
    CloseMismatch(String),
}

impl ClientError {
    /// The refusal reason when the daemon proved nothing ran; `None` otherwise. A
    /// connection failure also sent nothing, but carries no daemon reason.
    pub fn not_dispatched(&self) -> Option<Reason> {
        match self {
            ClientError::Refused { reason, .. } => Some(*reason),
            ClientError::ChainLost { .. } => Some(Reason::Request),
            _ => None,
        }
    }

    fn from_status(status: tonic::Status) -> Self {
        match not_dispatched_reason(&status) {
            Some(reason) => ClientError::Refused { reason, status },
            None => ClientError::MayHaveRun { status },
        }
    }
}

/// The snake_case gRPC code name (`deadline_exceeded`), as records and logs spell it.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "ok",
        Cancelled => "cancelled",
        Unknown => "unknown",
        InvalidArgument => "invalid_argument",
        DeadlineExceeded => "deadline_exceeded",
        NotFound => "not_found",
        AlreadyExists => "already_exists",
        PermissionDenied => "permission_denied",
        ResourceExhausted => "resource_exhausted",
        FailedPrecondition => "failed_precondition",
        Aborted => "aborted",
        OutOfRange => "out_of_range",
        Unimplemented => "unimplemented",
        Internal => "internal",
        Unavailable => "unavailable",
        DataLoss => "data_loss",
        Unauthenticated => "unauthenticated",
    }
}

/// The whole cause chain of an error, joined by `: `.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let next = c.to_string();
        if !s.ends_with(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = c.source();
    }
    s
}

/// A connection to one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    inner: SandboxServiceClient<Channel>,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl Client {
    /// Connects to `addr` (`http://127.0.0.1:8746` or `https://host:port`). For `https`,
    /// `opts.ca_file` names the PEM CA certificates the daemon's certificate must chain to.
    pub async fn connect(addr: &str, opts: ClientOptions) -> Result<Client, ClientError> {
        let fail = |detail: String| ClientError::Connect {
            addr: addr.to_owned(),
            detail,
        };
        let uri: Uri = addr
            .parse()
            .map_err(|e| fail(format!("not a URL like http://127.0.0.1:8746: {e}")))?;
        let host = uri
            .host()
            .ok_or_else(|| fail("the address names no host".into()))?
            .to_owned();
        let port = uri.port_u16();
        let authorization = match &opts.token {
            None => None,
            Some(t) => Some(
                format!("Bearer {}", t.trim())
                    .parse::<MetadataValue<_>>()
                    .map_err(|_| {
                        fail("the token is not a valid header value (visible ASCII only)".into())
                    })?,
            ),
        };

        let channel = match uri.scheme_str() {
            Some("http") => {
                if opts.ca_file.is_some() {
                    return Err(fail(
                        "a CA file was given for a plain http:// address; use https://".into(),
                    ));
                }
                Endpoint::from(uri.clone())
                    .connect_timeout(CONNECT_TIMEOUT)
                    .connect()
                    .await
                    .map_err(|e| fail(chain(&e)))?
            }
            Some("https") => {
                let ca_file = opts.ca_file.as_ref().ok_or_else(|| {
                    fail("an https:// address needs a CA file (the system's roots are never trusted)".into())
                })?;
                let tls = tls_connector(ca_file).map_err(fail)?;
                let port = port.unwrap_or(443);
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                let server_name = match bare.parse::<IpAddr>() {
                    Ok(ip) => ServerName::IpAddress(ip.into()),
                    Err(_) => ServerName::try_from(bare.to_owned())
                        .map_err(|e| fail(format!("bad server name {bare:?}: {e}")))?,
                };
                // tonic is handed a plain http:// endpoint so that it never applies TLS of
                // its own; the connector below does, and the origin keeps :scheme https.
                let plain: Uri = format!("http://{host}:{port}")
                    .parse()
                    .map_err(|e| fail(format!("{e}")))?;
                Endpoint::from(plain)
                    .origin(uri.clone())
                    .connect_timeout(CONNECT_TIMEOUT)
                    .connect_with_connector(TlsConnect {
                        tls,
                        server_name,
                        host: bare.to_owned(),
                        port,
                    })
                    .await
                    .map_err(|e| fail(chain(&e)))?
            }
            _ => {
                return Err(fail(
                    "the address must start with http:// or https://".into(),
                ))
            }
        };
        let inner = SandboxServiceClient::new(channel).max_decoding_message_size(MAX_ANSWER_BYTES);
        Ok(Client {
            inner,
            authorization,
        })
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(a) = &self.authorization {
            r.metadata_mut().insert("authorization", a.clone());
        }
        r
    }

    /// Sends `req`, then runs the client check on the answer. `Ok` means the answer's
    /// record matches what was sent and received and its tier meets the request's floor.
    pub async fn run(&mut self, req: pb::RunRequest) -> Result<pb::RunResponse, ClientError> {
        let answer = self
            .inner
            .run(self.request(req.clone()))
            .await
            .map_err(ClientError::from_status)?
            .into_inner();
        match check_answer(&req, &answer) {
            Ok(()) => Ok(answer),
            Err(error) => Err(ClientError::Check {
                error,
                answer: Box::new(answer),
            }),
        }
    }

    /// Asks the daemon what it serves: protocol, provider, tier, languages, limits.
    pub async fn describe(&mut self) -> Result<pb::DescribeResponse, ClientError> {
        Ok(self
            .inner
            .describe(self.request(pb::DescribeRequest {}))
            .await
            .map_err(ClientError::from_status)?
            .into_inner())
    }

    /// Opens a session. The answer's fingerprint must be the SHA-256 of its id.
    pub async fn open_session(
        &mut self,
        req: pb::OpenSessionRequest,
    ) -> Result<Session, ClientError> {
        let opened = self
            .inner
            .open_session(self.request(req))
            .await
            .map_err(ClientError::from_status)?
            .into_inner();
        let well_formed = opened.session_id.len() == 32
            && opened.session_id.bytes().all(|b| b.is_ascii_hexdigit());
        if !well_formed || session_fingerprint(&opened.session_id) != opened.session {
            return Err(ClientError::CloseMismatch(
                "the open answer's fingerprint is not the SHA-256 of its session id".into(),
            ));
        }
        Ok(Session::resume(
            opened.session_id.clone(),
            opened,
            0,
            String::new(),
        ))
    }

    /// Runs one call in `session` (its `session_id` is filled in here) and checks the
    /// answer's record, including that it is the next link of the session's chain. A call
    /// that may have run without an answer keeps its checked unanswered record in the
    /// chain ([`ClientError::Unanswered`]); one whose chain cannot be followed leaves the
    /// session unusable, and every later call is refused here before sending
    /// ([`ClientError::ChainLost`]).
    pub async fn session_run(
        &mut self,
        session: &mut Session,
        mut req: pb::SessionRunRequest,
    ) -> Result<pb::SessionRunResponse, ClientError> {
        if let Some(why) = &session.lost {
            return Err(ClientError::ChainLost { why: why.clone() });
        }
        req.session_id = session.id.clone();
        let expected = session.next_link();
        match self.inner.session_run(self.request(req.clone())).await {
            Ok(answer) => {
                let answer = answer.into_inner();
                let Some(run) = answer.run.as_ref() else {
                    session.lost = Some("an answer carried no run".into());
                    return Err(ClientError::Check {
                        error: CheckError::NoRecord,
                        answer: Box::default(),
                    });
                };
                if let Err(error) = check_session_answer(&req, run, &expected) {
                    session.lost = Some(format!("call {}: {error}", expected.sequence));
                    return Err(ClientError::Check {
                        error,
                        answer: Box::new(run.clone()),
                    });
                }
                session.advance(run.record.as_ref().map_or("", |r| &r.record_sha256));
                if answer.ended != 0 {
                    session.ended = Some((answer.ended(), answer.end_detail.clone()));
                }
                Ok(answer)
            }
            Err(status) if not_dispatched_reason(&status).is_some() => {
                if let Some(e) = plimsoll_core::session_ended(&status) {
                    session.ended = Some((e.reason(), e.detail));
                }
                Err(ClientError::from_status(status))
            }
            Err(status) => {
                let Some(record) = unanswered_call(&status) else {
                    session.lost = Some(format!(
                        "call {} failed with no answer and no unanswered record",
                        expected.sequence
                    ));
                    return Err(ClientError::MayHaveRun { status });
                };
                if let Err(error) = check_unanswered(&req, &record, &expected, &session.evidence) {
                    session.lost = Some(format!("call {}: {error}", expected.sequence));
                    return Err(ClientError::MayHaveRun { status });
                }
                session.advance(&record.record_sha256);
                Err(ClientError::Unanswered {
                    status,
                    record: Box::new(record),
                })
            }
        }
    }

    /// Closes `session` and checks that the daemon's count of executed calls and last
    /// record digest are this client's own.
    pub async fn close_session(
        &mut self,
        session: &Session,
    ) -> Result<pb::CloseSessionResponse, ClientError> {
        let closed = self
            .inner
            .close_session(self.request(pb::CloseSessionRequest {
                protocol: plimsoll_core::PROTOCOL,
                session_id: session.id.clone(),
            }))
            .await
            .map_err(ClientError::from_status)?
            .into_inner();
        if closed.session != session.opened.session {
            return Err(ClientError::CloseMismatch(
                "the close answer names another session".into(),
            ));
        }
        if session.lost.is_none()
            && (closed.calls != session.calls || closed.last_record_sha256 != session.last_sha256)
        {
            return Err(ClientError::CloseMismatch(format!(
                "the daemon counts {} calls ending in {:?}, this client {} ending in {:?}",
                closed.calls, closed.last_record_sha256, session.calls, session.last_sha256
            )));
        }
        Ok(closed)
    }
}

/// A rustls client config trusting exactly the certificates in `ca_file`.
/// A session as its caller holds it: the id (a capability, never printed), what the
/// daemon stated at open, and the chain position this client has checked.
#[derive(Clone)]
pub struct Session {
    id: String,
    opened: pb::OpenSessionResponse,
    evidence: SessionEvidence,
    calls: u64,
    last_sha256: String,
    lost: Option<String>,
    ended: Option<(pb::SessionEnd, String)>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("session", &self.opened.session)
            .field("calls", &self.calls)
            .field("last_sha256", &self.last_sha256)
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Resumes a session from its id and the chain position a caller stored (for example
    /// a CLI between two commands). The evidence of unanswered records is checked against
    /// `opened`.
    pub fn resume(
        id: String,
        opened: pb::OpenSessionResponse,
        calls: u64,
        last_sha256: String,
    ) -> Session {
        Session {
            evidence: SessionEvidence {
                provider: opened.sandbox.clone(),
                isolation: opened.isolation.clone(),
                environment: String::new(),
                software_identity: opened.software_identity.clone(),
                policy: String::new(),
            },
            id,
            opened,
            calls,
            last_sha256,
            lost: None,
            ended: None,
        }
    }
    /// The session id: a capability; keep it as secret as a token.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// What the daemon answered at open.
    pub fn opened(&self) -> &pb::OpenSessionResponse {
        &self.opened
    }
    /// What the daemon stated at open, as an unanswered call's record must repeat it.
    pub fn evidence(&self) -> &SessionEvidence {
        &self.evidence
    }
    /// The fingerprint (what records and logs carry).
    pub fn fingerprint(&self) -> &str {
        &self.opened.session
    }
    /// Executed calls this client has checked (answered and unanswered).
    pub fn calls(&self) -> u64 {
        self.calls
    }
    /// The last checked record digest, empty before the first call.
    pub fn last_record_sha256(&self) -> &str {
        &self.last_sha256
    }
    /// Why the chain can no longer be followed, if it cannot.
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }
    /// Why the session ended, once an answer said so.
    pub fn ended(&self) -> Option<&(pb::SessionEnd, String)> {
        self.ended.as_ref()
    }
    fn next_link(&self) -> ChainLink {
        ChainLink {
            session: self.opened.session.clone(),
            sequence: self.calls + 1,
            previous_sha256: self.last_sha256.clone(),
        }
    }
    fn advance(&mut self, sha: &str) {
        self.calls += 1;
        self.last_sha256 = sha.to_owned();
    }
}

fn tls_connector(ca_file: &std::path::Path) -> Result<tokio_rustls::TlsConnector, String> {
    let pem = std::fs::read(ca_file)
        .map_err(|e| format!("CA file {}: cannot read: {e}", ca_file.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("CA file {}: bad PEM: {e}", ca_file.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("CA file {}: unusable certificate: {e}", ca_file.display()))?;
        n += 1;
    }
    if n == 0 {
        return Err(format!(
            "CA file {}: holds no certificate",
            ca_file.display()
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Dials TCP and runs the TLS handshake; hands tonic the encrypted stream.
#[derive(Clone)]
struct TlsConnect {
    tls: tokio_rustls::TlsConnector,
    server_name: ServerName<'static>,
    host: String,
    port: u16,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower::Service<Uri> for TlsConnect {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect((this.host.as_str(), this.port)).await?;
            tcp.set_nodelay(true)?;
            let tls = this.tls.connect(this.server_name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_display_names_the_reason() {
        let status =
            plimsoll_core::Refusal::isolation("tier process is below floor vm").to_status();
        let e = ClientError::from_status(status);
        assert_eq!(e.not_dispatched(), Some(Reason::Isolation));
        assert_eq!(
            e.to_string(),
            "not dispatched (isolation): tier process is below floor vm"
        );
        let e = ClientError::from_status(tonic::Status::internal("boom"));
        assert_eq!(e.not_dispatched(), None);
        assert!(e.to_string().contains("may have run"), "{e}");
    }

    #[test]
    fn options_debug_hides_the_token() {
        let o = ClientOptions {
            token: Some("sekrit-token-value".into()),
            ca_file: None,
        };
        assert!(!format!("{o:?}").contains("sekrit"));
    }

    #[tokio::test]
    async fn bad_addresses_are_connect_errors() {
        for addr in ["127.0.0.1:1", "ftp://127.0.0.1:1", "https://127.0.0.1:1"] {
            let e = Client::connect(addr, ClientOptions::default())
                .await
                .unwrap_err();
            assert!(matches!(e, ClientError::Connect { .. }), "{addr}: {e}");
        }
    }
}
