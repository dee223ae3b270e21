//! plimsoll-client: a small async client for `plimsoll.v1.SandboxService` that checks every
//! answer's run record (`RECORDS.md`, "What a client checks") before handing it back.
//!
//! It must never return an unchecked answer as a success, and never call an error "not
//! dispatched" unless the daemon marked it so: any other failure is reported as "the code
//! may have run", so nobody retries it automatically. It never logs the bearer token.
//!
//! `https://` addresses are served by rustls (ring provider) trusting only the PEM CA file
//! the caller names; the system's roots are never consulted.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use plimsoll_core::check::{check_answer, CheckError};
use plimsoll_core::pb::sandbox_service_client::SandboxServiceClient;
use plimsoll_core::{not_dispatched_reason, Reason};
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
}

impl ClientError {
    /// The refusal reason when the daemon proved nothing ran; `None` otherwise. A
    /// connection failure also sent nothing, but carries no daemon reason.
    pub fn not_dispatched(&self) -> Option<Reason> {
        match self {
            ClientError::Refused { reason, .. } => Some(*reason),
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
}

/// A rustls client config trusting exactly the certificates in `ca_file`.
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
