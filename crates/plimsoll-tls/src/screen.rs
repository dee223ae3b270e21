//! What the terminator decides about the bytes a client sends before any byte is forwarded:
//! is it TLS at all, did the handshake succeed, did it agree on `h2`. The async accept path
//! and the fuzz target share these functions; [`screen_bytes`] drives the same decisions
//! over a byte slice so arbitrary input can be fed to them.

use std::io::Read;
use std::sync::Arc;

use rustls::{ServerConfig, ServerConnection};

use crate::ALPN_H2;

/// What the first bytes on a new connection look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prelude {
    /// Nothing yet.
    Empty,
    /// Consistent with a TLS handshake record so far.
    Tls,
    /// The cleartext HTTP/2 preface (`PRI * HTTP/2.0`): a plaintext gRPC client.
    PlaintextHttp2,
    /// Looks like an HTTP/1 request line: a plaintext HTTP client or probe.
    PlaintextHttp1,
    /// Anything else.
    NotTls,
}

impl Prelude {
    /// The log's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Prelude::Empty => "empty",
            Prelude::Tls => "tls",
            Prelude::PlaintextHttp2 => "plaintext HTTP/2 (a gRPC client without TLS)",
            Prelude::PlaintextHttp1 => "plaintext HTTP/1",
            Prelude::NotTls => "not TLS",
        }
    }
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Classifies the first bytes (any prefix of the stream; more bytes give a firmer answer).
/// A TLS record starts with content type 22 (handshake) and major version 3.
pub fn classify_prelude(first: &[u8]) -> Prelude {
    let Some(&b0) = first.first() else {
        return Prelude::Empty;
    };
    if b0 == 0x16 {
        return match first.get(1) {
            None | Some(0x03) => Prelude::Tls,
            Some(_) => Prelude::NotTls,
        };
    }
    let n = first.len().min(H2_PREFACE.len());
    if first[..n] == H2_PREFACE[..n] {
        return Prelude::PlaintextHttp2;
    }
    if b0.is_ascii_uppercase()
        && first
            .iter()
            .take(8)
            .all(|b| b.is_ascii_uppercase() || *b == b' ' || *b == b'/')
    {
        return Prelude::PlaintextHttp1;
    }
    Prelude::NotTls
}

/// Why a connection was refused before anything was forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The client did not speak TLS.
    NotTls(Prelude),
    /// The TLS handshake failed; the text names the alert or protocol fault.
    Handshake(String),
    /// The handshake completed without ALPN `h2` (the client offered no ALPN).
    NoAlpnH2,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NotTls(p) => write!(f, "client did not start TLS ({})", p.as_str()),
            Refused::Handshake(r) => write!(f, "TLS handshake failed: {r}"),
            Refused::NoAlpnH2 => f.write_str(
                "client negotiated no ALPN protocol; only h2 (gRPC) is served (closed without forwarding)",
            ),
        }
    }
}

/// After a completed handshake: forward only if `h2` was agreed.
pub fn check_established(conn: &ServerConnection) -> Result<(), Refused> {
    if conn.alpn_protocol() == Some(ALPN_H2) {
        Ok(())
    } else {
        Err(Refused::NoAlpnH2)
    }
}

/// Describes a server-side rustls error for the log: the fault and the alert it sends.
pub fn describe_server_error(e: &rustls::Error) -> String {
    use rustls::{Error as E, PeerIncompatible as PI};
    match e {
        E::PeerIncompatible(PI::SupportedVersionsExtensionRequired)
        | E::PeerIncompatible(PI::Tls12NotOfferedOrEnabled)
        | E::PeerIncompatible(PI::Tls13RequiredForQuic) => {
            "client does not offer TLS 1.3 (alert protocol_version)".into()
        }
        E::NoApplicationProtocol => {
            "client offered ALPN without h2 (alert no_application_protocol)".into()
        }
        E::NoCertificatesPresented => {
            "client presented no certificate; one chaining to the client CA is required (alert certificate_required)".into()
        }
        E::InvalidCertificate(ce) => {
            let alert: rustls::AlertDescription = ce.clone().into();
            format!(
                "client certificate refused: {ce:?} (alert {})",
                alert_name(alert)
            )
        }
        E::PeerIncompatible(p) => format!("client incompatible: {p:?} (alert handshake_failure)"),
        E::InvalidMessage(m) => format!("malformed TLS message: {m:?} (alert decode_error)"),
        E::AlertReceived(a) => format!("client sent alert {}", alert_name(*a)),
        E::InappropriateHandshakeMessage { .. } | E::InappropriateMessage { .. } => {
            format!("{e} (alert unexpected_message)")
        }
        other => other.to_string(),
    }
}

/// The TLS alert's RFC 8446 name (`unknown_ca`, `protocol_version`, ...).
pub fn alert_name(a: rustls::AlertDescription) -> String {
    // rustls prints the enum variant (`UnknownCA`); people search for the RFC name.
    let dbg = format!("{a:?}");
    let mut out = String::new();
    let chars: Vec<char> = dbg.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let prev_lower = i > 0 && chars[i - 1].is_ascii_lowercase();
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            let prev_upper = i > 0 && chars[i - 1].is_ascii_uppercase();
            if i > 0 && (prev_lower || (prev_upper && next_lower)) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(*c);
        }
    }
    out
}

/// What [`screen_bytes`] concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Screening {
    /// The bytes end before a decision.
    NeedMore,
    /// Refused; nothing would be forwarded.
    Refused(Refused),
    /// The handshake completed with `h2`; forwarding would start.
    Established,
}

/// Feeds `bytes` (as if sent by a client on the listener, in one go) through the same
/// decisions as the terminator's accept path: the prelude check, the server's rustls state
/// machine with `config`, and the `h2` check. It never panics on any input; the fuzz target
/// and the garbage tests call it.
pub fn screen_bytes(config: &Arc<ServerConfig>, bytes: &[u8]) -> Screening {
    match classify_prelude(bytes) {
        Prelude::Empty => return Screening::NeedMore,
        Prelude::Tls => {}
        other => return Screening::Refused(Refused::NotTls(other)),
    }
    let mut conn = match ServerConnection::new(config.clone()) {
        Ok(c) => c,
        Err(e) => return Screening::Refused(Refused::Handshake(describe_server_error(&e))),
    };
    let mut input = bytes;
    let mut sink = Vec::new();
    loop {
        if input.is_empty() {
            break;
        }
        match conn.read_tls(&mut input) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => return Screening::Refused(Refused::Handshake(e.to_string())),
        }
        if let Err(e) = conn.process_new_packets() {
            return Screening::Refused(Refused::Handshake(describe_server_error(&e)));
        }
        // What the server would answer goes nowhere, but must be produced without fault.
        while conn.wants_write() {
            sink.clear();
            if conn.write_tls(&mut sink).is_err() {
                break;
            }
        }
        if !conn.is_handshaking() {
            return match check_established(&conn) {
                Ok(()) => {
                    // Application data after the handshake would be forwarded; drain it.
                    let mut plain = [0u8; 4096];
                    while let Ok(n) = conn.reader().read(&mut plain) {
                        if n == 0 {
                            break;
                        }
                    }
                    Screening::Established
                }
                Err(r) => Screening::Refused(r),
            };
        }
    }
    Screening::NeedMore
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn config() -> Arc<ServerConfig> {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["sandboxd.plimsoll.invalid".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let ck = crate::pem::certified_key_from_pem(
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
        )
        .unwrap();
        crate::server::server_config(crate::server::RotatingCert::new(ck))
    }

    #[test]
    fn prelude_classes() {
        assert_eq!(classify_prelude(b""), Prelude::Empty);
        assert_eq!(classify_prelude(&[0x16]), Prelude::Tls);
        assert_eq!(classify_prelude(&[0x16, 0x03, 0x01]), Prelude::Tls);
        assert_eq!(classify_prelude(&[0x16, 0x02]), Prelude::NotTls);
        assert_eq!(
            classify_prelude(b"PRI * HTTP/2.0\r\n"),
            Prelude::PlaintextHttp2
        );
        assert_eq!(classify_prelude(b"PR"), Prelude::PlaintextHttp2);
        assert_eq!(
            classify_prelude(b"GET / HTTP/1.1\r\n"),
            Prelude::PlaintextHttp1
        );
        assert_eq!(classify_prelude(&[0, 1, 2]), Prelude::NotTls);
    }

    #[test]
    fn alert_names_follow_the_rfc() {
        use rustls::AlertDescription as A;
        assert_eq!(alert_name(A::UnknownCA), "unknown_ca");
        assert_eq!(alert_name(A::ProtocolVersion), "protocol_version");
        assert_eq!(
            alert_name(A::NoApplicationProtocol),
            "no_application_protocol"
        );
        assert_eq!(alert_name(A::BadCertificate), "bad_certificate");
    }

    #[test]
    fn plaintext_and_garbage_are_refused() {
        let cfg = config();
        assert_eq!(
            screen_bytes(&cfg, H2_PREFACE),
            Screening::Refused(Refused::NotTls(Prelude::PlaintextHttp2))
        );
        assert_eq!(screen_bytes(&cfg, b""), Screening::NeedMore);
        // A TLS record header announcing a ClientHello, then junk.
        let junk = [0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0xff, 0xff, 0xff, 0xff];
        assert!(matches!(
            screen_bytes(&cfg, &junk),
            Screening::Refused(Refused::Handshake(_))
        ));
    }

    /// 3,000 seeded random inputs, each judged by the step of the screen that must refuse
    /// it: a first byte that is not a TLS handshake record is refused as not TLS before
    /// rustls sees it; a complete TLS record of random bytes reaches rustls and is refused
    /// by it (never left waiting, which is what a screen that swallowed rustls's errors would
    /// do); a record announced longer than the bytes sent waits for more. No input panics.
    /// (That random bytes never *complete* a handshake is not this code's property but
    /// TLS 1.3's: the client's Finished needs keys random bytes do not have. It is not
    /// claimed here.)
    #[test]
    fn random_garbage_never_establishes() {
        let cfg = config();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x9090);
        let (mut not_tls, mut refused_by_rustls, mut waiting) = (0, 0, 0);
        for i in 0..3000 {
            let len = rng.gen_range(1..600);
            let mut buf: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let out = screen_bytes(&cfg, &buf);
            if buf[0] != 0x16 {
                match out {
                    Screening::Refused(Refused::NotTls(_)) => not_tls += 1,
                    o => panic!("input #{i} (first byte {:#04x}): {o:?}", buf[0]),
                }
                // The same bytes as one complete handshake record holding one complete
                // handshake message (its type random, its body random): rustls must refuse.
                if buf.len() >= 9 {
                    let body = (buf.len() - 5) as u16;
                    buf[..5].copy_from_slice(&[0x16, 0x03, rng.gen_range(1..4), 0, 0]);
                    buf[3..5].copy_from_slice(&body.to_be_bytes());
                    let message = (buf.len() - 9) as u32;
                    buf[6..9].copy_from_slice(&message.to_be_bytes()[1..]);
                    match screen_bytes(&cfg, &buf) {
                        Screening::Refused(Refused::Handshake(_)) => refused_by_rustls += 1,
                        o => panic!("input #{i} as a complete record: {o:?}"),
                    }
                }
            } else {
                assert_ne!(out, Screening::Established, "input #{i}");
            }
            // A record announced longer than what was sent: nothing to judge yet.
            if buf.len() >= 6 {
                let announced = (buf.len() - 5 + 1) as u16;
                buf[..5].copy_from_slice(&[0x16, 0x03, 0x01, 0, 0]);
                buf[3..5].copy_from_slice(&announced.to_be_bytes());
                match screen_bytes(&cfg, &buf) {
                    Screening::NeedMore => waiting += 1,
                    // A first byte that already breaks the ClientHello may be refused early.
                    Screening::Refused(Refused::Handshake(_)) => {}
                    o => panic!("input #{i} as a cut record: {o:?}"),
                }
            }
        }
        // Every class was reached, so each assertion above had inputs to fail on.
        assert!(
            not_tls > 2500 && refused_by_rustls > 2500,
            "{not_tls} {refused_by_rustls}"
        );
        assert!(waiting > 0, "{waiting}");
    }

    #[test]
    fn a_real_client_hello_is_accepted_and_one_without_h2_refused() {
        let cfg = config();
        for (alpn, want_refusal) in [
            (vec![b"h2".to_vec()], None),
            (vec![b"http/1.1".to_vec()], Some("no_application_protocol")),
        ] {
            let mut ccfg = rustls::ClientConfig::builder_with_provider(crate::provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(crate::test_support::AcceptAny))
                .with_no_client_auth();
            ccfg.alpn_protocols = alpn;
            let mut client = rustls::ClientConnection::new(
                Arc::new(ccfg),
                "sandboxd.plimsoll.invalid".try_into().unwrap(),
            )
            .unwrap();
            let mut hello = Vec::new();
            client.write_tls(&mut hello).unwrap();
            let out = screen_bytes(&cfg, &hello);
            match want_refusal {
                None => assert_eq!(out, Screening::NeedMore),
                Some(alert) => match out {
                    Screening::Refused(Refused::Handshake(r)) => assert!(r.contains(alert), "{r}"),
                    o => panic!("{o:?}"),
                },
            }
        }
    }
}
