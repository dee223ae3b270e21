//! A test certificate authority made with rcgen: a CA, server certificates it signs (with
//! chosen names and, when a test needs one out of date, chosen validity), the PEM and DER
//! forms tests write to files, and the rustls server configuration a TLS test server uses.

use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority.
pub struct Ca {
    /// The CA's key.
    pub key: KeyPair,
    /// The CA's self-signed certificate.
    pub cert: rcgen::Certificate,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ca(<pem>)")
    }
}

impl Ca {
    /// A fresh CA whose common name is `name`.
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("generate a CA key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = p.self_signed(&key).expect("self-sign the CA");
        Ca { key, cert }
    }

    /// A fresh CA named `prefix` and a random suffix, so no two CAs share an issuer name.
    pub fn unique(prefix: &str) -> Ca {
        Ca::new(&format!(
            "{prefix} {}",
            hex::encode(rand::random::<[u8; 6]>())
        ))
    }

    /// The CA certificate as PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// Writes the CA certificate as PEM to `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.pem()).expect("write the CA file");
    }

    /// A server certificate for `names` (the first is also its common name).
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, |_| {})
    }

    /// A leaf valid from 1 January of `not_before` to 1 January of `not_after` (years).
    pub fn leaf_valid(&self, names: &[&str], not_before: i32, not_after: i32) -> Leaf {
        self.leaf_with(names, |p| {
            p.not_before = rcgen::date_time_ymd(not_before, 1, 1);
            p.not_after = rcgen::date_time_ymd(not_after, 1, 1);
        })
    }

    /// A client certificate for `name` (extended key usage `clientAuth`), for mutual TLS.
    pub fn client_leaf(&self, name: &str) -> Leaf {
        self.leaf_with(&[name], |p| {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        })
    }

    fn leaf_with(&self, names: &[&str], edit: impl FnOnce(&mut CertificateParams)) -> Leaf {
        let key = KeyPair::generate().expect("generate a server key");
        let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("leaf parameters");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        edit(&mut p);
        p.distinguished_name.push(DnType::CommonName, names[0]);
        let cert = p
            .signed_by(&key, &self.cert, &self.key)
            .expect("sign the server certificate");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        }
    }
}

/// A server certificate and its key.
#[derive(Clone)]
pub struct Leaf {
    /// The certificate as PEM.
    pub cert_pem: String,
    /// The key as PEM (PKCS#8).
    pub key_pem: String,
    /// The certificate as DER.
    pub der: Vec<u8>,
    /// The key as DER (PKCS#8).
    pub key_der: Vec<u8>,
}

impl std::fmt::Debug for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Leaf(<pem>)")
    }
}

impl Leaf {
    /// A TLS 1.3 server configuration (ring) serving this certificate, offering `alpn`.
    pub fn server_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(
            vec![rustls_pki_types::CertificateDer::from(self.der.clone())],
            rustls_pki_types::PrivateKeyDer::Pkcs8(self.key_der.clone().into()),
        )
        .expect("the certificate and key match");
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(cfg)
    }
}
