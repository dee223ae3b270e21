//! The public time-stamp authorities this crate knows, with their pinned roots, and the PEM
//! reader that turns a root file into DER certificates.
//!
//! The roots are pinned, never a signing certificate: FreeTSA replaced its RSA signer with an
//! ECDSA P-384 one in February 2026 under the same root.

use crate::Error;
use base64::Engine;

/// A public time-stamp authority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Authority {
    /// Short name, as [`public`] looks it up.
    pub name: &'static str,
    /// The RFC 3161 HTTP(S) endpoint.
    pub url: &'static str,
    /// The root certificate to pin, PEM.
    pub root_pem: &'static str,
}

impl Authority {
    /// The pinned root as DER certificates, ready for [`crate::verify_response`]'s `roots`.
    pub fn roots(&self) -> Vec<Vec<u8>> {
        // Shipped PEMs are checked by the crate's tests, so this cannot fail in a release.
        certificates_from_pem(self.root_pem).unwrap_or_default()
    }
}

/// The authorities [`public`] knows.
pub const AUTHORITIES: [Authority; 2] = [
    Authority {
        name: "digicert",
        url: "http://timestamp.digicert.com",
        // C=US, O=DigiCert Inc, OU=www.digicert.com, CN=DigiCert Trusted Root G4 (to 2038).
        root_pem: include_str!("../roots/digicert-trusted-root-g4.pem"),
    },
    Authority {
        name: "freetsa",
        url: "https://freetsa.org/tsr",
        // O=Free TSA, OU=Root CA, CN=www.freetsa.org, RSA-4096 (to 2041).
        root_pem: include_str!("../roots/freetsa-root.pem"),
    },
];

/// The public authority called `name` (`digicert` or `freetsa`).
pub fn public(name: &str) -> Option<&'static Authority> {
    AUTHORITIES.iter().find(|a| a.name == name)
}

/// The largest PEM text read.
const MAX_PEM_BYTES: usize = 1024 * 1024;

/// The DER of every `CERTIFICATE` block in `pem`, in order. Any other block type (a private
/// key, a CRL, `TRUSTED CERTIFICATE`) is refused, as is text with no certificate at all.
pub fn certificates_from_pem(pem: &str) -> Result<Vec<Vec<u8>>, Error> {
    if pem.len() > MAX_PEM_BYTES {
        return Err(Error::TooLarge {
            what: "PEM text",
            size: pem.len(),
            limit: MAX_PEM_BYTES,
        });
    }
    let mut out = Vec::new();
    let mut lines = pem.lines().map(str::trim);
    while let Some(line) = lines.next() {
        let Some(label) = line
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        if label != "CERTIFICATE" {
            return Err(Error::Pem(format!(
                "a {label} block where only CERTIFICATE blocks are accepted"
            )));
        }
        let mut b64 = String::new();
        let mut ended = false;
        for l in lines.by_ref() {
            if l == "-----END CERTIFICATE-----" {
                ended = true;
                break;
            }
            if l.starts_with("-----") {
                return Err(Error::Pem(
                    "a CERTIFICATE block without its END line".into(),
                ));
            }
            b64.push_str(l);
        }
        if !ended {
            return Err(Error::Pem(
                "a CERTIFICATE block without its END line".into(),
            ));
        }
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| Error::Pem(format!("CERTIFICATE block is not base64: {e}")))?;
        out.push(der);
    }
    if out.is_empty() {
        return Err(Error::Pem("no CERTIFICATE block".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_accepts_only_certificate_blocks() {
        let cert = "-----BEGIN CERTIFICATE-----\nAAEC\n-----END CERTIFICATE-----\n";
        assert_eq!(certificates_from_pem(cert).unwrap(), vec![vec![0, 1, 2]]);
        let two = format!("junk\n{cert}text between\n{cert}");
        assert_eq!(certificates_from_pem(&two).unwrap().len(), 2);
        let key = "-----BEGIN PRIVATE KEY-----\nAAEC\n-----END PRIVATE KEY-----\n";
        for refused in [key.to_string(), format!("{cert}{key}")] {
            let err = certificates_from_pem(&refused).unwrap_err().to_string();
            assert!(
                err.contains("a PRIVATE KEY block where only CERTIFICATE"),
                "{err}"
            );
        }
        assert!(certificates_from_pem("").is_err());
        assert!(certificates_from_pem("-----BEGIN CERTIFICATE-----\nAAEC\n").is_err());
        assert!(certificates_from_pem(
            "-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----"
        )
        .is_err());
    }

    #[test]
    fn public_knows_two_authorities() {
        assert_eq!(
            public("digicert").unwrap().url,
            "http://timestamp.digicert.com"
        );
        assert_eq!(public("freetsa").unwrap().url, "https://freetsa.org/tsr");
        assert!(public("nonesuch").is_none());
    }
}
