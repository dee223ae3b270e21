//! PEM reading through `rustls-pki-types` (never `rustls-pemfile`): the terminator's
//! certificate and key pair, and plimsolld's CA file.
//!
//! Error messages name files and PEM labels, never key bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::{PemObject, SectionKind};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::provider;

/// Why a certificate/key pair could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PairError {
    /// The certificate file is not valid PEM.
    #[error("tls.crt is not valid PEM: {0}")]
    CertPem(String),
    /// The certificate file holds no `CERTIFICATE` block.
    #[error("tls.crt holds no PEM CERTIFICATE block")]
    NoCertificate,
    /// The key file is not valid PEM.
    #[error("tls.key is not valid PEM: {0}")]
    KeyPem(String),
    /// The key file holds no private key block.
    #[error("tls.key holds no PEM private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY)")]
    NoKey,
    /// The key could not be loaded by the `ring` provider.
    #[error("tls.key is not a usable private key: {0}")]
    BadKey(String),
    /// The key does not belong to the first certificate of the chain.
    #[error("tls.key does not match the first certificate in tls.crt: {0}")]
    Mismatch(String),
    /// The first certificate's `notAfter` has passed.
    #[error(
        "the certificate in tls.crt has expired: not after {not_after}, now {now} ({summary})"
    )]
    Expired {
        /// `notAfter`.
        not_after: String,
        /// The time it was checked at.
        now: String,
        /// Subject, names and SHA-256 of the refused certificate (never key material).
        summary: String,
    },
    /// The first certificate's `notBefore` has not come yet.
    #[error("the certificate in tls.crt is not valid yet: not before {not_before}, now {now} ({summary})")]
    NotYetValid {
        /// `notBefore`.
        not_before: String,
        /// The time it was checked at.
        now: String,
        /// Subject, names and SHA-256 of the refused certificate (never key material).
        summary: String,
    },
    /// The first certificate cannot be parsed to read its validity.
    #[error("the certificate in tls.crt cannot be parsed to read its validity: {0}")]
    Unparsable(String),
}

/// Checks that `now` lies within the certificate's validity (`notBefore` ≤ now ≤
/// `notAfter`, to the second). The terminator refuses to swap in a rotated pair that fails
/// this; an error describes the certificate by subject, names and SHA-256 only.
pub fn check_validity(
    cert: &CertificateDer<'_>,
    now: std::time::SystemTime,
) -> Result<(), PairError> {
    let (_, x) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|e| PairError::Unparsable(e.to_string()))?;
    let secs = match now.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    };
    let now_text = || {
        x509_parser::time::ASN1Time::from_timestamp(secs)
            .map_or_else(|_| format!("{secs} s after 1970"), |t| t.to_string())
    };
    let v = x.validity();
    if secs < v.not_before.timestamp() {
        return Err(PairError::NotYetValid {
            not_before: v.not_before.to_string(),
            now: now_text(),
            summary: summarize(cert).to_string(),
        });
    }
    if secs > v.not_after.timestamp() {
        return Err(PairError::Expired {
            not_after: v.not_after.to_string(),
            now: now_text(),
            summary: summarize(cert).to_string(),
        });
    }
    Ok(())
}

/// Builds a [`CertifiedKey`] from the PEM text of `tls.crt` (leaf first, then any
/// intermediates) and `tls.key` (PKCS#8, PKCS#1 or SEC1), and checks that the key belongs
/// to the leaf certificate.
pub fn certified_key_from_pem(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<CertifiedKey>, PairError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| PairError::CertPem(e.to_string()))?;
    if chain.is_empty() {
        return Err(PairError::NoCertificate);
    }
    let key = match PrivateKeyDer::from_pem_slice(key_pem) {
        Ok(k) => k,
        Err(rustls_pki_types::pem::Error::NoItemsFound) => return Err(PairError::NoKey),
        Err(e) => return Err(PairError::KeyPem(e.to_string())),
    };
    let provider = provider();
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| PairError::BadKey(e.to_string()))?;
    let ck = CertifiedKey::new(chain, signing_key);
    match ck.keys_match() {
        Ok(()) => Ok(Arc::new(ck)),
        Err(e) => Err(PairError::Mismatch(e.to_string())),
    }
}

/// Why a CA file could not be used. Every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaFileError {
    /// The file could not be read.
    #[error("CA file {path}: cannot read it: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no certificate.
    #[error(
        "CA file {path}: holds no PEM CERTIFICATE block; it must hold one or more CA certificates"
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The file holds a PEM block that is not a certificate (a key, a CSR, ...).
    #[error("CA file {path}: holds a PEM {label:?} block; it must hold CA certificates only")]
    NotCertificate {
        /// The file.
        path: PathBuf,
        /// The PEM label found.
        label: String,
    },
    /// The PEM text is malformed.
    #[error("CA file {path}: not valid PEM: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// The parser's reason.
        reason: String,
    },
    /// A certificate could not serve as a trust anchor.
    #[error("CA file {path}: certificate #{index} is not a usable CA certificate: {reason}")]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// 1-based position in the file.
        index: usize,
        /// Why.
        reason: String,
    },
}

/// Reads the CA certificates of a CA file: one or more `CERTIFICATE` blocks and nothing
/// else (text outside blocks, such as `openssl x509 -text` output, is ignored).
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaFileError> {
    let bytes = std::fs::read(path).map_err(|source| CaFileError::Unreadable {
        path: path.to_owned(),
        source,
    })?;
    parse_ca_pem(&bytes).map_err(|e| e.with_path(path))
}

/// The trust anchors of a CA file's certificates; a certificate that cannot be one is an
/// error naming the file and its position.
pub fn root_store(
    path: &Path,
    certs: &[CertificateDer<'static>],
) -> Result<rustls::RootCertStore, CaFileError> {
    let mut roots = rustls::RootCertStore::empty();
    for (i, c) in certs.iter().enumerate() {
        roots
            .add(c.clone())
            .map_err(|e| CaFileError::BadCertificate {
                path: path.to_owned(),
                index: i + 1,
                reason: e.to_string(),
            })?;
    }
    Ok(roots)
}

/// [`read_ca_file`] without the file: the path in errors is empty until
/// [`CaFileError::with_path`] sets it.
pub fn parse_ca_pem(bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, CaFileError> {
    let none = PathBuf::new;
    // The pki-types parser skips blocks with labels it does not know, so the labels are
    // checked on the raw text first: anything but CERTIFICATE is refused.
    for line in bytes.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(rest) = line.strip_prefix(b"-----BEGIN ") {
            let label = rest.strip_suffix(b"-----").unwrap_or(rest);
            if label != b"CERTIFICATE" {
                return Err(CaFileError::NotCertificate {
                    path: none(),
                    label: String::from_utf8_lossy(label).into_owned(),
                });
            }
        }
    }
    let mut certs = Vec::new();
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(bytes) {
        let (kind, der) = item.map_err(|e| CaFileError::Pem {
            path: none(),
            reason: e.to_string(),
        })?;
        if kind != SectionKind::Certificate {
            return Err(CaFileError::NotCertificate {
                path: none(),
                label: format!("{kind:?}"),
            });
        }
        certs.push(CertificateDer::from(der));
    }
    if certs.is_empty() {
        return Err(CaFileError::Empty { path: none() });
    }
    Ok(certs)
}

impl CaFileError {
    /// The same error naming `path`.
    pub fn with_path(self, path: &Path) -> CaFileError {
        let p = path.to_owned();
        match self {
            CaFileError::Unreadable { source, .. } => CaFileError::Unreadable { path: p, source },
            CaFileError::Empty { .. } => CaFileError::Empty { path: p },
            CaFileError::NotCertificate { label, .. } => {
                CaFileError::NotCertificate { path: p, label }
            }
            CaFileError::Pem { reason, .. } => CaFileError::Pem { path: p, reason },
            CaFileError::BadCertificate { index, reason, .. } => CaFileError::BadCertificate {
                path: p,
                index,
                reason,
            },
        }
    }
}

/// What the logs say about a certificate: its subject, names and validity end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSummary {
    /// The subject distinguished name.
    pub subject: String,
    /// The DNS and IP subject alternative names.
    pub names: Vec<String>,
    /// `notAfter`, RFC 2822-ish text as x509-parser prints it.
    pub not_after: String,
    /// SHA-256 of the DER certificate, hex.
    pub sha256: String,
}

impl std::fmt::Display for CertSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "subject {:?}, names [{}], not after {}, sha256 {}",
            self.subject,
            self.names.join(", "),
            self.not_after,
            self.sha256
        )
    }
}

/// Summarises a DER certificate for logs (no chain validation: this is only for people).
pub fn summarize(cert: &CertificateDer<'_>) -> CertSummary {
    use x509_parser::extensions::GeneralName;
    let sha256 = hex::encode(ring::digest::digest(&ring::digest::SHA256, cert.as_ref()));
    match x509_parser::parse_x509_certificate(cert.as_ref()) {
        Ok((_, x)) => {
            let mut names = Vec::new();
            if let Ok(Some(san)) = x.subject_alternative_name() {
                for n in &san.value.general_names {
                    match n {
                        GeneralName::DNSName(d) => names.push((*d).to_owned()),
                        GeneralName::IPAddress(ip) => names.push(format_ip(ip)),
                        _ => {}
                    }
                }
            }
            CertSummary {
                subject: x.subject().to_string(),
                names,
                not_after: x.validity().not_after.to_string(),
                sha256,
            }
        }
        Err(e) => CertSummary {
            subject: format!("(unparsable: {e})"),
            names: Vec::new(),
            not_after: "?".into(),
            sha256,
        },
    }
}

fn format_ip(b: &[u8]) -> String {
    match b.len() {
        4 => std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string(),
        16 => {
            let mut a = [0u8; 16];
            a.copy_from_slice(b);
            std::net::Ipv6Addr::from(a).to_string()
        }
        _ => hex::encode(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (String, String, rcgen::KeyPair) {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["sandboxd.plimsoll.invalid".into()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem(), key)
    }

    #[test]
    fn loads_pkcs8_ecdsa_pair() {
        let (c, k, _) = pair();
        let ck = certified_key_from_pem(c.as_bytes(), k.as_bytes()).unwrap();
        assert_eq!(ck.cert.len(), 1);
    }

    fn openssl(args: &[&str], input: Option<&Path>) -> Option<String> {
        let mut cmd = std::process::Command::new("openssl");
        cmd.args(args);
        if let Some(p) = input {
            cmd.arg("-in").arg(p);
        }
        let out = cmd.output().ok()?;
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(String::from_utf8(out.stdout).unwrap())
    }

    #[test]
    fn loads_sec1_and_pkcs1_keys() {
        // openssl converts the formats; it is on every machine image this project uses,
        // and the test says so and stops where it is not.
        if openssl(&["version"], None).is_none() {
            eprintln!("openssl missing: SEC1/PKCS#1 key formats not exercised");
            return;
        }
        let (c, k, _) = pair();
        let dir = tempfile::tempdir().unwrap();
        let k8 = dir.path().join("k8.pem");
        std::fs::write(&k8, &k).unwrap();
        let sec1 = openssl(&["ec"], Some(&k8)).unwrap();
        assert!(sec1.contains("BEGIN EC PRIVATE KEY"), "{sec1}");
        certified_key_from_pem(c.as_bytes(), sec1.as_bytes()).unwrap();

        let rsa = dir.path().join("rsa.pem");
        let rsa_path = rsa.to_str().unwrap();
        openssl(&["genrsa", "-traditional", "-out", rsa_path, "2048"], None).unwrap();
        let pkcs1 = std::fs::read_to_string(&rsa).unwrap();
        assert!(pkcs1.contains("BEGIN RSA PRIVATE KEY"));
        let pkcs8 = openssl(&["pkcs8", "-topk8", "-nocrypt"], Some(&rsa)).unwrap();
        let key = rcgen::KeyPair::from_pem_and_sign_algo(&pkcs8, &rcgen::PKCS_RSA_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["x.invalid".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        certified_key_from_pem(cert.pem().as_bytes(), pkcs1.as_bytes()).unwrap();
    }

    #[test]
    fn mismatched_key_is_refused() {
        let (c, _, _) = pair();
        let (_, other_key, _) = pair();
        let err = certified_key_from_pem(c.as_bytes(), other_key.as_bytes()).unwrap_err();
        assert!(matches!(err, PairError::Mismatch(_)), "{err}");
    }

    #[test]
    fn missing_parts_are_named() {
        let (c, k, _) = pair();
        assert_eq!(
            certified_key_from_pem(b"", k.as_bytes()).unwrap_err(),
            PairError::NoCertificate
        );
        assert_eq!(
            certified_key_from_pem(c.as_bytes(), c.as_bytes()).unwrap_err(),
            PairError::NoKey
        );
    }

    #[test]
    fn ca_file_rules() {
        let (c1, k1, _) = pair();
        let (c2, _, _) = pair();
        let both = format!("subject=whatever\n{c1}\n{c2}");
        assert_eq!(parse_ca_pem(both.as_bytes()).unwrap().len(), 2);
        assert!(matches!(
            parse_ca_pem(b"").unwrap_err(),
            CaFileError::Empty { .. }
        ));
        assert!(matches!(
            parse_ca_pem(b"just text\n").unwrap_err(),
            CaFileError::Empty { .. }
        ));
        let with_key = format!("{c1}{k1}");
        match parse_ca_pem(with_key.as_bytes()).unwrap_err() {
            CaFileError::NotCertificate { label, .. } => assert_eq!(label, "PRIVATE KEY"),
            e => panic!("{e}"),
        }
        let unknown = format!("{c1}-----BEGIN FOO-----\nAAAA\n-----END FOO-----\n");
        assert!(matches!(
            parse_ca_pem(unknown.as_bytes()).unwrap_err(),
            CaFileError::NotCertificate { .. }
        ));
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let err = read_ca_file(&missing).unwrap_err();
        assert!(err.to_string().contains("nope.pem"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = read_ca_file(&empty).unwrap_err();
        assert!(err.to_string().contains("empty.pem"), "{err}");
    }

    fn pair_valid(not_before: (i32, u8, u8), not_after: (i32, u8, u8)) -> CertificateDer<'static> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["sandboxd.plimsoll.invalid".into()]).unwrap();
        params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
        params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
        let cert = params.self_signed(&key).unwrap();
        CertificateDer::from(cert.der().to_vec())
    }

    #[test]
    fn validity_is_checked_against_the_given_time() {
        let now = std::time::SystemTime::now();
        check_validity(&pair_valid((2000, 1, 1), (4000, 1, 1)), now).unwrap();
        match check_validity(&pair_valid((2000, 1, 1), (2001, 1, 1)), now).unwrap_err() {
            PairError::Expired {
                not_after, summary, ..
            } => {
                assert!(not_after.contains("2001"), "{not_after}");
                assert!(summary.contains("sandboxd.plimsoll.invalid"), "{summary}");
            }
            e => panic!("{e}"),
        }
        match check_validity(&pair_valid((3999, 1, 1), (4000, 1, 1)), now).unwrap_err() {
            PairError::NotYetValid { not_before, .. } => {
                assert!(not_before.contains("3999"), "{not_before}")
            }
            e => panic!("{e}"),
        }
        // The bounds themselves are inside the validity.
        let c = pair_valid((2000, 1, 1), (2001, 1, 1));
        let at = |y: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(y);
        check_validity(&c, at(946_684_800)).unwrap(); // 2000-01-01T00:00:00Z
        check_validity(&c, at(978_307_200)).unwrap(); // 2001-01-01T00:00:00Z
        assert!(check_validity(&c, at(978_307_201)).is_err());
        assert!(check_validity(&c, at(946_684_799)).is_err());
    }

    #[test]
    fn summary_names_the_san() {
        let (c, _, _) = pair();
        let der = CertificateDer::from_pem_slice(c.as_bytes()).unwrap();
        let s = summarize(&der);
        assert_eq!(s.names, vec!["sandboxd.plimsoll.invalid".to_string()]);
        assert_eq!(s.sha256.len(), 64);
    }
}
