//! plimsoll-tls: the TLS 1.3 channel between plimsolld and a pod's sandboxd. The server side
//! is the pod's terminator (`plimsoll-sandboxd-tls`): it serves TLS 1.3 with ALPN `h2` from a
//! rotating Secret directory and forwards to sandboxd on loopback. The client side is what
//! plimsolld's providers dial pods with, trusting one CA file.
//!
//! It must never load the system's root certificates, never accept anything but TLS 1.3,
//! never forward a byte from a connection that has not completed the handshake with `h2`,
//! and never write key material (or certificate bytes) to a log.

use std::sync::Arc;

pub mod client;
pub mod client_auth;
pub mod pem;
pub mod screen;
pub mod server;
pub mod supervise;
pub mod terminator;

pub use client::{
    ClientPair, ClientSpec, ClientStream, ClientTls, ClientTlsError, ConnectError, PodIdentity,
    DEFAULT_SERVER_NAME,
};
pub use client_auth::{ClientCaFile, ClientCaReload, CLIENT_CA_VAR};
pub use pem::{CaFileError, PairError};
pub use server::{server_config, server_config_with, CertDir, RotatingCert};
pub use terminator::{Terminator, TerminatorConfig};

/// The one ALPN protocol the channel speaks: HTTP/2, for gRPC.
pub const ALPN_H2: &[u8] = b"h2";

/// The crypto provider for every configuration here: `ring`, so static builds need no
/// C toolchain beyond what ring itself brings.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[cfg(test)]
pub(crate) mod test_support {
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    /// Accepts any server certificate: only for feeding the server state machine in tests.
    #[derive(Debug)]
    pub struct AcceptAny;

    impl ServerCertVerifier for AcceptAny {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            crate::provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
}
