//! RFC 3161 time witnesses: build a time-stamp request that reveals only a digest, send it to
//! a time-stamp authority (TSA) over HTTP or HTTPS, and verify the answer offline against
//! roots the caller pins. This crate must never trust a token because the system trusts its
//! authority: the token is checked against the pinned roots only (the HTTPS transport may use
//! the system's roots, since the token does not depend on the channel).
//!
//! # What a successful verification proves
//!
//! [`verify_response`] and [`verify_token`] check, in this order:
//!
//! 1. the response's status is granted (0) or grantedWithMods (1); anything else is
//!    [`Error::StatusNotGranted`] naming the status, its text and its failInfo bits;
//! 2. the token is a CMS `ContentInfo` of `SignedData` with exactly one `SignerInfo` and
//!    eContentType id-ct-TSTInfo (1.2.840.113549.1.9.16.1.4);
//! 3. the signed attributes carry content-type id-ct-TSTInfo and a messageDigest equal to the
//!    hash of the eContent (with the SignerInfo's digest algorithm);
//! 4. the signer certificate is found by its SignerIdentifier (issuer and serial, or subject
//!    key identifier) among the token's certificates and the caller's extra certificates;
//! 5. the signature over the DER of the signed attributes (re-tagged as a SET) verifies with
//!    that certificate's key: RSA PKCS#1 v1.5 or ECDSA P-256/P-384, with SHA-256/384/512; the
//!    SignerInfo's digest algorithm is not SHA-1 ([`Error::Sha1Digest`]), and a signature
//!    algorithm that names a hash names the digest algorithm's
//!    ([`Error::SignatureDigestMismatch`]; `openssl ts -verify` refuses such a token too);
//! 6. the signer certificate's extended key usage is exactly id-kp-timeStamping and the
//!    extension is marked critical (RFC 3161 §2.3, as OpenSSL enforces it);
//! 7. the signed attributes bind the signer certificate with ESSCertID (SHA-1,
//!    signingCertificate) or ESSCertIDv2 (SHA-256 by default, signingCertificateV2); only the
//!    entry for the signer certificate is needed, other listed IDs are ignored;
//! 8. a chain from the signer certificate to one of the pinned roots is built from the token's
//!    certificates and the extra certificates, in any order, skipping certificates that are not
//!    needed (cross-certificates); every signature in it verifies, every issuer in the pool is
//!    a CA (basicConstraints cA), every issuer including the pinned root that has a keyUsage
//!    extension allows keyCertSign ([`Error::IssuerKeyUsage`]), no issuer including the root
//!    has more non-self-issued intermediates below it than its pathLenConstraint allows
//!    ([`Error::PathLenExceeded`]; both as OpenSSL checks them), and every certificate
//!    including the root is valid at the token's genTime (not at the time of verification);
//! 9. the message imprint's algorithm and digest equal what the caller expected; TSTInfo
//!    carries no critical extension (none is understood here:
//!    [`Error::UnknownCriticalExtension`] names its OID), and its genTime is a date that
//!    exists ([`Error::ImpossibleTime`]: no day 31 in a 30-day month, no Feb 29 outside leap
//!    years, no hour 24, minute 60 or second 60; certificate times, UTCTime or
//!    GeneralizedTime, are read by `x509-parser`, which refuses impossible dates as malformed
//!    certificates);
//! 10. the nonce equals the one sent, compared as integers (leading zero octets do not matter);
//!     a missing nonce when one was sent is an error.
//!
//! # What is not checked
//!
//! - No revocation (no CRL, no OCSP): a TSA key revoked after the fact still verifies.
//! - No policy OID pinning: the policy is reported in [`Witness::policy`] for the caller to
//!   judge.
//! - The TSTInfo `tsa` name field and `accuracy` are not checked; `ordering` is ignored.
//! - Certificate policies, name constraints and unknown critical extensions of the chain's
//!   certificates are not evaluated, nor key usage beyond keyCertSign on issuers (the TSA
//!   certificate's purpose is its EKU, step 6); names are compared as DER bytes.
//! - RSA-PSS and SHA-1 signatures are refused as unsupported, not verified. SHA-1 stays
//!   accepted only where RFC 3161 itself names it: the certHash of an ESSCertID (version 1).
//! - Whether the signer certificate has expired since genTime is reported
//!   ([`Witness::signer_expired_at`]), not judged: a token from an expired TSA certificate is
//!   still a valid witness of its time.
//!
//! # Dependencies, and why
//!
//! - DER of the TSP and CMS structures is read and written by a ~250-line strict reader in
//!   `der` (definite lengths only, every length checked against the bytes present), rather than
//!   `x509-tsp`/`cms`, which pin a RustCrypto generation (`der 0.7`) of their own.
//! - Certificates are parsed with `x509-parser` 0.16, already in the workspace.
//! - Hashes (SHA-1 for ESSCertID, SHA-256/384/512) and RSA PKCS#1 v1.5 verification use `ring`,
//!   already in the workspace.
//! - ECDSA uses RustCrypto `p256`/`p384` 0.14 `verify_prehash`, because `ring` has no P-384
//!   with SHA-512 (FreeTSA's signer since 2026) nor P-256 with SHA-384.
//! - HTTP(S) uses `hyper`, `hyper-util`, `hyper-rustls` (rustls with `ring`) and
//!   `rustls-native-certs`.
//!
//! # Limits
//!
//! Responses and tokens over [`MAX_RESPONSE_BYTES`] are refused before parsing, as are more
//! than [`MAX_CERTIFICATES`] certificates in a token, chains longer than [`MAX_CHAIN_DEPTH`]
//! and chain searches needing more than 64 signature checks. No input makes a parser panic
//! (see `tests/garbage.rs` and `fuzz/fuzz_targets/timestamp_response.rs`).
//!
//! # Transport
//!
//! [`send`] trusts the system's roots for an `https://` channel;
//! [`send_with_transport_roots`] trusts given ones instead (a proxy's CA, tests). Neither has
//! any bearing on the token, which [`verify_response`] checks against the pinned roots only.
//! The two public authorities are in [`AUTHORITIES`] ([`public`] looks one up by name) with
//! their roots shipped in the crate.

mod authority;
mod crypto;
mod der;
mod http;
mod request;
mod time;
mod verify;

pub use authority::{certificates_from_pem, public, Authority, AUTHORITIES};
pub use der::integers_equal;
pub use http::{send, send_with_transport_roots};
pub use request::TimeStampRequest;
pub use verify::{verify_response, verify_token};

/// The largest response (or stored token) accepted, in bytes; real ones are 1–7 KB.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;
/// The most certificates a token may carry (extra and pinned root certificates together may
/// number twice this).
pub const MAX_CERTIFICATES: usize = 32;
/// The longest chain accepted, counting the signer and the root.
pub const MAX_CHAIN_DEPTH: usize = 8;
/// The HTTP timeout [`send`] is usually given.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A hash algorithm for the message imprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashAlg {
    /// SHA-256 (2.16.840.1.101.3.4.2.1).
    Sha256,
    /// SHA-384 (2.16.840.1.101.3.4.2.2).
    Sha384,
    /// SHA-512 (2.16.840.1.101.3.4.2.3).
    Sha512,
}

impl HashAlg {
    /// The algorithm's name as [`Witness::hash`] reports it: `sha256`, `sha384`, `sha512`.
    pub fn name(self) -> &'static str {
        match self {
            HashAlg::Sha256 => "sha256",
            HashAlg::Sha384 => "sha384",
            HashAlg::Sha512 => "sha512",
        }
    }

    /// The digest length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            HashAlg::Sha256 => 32,
            HashAlg::Sha384 => 48,
            HashAlg::Sha512 => 64,
        }
    }

    /// The algorithm's OID in dotted form.
    pub fn oid(self) -> &'static str {
        match self {
            HashAlg::Sha256 => crypto::OID_SHA256,
            HashAlg::Sha384 => crypto::OID_SHA384,
            HashAlg::Sha512 => crypto::OID_SHA512,
        }
    }

    /// The algorithm with this dotted OID, if it is one of the three.
    pub fn from_oid(oid: &str) -> Option<Self> {
        [HashAlg::Sha256, HashAlg::Sha384, HashAlg::Sha512]
            .into_iter()
            .find(|h| h.oid() == oid)
    }

    /// Hashes `data`.
    pub fn digest(self, data: &[u8]) -> Vec<u8> {
        crypto::hash(crypto::Hash::from(self), data)
    }
}

/// What a token must witness: a digest and the algorithm that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imprint {
    /// The hash algorithm.
    pub algorithm: HashAlg,
    /// The digest, `algorithm.digest_len()` bytes.
    pub digest: Vec<u8>,
}

impl Imprint {
    /// The imprint of `data` under `algorithm`.
    pub fn of(algorithm: HashAlg, data: &[u8]) -> Self {
        Imprint {
            algorithm,
            digest: algorithm.digest(data),
        }
    }
}

/// What a verified token witnesses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Witness {
    /// The TSA's time (TSTInfo genTime), Unix milliseconds.
    pub gen_time_unix_ms: i64,
    /// The same time as RFC 3339 UTC text, e.g. `2025-05-09T11:58:55Z`.
    pub gen_time: String,
    /// The token's serial number, lowercase hex of its INTEGER contents.
    pub serial_hex: String,
    /// The TSA policy OID the token was issued under, dotted.
    pub policy: String,
    /// The signer certificate's subject name, e.g. `O=sigstore.dev, CN=sigstore-tsa`.
    pub tsa: String,
    /// The imprint's hash algorithm: `sha256`, `sha384` or `sha512`.
    pub hash: &'static str,
    /// The signer certificate's notAfter, Unix seconds.
    pub signer_not_after_unix: i64,
    /// The nonce the token carries, lowercase hex of its INTEGER contents (`None` when absent).
    pub nonce_hex: Option<String>,
}

impl Witness {
    /// Whether the signer certificate has expired by `now_unix` (seconds). The token stays a
    /// valid witness of its genTime; this says only that the TSA could no longer sign today.
    pub fn signer_expired_at(&self, now_unix: i64) -> bool {
        now_unix > self.signer_not_after_unix
    }
}

/// Why a request could not be built, sent, or a response or token verified. Each message
/// names what failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bytes that are not the expected DER structure.
    #[error("malformed DER in {at}: {reason}")]
    Malformed {
        /// The structure being read.
        at: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// An input larger than this crate accepts.
    #[error("{what} too large: {size} bytes, the limit is {limit}")]
    TooLarge {
        /// What was too large.
        what: &'static str,
        /// Its size (or the size seen so far).
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The TSA did not grant the request.
    #[error("time-stamp status not granted: status {status} ({name}){text}, failInfo {fail_info}")]
    StatusNotGranted {
        /// The PKIStatus number.
        status: u64,
        /// Its RFC 3161 name.
        name: &'static str,
        /// The statusString, prefixed `: `, or empty.
        text: String,
        /// The failInfo bits by name, or `none`.
        fail_info: String,
    },
    /// A granted response without a token.
    #[error("time-stamp response is granted but carries no token")]
    NoToken,
    /// The token is not what RFC 3161 says a token is.
    #[error("not a time-stamp token: {0}")]
    NotATimeStampToken(String),
    /// An algorithm this crate does not verify.
    #[error("unsupported algorithm: {0}")]
    UnsupportedAlgorithm(String),
    /// The signed attributes' messageDigest is not the hash of the TSTInfo.
    #[error("signed attribute messageDigest does not match the hash of the TSTInfo")]
    MessageDigestMismatch,
    /// No certificate matches the SignerIdentifier.
    #[error("signer certificate not found: no certificate in the token or the extra certificates matches the SignerInfo's {0}")]
    SignerNotFound(String),
    /// A signature that does not verify.
    #[error("bad signature: {0}")]
    BadSignature(String),
    /// The signer certificate lacks the timeStamping EKU (or carries other purposes too).
    #[error("TSA certificate extended key usage: {0}")]
    EkuMissing(String),
    /// The signer certificate's EKU extension is not critical.
    #[error("TSA certificate extended key usage is not marked critical (RFC 3161 §2.3)")]
    EkuNotCritical,
    /// The signingCertificate(V2) attribute is missing or names another certificate.
    #[error("signing certificate binding (ESSCertID): {0}")]
    SigningCertificate(String),
    /// No chain from the signer to a pinned root.
    #[error("not chained to a pinned root: {0}")]
    NotChained(String),
    /// A certificate in the chain is not valid at the token's genTime.
    #[error("certificate not valid at genTime {gen_time}: {subject} is valid from {not_before} to {not_after}")]
    NotValidAtGenTime {
        /// The certificate's subject.
        subject: String,
        /// Its notBefore, RFC 3339.
        not_before: String,
        /// Its notAfter, RFC 3339.
        not_after: String,
        /// The token's genTime, RFC 3339.
        gen_time: String,
    },
    /// The token witnesses another digest or algorithm.
    #[error("message imprint mismatch: expected {expected}, the token has {found}")]
    ImprintMismatch {
        /// `alg:hex` expected.
        expected: String,
        /// `alg:hex` in the token.
        found: String,
    },
    /// The token's nonce is not the one sent.
    #[error("nonce mismatch: sent {sent}, the token has {found}")]
    NonceMismatch {
        /// Hex sent.
        sent: String,
        /// Hex in the token.
        found: String,
    },
    /// A nonce was sent but the token has none.
    #[error("nonce missing: the request carried nonce {sent} but the token has none")]
    NonceMissing {
        /// Hex sent.
        sent: String,
    },
    /// The SignerInfo's digest algorithm is SHA-1.
    #[error("the token's SignerInfo digest algorithm is SHA-1, which is refused (SHA-1 collisions are practical, so its messageDigest binds nothing); the authority must sign with SHA-256, SHA-384 or SHA-512")]
    Sha1Digest,
    /// The signature algorithm names a hash other than the SignerInfo's digest algorithm.
    #[error("the token's signature algorithm {signature} hashes with {signature_hash}, but its SignerInfo digest algorithm is {digest}; they must be the same (openssl ts -verify refuses such a token too)")]
    SignatureDigestMismatch {
        /// The signatureAlgorithm OID, dotted.
        signature: String,
        /// The hash that OID names.
        signature_hash: &'static str,
        /// The SignerInfo's digestAlgorithm.
        digest: &'static str,
    },
    /// TSTInfo carries a critical extension this crate does not understand.
    #[error("TSTInfo carries the critical extension {oid}, which this verifier does not understand; a critical extension that is not understood must be refused (RFC 3161 §2.4.2, RFC 5280 §4.2)")]
    UnknownCriticalExtension {
        /// The extension's OID, dotted.
        oid: String,
    },
    /// A date and time that does not exist (day 31 in a 30-day month, Feb 29 outside a leap
    /// year, hour 24, minute or second 60).
    #[error("impossible time in {at}: {value:?} ({reason})")]
    ImpossibleTime {
        /// Where the time was read.
        at: &'static str,
        /// The time as the token wrote it.
        value: String,
        /// Which part does not exist.
        reason: String,
    },
    /// A certificate in the chain issued by one whose keyUsage does not allow keyCertSign.
    #[error("{issuer} would issue {subject}, but its key usage extension lacks keyCertSign, so it may not sign certificates")]
    IssuerKeyUsage {
        /// The issuer's subject.
        issuer: String,
        /// The subject of the certificate it would issue.
        subject: String,
    },
    /// A chain with more intermediates below a CA than its pathLenConstraint allows.
    #[error("{issuer} allows at most {path_len} intermediate CA certificate(s) below it (basicConstraints pathLenConstraint), but the chain to {leaf} has {found}")]
    PathLenExceeded {
        /// The constraining CA's subject.
        issuer: String,
        /// Its pathLenConstraint.
        path_len: u32,
        /// The intermediates below it in the chain.
        found: usize,
        /// The TSA certificate the chain starts from.
        leaf: String,
    },
    /// A request that cannot be built or is not a valid TimeStampReq.
    #[error("bad time-stamp request: {0}")]
    BadRequest(String),
    /// PEM text without a usable CERTIFICATE block.
    #[error("bad PEM: {0}")]
    Pem(String),
    /// The HTTP exchange failed.
    #[error("time-stamp HTTP exchange with {url} failed: {reason}")]
    Http {
        /// The URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The TSA did not answer in time.
    #[error("time-stamp request to {url} timed out after {timeout:?}")]
    Timeout {
        /// The URL.
        url: String,
        /// The timeout.
        timeout: std::time::Duration,
    },
}
