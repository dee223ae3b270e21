//! The TimeStampReq: built with only a digest, a random nonce and certReq, or parsed.
//!
//! ```text
//! TimeStampReq ::= SEQUENCE {
//!   version INTEGER { v1(1) }, messageImprint MessageImprint, reqPolicy TSAPolicyId OPTIONAL,
//!   nonce INTEGER OPTIONAL, certReq BOOLEAN DEFAULT FALSE, extensions [0] IMPLICIT OPTIONAL }
//! MessageImprint ::= SEQUENCE { hashAlgorithm AlgorithmIdentifier, hashedMessage OCTET STRING }
//! ```

use crate::der::{self, malformed, tag, Reader};
use crate::{Error, HashAlg, Imprint};
use ring::rand::SecureRandom;

/// The largest request [`TimeStampRequest::parse`] reads.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// Random nonce length before the top bit is cleared and leading zeros are dropped.
const NONCE_BYTES: usize = 16;
/// The shortest nonce generated (a redraw happens below this, with odds 2^-64).
const MIN_NONCE_BYTES: usize = 8;

/// A DER TimeStampReq and what it asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeStampRequest {
    der: Vec<u8>,
    imprint: Imprint,
    nonce: Vec<u8>,
    cert_req: bool,
}

impl TimeStampRequest {
    /// A request for a SHA-256 digest with a fresh random nonce and certReq TRUE.
    ///
    /// # Panics
    ///
    /// Only if the operating system's random number generator fails.
    pub fn sha256(digest: [u8; 32]) -> Self {
        Self::new(Imprint {
            algorithm: HashAlg::Sha256,
            digest: digest.to_vec(),
        })
        .expect("a SHA-256 imprint is valid and the system RNG works")
    }

    /// A request for `imprint` with a fresh random nonce (8–16 bytes, top bit clear, non-zero)
    /// and certReq TRUE; nothing else, so the request reveals only the digest.
    pub fn new(imprint: Imprint) -> Result<Self, Error> {
        let rng = ring::rand::SystemRandom::new();
        loop {
            let mut n = [0u8; NONCE_BYTES];
            rng.fill(&mut n).map_err(|_| {
                Error::BadRequest("the system random number generator failed".into())
            })?;
            n[0] &= 0x7f;
            let skip = n.iter().take_while(|&&b| b == 0).count();
            if NONCE_BYTES - skip >= MIN_NONCE_BYTES {
                return Self::with_nonce(imprint, &n[skip..]);
            }
        }
    }

    /// A request for `imprint` with the given nonce (big-endian INTEGER contents; empty means
    /// no nonce) and certReq TRUE. For tests and for callers that manage nonces themselves.
    pub fn with_nonce(imprint: Imprint, nonce: &[u8]) -> Result<Self, Error> {
        if imprint.digest.len() != imprint.algorithm.digest_len() {
            return Err(Error::BadRequest(format!(
                "a {} digest has {} bytes, not {}",
                imprint.algorithm.name(),
                imprint.algorithm.digest_len(),
                imprint.digest.len()
            )));
        }
        if nonce.len() > 64 {
            return Err(Error::BadRequest("nonce longer than 64 bytes".into()));
        }
        let alg = der::cons(
            tag::SEQUENCE,
            &[
                &der::oid(imprint.algorithm.oid()),
                &der::tlv(tag::NULL, &[]),
            ],
        );
        let mi = der::cons(
            tag::SEQUENCE,
            &[&alg, &der::tlv(tag::OCTET_STRING, &imprint.digest)],
        );
        let version = der::tlv(tag::INTEGER, &[1]);
        let mut body = [version, mi].concat();
        let nonce = if nonce.is_empty() {
            Vec::new()
        } else {
            minimal_integer(nonce)
        };
        if !nonce.is_empty() {
            body.extend(der::tlv(tag::INTEGER, &nonce));
        }
        body.extend(der::tlv(tag::BOOLEAN, &[0xff]));
        Ok(TimeStampRequest {
            der: der::tlv(tag::SEQUENCE, &body),
            imprint,
            nonce,
            cert_req: true,
        })
    }

    /// The request's DER encoding, to send as `application/timestamp-query`.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// The nonce, big-endian INTEGER contents as encoded; empty when the request has none.
    pub fn nonce(&self) -> &[u8] {
        &self.nonce
    }

    /// The message imprint asked for.
    pub fn imprint(&self) -> &Imprint {
        &self.imprint
    }

    /// Whether the request asks the TSA to include its certificate.
    pub fn cert_req(&self) -> bool {
        self.cert_req
    }

    /// Parses a DER TimeStampReq (version 1, SHA-256/384/512 imprint).
    pub fn parse(input: &[u8]) -> Result<Self, Error> {
        if input.len() > MAX_REQUEST_BYTES {
            return Err(Error::TooLarge {
                what: "time-stamp request",
                size: input.len(),
                limit: MAX_REQUEST_BYTES,
            });
        }
        let ctx = "TimeStampReq";
        let seq = der::single(input, tag::SEQUENCE, "TimeStampReq", ctx)?;
        let mut r = Reader::new(seq.value, ctx);
        let version = der::small_uint(&r.expect(tag::INTEGER, "version")?, ctx)?;
        if version != 1 {
            return Err(malformed(ctx, format!("version {version}, expected 1")));
        }
        let imprint = read_imprint(&mut r, "TimeStampReq messageImprint")?;
        r.optional(tag::OID)?; // reqPolicy
        let nonce = match r.optional(tag::INTEGER)? {
            Some(t) => der::integer(&t, ctx)?.to_vec(),
            None => Vec::new(),
        };
        let cert_req = match r.optional(tag::BOOLEAN)? {
            Some(t) => match t.value {
                [0xff] => true,
                [0x00] => false,
                _ => return Err(malformed(ctx, "certReq is not a DER BOOLEAN")),
            },
            None => false,
        };
        r.optional(tag::ctx_cons(0))?; // extensions
        r.finish()?;
        Ok(TimeStampRequest {
            der: input.to_vec(),
            imprint,
            nonce,
            cert_req,
        })
    }
}

/// A non-negative INTEGER's contents from big-endian magnitude bytes: leading zeros dropped,
/// a zero octet added when the high bit is set.
fn minimal_integer(mag: &[u8]) -> Vec<u8> {
    let mag = &mag[mag.iter().take_while(|&&b| b == 0).count()..];
    match mag.first() {
        None => vec![0],
        Some(&b) if b & 0x80 != 0 => [&[0u8][..], mag].concat(),
        Some(_) => mag.to_vec(),
    }
}

/// Reads a MessageImprint, refusing hash algorithms other than SHA-256/384/512 and a digest
/// of the wrong length.
pub(crate) fn read_imprint(r: &mut Reader<'_>, ctx: &'static str) -> Result<Imprint, Error> {
    let mut mi = r.nested(tag::SEQUENCE, "MessageImprint", ctx)?;
    let mut alg = mi.nested(tag::SEQUENCE, "hashAlgorithm", ctx)?;
    let oid = der::read_oid(&mut alg, "hash algorithm")?;
    if let Some(p) = alg.optional(tag::NULL)? {
        if !p.value.is_empty() {
            return Err(malformed(ctx, "hash algorithm parameters are not NULL"));
        }
    }
    alg.finish()?;
    let algorithm = HashAlg::from_oid(&oid).ok_or_else(|| {
        Error::UnsupportedAlgorithm(format!("message imprint hash algorithm {oid}"))
    })?;
    let digest = mi
        .expect(tag::OCTET_STRING, "hashedMessage")?
        .value
        .to_vec();
    mi.finish()?;
    if digest.len() != algorithm.digest_len() {
        return Err(malformed(
            ctx,
            format!("{} digest of {} bytes", algorithm.name(), digest.len()),
        ));
    }
    Ok(Imprint { algorithm, digest })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_request_has_only_version_imprint_nonce_and_cert_req() {
        let req = TimeStampRequest::sha256([7u8; 32]);
        let n = req.nonce();
        assert!(
            (MIN_NONCE_BYTES..=NONCE_BYTES).contains(&n.len()),
            "{n:02x?}"
        );
        assert_eq!(n[0] & 0x80, 0, "top bit must be clear");
        assert_ne!(n[0], 0, "no leading zero octet");
        let back = TimeStampRequest::parse(req.der()).unwrap();
        assert_eq!(back, req);
        // Exactly four elements: version, imprint, nonce, certReq.
        let seq = der::single(req.der(), tag::SEQUENCE, "t", "t").unwrap();
        let mut r = Reader::new(seq.value, "t");
        let tags: Vec<u8> = std::iter::from_fn(|| r.any().ok().map(|t| t.tag)).collect();
        assert_eq!(
            tags,
            [tag::INTEGER, tag::SEQUENCE, tag::INTEGER, tag::BOOLEAN]
        );
        // Two requests never share a nonce.
        assert_ne!(TimeStampRequest::sha256([7u8; 32]).nonce(), n);
    }

    #[test]
    fn high_bit_nonce_is_encoded_positive() {
        let imprint = Imprint::of(HashAlg::Sha384, b"x");
        let req = TimeStampRequest::with_nonce(imprint, &[0x80, 0x01]).unwrap();
        let back = TimeStampRequest::parse(req.der()).unwrap();
        assert_eq!(back.nonce(), [0x00, 0x80, 0x01]);
        assert_eq!(req.nonce(), back.nonce());
    }

    #[test]
    fn wrong_digest_length_is_refused() {
        let imprint = Imprint {
            algorithm: HashAlg::Sha512,
            digest: vec![0; 32],
        };
        assert!(TimeStampRequest::with_nonce(imprint, &[1]).is_err());
    }
}
