//! Offline verification of a TimeStampResp and of a stored token against pinned roots, in the
//! order the crate documentation lists. Every input here is untrusted: each structure is read
//! with the bounded reader in `der`, certificates with `x509-parser`, and nothing indexes
//! without a check.
//!
//! ```text
//! TimeStampResp ::= SEQUENCE { status PKIStatusInfo, timeStampToken ContentInfo OPTIONAL }
//! PKIStatusInfo ::= SEQUENCE { status INTEGER, statusString SEQUENCE OF UTF8String OPTIONAL,
//!                              failInfo BIT STRING OPTIONAL }
//! TSTInfo ::= SEQUENCE { version INTEGER, policy OID, messageImprint MessageImprint,
//!   serialNumber INTEGER, genTime GeneralizedTime, accuracy SEQUENCE OPTIONAL,
//!   ordering BOOLEAN DEFAULT FALSE, nonce INTEGER OPTIONAL, tsa [0] GeneralName OPTIONAL,
//!   extensions [1] IMPLICIT Extensions OPTIONAL }
//! ```

use crate::crypto::{self, Hash};
use crate::der::{self, integers_equal, malformed, tag, Reader};
use crate::request::read_imprint;
use crate::time::{generalized_to_unix_ms, rfc3339};
use crate::{
    Error, Imprint, TimeStampRequest, Witness, MAX_CERTIFICATES, MAX_CHAIN_DEPTH,
    MAX_RESPONSE_BYTES,
};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::FromDer;

const OID_SIGNED_DATA: &str = "1.2.840.113549.1.7.2";
const OID_TST_INFO: &str = "1.2.840.113549.1.9.16.1.4";
const OID_ATTR_CONTENT_TYPE: &str = "1.2.840.113549.1.9.3";
const OID_ATTR_MESSAGE_DIGEST: &str = "1.2.840.113549.1.9.4";
const OID_ATTR_SIGNING_CERTIFICATE: &str = "1.2.840.113549.1.9.16.2.12";
const OID_ATTR_SIGNING_CERTIFICATE_V2: &str = "1.2.840.113549.1.9.16.2.47";

/// At most this many signature checks while searching for a chain (bounds the work a token
/// full of same-named certificates can cause).
const MAX_CHAIN_SIGNATURE_CHECKS: usize = 64;

/// Checks a whole TimeStampResp against the request that was sent; answers the token (DER
/// ContentInfo) and what it witnesses. The imprint must equal the request's, and when the
/// request carried a nonce the token must carry the same one.
pub fn verify_response(
    resp: &[u8],
    req: &TimeStampRequest,
    roots: &[Vec<u8>],
    extra_certs: &[Vec<u8>],
) -> Result<(Vec<u8>, Witness), Error> {
    let token = response_token(resp)?;
    let nonce = (!req.nonce().is_empty()).then(|| req.nonce());
    let witness = verify_token(token, req.imprint(), nonce, roots, extra_certs)?;
    Ok((token.to_vec(), witness))
}

/// The token inside a granted TimeStampResp.
fn response_token(resp: &[u8]) -> Result<&[u8], Error> {
    if resp.len() > MAX_RESPONSE_BYTES {
        return Err(Error::TooLarge {
            what: "time-stamp response",
            size: resp.len(),
            limit: MAX_RESPONSE_BYTES,
        });
    }
    let ctx = "TimeStampResp";
    let seq = der::single(resp, tag::SEQUENCE, "TimeStampResp", ctx)?;
    let mut r = Reader::new(seq.value, ctx);
    let mut st = r.nested(tag::SEQUENCE, "PKIStatusInfo", "TimeStampResp status")?;
    let status = der::small_uint(&st.expect(tag::INTEGER, "status")?, st.ctx())?;
    let mut text = Vec::new();
    if let Some(ss) = st.optional(tag::SEQUENCE)? {
        let mut ss = Reader::new(ss.value, "TimeStampResp statusString");
        while !ss.is_empty() {
            let s = ss.any()?;
            text.push(
                String::from_utf8_lossy(s.value)
                    .chars()
                    .take(200)
                    .collect::<String>(),
            );
        }
    }
    let fail_info = match st.optional(tag::BIT_STRING)? {
        Some(b) => fail_info_names(b.value),
        None => "none".to_string(),
    };
    st.finish()?;
    let token = r.optional(tag::SEQUENCE)?;
    r.finish()?;
    if status > 1 {
        return Err(Error::StatusNotGranted {
            status,
            name: status_name(status),
            text: if text.is_empty() {
                String::new()
            } else {
                format!(": {}", text.join("; "))
            },
            fail_info,
        });
    }
    Ok(token.ok_or(Error::NoToken)?.raw)
}

fn status_name(s: u64) -> &'static str {
    match s {
        0 => "granted",
        1 => "grantedWithMods",
        2 => "rejection",
        3 => "waiting",
        4 => "revocationWarning",
        5 => "revocationNotification",
        _ => "unknown",
    }
}

/// The PKIFailureInfo bits set in a BIT STRING's contents, by name.
fn fail_info_names(v: &[u8]) -> String {
    const NAMES: [(usize, &str); 8] = [
        (0, "badAlg"),
        (2, "badRequest"),
        (5, "badDataFormat"),
        (14, "timeNotAvailable"),
        (15, "unacceptedPolicy"),
        (16, "unacceptedExtension"),
        (17, "addInfoNotAvailable"),
        (25, "systemFailure"),
    ];
    let bits = v.get(1..).unwrap_or_default();
    let set = |n: usize| bits.get(n / 8).is_some_and(|b| b & (0x80 >> (n % 8)) != 0);
    let mut names: Vec<String> = Vec::new();
    for n in 0..bits.len().min(8) * 8 {
        if set(n) {
            names.push(
                NAMES
                    .iter()
                    .find(|(i, _)| *i == n)
                    .map_or_else(|| format!("bit{n}"), |(_, s)| (*s).to_string()),
            );
        }
    }
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(",")
    }
}

/// The parts of a SignedData time-stamp token this module checks.
struct Token<'a> {
    e_content: &'a [u8],
    certs: Vec<&'a [u8]>,
    signer: SignerInfo<'a>,
}

struct SignerInfo<'a> {
    sid: SignerId<'a>,
    digest: Hash,
    signed_attrs: &'a [u8],
    sig_alg: String,
    signature: &'a [u8],
}

enum SignerId<'a> {
    IssuerSerial { issuer: &'a [u8], serial: &'a [u8] },
    KeyId(&'a [u8]),
}

fn parse_token(token: &[u8]) -> Result<Token<'_>, Error> {
    let ctx = "token ContentInfo";
    let ci = der::single(token, tag::SEQUENCE, "ContentInfo", ctx)?;
    let mut r = Reader::new(ci.value, ctx);
    let ct = der::read_oid(&mut r, "contentType")?;
    if ct != OID_SIGNED_DATA {
        return Err(Error::NotATimeStampToken(format!(
            "contentType {ct}, expected signedData {OID_SIGNED_DATA}"
        )));
    }
    let mut explicit = r.nested(tag::ctx_cons(0), "[0] content", ctx)?;
    r.finish()?;
    let ctx = "token SignedData";
    let mut sd = explicit.nested(tag::SEQUENCE, "SignedData", ctx)?;
    explicit.finish()?;
    let version = der::small_uint(&sd.expect(tag::INTEGER, "version")?, ctx)?;
    if version != 3 {
        // RFC 5652 §5.1: version 3 whenever eContentType is not id-data.
        return Err(malformed(ctx, format!("version {version}, expected 3")));
    }
    let mut digest_algs = Vec::new();
    let mut da = sd.nested(tag::SET, "digestAlgorithms", "token digestAlgorithms")?;
    while !da.is_empty() {
        if digest_algs.len() >= 8 {
            return Err(malformed(da.ctx(), "too many digest algorithms"));
        }
        digest_algs.push(Hash::from_oid(&der::read_algorithm(
            &mut da,
            "digestAlgorithm",
        )?)?);
    }
    let mut eci = sd.nested(tag::SEQUENCE, "encapContentInfo", "token encapContentInfo")?;
    let ect = der::read_oid(&mut eci, "eContentType")?;
    if ect != OID_TST_INFO {
        return Err(Error::NotATimeStampToken(format!(
            "eContentType {ect}, expected id-ct-TSTInfo {OID_TST_INFO}"
        )));
    }
    let mut ec = eci.nested(tag::ctx_cons(0), "[0] eContent", eci.ctx())?;
    let e_content = ec.expect(tag::OCTET_STRING, "eContent OCTET STRING")?.value;
    ec.finish()?;
    eci.finish()?;
    let mut certs = Vec::new();
    if let Some(set) = sd.optional(tag::ctx_cons(0))? {
        let mut cr = Reader::new(set.value, "token certificates");
        while !cr.is_empty() {
            let c = cr.any()?;
            // Other CertificateChoices (attribute certificates, other formats) are skipped.
            if c.tag == tag::SEQUENCE {
                certs.push(c.raw);
            }
            if certs.len() > MAX_CERTIFICATES {
                return Err(Error::TooLarge {
                    what: "token certificate count",
                    size: certs.len(),
                    limit: MAX_CERTIFICATES,
                });
            }
        }
    }
    sd.optional(tag::ctx_cons(1))?; // crls
    let mut sis = sd.nested(tag::SET, "signerInfos", "token signerInfos")?;
    sd.finish()?;
    let si = sis.nested(tag::SEQUENCE, "SignerInfo", "token SignerInfo")?;
    if !sis.is_empty() {
        return Err(Error::NotATimeStampToken(
            "more than one SignerInfo (RFC 3161 tokens have exactly one)".into(),
        ));
    }
    let signer = parse_signer_info(si)?;
    if !digest_algs.contains(&signer.digest) {
        return Err(malformed(
            ctx,
            "the signer's digest algorithm is not among the digestAlgorithms",
        ));
    }
    Ok(Token {
        e_content,
        certs,
        signer,
    })
}

fn parse_signer_info(mut si: Reader<'_>) -> Result<SignerInfo<'_>, Error> {
    let version = der::small_uint(&si.expect(tag::INTEGER, "version")?, si.ctx())?;
    let expected = if si.peek_tag() == Some(tag::SEQUENCE) {
        1
    } else {
        3
    };
    if version != expected {
        // RFC 5652 §5.3: 1 with issuerAndSerialNumber, 3 with subjectKeyIdentifier.
        return Err(malformed(
            si.ctx(),
            format!("version {version}, expected {expected} for its signer identifier"),
        ));
    }
    let sid = match si.peek_tag() {
        Some(tag::SEQUENCE) => {
            let mut ias = si.nested(tag::SEQUENCE, "IssuerAndSerialNumber", si.ctx())?;
            let issuer = ias.expect(tag::SEQUENCE, "issuer Name")?.raw;
            let serial = der::integer(&ias.expect(tag::INTEGER, "serialNumber")?, ias.ctx())?;
            ias.finish()?;
            SignerId::IssuerSerial { issuer, serial }
        }
        _ => SignerId::KeyId(si.expect(tag::ctx_prim(0), "subjectKeyIdentifier")?.value),
    };
    let digest = Hash::from_oid(&der::read_algorithm(&mut si, "digestAlgorithm")?)?;
    let signed_attrs = si
        .optional(tag::ctx_cons(0))?
        .ok_or_else(|| Error::NotATimeStampToken("the SignerInfo has no signed attributes".into()))?
        .raw;
    let sig_alg = der::read_algorithm(&mut si, "signatureAlgorithm")?;
    let signature = si.expect(tag::OCTET_STRING, "signature")?.value;
    si.optional(tag::ctx_cons(1))?; // unsignedAttrs
    si.finish()?;
    Ok(SignerInfo {
        sid,
        digest,
        signed_attrs,
        sig_alg,
        signature,
    })
}

/// The signed attributes this module reads, each at most once.
#[derive(Default)]
struct SignedAttrs<'a> {
    content_type: Option<String>,
    message_digest: Option<&'a [u8]>,
    signing_cert: Option<&'a [u8]>,
    signing_cert_v2: Option<&'a [u8]>,
}

fn parse_signed_attrs(raw: &[u8]) -> Result<SignedAttrs<'_>, Error> {
    let ctx = "token signed attributes";
    let set = der::single(raw, tag::ctx_cons(0), "signedAttrs", ctx)?;
    let mut r = Reader::new(set.value, ctx);
    let mut seen: Vec<String> = Vec::new();
    let mut out = SignedAttrs::default();
    while !r.is_empty() {
        let mut attr = r.nested(tag::SEQUENCE, "Attribute", ctx)?;
        let oid = der::read_oid(&mut attr, "attrType")?;
        let mut values = attr.nested(tag::SET, "attrValues", ctx)?;
        attr.finish()?;
        if seen.contains(&oid) {
            return Err(malformed(ctx, format!("attribute {oid} appears twice")));
        }
        if seen.len() >= 64 {
            return Err(malformed(ctx, "too many attributes"));
        }
        seen.push(oid.clone());
        let known = [
            OID_ATTR_CONTENT_TYPE,
            OID_ATTR_MESSAGE_DIGEST,
            OID_ATTR_SIGNING_CERTIFICATE,
            OID_ATTR_SIGNING_CERTIFICATE_V2,
        ];
        if !known.contains(&oid.as_str()) {
            continue;
        }
        let v = values.any()?;
        if !values.is_empty() {
            return Err(malformed(
                ctx,
                format!("attribute {oid} has more than one value"),
            ));
        }
        match oid.as_str() {
            OID_ATTR_CONTENT_TYPE => {
                if v.tag != tag::OID {
                    return Err(malformed(ctx, "content-type value is not an OID"));
                }
                out.content_type = Some(der::oid_text(v.value, ctx)?);
            }
            OID_ATTR_MESSAGE_DIGEST => {
                if v.tag != tag::OCTET_STRING {
                    return Err(malformed(ctx, "messageDigest value is not an OCTET STRING"));
                }
                out.message_digest = Some(v.value);
            }
            OID_ATTR_SIGNING_CERTIFICATE => out.signing_cert = Some(v.raw),
            _ => out.signing_cert_v2 = Some(v.raw),
        }
    }
    Ok(out)
}

struct TstInfo<'a> {
    policy: String,
    imprint: Imprint,
    serial: &'a [u8],
    gen_time_ms: i64,
    nonce: Option<&'a [u8]>,
}

fn parse_tst_info(e_content: &[u8]) -> Result<TstInfo<'_>, Error> {
    let ctx = "TSTInfo";
    let seq = der::single(e_content, tag::SEQUENCE, "TSTInfo", ctx)?;
    let mut r = Reader::new(seq.value, ctx);
    let version = der::small_uint(&r.expect(tag::INTEGER, "version")?, ctx)?;
    if version != 1 {
        return Err(malformed(ctx, format!("version {version}, expected 1")));
    }
    let policy = der::read_oid(&mut r, "policy")?;
    let imprint = read_imprint(&mut r, "TSTInfo messageImprint")?;
    let serial = der::integer(&r.expect(tag::INTEGER, "serialNumber")?, ctx)?;
    let gen_time_ms = generalized_to_unix_ms(r.expect(tag::GENERALIZED_TIME, "genTime")?.value)?;
    r.optional(tag::SEQUENCE)?; // accuracy
    r.optional(tag::BOOLEAN)?; // ordering
    let nonce = match r.optional(tag::INTEGER)? {
        Some(t) => Some(der::integer(&t, ctx)?),
        None => None,
    };
    r.optional(tag::ctx_cons(0))?; // tsa
    if let Some(ext) = r.optional(tag::ctx_cons(1))? {
        check_tst_extensions(ext.value)?;
    }
    r.finish()?;
    Ok(TstInfo {
        policy,
        imprint,
        serial,
        gen_time_ms,
        nonce,
    })
}

/// `extensions [1] IMPLICIT Extensions`: none is understood here, so any marked critical is
/// refused, naming its OID; the others are skipped.
fn check_tst_extensions(v: &[u8]) -> Result<(), Error> {
    let ctx = "TSTInfo extensions";
    let mut r = Reader::new(v, ctx);
    let mut n = 0;
    while !r.is_empty() {
        n += 1;
        if n > 64 {
            return Err(malformed(ctx, "too many extensions"));
        }
        let mut e = r.nested(tag::SEQUENCE, "Extension", ctx)?;
        let oid = der::read_oid(&mut e, "extnID")?;
        let critical = match e.optional(tag::BOOLEAN)? {
            Some(b) if b.value.len() == 1 => b.value[0] != 0,
            Some(_) => return Err(malformed(ctx, "critical is not a one-octet BOOLEAN")),
            None => false,
        };
        e.expect(tag::OCTET_STRING, "extnValue")?;
        e.finish()?;
        if critical {
            return Err(Error::UnknownCriticalExtension { oid });
        }
    }
    Ok(())
}

fn parse_cert<'a>(der_bytes: &'a [u8], what: &'static str) -> Result<X509Certificate<'a>, Error> {
    match X509Certificate::from_der(der_bytes) {
        Ok(([], c)) => Ok(c),
        Ok(_) => Err(malformed(what, "trailing bytes after the certificate")),
        Err(e) => Err(malformed(what, e.to_string())),
    }
}

fn subject_key_id<'a>(c: &X509Certificate<'a>) -> Option<&'a [u8]> {
    c.iter_extensions()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0),
            _ => None,
        })
}

/// Checks a stored token offline: `imprint` is what it must witness; `nonce` is compared when
/// given (`None` = not compared, e.g. a token read back from storage).
pub fn verify_token(
    token: &[u8],
    imprint: &Imprint,
    nonce: Option<&[u8]>,
    roots: &[Vec<u8>],
    extra_certs: &[Vec<u8>],
) -> Result<Witness, Error> {
    if token.len() > MAX_RESPONSE_BYTES {
        return Err(Error::TooLarge {
            what: "time-stamp token",
            size: token.len(),
            limit: MAX_RESPONSE_BYTES,
        });
    }
    if extra_certs.len() + roots.len() > 2 * MAX_CERTIFICATES {
        return Err(Error::TooLarge {
            what: "extra and root certificate count",
            size: extra_certs.len() + roots.len(),
            limit: 2 * MAX_CERTIFICATES,
        });
    }
    let tok = parse_token(token)?;
    let attrs = parse_signed_attrs(tok.signer.signed_attrs)?;
    let tst = parse_tst_info(tok.e_content)?;

    // The digest that binds the TSTInfo: not SHA-1, and the one the signature hashes with.
    if tok.signer.digest == Hash::Sha1 {
        return Err(Error::Sha1Digest);
    }
    if let Some(h) = crypto::signature_hash(&tok.signer.sig_alg) {
        if h != tok.signer.digest {
            return Err(Error::SignatureDigestMismatch {
                signature: tok.signer.sig_alg.clone(),
                signature_hash: h.name(),
                digest: tok.signer.digest.name(),
            });
        }
    }

    // Signed attributes: content-type and messageDigest.
    match attrs.content_type.as_deref() {
        Some(OID_TST_INFO) => {}
        Some(other) => {
            return Err(Error::NotATimeStampToken(format!(
                "signed content-type attribute is {other}, expected id-ct-TSTInfo"
            )))
        }
        None => {
            return Err(Error::NotATimeStampToken(
                "no content-type signed attribute".into(),
            ))
        }
    }
    let md = attrs
        .message_digest
        .ok_or_else(|| Error::NotATimeStampToken("no messageDigest signed attribute".into()))?;
    if md != crypto::hash(tok.signer.digest, tok.e_content).as_slice() {
        return Err(Error::MessageDigestMismatch);
    }

    // The signer certificate, by SignerIdentifier.
    let mut pool: Vec<(&[u8], X509Certificate<'_>)> = Vec::new();
    for c in &tok.certs {
        pool.push((c, parse_cert(c, "token certificate")?));
    }
    for c in extra_certs {
        pool.push((c, parse_cert(c, "extra certificate")?));
    }
    let signer_idx = pool
        .iter()
        .position(|(_, c)| match tok.signer.sid {
            SignerId::IssuerSerial { issuer, serial } => {
                c.issuer().as_raw() == issuer && integers_equal(c.raw_serial(), serial)
            }
            SignerId::KeyId(k) => subject_key_id(c) == Some(k),
        })
        .ok_or_else(|| {
            Error::SignerNotFound(match tok.signer.sid {
                SignerId::IssuerSerial { serial, .. } => {
                    format!("issuer and serial number {}", hex::encode(serial))
                }
                SignerId::KeyId(k) => format!("subject key identifier {}", hex::encode(k)),
            })
        })?;
    let (signer_der, signer) = &pool[signer_idx];

    // The signature over the signed attributes, re-tagged as SET OF.
    let mut signed = tok.signer.signed_attrs.to_vec();
    signed[0] = tag::SET;
    crypto::verify(
        signer.public_key(),
        &tok.signer.sig_alg,
        Some(tok.signer.digest),
        &signed,
        tok.signer.signature,
        "the token's signed attributes do not verify with the signer certificate's key",
    )?;

    check_eku(signer)?;
    check_ess(&attrs, signer_der, signer)?;

    // The chain to a pinned root, judged at genTime.
    let mut pinned = Vec::new();
    for r in roots {
        pinned.push((r.as_slice(), parse_cert(r, "pinned root certificate")?));
    }
    let gen_s = tst.gen_time_ms.div_euclid(1000);
    valid_at(signer, gen_s, tst.gen_time_ms)?;
    let mut chain = Chain {
        pool: &pool,
        roots: &pinned,
        gen_s,
        gen_ms: tst.gen_time_ms,
        checks: 0,
        failure: None,
    };
    if !chain.extend(signer_idx, &mut vec![signer_idx])? {
        return Err(chain.failure.take().unwrap_or_else(|| {
            Error::NotChained(format!(
                "no pinned root or given certificate issued {} (issuer of {})",
                name_text(signer.issuer()),
                name_text(signer.subject())
            ))
        }));
    }

    // What it witnesses.
    if tst.imprint != *imprint {
        return Err(Error::ImprintMismatch {
            expected: format!(
                "{}:{}",
                imprint.algorithm.name(),
                hex::encode(&imprint.digest)
            ),
            found: format!(
                "{}:{}",
                tst.imprint.algorithm.name(),
                hex::encode(&tst.imprint.digest)
            ),
        });
    }
    if let Some(sent) = nonce {
        match tst.nonce {
            None => {
                return Err(Error::NonceMissing {
                    sent: hex::encode(sent),
                })
            }
            Some(found) if !integers_equal(sent, found) => {
                return Err(Error::NonceMismatch {
                    sent: hex::encode(sent),
                    found: hex::encode(found),
                })
            }
            Some(_) => {}
        }
    }
    let magnitude = |v: &[u8]| hex::encode(&v[v.iter().take_while(|&&b| b == 0).count()..]);
    Ok(Witness {
        gen_time_unix_ms: tst.gen_time_ms,
        gen_time: rfc3339(tst.gen_time_ms),
        serial_hex: magnitude(tst.serial),
        policy: tst.policy,
        tsa: name_text(signer.subject()),
        hash: tst.imprint.algorithm.name(),
        signer_not_after_unix: signer.validity().not_after.timestamp(),
        nonce_hex: tst.nonce.map(magnitude),
    })
}

fn name_text(n: &x509_parser::x509::X509Name<'_>) -> String {
    let s = n.to_string();
    if s.is_empty() {
        "(empty name)".into()
    } else {
        s
    }
}

/// RFC 3161 §2.3: the EKU extension is critical and names id-kp-timeStamping only.
fn check_eku(signer: &X509Certificate<'_>) -> Result<(), Error> {
    let eku = signer
        .extended_key_usage()
        .map_err(|e| malformed("TSA certificate extended key usage", e.to_string()))?
        .ok_or_else(|| {
            Error::EkuMissing("the TSA certificate has no extended key usage extension".into())
        })?;
    let v = eku.value;
    if !v.time_stamping {
        return Err(Error::EkuMissing(
            "id-kp-timeStamping is missing from the TSA certificate".into(),
        ));
    }
    if v.any
        || v.server_auth
        || v.client_auth
        || v.code_signing
        || v.email_protection
        || v.ocsp_signing
        || !v.other.is_empty()
    {
        return Err(Error::EkuMissing(
            "the TSA certificate carries purposes other than id-kp-timeStamping".into(),
        ));
    }
    if !eku.critical {
        return Err(Error::EkuNotCritical);
    }
    Ok(())
}

/// The signingCertificate (ESSCertID, SHA-1) and signingCertificateV2 (ESSCertIDv2) attributes:
/// at least one is present, and each present one lists the signer certificate.
fn check_ess(
    attrs: &SignedAttrs<'_>,
    signer_der: &[u8],
    signer: &X509Certificate<'_>,
) -> Result<(), Error> {
    if attrs.signing_cert.is_none() && attrs.signing_cert_v2.is_none() {
        return Err(Error::SigningCertificate(
            "neither signingCertificate nor signingCertificateV2 is among the signed attributes"
                .into(),
        ));
    }
    for (raw, v2) in [(attrs.signing_cert, false), (attrs.signing_cert_v2, true)] {
        let Some(raw) = raw else { continue };
        let ctx = if v2 {
            "signingCertificateV2 attribute"
        } else {
            "signingCertificate attribute"
        };
        let seq = der::single(raw, tag::SEQUENCE, "SigningCertificate", ctx)?;
        let mut r = Reader::new(seq.value, ctx);
        let mut ids = r.nested(tag::SEQUENCE, "certs", ctx)?;
        let mut found = false;
        let mut n = 0;
        while !ids.is_empty() {
            n += 1;
            if n > MAX_CERTIFICATES {
                return Err(malformed(ctx, "too many ESSCertIDs"));
            }
            let mut id = ids.nested(tag::SEQUENCE, "ESSCertID", ctx)?;
            let h = if v2 && id.peek_tag() == Some(tag::SEQUENCE) {
                Hash::from_oid(&der::read_algorithm(&mut id, "hashAlgorithm")?)?
            } else if v2 {
                Hash::Sha256
            } else {
                Hash::Sha1
            };
            let cert_hash = id.expect(tag::OCTET_STRING, "certHash")?.value;
            let serial_ok = match id.optional(tag::SEQUENCE)? {
                Some(is) => {
                    let mut is = Reader::new(is.value, ctx);
                    is.expect(tag::SEQUENCE, "issuer GeneralNames")?;
                    let s = der::integer(&is.expect(tag::INTEGER, "serialNumber")?, ctx)?;
                    integers_equal(s, signer.raw_serial())
                }
                None => true,
            };
            id.finish()?;
            if serial_ok && cert_hash == crypto::hash(h, signer_der).as_slice() {
                found = true;
            }
        }
        if !found {
            return Err(Error::SigningCertificate(format!(
                "no {} in the {ctx} matches the signer certificate {}",
                if v2 { "ESSCertIDv2" } else { "ESSCertID" },
                name_text(signer.subject())
            )));
        }
    }
    Ok(())
}

fn valid_at(c: &X509Certificate<'_>, gen_s: i64, gen_ms: i64) -> Result<(), Error> {
    let v = c.validity();
    let (nb, na) = (v.not_before.timestamp(), v.not_after.timestamp());
    if gen_s < nb || gen_s > na {
        return Err(Error::NotValidAtGenTime {
            subject: name_text(c.subject()),
            not_before: rfc3339(nb.saturating_mul(1000)),
            not_after: rfc3339(na.saturating_mul(1000)),
            gen_time: rfc3339(gen_ms),
        });
    }
    Ok(())
}

/// Whether `issuer` may sign `cert`, `below` non-self-issued intermediates above the TSA
/// certificate `leaf`: a keyUsage extension, when present, allows keyCertSign, and a
/// pathLenConstraint, when present, allows `below` intermediates (as OpenSSL checks both).
fn may_issue(
    issuer: &X509Certificate<'_>,
    cert: &X509Certificate<'_>,
    leaf: &X509Certificate<'_>,
    below: usize,
) -> Result<(), Error> {
    let ku = issuer
        .key_usage()
        .map_err(|e| malformed("issuer certificate key usage", e.to_string()))?;
    if ku.is_some_and(|ku| !ku.value.key_cert_sign()) {
        return Err(Error::IssuerKeyUsage {
            issuer: name_text(issuer.subject()),
            subject: name_text(cert.subject()),
        });
    }
    let bc = issuer
        .basic_constraints()
        .map_err(|e| malformed("issuer certificate basic constraints", e.to_string()))?;
    if let Some(path_len) = bc.and_then(|bc| bc.value.path_len_constraint) {
        if below > path_len as usize {
            return Err(Error::PathLenExceeded {
                issuer: name_text(issuer.subject()),
                path_len,
                found: below,
                leaf: name_text(leaf.subject()),
            });
        }
    }
    Ok(())
}

/// A depth-first search from the signer to a pinned root through the pool.
struct Chain<'p, 'a> {
    pool: &'p [(&'a [u8], X509Certificate<'a>)],
    roots: &'p [(&'a [u8], X509Certificate<'a>)],
    gen_s: i64,
    gen_ms: i64,
    checks: usize,
    /// The most telling reason a candidate link failed, reported if no path succeeds.
    failure: Option<Error>,
}

impl Chain<'_, '_> {
    /// Whether `pool[idx]` (already checked valid at genTime) chains to a pinned root.
    fn extend(&mut self, idx: usize, path: &mut Vec<usize>) -> Result<bool, Error> {
        let (der_bytes, cert) = &self.pool[idx];
        // The certificate is itself a pinned root.
        if self.roots.iter().any(|(r, _)| r == der_bytes) {
            return Ok(true);
        }
        let leaf = &self.pool[path[0]].1;
        // The non-self-issued intermediates below an issuer of `cert` (RFC 5280 §6.1.4 (l)).
        let below = path[1..]
            .iter()
            .filter(|&&i| {
                let c = &self.pool[i].1;
                c.subject().as_raw() != c.issuer().as_raw()
            })
            .count();
        // Issued by a pinned root: preferred over any certificate in the pool, so a
        // cross-certificate of the root is never needed.
        for (_, root) in self.roots {
            if root.subject().as_raw() != cert.issuer().as_raw() {
                continue;
            }
            if let Err(e) = may_issue(root, cert, leaf, below) {
                self.failure = Some(e);
                continue;
            }
            if !self.signed_by(cert, root)? {
                continue;
            }
            match valid_at(root, self.gen_s, self.gen_ms) {
                Ok(()) => return Ok(true),
                Err(e) => self.failure = Some(e),
            }
        }
        if path.len() >= MAX_CHAIN_DEPTH {
            self.failure.get_or_insert(Error::NotChained(format!(
                "the chain is longer than {MAX_CHAIN_DEPTH} certificates"
            )));
            return Ok(false);
        }
        let mut named = false;
        for (i, (_, issuer)) in self.pool.iter().enumerate() {
            if path.contains(&i) || issuer.subject().as_raw() != cert.issuer().as_raw() {
                continue;
            }
            named = true;
            let is_ca = matches!(issuer.basic_constraints(), Ok(Some(bc)) if bc.value.ca);
            if !is_ca {
                self.failure.get_or_insert(Error::NotChained(format!(
                    "{} would issue {} but is not a CA (basicConstraints cA)",
                    name_text(issuer.subject()),
                    name_text(cert.subject())
                )));
                continue;
            }
            if let Err(e) = may_issue(issuer, cert, leaf, below) {
                self.failure = Some(e);
                continue;
            }
            if !self.signed_by(cert, issuer)? {
                continue;
            }
            if let Err(e) = valid_at(issuer, self.gen_s, self.gen_ms) {
                self.failure = Some(e);
                continue;
            }
            path.push(i);
            if self.extend(i, path)? {
                return Ok(true);
            }
            path.pop();
        }
        if !named {
            self.failure.get_or_insert(Error::NotChained(format!(
                "no pinned root or given certificate is {} (issuer of {})",
                name_text(cert.issuer()),
                name_text(cert.subject())
            )));
        }
        Ok(false)
    }

    /// Whether `issuer`'s key verifies `cert`'s signature; a failure is remembered.
    fn signed_by(
        &mut self,
        cert: &X509Certificate<'_>,
        issuer: &X509Certificate<'_>,
    ) -> Result<bool, Error> {
        if cert.signature_algorithm != cert.tbs_certificate.signature
            || cert.signature_value.unused_bits != 0
        {
            self.failure = Some(Error::NotChained(format!(
                "certificate {} has a signature algorithm that differs from its TBS, or a \
                 signature with unused bits",
                name_text(cert.subject())
            )));
            return Ok(false);
        }
        self.checks += 1;
        if self.checks > MAX_CHAIN_SIGNATURE_CHECKS {
            return Err(Error::NotChained(
                "too many candidate issuers to try".into(),
            ));
        }
        let what = format!(
            "certificate {} does not verify with the key of {}",
            name_text(cert.subject()),
            name_text(issuer.subject())
        );
        match crypto::verify(
            issuer.public_key(),
            &cert.signature_algorithm.algorithm.to_id_string(),
            None,
            cert.tbs_certificate.as_ref(),
            cert.signature_value.data.as_ref(),
            &what,
        ) {
            Ok(()) => Ok(true),
            // A link that does not verify is a chain failure, whatever the reason.
            Err(Error::BadSignature(what)) => {
                self.failure = Some(Error::NotChained(format!("the signature of {what}")));
                Ok(false)
            }
            Err(e) => {
                self.failure = Some(Error::NotChained(e.to_string()));
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sigstage TSA certificate (the leaf of `ts_chain.pem`).
    fn sigstage_leaf() -> Vec<u8> {
        let p = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/tsa/sigstage/ts_chain.pem"
        );
        crate::certificates_from_pem(&std::fs::read_to_string(p).unwrap())
            .unwrap()
            .remove(0)
    }

    /// SigningCertificate(V2) { certs { ESSCertID(v2) { [hashAlgorithm,] certHash [, issuerSerial] } } }
    fn signing_cert(alg: Option<&str>, hash: &[u8], serial: Option<&[u8]>) -> Vec<u8> {
        let mut id = Vec::new();
        if let Some(a) = alg {
            id.extend(der::cons(tag::SEQUENCE, &[&der::oid(a)]));
        }
        id.extend(der::tlv(tag::OCTET_STRING, hash));
        if let Some(s) = serial {
            let names = der::tlv(tag::SEQUENCE, &[]);
            id.extend(der::cons(
                tag::SEQUENCE,
                &[&names, &der::tlv(tag::INTEGER, s)],
            ));
        }
        let id = der::tlv(tag::SEQUENCE, &id);
        der::tlv(tag::SEQUENCE, &der::tlv(tag::SEQUENCE, &id))
    }

    #[test]
    fn ess_binding_matches_the_signer_only() {
        let leaf_der = sigstage_leaf();
        let (_, leaf) = X509Certificate::from_der(&leaf_der).unwrap();
        let serial = leaf.raw_serial().to_vec();
        let sha256 = crypto::hash(Hash::Sha256, &leaf_der);
        let sha1 = crypto::hash(Hash::Sha1, &leaf_der);
        let sha512 = crypto::hash(Hash::Sha512, &leaf_der);
        let v2 = |raw: &[u8]| {
            let attrs = SignedAttrs {
                signing_cert_v2: Some(raw),
                ..SignedAttrs::default()
            };
            check_ess(&attrs, &leaf_der, &leaf)
        };
        let v1 = |raw: &[u8]| {
            let attrs = SignedAttrs {
                signing_cert: Some(raw),
                ..SignedAttrs::default()
            };
            check_ess(&attrs, &leaf_der, &leaf)
        };
        v2(&signing_cert(None, &sha256, None)).unwrap();
        v2(&signing_cert(None, &sha256, Some(&serial))).unwrap();
        v2(&signing_cert(Some(crypto::OID_SHA512), &sha512, None)).unwrap();
        v1(&signing_cert(None, &sha1, Some(&serial))).unwrap();
        let mut other = sha256.clone();
        other[0] ^= 1;
        for bad in [
            v2(&signing_cert(None, &other, None)),
            v2(&signing_cert(None, &sha256, Some(&[0x01]))),
            v2(&signing_cert(Some(crypto::OID_SHA512), &sha256, None)),
            v1(&signing_cert(None, &sha256, None)),
        ] {
            let err = bad.unwrap_err();
            assert!(matches!(err, Error::SigningCertificate(_)), "{err}");
        }
        let none = check_ess(&SignedAttrs::default(), &leaf_der, &leaf).unwrap_err();
        assert!(
            none.to_string().contains("neither signingCertificate"),
            "{none}"
        );
    }

    #[test]
    fn fail_info_bits_are_named() {
        // BIT STRING contents: unused-bits octet, then bit 0 (badAlg) and bit 2 (badRequest).
        assert_eq!(fail_info_names(&[0x05, 0xa0]), "badAlg,badRequest");
        assert_eq!(
            fail_info_names(&[0x00, 0x00, 0x00, 0x00, 0x40]),
            "systemFailure"
        );
        assert_eq!(fail_info_names(&[0x00]), "none");
        assert_eq!(fail_info_names(&[]), "none");
    }

    #[test]
    fn rejection_names_status_and_fail_info() {
        // TimeStampResp { status { 2, "bad", failInfo badAlg } } with no token.
        let resp = [
            0x30, 0x10, 0x30, 0x0e, 0x02, 0x01, 0x02, 0x30, 0x05, 0x0c, 0x03, b'b', b'a', b'd',
            0x03, 0x02, 0x07, 0x80,
        ];
        let err = response_token(&resp).unwrap_err().to_string();
        assert!(err.contains("status 2 (rejection)"), "{err}");
        assert!(err.contains("bad"), "{err}");
        assert!(err.contains("badAlg"), "{err}");
        let granted_no_token = [0x30, 0x05, 0x30, 0x03, 0x02, 0x01, 0x00];
        assert!(matches!(
            response_token(&granted_no_token),
            Err(Error::NoToken)
        ));
    }
}
