//! The RFC 3161 HTTP transport: POST `application/timestamp-query`, expect
//! `application/timestamp-reply`, within a timeout, with the body capped at
//! [`MAX_RESPONSE_BYTES`](crate::MAX_RESPONSE_BYTES).
//!
//! HTTPS uses rustls (the `ring` provider) with the system's roots: the channel only carries
//! the token, which is verified separately against pinned roots, never against these.

use crate::{Error, TimeStampRequest, MAX_RESPONSE_BYTES};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::Duration;

const QUERY: &str = "application/timestamp-query";
const REPLY: &str = "application/timestamp-reply";

/// POSTs `req` to the TSA at `url` (`http://` or `https://`) and answers the response body,
/// unverified: pass it to [`verify_response`](crate::verify_response). Fails on a timeout,
/// a status other than 200, a content type other than `application/timestamp-reply`, or a
/// body over [`MAX_RESPONSE_BYTES`](crate::MAX_RESPONSE_BYTES) (refused without reading more).
pub async fn send(url: &str, req: &TimeStampRequest, timeout: Duration) -> Result<Vec<u8>, Error> {
    exchange(url, req, timeout, Transport::SystemRoots).await
}

/// As [`send`], but an `https://` channel is trusted through `transport_roots` (DER
/// certificates) instead of the system's roots: for a TSA behind a proxy with its own CA, and
/// for tests. These roots concern the channel only, never the token.
pub async fn send_with_transport_roots(
    url: &str,
    req: &TimeStampRequest,
    timeout: Duration,
    transport_roots: &[Vec<u8>],
) -> Result<Vec<u8>, Error> {
    exchange(url, req, timeout, Transport::Roots(transport_roots)).await
}

enum Transport<'a> {
    SystemRoots,
    Roots(&'a [Vec<u8>]),
}

async fn exchange(
    url: &str,
    req: &TimeStampRequest,
    timeout: Duration,
    transport: Transport<'_>,
) -> Result<Vec<u8>, Error> {
    let fail = |reason: String| Error::Http {
        url: url.to_string(),
        reason,
    };
    let uri: http::Uri = url.parse().map_err(|e| fail(format!("not a URL: {e}")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(fail("the URL must be http:// or https://".into())),
    };
    let exchange = async {
        let tls = tls_config(https, &transport).map_err(fail)?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
        let request = http::Request::post(uri)
            .header(http::header::CONTENT_TYPE, QUERY)
            .header(http::header::ACCEPT, REPLY)
            .body(Full::new(Bytes::copy_from_slice(req.der())))
            .map_err(|e| fail(e.to_string()))?;
        let resp = client
            .request(request)
            .await
            .map_err(|e| fail(error_chain(&e)))?;
        if resp.status() != http::StatusCode::OK {
            return Err(fail(format!("HTTP status {}", resp.status())));
        }
        let ct = resp
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let mime = ct.split(';').next().unwrap_or("").trim();
        if !mime.eq_ignore_ascii_case(REPLY) {
            return Err(fail(format!("content type {ct:?}, expected {REPLY}")));
        }
        let declared = resp
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(n) = declared {
            if n > MAX_RESPONSE_BYTES as u64 {
                return Err(Error::TooLarge {
                    what: "time-stamp response",
                    size: usize::try_from(n).unwrap_or(usize::MAX),
                    limit: MAX_RESPONSE_BYTES,
                });
            }
        }
        let body = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    Error::TooLarge {
                        what: "time-stamp response",
                        size: MAX_RESPONSE_BYTES + 1,
                        limit: MAX_RESPONSE_BYTES,
                    }
                } else {
                    fail(format!("reading the body: {e}"))
                }
            })?;
        Ok(body.to_bytes().to_vec())
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| Error::Timeout {
            url: url.to_string(),
            timeout,
        })?
}

/// rustls with the `ring` provider; the system's (or the given) roots for HTTPS, none for HTTP.
fn tls_config(https: bool, transport: &Transport<'_>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    if https {
        match transport {
            Transport::SystemRoots => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
            }
            Transport::Roots(given) => {
                roots.add_parsable_certificates(
                    given
                        .iter()
                        .map(|c| rustls::pki_types::CertificateDer::from(c.clone())),
                );
            }
        }
        if roots.is_empty() {
            return Err("no root certificates for the HTTPS transport".into());
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// An error and its sources, `: `-joined (hyper's top-level messages are terse).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}
