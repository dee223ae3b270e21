//! Hashes and signature verification: `ring` for digests and RSA PKCS#1 v1.5, RustCrypto
//! `p256`/`p384` `verify_prehash` for ECDSA (any of SHA-256/384/512 with either curve).

use crate::der::{self, tag, Reader};
use crate::{Error, HashAlg};
use x509_parser::x509::SubjectPublicKeyInfo;

pub(crate) const OID_SHA1: &str = "1.3.14.3.2.26";
pub(crate) const OID_SHA256: &str = "2.16.840.1.101.3.4.2.1";
pub(crate) const OID_SHA384: &str = "2.16.840.1.101.3.4.2.2";
pub(crate) const OID_SHA512: &str = "2.16.840.1.101.3.4.2.3";

const OID_RSA: &str = "1.2.840.113549.1.1.1";
const OID_RSA_SHA1: &str = "1.2.840.113549.1.1.5";
const OID_RSA_SHA256: &str = "1.2.840.113549.1.1.11";
const OID_RSA_SHA384: &str = "1.2.840.113549.1.1.12";
const OID_RSA_SHA512: &str = "1.2.840.113549.1.1.13";
const OID_EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const OID_ECDSA_SHA1: &str = "1.2.840.10045.4.1";
const OID_ECDSA_SHA256: &str = "1.2.840.10045.4.3.2";
const OID_ECDSA_SHA384: &str = "1.2.840.10045.4.3.3";
const OID_ECDSA_SHA512: &str = "1.2.840.10045.4.3.4";
const OID_P256: &str = "1.2.840.10045.3.1.7";
const OID_P384: &str = "1.3.132.0.34";

/// The hashes this crate computes (SHA-1 only for ESSCertID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hash {
    Sha1,
    Sha256,
    Sha384,
    Sha512,
}

impl From<HashAlg> for Hash {
    fn from(h: HashAlg) -> Self {
        match h {
            HashAlg::Sha256 => Hash::Sha256,
            HashAlg::Sha384 => Hash::Sha384,
            HashAlg::Sha512 => Hash::Sha512,
        }
    }
}

impl Hash {
    /// The hash's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Hash::Sha1 => "SHA-1",
            Hash::Sha256 => "SHA-256",
            Hash::Sha384 => "SHA-384",
            Hash::Sha512 => "SHA-512",
        }
    }

    pub fn from_oid(oid: &str) -> Result<Self, Error> {
        match oid {
            OID_SHA1 => Ok(Hash::Sha1),
            OID_SHA256 => Ok(Hash::Sha256),
            OID_SHA384 => Ok(Hash::Sha384),
            OID_SHA512 => Ok(Hash::Sha512),
            other => Err(Error::UnsupportedAlgorithm(format!(
                "digest algorithm {other}"
            ))),
        }
    }
}

pub(crate) fn hash(h: Hash, data: &[u8]) -> Vec<u8> {
    let alg = match h {
        Hash::Sha1 => &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        Hash::Sha256 => &ring::digest::SHA256,
        Hash::Sha384 => &ring::digest::SHA384,
        Hash::Sha512 => &ring::digest::SHA512,
    };
    ring::digest::digest(alg, data).as_ref().to_vec()
}

/// A signature scheme as named by an AlgorithmIdentifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scheme {
    Rsa(Hash),
    Ecdsa(Hash),
}

/// The hash a signatureAlgorithm OID names itself (`None` for OIDs that name only the key
/// type, `rsaEncryption` and `id-ecPublicKey`, and for unknown ones).
pub(crate) fn signature_hash(sig_oid: &str) -> Option<Hash> {
    match sig_oid {
        OID_RSA_SHA1 | OID_ECDSA_SHA1 => Some(Hash::Sha1),
        OID_RSA_SHA256 | OID_ECDSA_SHA256 => Some(Hash::Sha256),
        OID_RSA_SHA384 | OID_ECDSA_SHA384 => Some(Hash::Sha384),
        OID_RSA_SHA512 | OID_ECDSA_SHA512 => Some(Hash::Sha512),
        _ => None,
    }
}

/// The scheme of a signatureAlgorithm OID. CMS signers may name only the key type
/// (`rsaEncryption`, `id-ecPublicKey`); then `digest` (the SignerInfo's digestAlgorithm) says
/// which hash was signed.
fn scheme(sig_oid: &str, digest: Option<Hash>) -> Result<Scheme, Error> {
    let s = match (sig_oid, digest) {
        (OID_RSA_SHA256, _) => Scheme::Rsa(Hash::Sha256),
        (OID_RSA_SHA384, _) => Scheme::Rsa(Hash::Sha384),
        (OID_RSA_SHA512, _) => Scheme::Rsa(Hash::Sha512),
        (OID_ECDSA_SHA256, _) => Scheme::Ecdsa(Hash::Sha256),
        (OID_ECDSA_SHA384, _) => Scheme::Ecdsa(Hash::Sha384),
        (OID_ECDSA_SHA512, _) => Scheme::Ecdsa(Hash::Sha512),
        (OID_RSA, Some(h)) => Scheme::Rsa(h),
        (OID_EC_PUBLIC_KEY, Some(h)) => Scheme::Ecdsa(h),
        (other, _) => {
            return Err(Error::UnsupportedAlgorithm(format!(
                "signature algorithm {other} (supported: RSA PKCS#1 v1.5 and ECDSA with SHA-256/384/512)"
            )))
        }
    };
    if matches!(s, Scheme::Rsa(Hash::Sha1) | Scheme::Ecdsa(Hash::Sha1)) {
        return Err(sha1_refused());
    }
    Ok(s)
}

/// Verifies `signature` over `message` with `spki`'s key. `what` names the signature in the
/// error. `digest` is the CMS digestAlgorithm, when there is one.
pub(crate) fn verify(
    spki: &SubjectPublicKeyInfo<'_>,
    sig_oid: &str,
    digest: Option<Hash>,
    message: &[u8],
    signature: &[u8],
    what: &str,
) -> Result<(), Error> {
    let scheme = scheme(sig_oid, digest)?;
    let key_oid = spki.algorithm.algorithm.to_id_string();
    let key = spki.subject_public_key.data.as_ref();
    let bad = || Error::BadSignature(what.to_string());
    match scheme {
        Scheme::Rsa(h) => {
            if key_oid != OID_RSA {
                return Err(Error::UnsupportedAlgorithm(format!(
                    "an RSA signature with a {key_oid} key ({what})"
                )));
            }
            let alg: &dyn ring::signature::VerificationAlgorithm = match h {
                Hash::Sha256 => &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                Hash::Sha384 => &ring::signature::RSA_PKCS1_2048_8192_SHA384,
                Hash::Sha512 => &ring::signature::RSA_PKCS1_2048_8192_SHA512,
                Hash::Sha1 => return Err(sha1_refused()),
            };
            ring::signature::UnparsedPublicKey::new(alg, key)
                .verify(message, signature)
                .map_err(|_| bad())
        }
        Scheme::Ecdsa(h) => {
            if key_oid != OID_EC_PUBLIC_KEY {
                return Err(Error::UnsupportedAlgorithm(format!(
                    "an ECDSA signature with a {key_oid} key ({what})"
                )));
            }
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|o| o.to_id_string())
                .unwrap_or_default();
            let prehash = hash(h, message);
            match curve.as_str() {
                OID_P256 => {
                    use p256::ecdsa::signature::hazmat::PrehashVerifier;
                    let vk = p256::ecdsa::VerifyingKey::from_sec1_bytes(key).map_err(|_| bad())?;
                    let sig = p256::ecdsa::Signature::from_slice(&ecdsa_rs(signature, 32, what)?)
                        .map_err(|_| bad())?;
                    vk.verify_prehash(&prehash, &sig).map_err(|_| bad())
                }
                OID_P384 => {
                    use p384::ecdsa::signature::hazmat::PrehashVerifier;
                    let vk = p384::ecdsa::VerifyingKey::from_sec1_bytes(key).map_err(|_| bad())?;
                    let sig = p384::ecdsa::Signature::from_slice(&ecdsa_rs(signature, 48, what)?)
                        .map_err(|_| bad())?;
                    vk.verify_prehash(&prehash, &sig).map_err(|_| bad())
                }
                other => Err(Error::UnsupportedAlgorithm(format!(
                    "elliptic curve {other:?} (supported: P-256, P-384)"
                ))),
            }
        }
    }
}

fn sha1_refused() -> Error {
    Error::UnsupportedAlgorithm("signatures over SHA-1 are not accepted".into())
}

/// An ECDSA-Sig-Value (`SEQUENCE { r INTEGER, s INTEGER }`) as fixed-width `r || s`.
fn ecdsa_rs(sig: &[u8], width: usize, what: &str) -> Result<Vec<u8>, Error> {
    let bad = || Error::BadSignature(format!("{what} (not an ECDSA-Sig-Value)"));
    let ctx = "ECDSA signature";
    let seq = der::single(sig, tag::SEQUENCE, "ECDSA-Sig-Value", ctx).map_err(|_| bad())?;
    let mut r = Reader::new(seq.value, ctx);
    let mut out = Vec::with_capacity(2 * width);
    for _ in 0..2 {
        let t = r.expect(tag::INTEGER, "r or s").map_err(|_| bad())?;
        let v = der::integer(&t, ctx).map_err(|_| bad())?;
        if v[0] & 0x80 != 0 {
            return Err(bad());
        }
        let v = &v[v.iter().take_while(|&&b| b == 0).count()..];
        if v.len() > width {
            return Err(bad());
        }
        out.extend(std::iter::repeat_n(0u8, width - v.len()));
        out.extend_from_slice(v);
    }
    r.finish().map_err(|_| bad())?;
    Ok(out)
}
