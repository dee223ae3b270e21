//! Arbitrary bytes arriving on the terminator's listener: the prelude check, the server's
//! rustls state machine with the terminator's own configuration (TLS 1.3 only, ALPN h2) and
//! the h2 check must never panic, and no input can complete a handshake (that takes the
//! server's fresh key share, which no fixed input can know), so nothing is ever forwarded.

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use plimsoll_tls::screen::{classify_prelude, screen_bytes, Screening};

fn config() -> &'static Arc<rustls::ServerConfig> {
    static CFG: OnceLock<Arc<rustls::ServerConfig>> = OnceLock::new();
    CFG.get_or_init(|| {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["sandboxd.plimsoll.invalid".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let ck = plimsoll_tls::pem::certified_key_from_pem(
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
        )
        .unwrap();
        plimsoll_tls::server_config(plimsoll_tls::RotatingCert::new(ck))
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = classify_prelude(data);
    let out = screen_bytes(config(), data);
    assert_ne!(out, Screening::Established, "arbitrary bytes completed a handshake");
});
