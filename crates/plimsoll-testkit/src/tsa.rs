//! A live, independent RFC 3161 time-stamp authority for tests: OpenSSL's `openssl ts
//! -reply`, with a throwaway CA and TSA certificate made by `openssl` in a temporary
//! folder, served over HTTP on loopback by a small thread (one `openssl ts -reply` process
//! per POSTed query).
//!
//! Tests of the time-stamp verifier and of `plimsoll-attest witness` talk to it the way they
//! talk to DigiCert or FreeTSA, without any network beyond loopback.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;

/// How the authority's signing key and certificate are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TsaKey {
    /// RSA 2048, signing with SHA-256.
    Rsa,
    /// ECDSA P-384, signing with SHA-512 (as FreeTSA now does).
    EcdsaP384,
}

/// A running OpenSSL time-stamp authority.
#[derive(Debug)]
pub struct OpensslTsa {
    dir: tempfile::TempDir,
    url: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("openssl (needed for the test TSA) cannot run: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl OpensslTsa {
    /// Makes a CA and a TSA certificate (extended key usage timeStamping, critical when
    /// `critical_eku`) and starts serving on a free loopback port.
    pub fn start(key: TsaKey, critical_eku: bool) -> OpensslTsa {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let d = dir.path();
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "30",
                "-subj",
                "/CN=plimsoll test TSA root",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign",
            ],
        );
        let (newkey, digest): (&[&str], &str) = match key {
            TsaKey::Rsa => (&["-newkey", "rsa:2048"], "sha256"),
            TsaKey::EcdsaP384 => (
                &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-384"],
                "sha512",
            ),
        };
        let mut req = vec!["req"];
        req.extend_from_slice(newkey);
        req.extend_from_slice(&[
            "-nodes",
            "-keyout",
            "tsa.key",
            "-out",
            "tsa.csr",
            "-subj",
            "/CN=plimsoll test TSA",
        ]);
        openssl(d, &req);
        let eku = if critical_eku {
            "extendedKeyUsage=critical,timeStamping\n"
        } else {
            "extendedKeyUsage=timeStamping\n"
        };
        std::fs::write(d.join("ext.cnf"), eku).expect("write ext.cnf");
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "tsa.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "tsa.pem",
                "-days",
                "30",
                "-extfile",
                "ext.cnf",
            ],
        );
        std::fs::write(d.join("serial"), "01\n").expect("write serial");
        let cnf = format!(
            "[ tsa ]\ndefault_tsa = tsa1\n[ tsa1 ]\ndir = {dir}\nserial = $dir/serial\n\
             crypto_device = builtin\nsigner_cert = $dir/tsa.pem\ncerts = $dir/ca.pem\n\
             signer_key = $dir/tsa.key\nsigner_digest = {digest}\ndefault_policy = 1.2.3.4.1\n\
             digests = sha256, sha384, sha512\naccuracy = secs:1\nordering = yes\n\
             tsa_name = yes\ness_cert_id_chain = no\ness_cert_id_alg = sha256\n",
            dir = d.display()
        );
        std::fs::write(d.join("tsa.cnf"), cnf).expect("write tsa.cnf");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let url = format!("http://{}/tsr", listener.local_addr().expect("address"));
        let root = d.to_path_buf();
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { continue };
                let _ = serve(stream, &root, n);
            }
        });
        OpensslTsa { dir, url }
    }

    /// The URL to POST `application/timestamp-query` to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The CA certificate (PEM file) the authority's certificate chains to.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The authority's own certificate (PEM file).
    pub fn tsa_cert_file(&self) -> PathBuf {
        self.dir.path().join("tsa.pem")
    }

    /// The folder holding the keys, certificates and every query and reply served.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Answers one HTTP/1.1 request: a POSTed query gets `openssl ts -reply`'s answer.
fn serve(stream: TcpStream, dir: &Path, n: usize) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; length.min(1 << 20)];
    reader.read_exact(&mut body)?;
    let (query, reply) = (dir.join(format!("q{n}.tsq")), dir.join(format!("r{n}.tsr")));
    std::fs::write(&query, &body)?;
    let out = Command::new("openssl")
        .args(["ts", "-reply", "-config"])
        .arg(dir.join("tsa.cnf"))
        .arg("-queryfile")
        .arg(&query)
        .arg("-out")
        .arg(&reply)
        .current_dir(dir)
        .output()?;
    let mut stream = stream;
    match std::fs::read(&reply) {
        Ok(answer) if out.status.success() => {
            write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/timestamp-reply\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                answer.len()
            )?;
            stream.write_all(&answer)
        }
        _ => {
            let msg = String::from_utf8_lossy(&out.stderr).into_owned();
            write!(
                stream,
                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{msg}",
                msg.len()
            )
        }
    }
}
