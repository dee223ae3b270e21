//! The terminator's server side: a TLS 1.3-only, ALPN-`h2`-only rustls configuration whose
//! certificate can be swapped while it serves, and the Secret directory it is read from.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use crate::pem::{certified_key_from_pem, check_validity, summarize, CertSummary, PairError};
use crate::{provider, ALPN_H2};

/// The certificate new handshakes get. Swapping it never touches open connections: each
/// keeps the `Arc` it was handed.
#[derive(Debug)]
pub struct RotatingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl RotatingCert {
    /// Starts with `initial`.
    pub fn new(initial: Arc<CertifiedKey>) -> Arc<RotatingCert> {
        Arc::new(RotatingCert {
            current: RwLock::new(initial),
        })
    }

    /// The pair new handshakes get.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes `next` the pair for every later handshake.
    pub fn swap(&self, next: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = next;
    }
}

impl ResolvesServerCert for RotatingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The terminator's rustls configuration: TLS 1.3 only, ALPN exactly `["h2"]`, no client
/// certificates ([`server_config_with`] requires them), no session tickets (every connection proves the certificate afresh, and a
/// rotated certificate is seen by the next connection, not the next full handshake).
///
/// rustls refuses a client that offers ALPN without `h2` (`no_application_protocol`), but
/// accepts one that offers no ALPN at all; [`crate::screen::check_established`] refuses that
/// one after the handshake.
pub fn server_config(cert: Arc<RotatingCert>) -> Arc<ServerConfig> {
    server_config_with(cert, None)
}

/// [`server_config`], requiring a client certificate verified by `client` when given
/// (mutual TLS: `PLIMSOLL_SANDBOXD_CLIENT_CA`). A client without one, or with one that
/// does not chain to the client CA, fails the handshake, so nothing of it is forwarded.
pub fn server_config_with(
    cert: Arc<RotatingCert>,
    client: Option<Arc<crate::client_auth::RotatingClientVerifier>>,
) -> Arc<ServerConfig> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("the ring provider supports TLS 1.3");
    let builder = match client {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(cert);
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    cfg.send_tls13_tickets = 0;
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    cfg.max_early_data_size = 0;
    Arc::new(cfg)
}

/// Why the Secret directory could not be read into a pair.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertDirError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The files were read but do not make a usable pair.
    #[error("{dir}: {source}")]
    Pair {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: PairError,
    },
}

/// What one poll of the directory found.
#[derive(Debug)]
#[non_exhaustive]
pub enum ReloadOutcome {
    /// Same bytes as the pair being served (or as a pair already rejected).
    Unchanged,
    /// A new pair is served to every later handshake.
    Reloaded(CertSummary),
    /// The directory changed to something unusable; the served pair is kept. Reported once
    /// per distinct content, and only after two polls in a row saw the same content, so a
    /// poll that lands in the middle of a swap does not raise a false alarm.
    Rejected(CertDirError),
    /// Unusable content seen for the first time; judged at the next poll.
    Pending,
}

/// A rotated pair that was good but outside its validity when last polled. It is checked
/// again at every poll (a certificate issued a moment ahead of this node's clock becomes
/// valid without a new Secret), and swapped in once valid.
#[derive(Debug)]
struct OutOfValidity {
    digest: [u8; 32],
    key: Arc<CertifiedKey>,
}

/// The Secret mount (`tls.crt`, `tls.key`). The kubelet updates it by swapping a `..data`
/// symlink, so it is polled by content (following the symlinks each time), never watched by
/// inode.
#[derive(Debug)]
pub struct CertDir {
    dir: PathBuf,
    served: [u8; 32],
    rejected: Option<[u8; 32]>,
    pending: Option<[u8; 32]>,
    out_of_validity: Option<OutOfValidity>,
    cert: Arc<RotatingCert>,
}

/// The certificate file's name in the directory.
pub const CERT_FILE: &str = "tls.crt";
/// The key file's name in the directory.
pub const KEY_FILE: &str = "tls.key";

impl CertDir {
    /// Reads the pair once; a missing or broken pair is an error (the terminator does not
    /// start without one).
    pub fn open(dir: &Path) -> Result<(CertDir, CertSummary), CertDirError> {
        let (digest, read) = read_pair(dir);
        let (crt, key) = read?;
        let ck = certified_key_from_pem(&crt, &key).map_err(|source| CertDirError::Pair {
            dir: dir.to_owned(),
            source,
        })?;
        let summary = summarize(&ck.cert[0]);
        Ok((
            CertDir {
                dir: dir.to_owned(),
                served: digest,
                rejected: None,
                pending: None,
                out_of_validity: None,
                cert: RotatingCert::new(ck),
            },
            summary,
        ))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The swappable certificate to build a [`server_config`] with.
    pub fn cert(&self) -> Arc<RotatingCert> {
        self.cert.clone()
    }

    fn swap_in(&mut self, digest: [u8; 32], ck: Arc<CertifiedKey>) -> ReloadOutcome {
        let summary = summarize(&ck.cert[0]);
        self.cert.swap(ck);
        self.served = digest;
        self.pending = None;
        self.rejected = None;
        self.out_of_validity = None;
        ReloadOutcome::Reloaded(summary)
    }

    /// Re-reads both files and, when their bytes changed and make a good pair whose
    /// certificate is valid now (`notBefore` ≤ now ≤ `notAfter`), swaps it in.
    pub fn poll(&mut self) -> ReloadOutcome {
        self.poll_at(std::time::SystemTime::now())
    }

    /// [`CertDir::poll`] with the validity checked against `now`.
    pub fn poll_at(&mut self, now: std::time::SystemTime) -> ReloadOutcome {
        let (digest, read) = read_pair(&self.dir);
        if digest == self.served {
            self.pending = None;
            self.out_of_validity = None;
            return ReloadOutcome::Unchanged;
        }
        if self.rejected == Some(digest) {
            // Refused for its validity: time may have made it good.
            if let Some(o) = self.out_of_validity.as_ref().filter(|o| o.digest == digest) {
                if check_validity(&o.key.cert[0], now).is_ok() {
                    let ck = o.key.clone();
                    return self.swap_in(digest, ck);
                }
            }
            return ReloadOutcome::Unchanged;
        }
        let result = read.and_then(|(crt, key)| {
            let pair_error = |source| CertDirError::Pair {
                dir: self.dir.clone(),
                source,
            };
            let ck = certified_key_from_pem(&crt, &key).map_err(pair_error)?;
            if let Err(e) = check_validity(&ck.cert[0], now) {
                self.out_of_validity = Some(OutOfValidity {
                    digest,
                    key: ck.clone(),
                });
                return Err(pair_error(e));
            }
            Ok(ck)
        });
        match result {
            Ok(ck) => self.swap_in(digest, ck),
            Err(e) => {
                if self.pending == Some(digest) {
                    self.pending = None;
                    self.rejected = Some(digest);
                    ReloadOutcome::Rejected(e)
                } else {
                    self.pending = Some(digest);
                    ReloadOutcome::Pending
                }
            }
        }
    }
}

/// Reads `tls.crt` and `tls.key`; the digest covers the bytes (or the read error), so it
/// changes exactly when what a reload would see changes.
/// The PEM bytes of `tls.crt` and `tls.key`.
type PairBytes = (Vec<u8>, Vec<u8>);

fn read_pair(dir: &Path) -> ([u8; 32], Result<PairBytes, CertDirError>) {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut read = |name: &str| {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(b) => {
                ctx.update(&(b.len() as u64).to_be_bytes());
                ctx.update(&b);
                Ok(b)
            }
            Err(source) => {
                ctx.update(b"error:");
                ctx.update(source.to_string().as_bytes());
                Err(CertDirError::Read { path, source })
            }
        }
    };
    let crt = read(CERT_FILE);
    let key = read(KEY_FILE);
    let mut digest = [0u8; 32];
    digest.copy_from_slice(ctx.finish().as_ref());
    let pair = match (crt, key) {
        (Ok(c), Ok(k)) => Ok((c, k)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    (digest, pair)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(dir.join(CERT_FILE), cert.pem()).unwrap();
        std::fs::write(dir.join(KEY_FILE), key.serialize_pem()).unwrap();
        name.to_owned()
    }

    #[test]
    fn poll_swaps_good_pairs_and_keeps_old_on_broken() {
        let d = tempfile::tempdir().unwrap();
        write_pair(d.path(), "one.invalid");
        let (mut cd, first) = CertDir::open(d.path()).unwrap();
        assert_eq!(first.names, vec!["one.invalid"]);
        assert!(matches!(cd.poll(), ReloadOutcome::Unchanged));

        write_pair(d.path(), "two.invalid");
        match cd.poll() {
            ReloadOutcome::Reloaded(s) => assert_eq!(s.names, vec!["two.invalid"]),
            o => panic!("{o:?}"),
        }
        let served = cd.cert().current();

        std::fs::write(d.path().join(KEY_FILE), "garbage").unwrap();
        assert!(matches!(cd.poll(), ReloadOutcome::Pending));
        assert!(matches!(cd.poll(), ReloadOutcome::Rejected(_)));
        assert!(matches!(cd.poll(), ReloadOutcome::Unchanged));
        assert!(Arc::ptr_eq(&served, &cd.cert().current()));
    }

    /// Writes a self-signed pair valid from `not_before` to `not_after` (years, 1 January).
    fn write_pair_valid(dir: &Path, name: &str, not_before: i32, not_after: i32) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![name.into()]).unwrap();
        params.not_before = rcgen::date_time_ymd(not_before, 1, 1);
        params.not_after = rcgen::date_time_ymd(not_after, 1, 1);
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join(CERT_FILE), cert.pem()).unwrap();
        std::fs::write(dir.join(KEY_FILE), key.serialize_pem()).unwrap();
    }

    #[test]
    fn expired_and_not_yet_valid_rotations_keep_the_old_pair() {
        let d = tempfile::tempdir().unwrap();
        write_pair(d.path(), "one.invalid");
        let (mut cd, _) = CertDir::open(d.path()).unwrap();
        let served = cd.cert().current();

        // Expired: refused (after the second poll that saw it), the old pair kept.
        write_pair_valid(d.path(), "expired.invalid", 2000, 2001);
        assert!(matches!(cd.poll(), ReloadOutcome::Pending));
        match cd.poll() {
            ReloadOutcome::Rejected(e) => {
                let m = e.to_string();
                assert!(
                    m.contains("has expired") && m.contains("expired.invalid"),
                    "{m}"
                );
                assert!(!m.contains("PRIVATE KEY"), "{m}");
            }
            o => panic!("{o:?}"),
        }
        assert!(matches!(cd.poll(), ReloadOutcome::Unchanged));
        assert!(Arc::ptr_eq(&served, &cd.cert().current()));

        // Not yet valid: refused, the old pair kept; once its time comes it is swapped in
        // without a new Secret.
        write_pair_valid(d.path(), "future.invalid", 3999, 4000);
        assert!(matches!(cd.poll(), ReloadOutcome::Pending));
        match cd.poll() {
            ReloadOutcome::Rejected(e) => {
                let m = e.to_string();
                assert!(
                    m.contains("not valid yet") && m.contains("future.invalid"),
                    "{m}"
                )
            }
            o => panic!("{o:?}"),
        }
        assert!(matches!(cd.poll(), ReloadOutcome::Unchanged));
        assert!(Arc::ptr_eq(&served, &cd.cert().current()));
        // 3999-06-01, inside its validity.
        let later = std::time::UNIX_EPOCH + std::time::Duration::from_secs(64_042_099_200);
        match cd.poll_at(later) {
            ReloadOutcome::Reloaded(s) => assert_eq!(s.names, vec!["future.invalid"]),
            o => panic!("{o:?}"),
        }
        assert!(!Arc::ptr_eq(&served, &cd.cert().current()));
    }

    #[test]
    fn open_refuses_a_missing_pair() {
        let d = tempfile::tempdir().unwrap();
        let err = CertDir::open(d.path()).unwrap_err();
        assert!(err.to_string().contains("tls.crt"), "{err}");
    }
}
