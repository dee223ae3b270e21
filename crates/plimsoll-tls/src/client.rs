//! plimsolld's side of the pod channel: TLS 1.3 to a pod's IP, trusting only the CA file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use plimsoll_core::Refusal;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::pem::{read_ca_file, root_store, CaFileError, PairError};
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
    identity: PodIdentity,
    client_cert: Option<ClientPair>,
    ca_file: PathBuf,
    ca_count: usize,
    timeout: Duration,
}

/// The client certificate plimsolld presents (mutual TLS), as files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientPair {
    /// PEM certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// PEM private key of the leaf.
    pub key_file: PathBuf,
}

/// Everything a [`ClientTls`] is built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSpec {
    /// The CA file the pods' certificates must chain to.
    pub ca_file: PathBuf,
    /// The name checked in a shared certificate ([`PodIdentity::Shared`]).
    pub server_name: String,
    /// What the pod's certificate must prove besides its chain.
    pub identity: PodIdentity,
    /// The client certificate to present, if any.
    pub client_cert: Option<ClientPair>,
}

impl ClientSpec {
    /// A shared-certificate, token-only spec: the CA file and the server name.
    pub fn shared(ca_file: impl Into<PathBuf>, server_name: &str) -> ClientSpec {
        ClientSpec {
            ca_file: ca_file.into(),
            server_name: server_name.to_owned(),
            identity: PodIdentity::Shared,
            client_cert: None,
        }
    }

    /// The files a reload must watch: the CA file, then the client pair if any.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut v = vec![self.ca_file.clone()];
        if let Some(p) = &self.client_cert {
            v.push(p.cert_file.clone());
            v.push(p.key_file.clone());
        }
        v
    }
}

/// Presents one fixed certificate to every server that asks.
#[derive(Debug)]
struct FixedClientCert(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for FixedClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_file", &self.ca_file)
            .field("ca_count", &self.ca_count)
            .field("server_name", &self.server_name_text)
            .field("identity", &self.identity)
            .field("client_cert", &self.client_cert)
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
    /// The client certificate or key file cannot be read.
    #[error("client certificate: cannot read {path}: {source}")]
    ClientRead {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The client certificate and key do not make a usable pair (or the certificate is
    /// outside its validity).
    #[error("client certificate {cert} with key {key}: {source}", cert = .cert_file.display(), key = .key_file.display())]
    ClientPair {
        /// The certificate file.
        cert_file: PathBuf,
        /// The key file.
        key_file: PathBuf,
        /// Why (names labels and the certificate's summary, never key bytes).
        #[source]
        source: Box<PairError>,
    },
}

impl ClientTls {
    /// Builds the client from the CA file alone (one or more `CERTIFICATE` blocks; anything
    /// else, an empty file or an unreadable one is an error naming the file).
    pub fn from_ca_file(
        ca_file: impl AsRef<Path>,
        server_name: &str,
    ) -> Result<ClientTls, ClientTlsError> {
        ClientTls::build(&ClientSpec::shared(ca_file.as_ref(), server_name))
    }

    /// Builds the client from a whole spec: the CA file, what the pod's certificate must
    /// prove ([`PodIdentity`]) and the client certificate to present (read and checked
    /// now: a pair whose key does not match, or whose certificate is outside its validity,
    /// is an error naming both files).
    pub fn build(spec: &ClientSpec) -> Result<ClientTls, ClientTlsError> {
        let ca_file = spec.ca_file.as_path();
        let server_name = spec.server_name.as_str();
        let certs = read_ca_file(ca_file)?;
        let roots = root_store(ca_file, &certs)?;
        let name = ServerName::try_from(server_name.to_owned()).map_err(|_| {
            ClientTlsError::ServerName {
                name: server_name.to_owned(),
            }
        })?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("the ring provider supports TLS 1.3")
            .with_root_certificates(roots);
        let mut cfg = match &spec.client_cert {
            None => builder.with_no_client_auth(),
            Some(pair) => {
                let key = load_client_pair(pair)?;
                builder.with_client_cert_resolver(Arc::new(FixedClientCert(key)))
            }
        };
        cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
        // Every connection verifies the pod's chain in full; no resumption across pods.
        cfg.resumption = rustls::client::Resumption::disabled();
        cfg.enable_early_data = false;
        Ok(ClientTls {
            config: Arc::new(cfg),
            server_name: name,
            server_name_text: server_name.to_owned(),
            identity: spec.identity,
            client_cert: spec.client_cert.clone(),
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

    /// The name checked in the server's certificate (shared identity only).
    pub fn server_name(&self) -> &str {
        &self.server_name_text
    }

    /// What a pod's certificate must prove besides its chain.
    pub fn identity(&self) -> PodIdentity {
        self.identity
    }

    /// The client certificate presented, if any.
    pub fn client_cert(&self) -> Option<&ClientPair> {
        self.client_cert.as_ref()
    }

    /// What the pod at `addr` must carry, for messages: the server name, or the IP.
    pub fn expected_name(&self, addr: SocketAddr) -> String {
        match self.identity {
            PodIdentity::Shared => self.server_name_text.clone(),
            PodIdentity::Ip => format!("IP address {} (pod identity ip)", addr.ip()),
        }
    }

    /// The rustls configuration (TLS 1.3, ALPN h2, the CA file's roots).
    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.clone()
    }

    /// Dials `addr`, completes the TLS handshake and checks that `h2` was selected. No
    /// application byte is sent before this returns `Ok`, so every error here means the pod
    /// was sent nothing.
    ///
    /// With a client certificate, TLS 1.3 lets the client finish its handshake before the
    /// server has judged that certificate; so the client then waits for the server's
    /// first bytes (sandboxd's HTTP/2 SETTINGS, which a server sends unasked) and returns
    /// only once they came: a terminator that refused the certificate answers with an
    /// alert instead, which is reported here as a failed handshake, with nothing sent.
    pub async fn connect(&self, addr: SocketAddr) -> Result<ClientStream, ConnectError> {
        match tokio::time::timeout(self.timeout, self.connect_inner(addr)).await {
            Ok(r) => r,
            Err(_) => Err(ConnectError::Timeout {
                addr,
                after: self.timeout,
                ca_file: self.ca_file.clone(),
                server_name: self.expected_name(addr),
            }),
        }
    }

    async fn connect_inner(&self, addr: SocketAddr) -> Result<ClientStream, ConnectError> {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|source| ConnectError::Connect { addr, source })?;
        let _ = tcp.set_nodelay(true);
        let connector = TlsConnector::from(self.config.clone());
        // Per-pod identity: the name verified is the address dialed, so webpki requires
        // an IP subject alternative name equal to it (and no SNI is sent).
        let name = match self.identity {
            PodIdentity::Shared => self.server_name.clone(),
            PodIdentity::Ip => ServerName::IpAddress(addr.ip().into()),
        };
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| self.handshake_error(addr, describe_client_io_error(&e)))?;
        if tls.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
            return Err(self.handshake_error(
                addr,
                "the server selected no ALPN protocol; h2 is required".into(),
            ));
        }
        let mut stream = ClientStream {
            inner: tls,
            pending: Vec::new(),
            pos: 0,
        };
        if self.client_cert.is_some() {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0u8; 4096];
            match stream.inner.read(&mut buf).await {
                Ok(n) if n > 0 => {
                    buf.truncate(n);
                    stream.pending = buf;
                }
                Ok(_) => return Err(self.closed_after_handshake(addr)),
                Err(e)
                    if e.kind() == std::io::ErrorKind::UnexpectedEof
                        && e.get_ref()
                            .and_then(|i| i.downcast_ref::<rustls::Error>())
                            .is_none() =>
                {
                    return Err(self.closed_after_handshake(addr))
                }
                Err(e) => return Err(self.client_cert_refused(addr, &e)),
            }
        }
        Ok(stream)
    }

    /// The terminator answered the client certificate with an alert (or the connection
    /// broke): the advice depends on which alert.
    fn client_cert_refused(&self, addr: SocketAddr, e: &std::io::Error) -> ConnectError {
        use rustls::AlertDescription as A;
        let cert = self
            .client_cert
            .as_ref()
            .map(|p| p.cert_file.display().to_string())
            .unwrap_or_default();
        let alert = e
            .get_ref()
            .and_then(|i| i.downcast_ref::<rustls::Error>())
            .and_then(|re| match re {
                rustls::Error::AlertReceived(a) => Some(*a),
                _ => None,
            });
        let advice = match alert {
            Some(A::CertificateExpired) => format!(
                "renew plimsolld's client certificate {cert} (SANDBOX_AGENTSANDBOX_CLIENT_CERT_FILE); it is re-read when it changes"
            ),
            Some(A::UnknownCA | A::BadCertificate | A::CertificateRequired | A::CertificateUnknown | A::UnsupportedCertificate) | None => format!(
                "the pod's PLIMSOLL_SANDBOXD_CLIENT_CA must hold the CA that signed plimsolld's client certificate {cert}"
            ),
            Some(_) => "see the pod's log for why the terminator refused the connection".to_owned(),
        };
        self.handshake_error(
            addr,
            format!(
                "the pod did not accept plimsolld's client certificate ({}); {advice}",
                describe_client_io_error(e)
            ),
        )
    }

    /// The terminator accepted the handshake (and so the client certificate) but closed
    /// without a byte from sandboxd: nothing was forwarded to the code's side of the pod.
    fn closed_after_handshake(&self, addr: SocketAddr) -> ConnectError {
        self.handshake_error(addr, "the pod's terminator accepted the handshake, then closed the connection before sandboxd said a word (sandboxd not answering, or its socket replaced); see the pod's log".into())
    }

    /// A failed handshake with the pod at `addr`, naming the CA file and what the pod had
    /// to prove.
    fn handshake_error(&self, addr: SocketAddr, reason: String) -> ConnectError {
        ConnectError::Handshake {
            addr,
            ca_file: self.ca_file.clone(),
            server_name: self.expected_name(addr),
            reason,
        }
    }
}

/// A confirmed connection to a pod: the TLS stream, with whatever the server sent while
/// the client waited for its acceptance of the client certificate handed back first.
pub struct ClientStream {
    inner: TlsStream<TcpStream>,
    pending: Vec<u8>,
    pos: usize,
}

impl std::fmt::Debug for ClientStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientStream")
            .field("buffered", &(self.pending.len() - self.pos))
            .finish()
    }
}

impl ClientStream {
    /// The TLS connection (peer certificates, ALPN, ...).
    pub fn connection(&self) -> &rustls::ClientConnection {
        self.inner.get_ref().1
    }
}

impl tokio::io::AsyncRead for ClientStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.pos < self.pending.len() {
            let n = buf.remaining().min(self.pending.len() - self.pos);
            let start = self.pos;
            buf.put_slice(&self.pending[start..start + n]);
            self.pos += n;
            if self.pos == self.pending.len() {
                self.pending = Vec::new();
                self.pos = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for ClientStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Reads and checks the client pair: PEM chain and key that match, the leaf inside its
/// validity now.
fn load_client_pair(pair: &ClientPair) -> Result<Arc<rustls::sign::CertifiedKey>, ClientTlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| ClientTlsError::ClientRead {
            path: path.to_owned(),
            source,
        })
    };
    let crt = read(&pair.cert_file)?;
    let key = read(&pair.key_file)?;
    let pair_error = |source| ClientTlsError::ClientPair {
        cert_file: pair.cert_file.clone(),
        key_file: pair.key_file.clone(),
        source: Box::new(source),
    };
    let ck = crate::pem::certified_key_from_pem(&crt, &key).map_err(pair_error)?;
    crate::pem::check_validity(&ck.cert[0], std::time::SystemTime::now()).map_err(pair_error)?;
    Ok(ck)
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
        E::InvalidCertificate(rustls::CertificateError::NotValidForNameContext {
            expected,
            presented,
        }) => {
            let expected = match expected {
                ServerName::IpAddress(ip) => format!("IP address {}", std::net::IpAddr::from(*ip)),
                other => format!("name {}", other.to_str()),
            };
            let carried = if presented.is_empty() {
                "no subject alternative name at all".to_owned()
            } else {
                presented.join(", ")
            };
            format!(
                "invalid peer certificate: NotValidForName: it does not carry {expected}; it carries {carried} (alert sent: bad_certificate)"
            )
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn self_signed(name: &str, ca: bool) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        if ca {
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        }
        (p.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    #[test]
    fn a_client_pair_that_does_not_match_or_is_missing_names_its_files() {
        let d = tempfile::tempdir().unwrap();
        let (ca, _) = self_signed("ca.invalid", true);
        std::fs::write(d.path().join("ca.pem"), ca).unwrap();
        let (cert, key) = self_signed("plimsolld.invalid", false);
        let (_, other_key) = self_signed("other.invalid", false);
        std::fs::write(d.path().join("c.crt"), &cert).unwrap();
        std::fs::write(d.path().join("c.key"), &key).unwrap();
        std::fs::write(d.path().join("other.key"), &other_key).unwrap();
        let spec = |key_file: &str| ClientSpec {
            client_cert: Some(ClientPair {
                cert_file: d.path().join("c.crt"),
                key_file: d.path().join(key_file),
            }),
            identity: PodIdentity::Ip,
            ..ClientSpec::shared(d.path().join("ca.pem"), DEFAULT_SERVER_NAME)
        };
        let ok = ClientTls::build(&spec("c.key")).unwrap();
        assert_eq!(ok.identity(), PodIdentity::Ip);
        assert!(ok.client_cert().is_some());
        assert_eq!(
            ok.expected_name("10.0.3.7:9090".parse().unwrap()),
            "IP address 10.0.3.7 (pod identity ip)"
        );

        let e = ClientTls::build(&spec("other.key"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("c.crt") && e.contains("other.key"), "{e}");
        assert!(e.contains("does not match"), "{e}");
        assert!(!e.contains("BEGIN"), "no key material in errors: {e}");

        let e = ClientTls::build(&spec("missing.key"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.key"), "{e}");
    }
}
