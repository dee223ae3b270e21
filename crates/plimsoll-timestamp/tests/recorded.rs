//! Recorded answers from real time-stamp authorities (`testdata/tsa/`), verified offline:
//! the good tokens verify, and each kind of tampering or wrong expectation fails with an error
//! that names what failed.

use plimsoll_timestamp::{
    certificates_from_pem, public, verify_response, verify_token, Error, HashAlg, Imprint,
    TimeStampRequest,
};

macro_rules! fixture {
    ($p:literal) => {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../testdata/tsa/", $p)
    };
}

fn read(p: &str) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// The sigstage chain split into (roots: the self-signed certificate, others).
fn sigstage_chain() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let pem = String::from_utf8(read(fixture!("sigstage/ts_chain.pem"))).unwrap();
    let certs = certificates_from_pem(&pem).unwrap();
    let (roots, others): (Vec<_>, Vec<_>) = certs.into_iter().partition(|c| {
        let (_, x) = x509_parser::parse_x509_certificate(c).unwrap();
        x.subject().as_raw() == x.issuer().as_raw()
    });
    assert_eq!(roots.len(), 1, "ts_chain.pem has one self-signed root");
    (roots, others)
}

fn hello() -> Vec<u8> {
    read(fixture!("hello.txt"))
}

/// The token of a TimeStampResp fixture, via a request with the right imprint and no nonce.
fn token_of(
    resp: &[u8],
    alg: HashAlg,
    roots: &[Vec<u8>],
) -> (Vec<u8>, plimsoll_timestamp::Witness) {
    let req = TimeStampRequest::with_nonce(Imprint::of(alg, &hello()), &[]).unwrap();
    verify_response(resp, &req, roots, &[]).unwrap()
}

#[test]
fn sigstage_tokens_verify_for_each_hash() {
    let (roots, _) = sigstage_chain();
    for (file, alg) in [
        (fixture!("sigstage/response-sha256.tsr"), HashAlg::Sha256),
        (fixture!("sigstage/response-sha384.tsr"), HashAlg::Sha384),
        (fixture!("sigstage/response-sha512.tsr"), HashAlg::Sha512),
    ] {
        let (token, w) = token_of(&read(file), alg, &roots);
        assert_eq!(w.hash, alg.name(), "{file}");
        assert_eq!(w.tsa, "O=sigstore.dev, CN=sigstore-tsa", "{file}");
        assert_eq!(w.policy, "1.3.6.1.4.1.57264.2", "{file}");
        assert!(
            w.gen_time.starts_with("2025-05-09T11:58:5"),
            "{file}: {}",
            w.gen_time
        );
        assert!(!w.signer_expired_at(w.gen_time_unix_ms / 1000), "{file}");
        // The bare token verifies the same way, as stored.
        let again = verify_token(&token, &Imprint::of(alg, &hello()), None, &roots, &[]).unwrap();
        assert_eq!(again, w);
    }
    let (_, w) = token_of(
        &read(fixture!("sigstage/response-sha256.tsr")),
        HashAlg::Sha256,
        &roots,
    );
    assert_eq!(w.gen_time, "2025-05-09T11:58:55Z");
    assert_eq!(w.gen_time_unix_ms, 1_746_791_935_000);
    assert_eq!(w.serial_hex, "784b4c5e57aaa63b570f15cba4df95251668ae9e");
    assert_eq!(
        w.nonce_hex.as_deref(),
        Some("051708b19a1d2e209c2236ffc3238bf24dcecc40")
    );
    // 2035-03-26T08:14:06Z, the leaf's notAfter.
    assert_eq!(w.signer_not_after_unix, 2_058_509_646);
}

#[test]
fn invalid_signature_fails_naming_the_signature() {
    let (roots, _) = sigstage_chain();
    let req = TimeStampRequest::with_nonce(Imprint::of(HashAlg::Sha256, &hello()), &[]).unwrap();
    let resp = read(fixture!("sigstage/response-invalid-signature.tsr"));
    let err = verify_response(&resp, &req, &roots, &[]).unwrap_err();
    assert!(matches!(err, Error::BadSignature(_)), "{err}");
    assert!(err.to_string().contains("bad signature"), "{err}");
}

#[test]
fn no_embedded_cert_needs_the_certificate_given() {
    let (roots, others) = sigstage_chain();
    let req = TimeStampRequest::with_nonce(Imprint::of(HashAlg::Sha256, &hello()), &[]).unwrap();
    let resp = read(fixture!("sigstage/response-no-embedded-cert.tsr"));
    let err = verify_response(&resp, &req, &roots, &[]).unwrap_err();
    assert!(matches!(err, Error::SignerNotFound(_)), "{err}");
    assert!(
        err.to_string().contains("signer certificate not found"),
        "{err}"
    );
    let (_, w) = verify_response(&resp, &req, &roots, &others).unwrap();
    assert_eq!(w.tsa, "O=sigstore.dev, CN=sigstore-tsa");
    assert!(
        w.gen_time.starts_with("2025-06-18T08:13:02"),
        "{}",
        w.gen_time
    );
}

#[test]
fn wrong_imprint_fails_naming_the_imprint() {
    let (roots, _) = sigstage_chain();
    let resp = read(fixture!("sigstage/response-sha256.tsr"));
    for imprint in [
        Imprint::of(HashAlg::Sha256, b"hellO"),
        // Same bytes of `hello`, other algorithm.
        Imprint::of(HashAlg::Sha384, &hello()),
    ] {
        let req = TimeStampRequest::with_nonce(imprint, &[]).unwrap();
        let err = verify_response(&resp, &req, &roots, &[]).unwrap_err();
        assert!(matches!(err, Error::ImprintMismatch { .. }), "{err}");
        assert!(
            err.to_string().contains("message imprint mismatch"),
            "{err}"
        );
    }
}

#[test]
fn request_der_parses_and_its_nonce_is_not_the_sigstage_answers() {
    // `request.der` is a real TimeStampReq. Its imprint is SHA-512 of `hello` and its nonce
    // 0x34cfa9899986d2f5; none of the sigstage answers carries that nonce (each carries its
    // own 20-byte nonce), so it is not the request behind them, whatever the README says.
    let req = TimeStampRequest::parse(&read(fixture!("sigstage/request.der"))).unwrap();
    assert_eq!(req.imprint(), &Imprint::of(HashAlg::Sha512, &hello()));
    assert_eq!(hex::encode(req.nonce()), "34cfa9899986d2f5");
    assert!(req.cert_req());
    let (roots, _) = sigstage_chain();
    let resp = read(fixture!("sigstage/response-sha512.tsr"));
    let err = verify_response(&resp, &req, &roots, &[]).unwrap_err();
    assert!(matches!(err, Error::NonceMismatch { .. }), "{err}");
}

#[test]
fn wrong_nonce_fails_naming_the_nonce_and_leading_zeros_do_not_matter() {
    let (roots, _) = sigstage_chain();
    let resp = read(fixture!("sigstage/response-sha256.tsr"));
    let imprint = Imprint::of(HashAlg::Sha256, &hello());
    let good = hex::decode("051708b19a1d2e209c2236ffc3238bf24dcecc40").unwrap();
    // The nonce it carries, also with extra leading zero octets, verifies.
    for nonce in [good.clone(), [&[0u8, 0][..], &good].concat()] {
        let req = TimeStampRequest::with_nonce(imprint.clone(), &nonce).unwrap();
        verify_response(&resp, &req, &roots, &[]).unwrap();
    }
    // Given to `verify_token` as raw bytes with leading zero octets, it still compares equal.
    let (token, _) = verify_response(
        &resp,
        &TimeStampRequest::with_nonce(imprint.clone(), &good).unwrap(),
        &roots,
        &[],
    )
    .unwrap();
    let padded = [&[0u8, 0][..], &good].concat();
    verify_token(&token, &imprint, Some(&padded), &roots, &[]).unwrap();
    let mut bad = good.clone();
    *bad.last_mut().unwrap() ^= 1;
    let req = TimeStampRequest::with_nonce(imprint.clone(), &bad).unwrap();
    let err = verify_response(&resp, &req, &roots, &[]).unwrap_err();
    assert!(matches!(err, Error::NonceMismatch { .. }), "{err}");
    assert!(err.to_string().contains("nonce mismatch"), "{err}");
    // A fresh random request never matches a recorded answer.
    let req = TimeStampRequest::sha256(imprint.digest.clone().try_into().unwrap());
    let err = verify_response(&resp, &req, &roots, &[]).unwrap_err();
    assert!(err.to_string().contains("nonce mismatch"), "{err}");
}

#[test]
fn another_root_fails_naming_the_chain() {
    let resp = read(fixture!("sigstage/response-sha256.tsr"));
    let identrust =
        certificates_from_pem(&String::from_utf8(read(fixture!("identrust/root.pem"))).unwrap())
            .unwrap();
    let digicert = public("digicert").unwrap().roots();
    for roots in [digicert.clone(), identrust, vec![]] {
        let req =
            TimeStampRequest::with_nonce(Imprint::of(HashAlg::Sha256, &hello()), &[]).unwrap();
        let err = verify_response(&resp, &req, &roots, &[]).unwrap_err();
        assert!(matches!(err, Error::NotChained(_)), "{err}");
        assert!(
            err.to_string().contains("not chained to a pinned root"),
            "{err}"
        );
    }
    // The sigstage root given only as an extra certificate is no trust anchor.
    let (root, _) = sigstage_chain();
    let req = TimeStampRequest::with_nonce(Imprint::of(HashAlg::Sha256, &hello()), &[]).unwrap();
    let err = verify_response(&resp, &req, &digicert, &root).unwrap_err();
    assert!(matches!(err, Error::NotChained(_)), "{err}");
}

#[test]
fn identrust_token_verifies_at_gen_time_and_says_its_certificate_expired() {
    let roots =
        certificates_from_pem(&String::from_utf8(read(fixture!("identrust/root.pem"))).unwrap())
            .unwrap();
    let resp = read(fixture!("identrust/issue-104.tsr"));
    let req = TimeStampRequest::with_nonce(Imprint::of(HashAlg::Sha512, &hello()), &[]).unwrap();
    let (_, w) = verify_response(&resp, &req, &roots, &[]).unwrap();
    assert_eq!(w.gen_time, "2025-03-11T08:52:08Z");
    assert_eq!(w.policy, "2.16.840.1.113839.0.6.13.3");
    assert_eq!(w.hash, "sha512");
    assert!(w.tsa.contains("TrustID Timestamp Authority"), "{}", w.tsa);
    assert_eq!(w.nonce_hex.as_deref(), Some("75c3b3214ac39fbb"));
    // The TSA certificate's notAfter is 2026-01-17T19:48:39Z.
    assert_eq!(w.signer_not_after_unix, 1_768_679_319);
    assert!(!w.signer_expired_at(w.gen_time_unix_ms / 1000));
    assert!(w.signer_expired_at(1_768_679_320));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        w.signer_expired_at(now),
        "the IdenTrust TSA certificate has since expired"
    );
}

#[test]
fn pinned_public_roots_have_their_fingerprints() {
    for (name, fp) in [
        (
            "digicert",
            "552f7bdcf1a7af9e6ce672017f4f12abf77240c78e761ac203d1d9d20ac89988",
        ),
        (
            "freetsa",
            "a6379e7cecc05faa3cbf076013d745e327bbbaa38c0b9af22469d4701d18aabc",
        ),
    ] {
        let a = public(name).unwrap();
        let roots = a.roots();
        assert_eq!(roots.len(), 1, "{name}");
        assert_eq!(hex::encode(HashAlg::Sha256.digest(&roots[0])), fp, "{name}");
        let (_, c) = x509_parser::parse_x509_certificate(&roots[0]).unwrap();
        assert_eq!(
            c.subject().as_raw(),
            c.issuer().as_raw(),
            "{name} root is self-signed"
        );
    }
    // The shipped copies are the repository's fixtures.
    for (name, file) in [
        ("digicert", fixture!("roots/digicert-trusted-root-g4.pem")),
        ("freetsa", fixture!("roots/freetsa-root.pem")),
    ] {
        assert_eq!(
            public(name).unwrap().root_pem.as_bytes(),
            read(file),
            "{name}"
        );
    }
}
