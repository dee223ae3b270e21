//! plimsolld's side of the pod channel: TLS 1.3 to a pod's IP, trusting only the CA file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::Refusal;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::pem::{read_ca_file, CaFileError};
use crate::screen::alert_name;
use crate::{provider, ALPN_H2};

/// The name checked in the pod certificate when none is configured.
pub const DEFAULT_SERVER_NAME: &str = "sandboxd.plimsoll.invalid";

/// What a pod's certificate must prove besides its chain to the CA file
/// (`SANDBOX_AGENTSANDBOX_POD_IDENTITY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodIdentity {
    /// `shared`: one certificate for every pod, carrying the configured server name. A
    /// handshake proves "a pod of this deployment", not "the pod dialed".
    #[default]
    Shared,
    /// `ip`: each pod's own certificate must carry, as an IP subject alternative name, the
    /// exact address plimsolld dialed (read from the claim's status). The server name is
    /// not checked in this mode.
    Ip,
}

impl PodIdentity {
    /// The variable's value for this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            PodIdentity::Shared => "shared",
            PodIdentity::Ip => "ip",
        }
    }

    /// Parses the variable's value (`shared` or `ip`).
    pub fn parse(s: &str) -> Option<PodIdentity> {
        match s {
            "shared" => Some(PodIdentity::Shared),
            "ip" => Some(PodIdentity::Ip),
            _ => None,
        }
    }
}

impl std::fmt::Display for PodIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How long a TCP connect plus TLS handshake may take before the pod is given up on.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A TLS client that trusts exactly the certificates of one CA file (never the system's
/// roots), speaks TLS 1.3 only, offers ALPN `h2` and requires the server to select it.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
    server_name_text: String,
    ca_file: PathBuf,
    ca_count: usize,
    timeout: Duration,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_file", &self.ca_file)
            .field("ca_count", &self.ca_count)
            .field("server_name", &self.server_name_text)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A configuration error of the client (a startup error for plimsolld).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientTlsError {
    /// The CA file is unusable.
    #[error(transparent)]
    CaFile(#[from] CaFileError),
    /// The server name is neither a DNS name nor an IP address.
    #[error("server name {name:?} is not a valid DNS name or IP address")]
    ServerName {
        /// The name given.
        name: String,
    },
}

impl ClientTls {
    /// Builds the client from the CA file alone (one or more `CERTIFICATE` blocks; anything
    /// else, an empty file or an unreadable one is an error naming the file).
    pub fn from_ca_file(
        ca_file: impl AsRef<Path>,
        server_name: &str,
    ) -> Result<ClientTls, ClientTlsError> {
        let ca_file = ca_file.as_ref();
        let certs = read_ca_file(ca_file)?;
        let mut roots = RootCertStore::empty();
        for (i, c) in certs.iter().enumerate() {
            roots
                .add(c.clone())
                .map_err(|e| CaFileError::BadCertificate {
                    path: ca_file.to_owned(),
                    index: i + 1,
                    reason: e.to_string(),
                })?;
        }
        let name = ServerName::try_from(server_name.to_owned()).map_err(|_| {
            ClientTlsError::ServerName {
                name: server_name.to_owned(),
            }
        })?;
        let mut cfg = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("the ring provider supports TLS 1.3")
            .with_root_certificates(roots)
            .with_no_client_auth();
        cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
        // Every connection verifies the pod's chain in full; no resumption across pods.
        cfg.resumption = rustls::client::Resumption::disabled();
        cfg.enable_early_data = false;
        Ok(ClientTls {
            config: Arc::new(cfg),
            server_name: name,
            server_name_text: server_name.to_owned(),
            ca_file: ca_file.to_owned(),
            ca_count: certs.len(),
            timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        })
    }

    /// The same client with another bound on connect plus handshake.
    pub fn with_timeout(mut self, timeout: Duration) -> ClientTls {
        self.timeout = timeout;
        self
    }

    /// The CA file trusted.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// How many CA certificates the file held.
    pub fn ca_count(&self) -> usize {
        self.ca_count
    }

    /// The name checked in the server's certificate.
    pub fn server_name(&self) -> &str {
        &self.server_name_text
    }

    /// The rustls configuration (TLS 1.3, ALPN h2, the CA file's roots).
    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }

    /// Dials `addr`, completes the TLS handshake and checks that `h2` was selected. No
    /// application byte is sent before this returns `Ok`, so every error here means the pod
    /// was sent nothing.
    pub async fn connect(&self, addr: SocketAddr) -> Result<TlsStream<TcpStream>, ConnectError> {
        match tokio::time::timeout(self.timeout, self.connect_inner(addr)).await {
            Ok(r) => r,
            Err(_) => Err(ConnectError::Timeout {
                addr,
                after: self.timeout,
                ca_file: self.ca_file.clone(),
                server_name: self.server_name_text.clone(),
            }),
        }
    }

    async fn connect_inner(&self, addr: SocketAddr) -> Result<TlsStream<TcpStream>, ConnectError> {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| ConnectError::Connect { addr, source })?;
        let _ = tcp.set_nodelay(true);
        let connector = TlsConnector::from(self.config.clone());
        let tls = connector
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| ConnectError::Handshake {
                addr,
                ca_file: self.ca_file.clone(),
                server_name: self.server_name_text.clone(),
                reason: describe_client_io_error(&e),
            })?;
        if tls.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
            return Err(ConnectError::Handshake {
                addr,
                ca_file: self.ca_file.clone(),
                server_name: self.server_name_text.clone(),
                reason: "the server selected no ALPN protocol; h2 is required".into(),
            });
        }
        Ok(tls)
    }
}

/// Why a pod could not be reached over a confirmed TLS channel. Every variant means nothing
/// was sent to the pod.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The TCP connection failed.
    #[error("cannot connect to sandboxd at {addr}: {source}")]
    Connect {
        /// The pod address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Connect plus handshake took too long.
    #[error("TLS handshake with sandboxd at {addr} did not complete within {after:?} (CA file {ca_file}, server name {server_name})", ca_file = .ca_file.display())]
    Timeout {
        /// The pod address.
        addr: SocketAddr,
        /// The bound.
        after: Duration,
        /// The CA file trusted.
        ca_file: PathBuf,
        /// The name checked.
        server_name: String,
    },
    /// The handshake failed: unknown issuer, wrong name, wrong version, no ALPN `h2`, ...
    #[error("TLS handshake with sandboxd at {addr} failed (CA file {ca_file}, server name {server_name}): {reason}", ca_file = .ca_file.display())]
    Handshake {
        /// The pod address.
        addr: SocketAddr,
        /// The CA file trusted.
        ca_file: PathBuf,
        /// The name checked.
        server_name: String,
        /// The fault and the TLS alert, e.g. `invalid peer certificate: UnknownIssuer
        /// (alert sent: unknown_ca)`.
        reason: String,
    },
}

impl ConnectError {
    /// The refusal plimsolld answers with: nothing was dispatched, reason `environment`
    /// (the sandbox could not be confirmed, so the run's environment is not the one the
    /// operator configured). The message is this error's text.
    pub fn to_refusal(&self) -> Refusal {
        Refusal::environment(format!("the sandbox could not be confirmed: {self}"))
    }
}

/// Turns tokio-rustls' I/O error into the fault and alert.
fn describe_client_io_error(e: &std::io::Error) -> String {
    match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        Some(re) => describe_client_error(re),
        None => match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                "the server closed the connection during the handshake (is it a TLS 1.3 server with ALPN h2?)".into()
            }
            _ => e.to_string(),
        },
    }
}

/// Describes a client-side rustls error with the alert sent or received.
pub fn describe_client_error(e: &rustls::Error) -> String {
    use rustls::Error as E;
    match e {
        E::InvalidCertificate(ce) => {
            let alert: rustls::AlertDescription = ce.clone().into();
            format!(
                "invalid peer certificate: {ce:?} (alert sent: {})",
                alert_name(alert)
            )
        }
        E::AlertReceived(a) => format!("the server sent alert {}", alert_name(*a)),
        E::PeerIncompatible(p) => {
            format!("server incompatible: {p:?} (alert sent: handshake_failure)")
        }
        E::PeerMisbehaved(p) => format!("server misbehaved: {p:?}"),
        E::NoApplicationProtocol => {
            "the server selected no ALPN h2 (alert sent: no_application_protocol)".into()
        }
        E::InvalidMessage(m) => format!(
            "malformed TLS message from the server: {m:?} (alert sent: decode_error; is it TLS?)"
        ),
        other => other.to_string(),
    }
}
