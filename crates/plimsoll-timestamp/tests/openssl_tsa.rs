//! A live, independent peer: OpenSSL as the time-stamp authority (`openssl ts -reply` behind
//! a tiny HTTP server on 127.0.0.1) and as a second verifier (`openssl ts -verify`).
//!
//! The throwaway PKI: an RSA root; an RSA TSA issued by it (ESSCertID with SHA-1); a P-256
//! intermediate CA issued by the root and an ECDSA P-384 TSA issued by the intermediate
//! (ESSCertIDv2, signing with SHA-384 and with SHA-512); and a TSA certificate whose EKU is not
//! critical, which `openssl ts -reply` refuses to sign with, so that token is made with
//! `openssl cms -sign -cades` instead. Needs `openssl` on PATH (CI has it); fails saying so
//! when it is missing.

use plimsoll_timestamp::{
    send, send_with_transport_roots, verify_response, verify_token, Error, HashAlg, Imprint,
    TimeStampRequest,
};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

const EXT_CNF: &str = "\
[ca]
basicConstraints=critical,CA:TRUE
keyUsage=critical,keyCertSign,cRLSign
subjectKeyIdentifier=hash
[tsa]
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=critical,timeStamping
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
[tsa_noncrit]
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=timeStamping
subjectKeyIdentifier=hash
[tsa_noeku]
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=critical,serverAuth
[tsa_extra]
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=critical,timeStamping,codeSigning
[ca_nocertsign]
basicConstraints=critical,CA:TRUE
keyUsage=critical,digitalSignature,cRLSign
subjectKeyIdentifier=hash
[ca_pathlen0]
basicConstraints=critical,CA:TRUE,pathlen:0
keyUsage=critical,keyCertSign,cRLSign
subjectKeyIdentifier=hash
[notca]
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyCertSign
subjectKeyIdentifier=hash
";

/// A minimal `openssl ca` database, only to issue a backdated certificate.
const CA_CNF: &str = "\
[ca]
default_ca = old
[old]
database = cadb/index.txt
new_certs_dir = cadb
serial = cadb/serial
default_md = sha256
policy = any
unique_subject = no
[any]
commonName = supplied
";

/// The `[tsa]` sections `openssl ts -reply` signs with, one per HTTP path.
fn ts_cnf(dir: &Path) -> String {
    let d = dir.display();
    let section = |name: &str, cert: &str, key: &str, md: &str, ess: &str, certs: &str| {
        format!(
            "[{name}]\nserial = {d}/serial\nsigner_cert = {d}/{cert}\nsigner_key = {d}/{key}\n\
             signer_digest = {md}\ndefault_policy = 1.2.3.4.1\nother_policies = 1.2.3.4.5\n\
             digests = sha256, sha384, sha512\naccuracy = secs:1\nordering = yes\n\
             tsa_name = yes\ness_cert_id_chain = no\ness_cert_id_alg = {ess}\n{certs}\n"
        )
    };
    let inter = format!("certs = {d}/inter.pem");
    [
        "[tsa]\ndefault_tsa = rsa\n".to_string(),
        section("rsa", "rsa.pem", "rsa.key", "sha256", "sha1", ""),
        section("ec384", "ec.pem", "ec.key", "sha384", "sha256", &inter),
        section("ec512", "ec.pem", "ec.key", "sha512", "sha256", &inter),
        section("noncrit", "noncrit.pem", "rsa.key", "sha256", "sha256", ""),
        // The P-384 TSA without its intermediate in the token.
        section("ec384bare", "ec.pem", "ec.key", "sha384", "sha256", ""),
        // A TSA certificate that expired in 2021: every token it signs now is outside it.
        section("expired", "expired.pem", "rsa.key", "sha256", "sha256", ""),
        // The RSA TSA signing with SHA-1 (digestAlgorithm sha1, signatureAlgorithm rsaEncryption).
        section("sha1", "rsa.pem", "rsa.key", "sha1", "sha256", ""),
        // A TSA certificate issued by a CA whose keyUsage lacks keyCertSign.
        section(
            "undernokcs",
            "under-nokcs.pem",
            "rsa.key",
            "sha256",
            "sha256",
            &format!("certs = {d}/nokcs.pem"),
        ),
        // A TSA certificate two CAs below one with pathlen:0.
        section(
            "underpl0",
            "under-pl0.pem",
            "rsa.key",
            "sha256",
            "sha256",
            &format!("certs = {d}/pl0-chain.pem"),
        ),
        // A TSA certificate issued by a certificate that is not a CA.
        section(
            "undernotca",
            "under-notca.pem",
            "rsa.key",
            "sha256",
            "sha256",
            &format!("certs = {d}/notca.pem"),
        ),
    ]
    .concat()
}

struct Pki {
    dir: tempfile::TempDir,
    url: String,
    /// The same TSA behind TLS with a throwaway server certificate for 127.0.0.1.
    https_url: String,
    /// That server certificate, DER, to trust for the channel.
    https_cert: Vec<u8>,
}

impl Pki {
    fn path(&self, f: &str) -> PathBuf {
        self.dir.path().join(f)
    }
    fn der(&self, pem_file: &str) -> Vec<u8> {
        let pem = std::fs::read_to_string(self.path(pem_file)).unwrap();
        plimsoll_timestamp::certificates_from_pem(&pem)
            .unwrap()
            .remove(0)
    }
    fn root(&self) -> Vec<Vec<u8>> {
        vec![self.der("ca.pem")]
    }
}

fn openssl(dir: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| {
            panic!("this test needs the `openssl` command (apt-get install openssl): {e}")
        });
    out
}

fn openssl_ok(dir: &Path, args: &[&str]) {
    let out = openssl(dir, args);
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn pki() -> &'static Pki {
    static PKI: OnceLock<Pki> = OnceLock::new();
    PKI.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("ext.cnf"), EXT_CNF).unwrap();
        std::fs::write(d.join("serial"), "01\n").unwrap();
        std::fs::write(d.join("ts.cnf"), ts_cnf(d)).unwrap();
        let days = ["-days", "3650"];
        openssl_ok(
            d,
            &[
                &[
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                ][..],
                &["-out", "ca.pem", "-subj", "/CN=plimsoll test TSA root"],
                &["-config", "ext.cnf", "-extensions", "ca"],
                &days,
            ]
            .concat(),
        );
        // A second root with the same name and another key, for "pinned to another root".
        openssl_ok(
            d,
            &[
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    "other.key",
                ][..],
                &["-out", "other.pem", "-subj", "/CN=plimsoll test TSA root"],
                &["-config", "ext.cnf", "-extensions", "ca"],
                &days,
            ]
            .concat(),
        );
        let csr = |key: &str, newkey: &[&str], subj: &str, csr: &str| {
            openssl_ok(
                d,
                &[
                    &[
                        "req", "-new", "-nodes", "-keyout", key, "-out", csr, "-subj", subj,
                    ][..],
                    newkey,
                    &["-config", "ext.cnf"],
                ]
                .concat(),
            )
        };
        let sign = |csr: &str, ca: &str, ca_key: &str, serial: &str, out: &str, ext: &str| {
            openssl_ok(
                d,
                &[
                    &["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key][..],
                    &["-set_serial", serial, "-out", out, "-days", "365"],
                    &["-extfile", "ext.cnf", "-extensions", ext],
                ]
                .concat(),
            )
        };
        let rsa = ["-newkey", "rsa:2048"];
        csr("rsa.key", &rsa, "/CN=plimsoll test TSA RSA", "rsa.csr");
        sign("rsa.csr", "ca.pem", "ca.key", "2", "rsa.pem", "tsa");
        sign(
            "rsa.csr",
            "ca.pem",
            "ca.key",
            "3",
            "noncrit.pem",
            "tsa_noncrit",
        );
        let p256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];
        csr(
            "inter.key",
            &p256,
            "/CN=plimsoll test TSA P-256 CA",
            "inter.csr",
        );
        sign("inter.csr", "ca.pem", "ca.key", "4", "inter.pem", "ca");
        let p384 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"];
        csr("ec.key", &p384, "/CN=plimsoll test TSA P-384", "ec.csr");
        sign("ec.csr", "inter.pem", "inter.key", "5", "ec.pem", "tsa");
        sign("rsa.csr", "ca.pem", "ca.key", "6", "noeku.pem", "tsa_noeku");
        sign("rsa.csr", "ca.pem", "ca.key", "7", "extra.pem", "tsa_extra");
        csr(
            "notca.key",
            &p256,
            "/CN=plimsoll test not a CA",
            "notca.csr",
        );
        sign("notca.csr", "ca.pem", "ca.key", "9", "notca.pem", "notca");
        sign(
            "rsa.csr",
            "notca.pem",
            "notca.key",
            "10",
            "under-notca.pem",
            "tsa",
        );
        // A CA without keyCertSign, and a TSA certificate it signed.
        csr(
            "nokcs.key",
            &p256,
            "/CN=plimsoll test CA without keyCertSign",
            "nokcs.csr",
        );
        sign(
            "nokcs.csr",
            "ca.pem",
            "ca.key",
            "12",
            "nokcs.pem",
            "ca_nocertsign",
        );
        sign(
            "rsa.csr",
            "nokcs.pem",
            "nokcs.key",
            "13",
            "under-nokcs.pem",
            "tsa",
        );
        // root → pathlen:0 CA → CA → TSA: one intermediate more than pathlen:0 allows.
        csr(
            "pl0.key",
            &p256,
            "/CN=plimsoll test CA pathlen 0",
            "pl0.csr",
        );
        sign(
            "pl0.csr",
            "ca.pem",
            "ca.key",
            "14",
            "pl0.pem",
            "ca_pathlen0",
        );
        csr(
            "pl0sub.key",
            &p256,
            "/CN=plimsoll test CA below pathlen 0",
            "pl0sub.csr",
        );
        sign("pl0sub.csr", "pl0.pem", "pl0.key", "15", "pl0sub.pem", "ca");
        sign(
            "rsa.csr",
            "pl0sub.pem",
            "pl0sub.key",
            "16",
            "under-pl0.pem",
            "tsa",
        );
        let pl0_chain = [
            std::fs::read_to_string(d.join("pl0sub.pem")).unwrap(),
            std::fs::read_to_string(d.join("pl0.pem")).unwrap(),
        ]
        .concat();
        std::fs::write(d.join("pl0-chain.pem"), pl0_chain).unwrap();
        // `openssl x509` cannot backdate; `openssl ca` can.
        std::fs::create_dir_all(d.join("cadb")).unwrap();
        std::fs::write(d.join("cadb/index.txt"), "").unwrap();
        std::fs::write(d.join("cadb/serial"), "20\n").unwrap();
        std::fs::write(d.join("ca.cnf"), CA_CNF).unwrap();
        openssl_ok(
            d,
            &[
                &[
                    "ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key",
                ][..],
                &["-in", "rsa.csr", "-out", "expired.pem", "-notext"],
                &[
                    "-startdate",
                    "20200101000000Z",
                    "-enddate",
                    "20210101000000Z",
                ],
                &["-extfile", "ext.cnf", "-extensions", "tsa"],
            ]
            .concat(),
        );
        // Same name as the intermediate, another P-256 key.
        csr(
            "fake.key",
            &p256,
            "/CN=plimsoll test TSA P-256 CA",
            "fake.csr",
        );
        sign("fake.csr", "ca.pem", "ca.key", "11", "fake-inter.pem", "ca");
        let chain = [
            std::fs::read_to_string(d.join("ec.pem")).unwrap(),
            std::fs::read_to_string(d.join("inter.pem")).unwrap(),
        ]
        .concat();
        std::fs::write(d.join("ec-chain.pem"), chain).unwrap();

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let root = d.to_path_buf();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                serve(conn, &root);
            }
        });

        let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let https_cert = ck.cert.der().to_vec();
        let key = rustls::pki_types::PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der());
        let tls = std::sync::Arc::new(
            rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![https_cert.clone().into()], key.into())
            .unwrap(),
        );
        let tls_listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let https_url = format!("https://{}", tls_listener.local_addr().unwrap());
        let root = d.to_path_buf();
        std::thread::spawn(move || {
            for tcp in tls_listener.incoming().flatten() {
                let conn = rustls::ServerConnection::new(tls.clone()).unwrap();
                serve(rustls::StreamOwned::new(conn, tcp), &root);
            }
        });
        Pki {
            dir,
            url,
            https_url,
            https_cert,
        }
    })
}

/// One HTTP/1.1 exchange: the path picks the `[tsa]` section, or a misbehaving answer.
fn serve(mut conn: impl Read + Write, dir: &Path) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_end, content_length) = loop {
        let Ok(k) = conn.read(&mut chunk) else { return };
        if k == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..k]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..p]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (p + 4, len);
        }
    };
    while buf.len() < head_end + content_length {
        let Ok(k) = conn.read(&mut chunk) else { return };
        if k == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..k]);
    }
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    let body = &buf[head_end..head_end + content_length];
    fn reply(conn: &mut impl Write, ct: &str, len: Option<usize>, body: &[u8]) {
        let mut h = format!("HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nConnection: close\r\n");
        if let Some(l) = len {
            h.push_str(&format!("Content-Length: {l}\r\n"));
        }
        h.push_str("\r\n");
        let _ = conn.write_all(h.as_bytes());
        let _ = conn.write_all(body);
        let _ = conn.flush();
    }
    const REPLY: &str = "application/timestamp-reply";
    match path.as_str() {
        "/big-declared" => reply(&mut conn, REPLY, Some(100_000), &[0x30; 1024]),
        "/big-streamed" => reply(&mut conn, REPLY, None, &vec![0x30; 100_000]),
        "/text" => reply(&mut conn, "text/html", Some(2), b"hi"),
        "/slow" => std::thread::sleep(Duration::from_secs(3)),
        section => {
            let section = section.trim_start_matches('/');
            let q = dir.join(format!("q{n}.tsq"));
            let r = dir.join(format!("r{n}.tsr"));
            std::fs::write(&q, body).unwrap();
            // The HTTP and HTTPS servers share one serial file: one `openssl ts -reply` at a time.
            static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
            let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
            let out = openssl(
                dir,
                &[
                    "ts",
                    "-reply",
                    "-config",
                    "ts.cnf",
                    "-section",
                    section,
                    "-queryfile",
                    q.to_str().unwrap(),
                    "-out",
                    r.to_str().unwrap(),
                ],
            );
            let resp = std::fs::read(&r).unwrap_or_default();
            if !out.status.success() || resp.is_empty() {
                eprintln!(
                    "openssl ts -reply: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            reply(&mut conn, REPLY, Some(resp.len()), &resp);
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Sends a fresh request for `data` to `path` and answers (request, response).
fn stamp(path: &str, alg: HashAlg, data: &[u8]) -> (TimeStampRequest, Vec<u8>) {
    let pki = pki();
    let req = TimeStampRequest::new(Imprint::of(alg, data)).unwrap();
    let url = format!("{}{path}", pki.url);
    let resp = runtime()
        .block_on(send(&url, &req, Duration::from_secs(20)))
        .unwrap();
    (req, resp)
}

/// `openssl ts -verify` of a request/answer pair the crate made and received.
fn openssl_verifies(req: &TimeStampRequest, resp: &[u8], untrusted: &str, tag: &str) {
    let (ok, text) = openssl_verdict(req, resp, untrusted, tag);
    assert!(ok, "openssl ts -verify refused the crate's pair: {text}");
}

/// Whether `openssl ts -verify` accepts the pair, and what it said.
fn openssl_verdict(
    req: &TimeStampRequest,
    resp: &[u8],
    untrusted: &str,
    tag: &str,
) -> (bool, String) {
    let pki = pki();
    let q = pki.path(&format!("crate-{tag}.tsq"));
    let r = pki.path(&format!("crate-{tag}.tsr"));
    std::fs::write(&q, req.der()).unwrap();
    std::fs::write(&r, resp).unwrap();
    let out = openssl(
        pki.dir.path(),
        &[
            "ts",
            "-verify",
            "-queryfile",
            q.to_str().unwrap(),
            "-in",
            r.to_str().unwrap(),
            "-CAfile",
            "ca.pem",
            "-untrusted",
            untrusted,
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    (
        out.status.success() && text.contains("Verification: OK"),
        format!("{text} {}", String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn rsa_tsa_answer_verifies_here_and_in_openssl() {
    let pki = pki();
    let (req, resp) = stamp("/rsa", HashAlg::Sha256, b"what ran");
    let (token, w) = verify_response(&resp, &req, &pki.root(), &[]).unwrap();
    assert_eq!(w.tsa, "CN=plimsoll test TSA RSA");
    assert_eq!(w.policy, "1.2.3.4.1");
    assert_eq!(w.hash, "sha256");
    assert_eq!(
        w.nonce_hex.as_deref(),
        Some(hex::encode(req.nonce()).as_str())
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((w.gen_time_unix_ms - now).abs() < 120_000, "{}", w.gen_time);
    assert!(!w.signer_expired_at(now / 1000));
    // The stored token verifies alone, with or without the nonce.
    verify_token(&token, req.imprint(), None, &pki.root(), &[]).unwrap();
    verify_token(&token, req.imprint(), Some(req.nonce()), &pki.root(), &[]).unwrap();
    openssl_verifies(&req, &resp, "rsa.pem", "rsa");
}

#[test]
fn ecdsa_p384_answers_verify_with_sha384_and_sha512() {
    let pki = pki();
    for (path, alg) in [("/ec384", HashAlg::Sha384), ("/ec512", HashAlg::Sha512)] {
        let (req, resp) = stamp(path, alg, b"what ran");
        let (_, w) = verify_response(&resp, &req, &pki.root(), &[])
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(w.tsa, "CN=plimsoll test TSA P-384", "{path}");
        assert_eq!(w.hash, alg.name(), "{path}");
        openssl_verifies(&req, &resp, "ec-chain.pem", path.trim_start_matches('/'));
        // The P-256 intermediate is in the token; pinning it instead of the root also works.
        verify_response(&resp, &req, &[pki.der("inter.pem")], &[]).unwrap();
    }
}

#[test]
fn openssl_token_pinned_to_another_root_is_refused() {
    let pki = pki();
    let (req, resp) = stamp("/rsa", HashAlg::Sha256, b"what ran");
    // Same name as the real root, other key: the link fails on its signature.
    let err = verify_response(&resp, &req, &[pki.der("other.pem")], &[]).unwrap_err();
    assert!(matches!(err, Error::NotChained(_)), "{err}");
    assert!(
        err.to_string().contains("not chained to a pinned root"),
        "{err}"
    );
    // An unrelated root.
    let freetsa = plimsoll_timestamp::public("freetsa").unwrap().roots();
    let err = verify_response(&resp, &req, &freetsa, &[]).unwrap_err();
    assert!(matches!(err, Error::NotChained(_)), "{err}");
    // The ECDSA chain without its intermediate's issuer pinned.
    let (req, resp) = stamp("/ec384", HashAlg::Sha384, b"what ran");
    let err = verify_response(&resp, &req, &[pki.der("other.pem")], &[]).unwrap_err();
    assert!(matches!(err, Error::NotChained(_)), "{err}");
}

#[test]
fn tampered_openssl_answer_fails() {
    let pki = pki();
    let (req, resp) = stamp("/rsa", HashAlg::Sha256, b"what ran");
    // The last byte is in the RSA signature of the signed attributes.
    let mut bad = resp.clone();
    *bad.last_mut().unwrap() ^= 1;
    let err = verify_response(&bad, &req, &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::BadSignature(_)), "{err}");
    // Another request's nonce.
    let other = TimeStampRequest::new(req.imprint().clone()).unwrap();
    let err = verify_response(&resp, &other, &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::NonceMismatch { .. }), "{err}");
}

/// Re-signs the TSTInfo of a real OpenSSL token with `cert` via `openssl cms -sign`, with
/// `-cades` (which adds signingCertificateV2) when `ess`, answering the new token.
fn cms_token(tag: &str, cert: &str, ess: bool) -> (TimeStampRequest, Vec<u8>) {
    cms_token_edited(tag, cert, ess, &|tst| tst.to_vec())
}

/// [`cms_token`] with the TSTInfo changed by `edit` before it is signed.
fn cms_token_edited(
    tag: &str,
    cert: &str,
    ess: bool,
    edit: &dyn Fn(&[u8]) -> Vec<u8>,
) -> (TimeStampRequest, Vec<u8>) {
    let pki = pki();
    let d = pki.dir.path();
    let (req, resp) = stamp("/rsa", HashAlg::Sha256, b"what ran");
    let resp_file = format!("cms-{tag}.tsr");
    std::fs::write(d.join(&resp_file), &resp).unwrap();
    let tok = format!("cms-{tag}-orig.der");
    let tst = format!("cms-{tag}-tst.der");
    let out = format!("cms-{tag}.der");
    openssl_ok(
        d,
        &[
            "ts",
            "-reply",
            "-in",
            &resp_file,
            "-token_out",
            "-out",
            &tok,
        ],
    );
    openssl_ok(
        d,
        &[
            "cms",
            "-verify",
            "-noverify",
            "-binary",
            "-inform",
            "DER",
            "-in",
            &tok,
            "-out",
            &tst,
        ],
    );
    let edited = edit(&std::fs::read(d.join(&tst)).unwrap());
    std::fs::write(d.join(&tst), edited).unwrap();
    openssl_ok(
        d,
        &[
            &["cms", "-sign", "-binary", "-nodetach", "-outform", "DER"][..],
            if ess { &["-cades"][..] } else { &[] },
            &[
                "-econtent_type",
                "1.2.840.113549.1.9.16.1.4",
                "-md",
                "sha256",
            ],
            &[
                "-nosmimecap",
                "-in",
                &tst,
                "-signer",
                cert,
                "-inkey",
                "rsa.key",
                "-out",
                &out,
            ],
        ]
        .concat(),
    );
    (req, std::fs::read(d.join(&out)).unwrap())
}

#[test]
fn tsa_certificate_without_critical_eku_is_refused() {
    let pki = pki();
    // OpenSSL's TSA itself refuses to sign with such a certificate.
    let req = TimeStampRequest::new(Imprint::of(HashAlg::Sha256, b"x")).unwrap();
    std::fs::write(pki.path("noncrit.tsq"), req.der()).unwrap();
    let out = openssl(
        pki.dir.path(),
        &[
            &["ts", "-reply", "-config", "ts.cnf", "-section", "noncrit"][..],
            &["-queryfile", "noncrit.tsq", "-out", "noncrit.tsr"],
        ]
        .concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid signer certificate purpose"),
        "{stderr}"
    );
    // The same TSTInfo signed by the critical-EKU certificate through `openssl cms` verifies,
    // so the CMS path makes acceptable tokens...
    let (req, token) = cms_token("crit", "rsa.pem", true);
    verify_token(&token, req.imprint(), Some(req.nonce()), &pki.root(), &[]).unwrap();
    // ...and with the non-critical one it fails on the EKU alone.
    let (req, token) = cms_token("noncrit", "noncrit.pem", true);
    let err = verify_token(&token, req.imprint(), Some(req.nonce()), &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::EkuNotCritical), "{err}");
    assert!(
        err.to_string()
            .contains("extended key usage is not marked critical"),
        "{err}"
    );
}

#[test]
fn send_refuses_oversized_wrong_type_and_slow_answers() {
    let pki = pki();
    let req = TimeStampRequest::sha256([1; 32]);
    let rt = runtime();
    let t = Duration::from_secs(20);
    for path in ["/big-declared", "/big-streamed"] {
        let err = rt
            .block_on(send(&format!("{}{path}", pki.url), &req, t))
            .unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{path}: {err}");
    }
    let err = rt
        .block_on(send(&format!("{}/text", pki.url), &req, t))
        .unwrap_err();
    assert!(err.to_string().contains("content type"), "{err}");
    let err = rt
        .block_on(send(
            &format!("{}/slow", pki.url),
            &req,
            Duration::from_millis(300),
        ))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    let err = rt.block_on(send("ftp://127.0.0.1/", &req, t)).unwrap_err();
    assert!(matches!(err, Error::Http { .. }), "{err}");
}

#[test]
fn token_without_signing_certificate_binding_is_refused() {
    let pki = pki();
    // `openssl cms -sign` without `-cades` adds no signingCertificate(V2) attribute.
    let (req, token) = cms_token("noess", "rsa.pem", false);
    let err = verify_token(&token, req.imprint(), Some(req.nonce()), &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::SigningCertificate(_)), "{err}");
    assert!(err.to_string().contains("ESSCertID"), "{err}");
    // A binding that names another certificate: `verify::tests::ess_binding_matches_the_signer_only`.
}

#[test]
fn tsa_certificate_without_timestamping_eku_alone_is_refused() {
    let pki = pki();
    for (tag, cert, says) in [
        ("noeku", "noeku.pem", "id-kp-timeStamping is missing"),
        (
            "extra",
            "extra.pem",
            "purposes other than id-kp-timeStamping",
        ),
    ] {
        let (req, token) = cms_token(tag, cert, true);
        let err = verify_token(&token, req.imprint(), None, &pki.root(), &[]).unwrap_err();
        assert!(matches!(err, Error::EkuMissing(_)), "{tag}: {err}");
        assert!(err.to_string().contains(says), "{tag}: {err}");
    }
}

#[test]
fn chain_is_built_from_extra_certificates_in_any_order_and_each_link_is_checked() {
    let pki = pki();
    let (req, resp) = stamp("/ec384bare", HashAlg::Sha384, b"what ran");
    let (inter, fake) = (pki.der("inter.pem"), pki.der("fake-inter.pem"));
    // Without the intermediate there is no chain.
    let err = verify_response(&resp, &req, &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::NotChained(_)), "{err}");
    // A same-named intermediate with another P-256 key does not verify the TSA certificate.
    let err = verify_response(&resp, &req, &pki.root(), std::slice::from_ref(&fake)).unwrap_err();
    assert!(matches!(err, Error::NotChained(_)), "{err}");
    assert!(err.to_string().contains("does not verify"), "{err}");
    // The real one, with or beside the fake, in either order.
    for extra in [
        vec![inter.clone()],
        vec![fake.clone(), inter.clone()],
        vec![inter.clone(), fake.clone(), pki.der("ca.pem")],
    ] {
        verify_response(&resp, &req, &pki.root(), &extra).unwrap();
    }
    // A TSA certificate issued by a certificate that is not a CA.
    let (req, resp) = stamp("/undernotca", HashAlg::Sha256, b"what ran");
    let err = verify_response(&resp, &req, &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::NotChained(_)), "{err}");
    assert!(err.to_string().contains("is not a CA"), "{err}");
}

#[test]
fn nonce_missing_and_high_bit_nonces() {
    let pki = pki();
    // A request without a nonce: the TSA's token has none.
    let req = TimeStampRequest::with_nonce(Imprint::of(HashAlg::Sha256, b"n"), &[]).unwrap();
    let url = format!("{}/rsa", pki.url);
    let resp = runtime()
        .block_on(send(&url, &req, Duration::from_secs(20)))
        .unwrap();
    let (token, w) = verify_response(&resp, &req, &pki.root(), &[]).unwrap();
    assert_eq!(w.nonce_hex, None);
    let err = verify_token(&token, req.imprint(), Some(&[1, 2, 3]), &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::NonceMissing { .. }), "{err}");
    assert!(err.to_string().contains("nonce missing"), "{err}");
    // A nonce with its high bit set goes out as 00 80 ..; the echo compares equal to the
    // magnitude with or without the sign octet, and with extra leading zeros.
    let req =
        TimeStampRequest::with_nonce(Imprint::of(HashAlg::Sha256, b"n"), &[0x80, 0, 7]).unwrap();
    assert_eq!(req.nonce(), [0x00, 0x80, 0x00, 0x07]);
    let resp = runtime()
        .block_on(send(&url, &req, Duration::from_secs(20)))
        .unwrap();
    let (token, w) = verify_response(&resp, &req, &pki.root(), &[]).unwrap();
    assert_eq!(w.nonce_hex.as_deref(), Some("800007"));
    for sent in [&[0x80, 0, 7][..], &[0, 0x80, 0, 7], &[0, 0, 0, 0x80, 0, 7]] {
        verify_token(&token, req.imprint(), Some(sent), &pki.root(), &[]).unwrap();
    }
    let err =
        verify_token(&token, req.imprint(), Some(&[0x80, 0, 8]), &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::NonceMismatch { .. }), "{err}");
}

#[test]
fn token_outside_the_signer_validity_is_refused() {
    let pki = pki();
    let (req, resp) = stamp("/expired", HashAlg::Sha256, b"what ran");
    let err = verify_response(&resp, &req, &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::NotValidAtGenTime { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("certificate not valid at genTime"), "{text}");
    assert!(
        text.contains(
            "CN=plimsoll test TSA RSA is valid from 2020-01-01T00:00:00Z to 2021-01-01T00:00:00Z"
        ),
        "{text}"
    );
}

#[test]
fn https_transport_trusts_the_given_roots_or_the_system_roots() {
    let pki = pki();
    let req = TimeStampRequest::new(Imprint::of(HashAlg::Sha256, b"over tls")).unwrap();
    let url = format!("{}/rsa", pki.https_url);
    let t = Duration::from_secs(20);
    let rt = runtime();
    let resp = rt
        .block_on(send_with_transport_roots(
            &url,
            &req,
            t,
            std::slice::from_ref(&pki.https_cert),
        ))
        .unwrap();
    verify_response(&resp, &req, &pki.root(), &[]).unwrap();
    // The system's roots do not know the throwaway server certificate.
    let err = rt.block_on(send(&url, &req, t)).unwrap_err();
    assert!(matches!(err, Error::Http { .. }), "{err}");
    assert!(
        err.to_string().to_lowercase().contains("certificate"),
        "{err}"
    );
    // Trusting the TSA's root for the channel does not make the server's certificate valid.
    let err = rt
        .block_on(send_with_transport_roots(&url, &req, t, &pki.root()))
        .unwrap_err();
    assert!(matches!(err, Error::Http { .. }), "{err}");
}

/// The header length and contents length of the DER element at `p`.
fn der_header(b: &[u8], p: usize) -> (usize, usize) {
    let l = b[p + 1] as usize;
    if l & 0x80 == 0 {
        return (2, l);
    }
    let n = l & 0x7f;
    let len = b[p + 2..p + 2 + n]
        .iter()
        .fold(0usize, |a, &x| a << 8 | x as usize);
    (2 + n, len)
}

/// The offsets of the elements inside the constructed element at `p`.
fn der_children(b: &[u8], p: usize) -> Vec<usize> {
    let (h, l) = der_header(b, p);
    let (mut q, end, mut out) = (p + h, p + h + l, Vec::new());
    while q < end {
        out.push(q);
        let (h2, l2) = der_header(b, q);
        q += h2 + l2;
    }
    out
}

/// One DER element.
fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let n = content.len();
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes: Vec<u8> = n
            .to_be_bytes()
            .into_iter()
            .skip_while(|&x| x == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// The SignerInfo of a TimeStampResp: its offset and its elements' offsets.
fn signer_info(resp: &[u8]) -> Vec<usize> {
    let token = der_children(resp, 0)[1];
    let content = der_children(resp, token)[1];
    let signed_data = der_children(resp, content)[0];
    let signer_infos = *der_children(resp, signed_data).last().unwrap();
    der_children(resp, der_children(resp, signer_infos)[0])
}

/// An OpenSSL RSA answer with its signatureAlgorithm replaced by `sig_oid` (contents, the same
/// length as rsaEncryption's) and its signed attributes signed again with the TSA's own key
/// over `md`: what a TSA, or anyone holding its key, can send.
fn resigned(resp: &[u8], sig_oid: &[u8], md: &str, tag: &str) -> Vec<u8> {
    let pki = pki();
    let mut resp = resp.to_vec();
    let si = signer_info(&resp);
    let (attrs, sig_alg, sig) = (si[3], si[4], si[5]);
    let (h, l) = der_header(&resp, attrs);
    let mut signed = resp[attrs..attrs + h + l].to_vec();
    signed[0] = 0x31; // [0] IMPLICIT → SET OF, as signed
    let oid = der_children(&resp, sig_alg)[0];
    let (h, l) = der_header(&resp, oid);
    assert_eq!(l, sig_oid.len());
    resp[oid + h..oid + h + l].copy_from_slice(sig_oid);
    let attrs_file = format!("resign-{tag}.der");
    let sig_file = format!("resign-{tag}.sig");
    std::fs::write(pki.path(&attrs_file), &signed).unwrap();
    openssl_ok(
        pki.dir.path(),
        &[
            "dgst",
            &format!("-{md}"),
            "-sign",
            "rsa.key",
            "-out",
            &sig_file,
            &attrs_file,
        ],
    );
    let new_sig = std::fs::read(pki.path(&sig_file)).unwrap();
    let (h, l) = der_header(&resp, sig);
    assert_eq!(l, new_sig.len());
    resp[sig + h..sig + h + l].copy_from_slice(&new_sig);
    resp
}

/// sha256WithRSAEncryption and sha384WithRSAEncryption, as OID contents.
const SHA256_WITH_RSA: [u8; 9] = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0b];
const SHA384_WITH_RSA: [u8; 9] = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c];

#[test]
fn sha1_as_the_signer_digest_is_refused() {
    let pki = pki();
    // OpenSSL's own answer with `signer_digest = sha1`.
    let (req, resp) = stamp("/sha1", HashAlg::Sha256, b"what ran");
    let err = verify_response(&resp, &req, &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::Sha1Digest), "{err}");
    assert!(err.to_string().contains("SHA-1"), "{err}");
    // The same answer signed again over SHA-256 and named sha256WithRSAEncryption: the
    // messageDigest stays SHA-1 of the TSTInfo. OpenSSL refuses it; so does this crate.
    let forged = resigned(&resp, &SHA256_WITH_RSA, "sha256", "sha1");
    let (ok, text) = openssl_verdict(&req, &forged, "rsa.pem", "sha1-forged");
    assert!(!ok, "openssl ts -verify accepted it: {text}");
    let err = verify_response(&forged, &req, &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::Sha1Digest), "{err}");
}

#[test]
fn a_signature_hash_other_than_the_digest_is_refused() {
    let pki = pki();
    let (req, resp) = stamp("/rsa", HashAlg::Sha256, b"what ran");
    // Named and signed with the digest's own hash, the re-signed answer still verifies
    // (so the surgery itself is sound)...
    let same = resigned(&resp, &SHA256_WITH_RSA, "sha256", "same");
    verify_response(&same, &req, &pki.root(), &[]).unwrap();
    // ...but a SHA-384 signature over a SHA-256 digest does not, here or in OpenSSL.
    let forged = resigned(&resp, &SHA384_WITH_RSA, "sha384", "mismatch");
    let (ok, text) = openssl_verdict(&req, &forged, "rsa.pem", "mismatch");
    assert!(!ok, "openssl ts -verify accepted it: {text}");
    let err = verify_response(&forged, &req, &pki.root(), &[]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SignatureDigestMismatch {
                signature_hash: "SHA-384",
                digest: "SHA-256",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("1.2.840.113549.1.1.12"), "{err}");
}

/// A TSTInfo with `ext` (one Extension, DER) appended as `extensions [1]`.
fn with_extension(tst: &[u8], ext: &[u8]) -> Vec<u8> {
    let (h, l) = der_header(tst, 0);
    let mut content = tst[h..h + l].to_vec();
    content.extend(der_tlv(0xa1, ext));
    der_tlv(0x30, &content)
}

#[test]
fn unknown_critical_tstinfo_extensions_are_refused() {
    let pki = pki();
    let oid = der_tlv(0x06, &[0x2a, 0x03, 0x04, 0x63]); // 1.2.3.4.99
    let value = der_tlv(0x04, &der_tlv(0x05, &[]));
    let critical = der_tlv(0x30, &[&oid[..], &[0x01, 0x01, 0xff], &value].concat());
    let (req, token) = cms_token_edited("critext", "rsa.pem", true, &|tst| {
        with_extension(tst, &critical)
    });
    let err = verify_token(&token, req.imprint(), Some(req.nonce()), &pki.root(), &[]).unwrap_err();
    assert!(
        matches!(&err, Error::UnknownCriticalExtension { oid } if oid == "1.2.3.4.99"),
        "{err}"
    );
    assert!(err.to_string().contains("1.2.3.4.99"), "{err}");
    // The same extension not marked critical is skipped.
    let plain = der_tlv(0x30, &[&oid[..], &value].concat());
    let (req, token) = cms_token_edited("plainext", "rsa.pem", true, &|tst| {
        with_extension(tst, &plain)
    });
    verify_token(&token, req.imprint(), Some(req.nonce()), &pki.root(), &[]).unwrap();
}

#[test]
fn an_impossible_gen_time_is_refused() {
    let pki = pki();
    let (req, token) = cms_token_edited("day31", "rsa.pem", true, &|tst| {
        let mut tst = tst.to_vec();
        let gen = der_children(&tst, 0)[4];
        let (h, l) = der_header(&tst, gen);
        let now = String::from_utf8(tst[gen + h..gen + h + l].to_vec()).unwrap();
        assert_eq!(l, 15, "a genTime without fraction: {now}");
        // Day 31 of the next 30-day month: read as the first of the month after it, that
        // day is inside the TSA certificate's year, so only the calendar can refuse it.
        let year: u32 = now[..4].parse().unwrap();
        let bad = [year, year + 1]
            .into_iter()
            .flat_map(|y| [4u32, 6, 9, 11].map(|m| (y, m)))
            .find(|&(y, m)| format!("{y:04}{:02}01120000Z", m + 1) > now)
            .map(|(y, m)| format!("{y:04}{m:02}31120000Z"))
            .unwrap();
        tst[gen + h..gen + h + l].copy_from_slice(bad.as_bytes());
        tst
    });
    let err = verify_token(&token, req.imprint(), Some(req.nonce()), &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::ImpossibleTime { .. }), "{err}");
    assert!(err.to_string().contains("has no day 31"), "{err}");
}

#[test]
fn an_issuer_without_key_cert_sign_or_over_its_path_length_is_refused() {
    let pki = pki();
    let (req, resp) = stamp("/undernokcs", HashAlg::Sha256, b"what ran");
    let (ok, text) = openssl_verdict(&req, &resp, "under-nokcs.pem", "nokcs");
    assert!(!ok, "openssl ts -verify accepted it: {text}");
    let err = verify_response(&resp, &req, &pki.root(), &[]).unwrap_err();
    assert!(matches!(err, Error::IssuerKeyUsage { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("CN=plimsoll test CA without keyCertSign would issue"),
        "{err}"
    );
    let (req, resp) = stamp("/underpl0", HashAlg::Sha256, b"what ran");
    let (ok, text) = openssl_verdict(&req, &resp, "under-pl0.pem", "pl0");
    assert!(!ok, "openssl ts -verify accepted it: {text}");
    let err = verify_response(&resp, &req, &pki.root(), &[]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::PathLenExceeded {
                path_len: 0,
                found: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("CN=plimsoll test CA pathlen 0"),
        "{err}"
    );
    // Pinned at the CA below the constraint, the chain no longer passes the pathlen:0 CA.
    verify_response(&resp, &req, &[pki.der("pl0sub.pem")], &[]).unwrap();
}
