//! Streamable HTTP: the MCP endpoint at `/mcp`, behind a bearer-token check.
//!
//! rmcp's `StreamableHttpService` speaks the protocol; this module owns the listener, the
//! path, the token and the limits. The token is compared as SHA-256 digests (the time taken
//! says nothing about the token) and never logged. Hosts are checked by rmcp
//! (`allowed_hosts`, a DNS-rebinding guard): loopback names, plus the names the operator
//! adds. Request bodies are capped ([`MAX_BODY_BYTES`]).

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;

use crate::server::PlimsollMcp;

/// The path the MCP endpoint answers on.
pub const PATH: &str = "/mcp";

/// The largest request body accepted: room for the largest request plimsolld accepts
/// (8 MiB of protobuf) written as JSON with escapes.
pub const MAX_BODY_BYTES: usize = 4 * plimsoll_core::validate::MAX_REQUEST_BYTES;

/// How the HTTP door is set up.
#[derive(Clone, Default)]
pub struct HttpOptions {
    /// The bearer token every request must carry (`Authorization: Bearer …`); `None`
    /// only on loopback (the binary enforces that).
    pub bearer_token: Option<String>,
    /// Host names (or `host:port`) accepted besides the loopback ones.
    pub allowed_hosts: Vec<String>,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "<set>"))
            .field("allowed_hosts", &self.allowed_hosts)
            .finish()
    }
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

fn plain(status: http::StatusCode, text: &str) -> http::Response<Body> {
    let mut r = http::Response::new(Full::new(Bytes::from(format!("{text}\n"))).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn digest(b: &[u8]) -> ring::digest::Digest {
    ring::digest::digest(&ring::digest::SHA256, b)
}

/// Serves MCP over streamable HTTP on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    server: PlimsollMcp,
    opts: HttpOptions,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1", "[::1]"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    hosts.extend(opts.allowed_hosts.iter().cloned());
    let cancel = tokio_util::sync::CancellationToken::new();
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        .with_cancellation_token(cancel.clone());
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let expected = opts.bearer_token.as_deref().map(|t| digest(t.as_bytes()));
    let state = Arc::new((mcp, expected));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let state = state.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(route(&state.0, state.1.as_ref(), req).await)
                }
            });
            let conn = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = conn.serve_connection(TokioIo::new(tcp), svc).await {
                tracing::debug!(%peer, error = %e, "an MCP HTTP connection ended with an error");
            }
        });
    }
    cancel.cancel();
    Ok(())
}

async fn route(
    mcp: &StreamableHttpService<PlimsollMcp, LocalSessionManager>,
    expected: Option<&ring::digest::Digest>,
    req: http::Request<Incoming>,
) -> http::Response<Body> {
    if req.uri().path() != PATH {
        return plain(
            http::StatusCode::NOT_FOUND,
            "not found: the MCP endpoint is /mcp",
        );
    }
    if let Some(expected) = expected {
        let given = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| digest(t.trim().as_bytes()));
        if given.as_ref().map(|d| d.as_ref()) != Some(expected.as_ref()) {
            let mut r = plain(
                http::StatusCode::UNAUTHORIZED,
                "unauthorized: send Authorization: Bearer <the token plimsoll-mcp was given>",
            );
            r.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
            return r;
        }
    }
    mcp.handle(req).await
}
