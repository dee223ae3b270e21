//! The terminator's side of mutual TLS: a client certificate is required and must chain to
//! the CA file named by `PLIMSOLL_SANDBOXD_CLIENT_CA` (public certificates only) before a
//! byte is forwarded. The file is re-read by content, like the certificate directory, and
//! a rotated CA file is used for every later handshake; an unusable new file is refused and
//! the previous CAs kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::pem::{parse_ca_pem, root_store, CaFileError};
use crate::provider;

/// The environment variable naming the client CA file (pod side).
pub const CLIENT_CA_VAR: &str = "PLIMSOLL_SANDBOXD_CLIENT_CA";

/// A client-certificate verifier whose CAs can be replaced while it serves.
#[derive(Debug)]
pub struct RotatingClientVerifier {
    current: RwLock<Arc<dyn ClientCertVerifier>>,
}

impl RotatingClientVerifier {
    fn current(&self) -> Arc<dyn ClientCertVerifier> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn swap(&self, next: Arc<dyn ClientCertVerifier>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = next;
    }
}

impl ClientCertVerifier for RotatingClientVerifier {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: the client has exactly one certificate to offer anyway, and the CA list
    /// changes under rotation.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Builds the webpki verifier for a set of CA certificates (every client must present a
/// certificate chaining to one of them, with the `clientAuth` usage when it states any).
fn verifier_for(
    path: &Path,
    certs: &[CertificateDer<'static>],
) -> Result<Arc<dyn ClientCertVerifier>, CaFileError> {
    let roots = root_store(path, certs)?;
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| CaFileError::BadCertificate {
            path: path.to_owned(),
            index: 1,
            reason: e.to_string(),
        })
}

/// What one poll of the client CA file found.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClientCaReload {
    /// Same bytes as the CAs in use (or as a file already refused).
    Unchanged,
    /// New CAs are used for every later handshake; how many certificates the file holds.
    Reloaded(usize),
    /// The file changed to something unusable; the previous CAs are kept. Reported once
    /// per distinct content.
    Rejected(CaFileError),
}

/// The client CA file and the verifier made from it.
#[derive(Debug)]
pub struct ClientCaFile {
    path: PathBuf,
    served: [u8; 32],
    rejected: Option<[u8; 32]>,
    verifier: Arc<RotatingClientVerifier>,
}

fn digest_of(bytes: &std::io::Result<Vec<u8>>) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    match bytes {
        Ok(b) => ctx.update(b),
        Err(e) => {
            ctx.update(b"error:");
            ctx.update(e.to_string().as_bytes());
        }
    }
    let mut d = [0u8; 32];
    d.copy_from_slice(ctx.finish().as_ref());
    d
}

fn load(
    path: &Path,
    bytes: std::io::Result<Vec<u8>>,
) -> Result<(Arc<dyn ClientCertVerifier>, usize), CaFileError> {
    let bytes = bytes.map_err(|source| CaFileError::Unreadable {
        path: path.to_owned(),
        source,
    })?;
    let certs = parse_ca_pem(&bytes).map_err(|e| e.with_path(path))?;
    Ok((verifier_for(path, &certs)?, certs.len()))
}

impl ClientCaFile {
    /// Reads the file once (one or more `CERTIFICATE` blocks and nothing else); an unusable
    /// file is an error naming it. Returns the number of CA certificates too.
    pub fn open(path: &Path) -> Result<(ClientCaFile, usize), CaFileError> {
        let bytes = std::fs::read(path);
        let served = digest_of(&bytes);
        let (v, n) = load(path, bytes)?;
        Ok((
            ClientCaFile {
                path: path.to_owned(),
                served,
                rejected: None,
                verifier: Arc::new(RotatingClientVerifier {
                    current: RwLock::new(v),
                }),
            },
            n,
        ))
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The verifier to build the server configuration with.
    pub fn verifier(&self) -> Arc<RotatingClientVerifier> {
        self.verifier.clone()
    }

    /// Re-reads the file and, when its bytes changed and hold usable CA certificates,
    /// uses them for every later handshake. Open connections are not touched.
    pub fn poll(&mut self) -> ClientCaReload {
        let bytes = std::fs::read(&self.path);
        let d = digest_of(&bytes);
        if d == self.served || self.rejected == Some(d) {
            return ClientCaReload::Unchanged;
        }
        match load(&self.path, bytes) {
            Ok((v, n)) => {
                self.verifier.swap(v);
                self.served = d;
                self.rejected = None;
                ClientCaReload::Reloaded(n)
            }
            Err(e) => {
                self.rejected = Some(d);
                ClientCaReload::Rejected(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem(name: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, name.to_owned());
        p.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn a_broken_rotation_keeps_the_previous_cas_and_a_good_one_is_taken() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("ca.crt");
        std::fs::write(&f, ca_pem("one")).unwrap();
        let (mut c, n) = ClientCaFile::open(&f).unwrap();
        assert_eq!(n, 1);
        let first = c.verifier().current();
        assert!(matches!(c.poll(), ClientCaReload::Unchanged));

        std::fs::write(
            &f,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        match c.poll() {
            ClientCaReload::Rejected(e) => assert!(e.to_string().contains("PRIVATE KEY"), "{e}"),
            o => panic!("{o:?}"),
        }
        assert!(matches!(c.poll(), ClientCaReload::Unchanged));
        assert!(Arc::ptr_eq(&first, &c.verifier().current()));

        std::fs::write(&f, format!("{}{}", ca_pem("one"), ca_pem("two"))).unwrap();
        assert!(matches!(c.poll(), ClientCaReload::Reloaded(2)));
        assert!(!Arc::ptr_eq(&first, &c.verifier().current()));
    }

    #[test]
    fn open_names_the_file() {
        let d = tempfile::tempdir().unwrap();
        let e = ClientCaFile::open(&d.path().join("missing.crt")).unwrap_err();
        assert!(e.to_string().contains("missing.crt"), "{e}");
    }
}
