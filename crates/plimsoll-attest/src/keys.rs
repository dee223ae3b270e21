//! Ed25519 keys: PKCS#8 `PRIVATE KEY` and SPKI `PUBLIC KEY` PEM, and key IDs.
//!
//! Private keys are written as PKCS#8 v1 holding only the seed, as `openssl genpkey
//! -algorithm ed25519` and Go's `x509.MarshalPKCS8PrivateKey` write them; v1 and v2 (with
//! the public key, as ring writes) are read. The key ID is the lowercase hex SHA-256 of the
//! public key's SPKI DER. Neither type prints key material in `Debug`.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

use crate::AttestError;

/// DER of a PKCS#8 v1 Ed25519 private key up to the 32-byte seed.
const PKCS8_V1_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];
/// What follows the seed in a v2 key (RFC 5958 `[1] IMPLICIT` public key, as ring and
/// RFC 8410 write it), up to the 32-byte public key.
const PKCS8_V2_PUBLIC: [u8; 3] = [0x81, 0x21, 0x00];
/// The same, as an explicitly tagged BIT STRING (seen in some older tools).
const PKCS8_V2_PUBLIC_EXPLICIT: [u8; 5] = [0xa1, 0x23, 0x03, 0x21, 0x00];
/// DER of an Ed25519 SubjectPublicKeyInfo up to the 32-byte key.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// An Ed25519 signing key (the harness's).
pub struct SigningKey {
    seed: [u8; 32],
    pair: Ed25519KeyPair,
    public: PublicKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("key_id", &self.key_id())
            .finish_non_exhaustive()
    }
}

impl Clone for SigningKey {
    fn clone(&self) -> Self {
        Self::from_seed(self.seed).expect("a seed that loaded once loads again")
    }
}

impl SigningKey {
    fn new(seed: [u8; 32], pair: Ed25519KeyPair) -> Self {
        let public = PublicKey::from_raw(pair.public_key().as_ref().try_into().expect("32 bytes"));
        SigningKey { seed, pair, public }
    }

    /// A new key from the system's random source.
    pub fn generate() -> Result<Self, AttestError> {
        let mut seed = [0u8; 32];
        SystemRandom::new()
            .fill(&mut seed)
            .map_err(|_| AttestError::Key("the system random source failed".into()))?;
        Self::from_seed(seed)
    }

    fn from_seed(seed: [u8; 32]) -> Result<Self, AttestError> {
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
            .map_err(|e| AttestError::Key(format!("not an Ed25519 seed: {e}")))?;
        Ok(SigningKey::new(seed, pair))
    }

    /// Reads a PKCS#8 `PRIVATE KEY` PEM holding an Ed25519 key (v1 or v2).
    pub fn from_pkcs8_pem(pem: &str) -> Result<Self, AttestError> {
        let der = pem_decode(pem, "PRIVATE KEY")?;
        Self::from_pkcs8_der(&der)
    }

    /// Reads PKCS#8 DER holding an Ed25519 key (v1 or v2).
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Self, AttestError> {
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der).map_err(|e| {
            AttestError::Key(format!(
                "not an unencrypted Ed25519 PKCS#8 private key ({e})"
            ))
        })?;
        let same_algorithm = der.len() >= 48 && der[5..16] == PKCS8_V1_PREFIX[5..16];
        let v2_public = if !same_algorithm || der[1] as usize + 2 != der.len() {
            None
        } else if der[2..5] == [0x02, 0x01, 0x01] && der[48..].starts_with(&PKCS8_V2_PUBLIC) {
            Some(&der[48 + PKCS8_V2_PUBLIC.len()..])
        } else if der[2..5] == [0x02, 0x01, 0x01]
            && der[48..].starts_with(&PKCS8_V2_PUBLIC_EXPLICIT)
        {
            Some(&der[48 + PKCS8_V2_PUBLIC_EXPLICIT.len()..])
        } else {
            None
        };
        if der.len() == 48 && der[..16] == PKCS8_V1_PREFIX {
            // v1: the seed only.
        } else if let Some(public) = v2_public {
            if public != pair.public_key().as_ref() {
                return Err(AttestError::Key(
                    "the PKCS#8 key's public key does not belong to its private key".into(),
                ));
            }
        } else {
            return Err(AttestError::Key(
                "an Ed25519 PKCS#8 key in a layout other than plain v1 or v2 (attributes?)".into(),
            ));
        }
        let seed: [u8; 32] = der[16..48].try_into().expect("32 bytes");
        Ok(SigningKey::new(seed, pair))
    }

    /// PKCS#8 v1 DER (version 0, seed only), as openssl and Go write it.
    pub fn to_pkcs8_der(&self) -> Vec<u8> {
        let mut der = PKCS8_V1_PREFIX.to_vec();
        der.extend_from_slice(&self.seed);
        der
    }

    /// PKCS#8 v1 `PRIVATE KEY` PEM.
    pub fn to_pkcs8_pem(&self) -> String {
        pem_encode("PRIVATE KEY", &self.to_pkcs8_der())
    }

    /// The public half.
    pub fn public(&self) -> PublicKey {
        self.public.clone()
    }

    /// The key ID: hex SHA-256 of the public key's SPKI DER.
    pub fn key_id(&self) -> String {
        self.public.key_id()
    }

    /// An Ed25519 signature over `msg`.
    pub fn sign(&self, msg: &[u8]) -> Vec<u8> {
        self.pair.sign(msg).as_ref().to_vec()
    }
}

/// An Ed25519 public key (the verifier's).
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    raw: [u8; 32],
    /// The key ID, computed once (verification compares it on every signature).
    id: String,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublicKey")
            .field("key_id", &self.key_id())
            .finish()
    }
}

impl PublicKey {
    /// Reads an SPKI `PUBLIC KEY` PEM holding an Ed25519 key.
    pub fn from_spki_pem(pem: &str) -> Result<Self, AttestError> {
        Self::from_spki_der(&pem_decode(pem, "PUBLIC KEY")?)
    }

    /// Reads SPKI DER holding an Ed25519 key.
    pub fn from_spki_der(der: &[u8]) -> Result<Self, AttestError> {
        if der.len() != 44 || der[..12] != SPKI_PREFIX {
            return Err(AttestError::Key(
                "not an Ed25519 SubjectPublicKeyInfo (only Ed25519 keys are used)".into(),
            ));
        }
        Ok(PublicKey::from_raw(der[12..].try_into().expect("32 bytes")))
    }

    fn from_raw(raw: [u8; 32]) -> Self {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&raw);
        let id = hex::encode(ring::digest::digest(&ring::digest::SHA256, &der));
        PublicKey { raw, id }
    }

    /// The raw 32-byte key.
    pub fn raw(&self) -> &[u8; 32] {
        &self.raw
    }

    /// SPKI DER.
    pub fn to_spki_der(&self) -> Vec<u8> {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.raw);
        der
    }

    /// SPKI `PUBLIC KEY` PEM, byte for byte what `openssl pkey -pubout` prints.
    pub fn to_spki_pem(&self) -> String {
        pem_encode("PUBLIC KEY", &self.to_spki_der())
    }

    /// The key ID: lowercase hex SHA-256 of the SPKI DER.
    pub fn key_id(&self) -> String {
        self.id.clone()
    }

    /// The key ID without a copy.
    pub fn key_id_str(&self) -> &str {
        &self.id
    }

    /// Whether `sig` is this key's Ed25519 signature over `msg`.
    pub fn verify(&self, msg: &[u8], sig: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.raw)
            .verify(msg, sig)
            .is_ok()
    }
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The DER of the first PEM block, which must be labelled `label`.
fn pem_decode(pem: &str, label: &str) -> Result<Vec<u8>, AttestError> {
    let Some(begin_at) = pem.find("-----BEGIN ") else {
        return Err(AttestError::Key(format!(
            "no PEM block found (expected {label:?})"
        )));
    };
    let rest = &pem[begin_at + "-----BEGIN ".len()..];
    let Some(label_end) = rest.find("-----") else {
        return Err(AttestError::Key("malformed PEM BEGIN line".into()));
    };
    let found = &rest[..label_end];
    if found != label {
        return Err(AttestError::Key(format!(
            "PEM block is {found:?}, expected {label:?}"
        )));
    }
    let body = &rest[label_end + 5..];
    let end_marker = format!("-----END {label}-----");
    let Some(end_at) = body.find(&end_marker) else {
        return Err(AttestError::Key(format!(
            "PEM block {label:?} has no END line"
        )));
    };
    let b64: String = body[..end_at]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    if b64.contains(':') {
        return Err(AttestError::Key(
            "PEM headers (an encrypted key?) are not supported".into(),
        ));
    }
    STANDARD
        .decode(b64.as_bytes())
        .map_err(|e| AttestError::Key(format!("PEM body is not base64: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_layouts() {
        let k = SigningKey::generate().unwrap();
        let pem = k.to_pkcs8_pem();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
        let der = k.to_pkcs8_der();
        assert_eq!(hex::encode(&der[..16]), "302e020100300506032b657004220420");
        let back = SigningKey::from_pkcs8_pem(&pem).unwrap();
        assert_eq!(back.key_id(), k.key_id());
        assert_eq!(back.public(), k.public());
        let spki = k.public().to_spki_der();
        assert_eq!(hex::encode(&spki[..12]), "302a300506032b6570032100");
        let pubk = PublicKey::from_spki_pem(&k.public().to_spki_pem()).unwrap();
        assert_eq!(pubk.key_id(), k.key_id());
        assert_eq!(k.key_id().len(), 64);

        // ring's own v2 layout loads to the same key.
        let v2 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        let from_v2 = SigningKey::from_pkcs8_der(v2.as_ref()).unwrap();
        let again = SigningKey::from_pkcs8_der(&from_v2.to_pkcs8_der()).unwrap();
        assert_eq!(again.public(), from_v2.public());
        // A v2 key whose public key belongs to another private key is refused.
        let mut bad = v2.as_ref().to_vec();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(SigningKey::from_pkcs8_der(&bad).is_err());

        let sig = k.sign(b"msg");
        assert!(pubk.verify(b"msg", &sig));
        assert!(!pubk.verify(b"msh", &sig));
        assert!(!format!("{k:?}").contains(&hex::encode(k.seed)));
    }

    #[test]
    fn garbage_and_other_algorithms_are_refused() {
        let k = SigningKey::generate().unwrap();
        assert!(SigningKey::from_pkcs8_pem("hello").is_err());
        assert!(SigningKey::from_pkcs8_pem(&k.public().to_spki_pem()).is_err());
        assert!(PublicKey::from_spki_pem(&k.to_pkcs8_pem()).is_err());
        // An EC P-256 SPKI (openssl ecparam output) is refused by name.
        let ec = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEtzY3cW2DlWJ0JfS1/xJ0V4T2pZ7sKqYv\nc4bcb6f2ry9n1Px0RVYhA6gh+Q9yk5QxVZbDKFIq4O2fMuvSBF9Kdw==\n-----END PUBLIC KEY-----\n";
        let err = PublicKey::from_spki_pem(ec).unwrap_err().to_string();
        assert!(err.contains("Ed25519"), "{err}");
        let junk = pem_encode("PRIVATE KEY", b"not der at all");
        assert!(SigningKey::from_pkcs8_pem(&junk).is_err());
        let enc =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        assert!(SigningKey::from_pkcs8_pem(enc).is_err());
    }
}
