//! Arbitrary bytes as a DSSE envelope and as an in-toto statement: the decoders never
//! panic, a decoded envelope re-encodes to JSON that decodes to the same envelope, and
//! verification (which must fail: nothing here is signed by the key) never panics.

#![no_main]

use libfuzzer_sys::fuzz_target;
use plimsoll_attest::dsse::Envelope;
use plimsoll_attest::statement::decode_statement;
use plimsoll_attest::SigningKey;

fn key() -> &'static SigningKey {
    static KEY: std::sync::OnceLock<SigningKey> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let mut der = hex_prefix();
        der.extend_from_slice(&[7u8; 32]);
        SigningKey::from_pkcs8_der(&der).expect("a fixed seed loads")
    })
}

fn hex_prefix() -> Vec<u8> {
    vec![
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ]
}

fuzz_target!(|data: &[u8]| {
    let _ = decode_statement(data);
    if let Ok(env) = Envelope::from_json(data) {
        let again = Envelope::from_json(env.to_json().as_bytes()).expect("re-encoded envelope decodes");
        assert_eq!(again, env, "envelope JSON round trip changed it");
        assert!(env.verify(&key().public()).is_err(), "an unsigned input verified");
        let _ = decode_statement(&env.payload);
        let _ = plimsoll_attest::verify_record(&env, &key().public());
    }
});
