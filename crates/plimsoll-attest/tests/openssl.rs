//! Interop with OpenSSL: keys from `openssl genpkey` load and sign, our public key PEM is
//! byte for byte `openssl pkey -pubout`'s, OpenSSL verifies the PAE bytes we signed, and
//! OpenSSL reads the keys we write.

mod common;

use std::path::Path;
use std::process::Command;

use plimsoll_attest::dsse::{pae, PAYLOAD_TYPE};
use plimsoll_attest::{sign_record, PublicKey, SigningKey};

const OPENSSL: &str = "/usr/bin/openssl";

fn openssl(args: &[&str], dir: &Path) -> String {
    assert!(
        Path::new(OPENSSL).exists(),
        "{OPENSSL} is missing: these interop tests need OpenSSL installed"
    );
    let out = Command::new(OPENSSL)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn openssl_keys_load_and_openssl_verifies_what_we_sign() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", "k.pem"], d);
    let key = SigningKey::from_pkcs8_pem(&std::fs::read_to_string(d.join("k.pem")).unwrap())
        .expect("an openssl genpkey key loads");
    // openssl writes PKCS#8 v1 exactly as we do.
    assert_eq!(
        key.to_pkcs8_pem(),
        std::fs::read_to_string(d.join("k.pem")).unwrap()
    );

    let pub_pem = openssl(&["pkey", "-in", "k.pem", "-pubout"], d);
    assert_eq!(key.public().to_spki_pem(), pub_pem);
    let theirs = PublicKey::from_spki_pem(&pub_pem).unwrap();
    assert_eq!(theirs.key_id(), key.key_id());
    std::fs::write(d.join("pub.pem"), &pub_pem).unwrap();
    // The key ID is the SHA-256 of the SPKI DER as OpenSSL writes it.
    openssl(
        &[
            "pkey", "-pubin", "-in", "pub.pem", "-outform", "DER", "-out", "pub.der",
        ],
        d,
    );
    assert_eq!(
        key.key_id(),
        common::sha(&std::fs::read(d.join("pub.der")).unwrap())
    );

    // The PAE of a real record statement, signed by the crate.
    let (_, resp) = common::run("console.log(1)", "1\n");
    let env = sign_record(&key, resp.record.as_ref().unwrap()).unwrap();
    assert_eq!(env.signatures[0].keyid, key.key_id());
    let msg = pae(PAYLOAD_TYPE, &env.payload);
    std::fs::write(d.join("pae.bin"), &msg).unwrap();
    std::fs::write(d.join("sig.bin"), &env.signatures[0].sig).unwrap();
    let out = openssl(
        &[
            "pkeyutl", "-verify", "-pubin", "-inkey", "pub.pem", "-rawin", "-in", "pae.bin",
            "-sigfile", "sig.bin",
        ],
        d,
    );
    assert!(out.contains("Signature Verified Successfully"), "{out}");

    // And a signature by openssl over the same bytes verifies here.
    openssl(
        &[
            "pkeyutl",
            "-sign",
            "-inkey",
            "k.pem",
            "-rawin",
            "-in",
            "pae.bin",
            "-out",
            "their.sig",
        ],
        d,
    );
    let their_sig = std::fs::read(d.join("their.sig")).unwrap();
    assert!(theirs.verify(&msg, &their_sig));
    let mut flipped = msg.clone();
    flipped[10] ^= 1;
    assert!(!theirs.verify(&flipped, &their_sig));
}

#[test]
fn openssl_reads_the_keys_we_write() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = SigningKey::generate().unwrap();
    std::fs::write(d.join("ours.pem"), key.to_pkcs8_pem()).unwrap();
    let text = openssl(&["pkey", "-in", "ours.pem", "-noout", "-text"], d);
    assert!(text.contains("ED25519 Private-Key"), "{text}");
    let pub_pem = openssl(&["pkey", "-in", "ours.pem", "-pubout"], d);
    assert_eq!(pub_pem, key.public().to_spki_pem());
    std::fs::write(d.join("ours.pub"), key.public().to_spki_pem()).unwrap();
    let text = openssl(&["pkey", "-pubin", "-in", "ours.pub", "-noout", "-text"], d);
    assert!(text.contains("ED25519 Public-Key"), "{text}");
    // An RSA key is refused with a clear error.
    openssl(
        &[
            "genpkey",
            "-algorithm",
            "rsa",
            "-pkeyopt",
            "rsa_keygen_bits:1024",
            "-out",
            "rsa.pem",
        ],
        d,
    );
    let e = SigningKey::from_pkcs8_pem(&std::fs::read_to_string(d.join("rsa.pem")).unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("Ed25519"), "{e}");
    let rsa_pub = openssl(&["pkey", "-in", "rsa.pem", "-pubout"], d);
    assert!(PublicKey::from_spki_pem(&rsa_pub).is_err());
}
