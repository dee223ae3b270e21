//! DSSE envelopes: the pre-authentication encoding (PAE) that is signed, and the envelope
//! JSON `{"payloadType":…,"payload":<b64>,"signatures":[{"keyid":…,"sig":<b64>}]}` in the
//! member order Go's struct emits.

use std::borrow::Cow;

use serde::Deserialize;

use crate::gojson::{self, Object};
use crate::keys::{PublicKey, SigningKey};
use crate::AttestError;

/// The payload type of every envelope here: an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// `DSSEv1 <len(type)> <type> <len(payload)> <payload>`, lengths in decimal.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let head = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    );
    let mut out = Vec::with_capacity(head.len() + payload.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(payload);
    out
}

/// One signature of an envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// The signer's key ID (hex SHA-256 of its SPKI DER), or empty.
    pub keyid: String,
    /// The Ed25519 signature over the PAE.
    pub sig: Vec<u8>,
}

/// A DSSE envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Must be [`PAYLOAD_TYPE`] to verify.
    pub payload_type: String,
    /// The raw statement bytes.
    pub payload: Vec<u8>,
    /// The signatures, usually one.
    pub signatures: Vec<Signature>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSignature<'a> {
    #[serde(borrow)]
    keyid: Cow<'a, str>,
    #[serde(borrow)]
    sig: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEnvelope<'a> {
    #[serde(rename = "payloadType", borrow)]
    payload_type: Cow<'a, str>,
    #[serde(borrow)]
    payload: Cow<'a, str>,
    #[serde(borrow)]
    signatures: Vec<RawSignature<'a>>,
}

impl RawEnvelope<'_> {
    pub(crate) fn decode(self) -> Result<Envelope, AttestError> {
        let payload = gojson::decode_base64(&self.payload)
            .map_err(|e| AttestError::Envelope(format!("payload is not std base64: {e}")))?;
        let signatures = self
            .signatures
            .into_iter()
            .map(|s| {
                Ok(Signature {
                    sig: gojson::decode_base64(&s.sig).map_err(|e| {
                        AttestError::Envelope(format!("signature is not std base64: {e}"))
                    })?,
                    keyid: s.keyid.into_owned(),
                })
            })
            .collect::<Result<_, AttestError>>()?;
        Ok(Envelope {
            payload_type: self.payload_type.into_owned(),
            payload,
            signatures,
        })
    }
}

impl Envelope {
    /// Signs `payload` (a statement) with `key`: one signature carrying the key's ID.
    pub fn sign(key: &SigningKey, payload: Vec<u8>) -> Self {
        let sig = key.sign(&pae(PAYLOAD_TYPE, &payload));
        Envelope {
            payload_type: PAYLOAD_TYPE.to_owned(),
            payload,
            signatures: vec![Signature {
                keyid: key.key_id(),
                sig,
            }],
        }
    }

    /// The envelope as Go's `json.Marshal` writes it.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(self.payload.len() * 4 / 3 + 200);
        self.write_json(&mut out);
        out
    }

    pub(crate) fn write_json(&self, out: &mut String) {
        let mut o = Object::new(out);
        o.str("payloadType", &self.payload_type)
            .bytes("payload", &self.payload);
        let list = o.key("signatures");
        list.push('[');
        for (i, s) in self.signatures.iter().enumerate() {
            if i > 0 {
                list.push(',');
            }
            let mut so = Object::new(list);
            so.str("keyid", &s.keyid).bytes("sig", &s.sig);
            so.end();
        }
        list.push(']');
        o.end();
    }

    /// Decodes envelope JSON; unknown members, wrong types and bad base64 are refused.
    pub fn from_json(json: &[u8]) -> Result<Self, AttestError> {
        let raw: RawEnvelope<'_> = serde_json::from_slice(json)
            .map_err(|e| AttestError::Envelope(format!("not a DSSE envelope: {e}")))?;
        raw.decode()
    }

    /// Checks the payload type and that some signature whose key ID is empty or `key`'s
    /// verifies over the PAE; hands back the payload.
    pub fn verify(&self, key: &PublicKey) -> Result<&[u8], AttestError> {
        if self.payload_type != PAYLOAD_TYPE {
            return Err(AttestError::Envelope(format!(
                "payloadType is {:?}, not {PAYLOAD_TYPE:?}",
                self.payload_type
            )));
        }
        let id = key.key_id_str();
        let msg = pae(&self.payload_type, &self.payload);
        let ok = self
            .signatures
            .iter()
            .any(|s| (s.keyid.is_empty() || s.keyid == id) && key.verify(&msg, &s.sig));
        if ok {
            Ok(&self.payload)
        } else {
            Err(AttestError::Signature(format!(
                "no signature by key {id} verifies ({} signature(s) present)",
                self.signatures.len()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_the_dsse_v1_encoding() {
        // The example from the DSSE protocol description.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ".to_vec());
    }

    #[test]
    fn envelope_json_round_trip_and_verify() {
        let k = SigningKey::generate().unwrap();
        let env = Envelope::sign(&k, b"{\"x\":1}".to_vec());
        let json = env.to_json();
        assert!(json.starts_with(
            "{\"payloadType\":\"application/vnd.in-toto+json\",\"payload\":\"eyJ4IjoxfQ==\",\"signatures\":[{\"keyid\":\""
        ));
        let back = Envelope::from_json(json.as_bytes()).unwrap();
        assert_eq!(back, env);
        assert_eq!(back.verify(&k.public()).unwrap(), b"{\"x\":1}");
        let other = SigningKey::generate().unwrap();
        assert!(back.verify(&other.public()).is_err());

        // An empty key ID is accepted; another key's ID is not even tried.
        let mut anon = env.clone();
        anon.signatures[0].keyid.clear();
        assert!(anon.verify(&k.public()).is_ok());
        let mut wrong_id = env.clone();
        wrong_id.signatures[0].keyid = other.key_id();
        assert!(wrong_id.verify(&k.public()).is_err());
        let mut wrong_type = env.clone();
        wrong_type.payload_type = "text/plain".into();
        assert!(wrong_type.verify(&k.public()).is_err());

        assert!(Envelope::from_json(b"{}").is_err());
        let extra = json.replacen("{", "{\"x\":1,", 1);
        assert!(Envelope::from_json(extra.as_bytes()).is_err());
        let bad_b64 = json.replace("eyJ4IjoxfQ==", "eyJ4IjoxfQ");
        assert!(Envelope::from_json(bad_b64.as_bytes()).is_err());
    }
}
