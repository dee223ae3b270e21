//! Streamable HTTP: the MCP endpoint at `/mcp`, behind a bearer-token check, on a TCP
//! address or a Unix socket.
//!
//! rmcp's `StreamableHttpService` speaks the protocol; this module owns the listener, the
//! path, the token and the limits. The token is compared as SHA-256 digests (the time taken
//! says nothing about the token) and never logged. Hosts are checked by rmcp
//! (`allowed_hosts`, a DNS-rebinding guard): loopback names, plus the names the operator
//! adds. Origins are checked by rmcp too, always on: a request that carries an `Origin`
//! header (a browser's) is refused `403` unless the operator allowed that origin; a request
//! without one (every non-browser client) passes. Request bodies are capped
//! ([`MAX_BODY_BYTES`]).
//!
//! The listener is bounded ([`Limits`]): at most `max_connections` connections are served
//! at once (further ones wait in the kernel's backlog until one ends, so idle connections
//! delay a client, never lock it out); a connection must send a request's headers within
//! `header_timeout` (also between requests on a kept-alive connection), and one that moves
//! no byte either way for `idle_timeout` is closed (SSE streams send a keep-alive every
//! 15 s, so a long tool call is not idle). HTTP/1.1 only. When accepting fails (out of file
//! descriptors, for example), the listener waits 50 ms, doubling to 1 s, and logs one line
//! at most every [`ACCEPT_LOG_EVERY`] with the count of failures since.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener};

use crate::server::PlimsollMcp;

/// The path the MCP endpoint answers on.
pub const PATH: &str = "/mcp";

/// The largest request body accepted: room for the largest request plimsolld accepts
/// (8 MiB of protobuf) written as JSON with escapes.
pub const MAX_BODY_BYTES: usize = 4 * plimsoll_core::validate::MAX_REQUEST_BYTES;

/// The least time between two log lines about failed accepts.
pub const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

/// The listener's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers.
    pub header_timeout: Duration,
    /// How long a connection may move no byte either way before it is closed.
    pub idle_timeout: Duration,
}

impl Limits {
    /// `--max-connections`'s default.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 128;
    /// `--header-timeout-ms`'s default.
    pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
    /// `--idle-timeout-ms`'s default: longer than the SSE keep-alive (15 s).
    pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: Limits::DEFAULT_MAX_CONNECTIONS,
            header_timeout: Duration::from_millis(Limits::DEFAULT_HEADER_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(Limits::DEFAULT_IDLE_TIMEOUT_MS),
        }
    }
}

/// How the HTTP door is set up.
#[derive(Clone, Default)]
pub struct HttpOptions {
    /// The bearer token every request must carry (`Authorization: Bearer …`). The binary
    /// requires one on every TCP address; `None` only on a Unix socket, whose file mode
    /// is the gate.
    pub bearer_token: Option<String>,
    /// Host names (or `host:port`) accepted besides the loopback ones.
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host:port`, `:*` for any port) a request's `Origin` header may
    /// name; empty refuses every request that carries one.
    pub allowed_origins: Vec<String>,
    /// The listener's bounds.
    pub limits: Limits,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "<set>"))
            .field("allowed_hosts", &self.allowed_hosts)
            .field("allowed_origins", &self.allowed_origins)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Where the door listens.
#[derive(Debug)]
pub enum Listener {
    /// A TCP address.
    Tcp(TcpListener),
    /// A Unix socket (see [`bind_unix`]).
    Unix(UnixListener),
}

/// One accepted connection.
trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

impl Listener {
    async fn accept(&self) -> std::io::Result<Box<dyn Io>> {
        Ok(match self {
            Listener::Tcp(l) => {
                let (tcp, _) = l.accept().await?;
                let _ = tcp.set_nodelay(true);
                Box::new(tcp)
            }
            Listener::Unix(l) => Box::new(l.accept().await?.0),
        })
    }
}

/// Why a Unix socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The path exists and is not a socket: never replaced.
    #[error("{0} exists and is not a socket; remove it or choose another path")]
    NotASocket(String),
    /// A server already answers on the socket.
    #[error("{0}: another server is listening on this socket; stop it or choose another path")]
    InUse(String),
    /// The path has no parent directory or no file name.
    #[error("{0}: not a socket path (give a file in an existing directory)")]
    BadPath(String),
    /// A system call failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
}

/// Binds a Unix socket at `path` with mode 0600, owned by this process's user.
///
/// The socket is made in a private directory (mode 0700) beside `path`, set to 0600 there,
/// then renamed into place, so there is no moment at which anyone else could open it. An
/// existing socket nobody answers on (left by a server that was killed) is replaced; an
/// existing socket a server answers on, or any other kind of file, is refused.
pub fn bind_unix(path: &std::path::Path) -> Result<UnixListener, BindError> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
    let shown = path.display().to_string();
    let io = |source| BindError::Io {
        path: shown.clone(),
        source,
    };
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(BindError::BadPath(shown));
    };
    let parent = if parent.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        parent
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(BindError::InUse(shown));
            }
        }
        Ok(_) => return Err(BindError::NotASocket(shown)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let private = parent.join(format!(
        ".{}.{}",
        name.to_string_lossy(),
        hex::encode(rand::random::<[u8; 8]>())
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(io)?;
    let made = (|| {
        let inner = private.join("s");
        let listener = std::os::unix::net::UnixListener::bind(&inner)?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))?;
        // A path that appeared since the check above is refused, not replaced.
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if !m.file_type().is_socket() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "appeared while the socket was made",
                ));
            }
        }
        std::fs::rename(&inner, path)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    let listener = made.map_err(io)?;
    UnixListener::from_std(listener).map_err(io)
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
    listener: Listener,
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
        .with_allowed_origins(opts.allowed_origins.iter().cloned())
        .enforce_origin_validation()
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        .with_cancellation_token(cancel.clone());
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let expected = opts.bearer_token.as_deref().map(|t| digest(t.as_bytes()));
    let state = Arc::new((mcp, expected));
    let limits = opts.limits;
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let mut backoff = AcceptBackoff::default();
    tokio::pin!(shutdown);
    loop {
        // At the cap, stop accepting: new connections wait in the backlog, not refused.
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => match s {
                Ok(s) => s,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let io = tokio::select! {
            a = listener.accept() => match a {
                Ok(io) => {
                    if let Some(failed) = backoff.succeeded() {
                        tracing::info!(failed, "accepting connections again");
                    }
                    io
                }
                Err(e) => {
                    let (delay, log) = backoff.failed(Instant::now());
                    if let Some(failed) = log {
                        tracing::warn!(error = %e, failed, retry_ms = delay.as_millis() as u64,
                            "accepting MCP HTTP connections fails; retrying with a growing pause");
                    }
                    drop(slot);
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = &mut shutdown => break,
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let state = state.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(route(&state.0, state.1.as_ref(), req).await)
                }
            });
            let (io, last) = Watched::new(io);
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(io), svc);
            tokio::pin!(conn);
            let check = (limits.idle_timeout / 4).max(Duration::from_millis(10));
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "an MCP HTTP connection ended with an error");
                        }
                        break;
                    }
                    () = tokio::time::sleep(check) => {
                        if last.idle() >= limits.idle_timeout {
                            tracing::debug!("an idle MCP HTTP connection was closed");
                            break;
                        }
                    }
                }
            }
        });
    }
    cancel.cancel();
    Ok(())
}

/// The pause after a failed accept, and whether to log it: 50 ms doubling to 1 s, reset
/// by a successful accept; one log line at most every [`ACCEPT_LOG_EVERY`].
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    delay: Option<Duration>,
    failed: u64,
    unlogged: u64,
    logged_at: Option<Instant>,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(50);
    const MOST: Duration = Duration::from_secs(1);

    /// An accept failed at `now`: the pause before the next one, and `Some(failures
    /// since the last line)` when a line is due.
    pub fn failed(&mut self, now: Instant) -> (Duration, Option<u64>) {
        let delay = self.delay.map_or(Self::FIRST, |d| (d * 2).min(Self::MOST));
        self.delay = Some(delay);
        self.failed += 1;
        self.unlogged += 1;
        let due = self
            .logged_at
            .is_none_or(|t| now.duration_since(t) >= ACCEPT_LOG_EVERY);
        let log = due.then(|| {
            self.logged_at = Some(now);
            std::mem::take(&mut self.unlogged)
        });
        (delay, log)
    }

    /// An accept succeeded: `Some(failures)` if it ends a run of failures.
    pub fn succeeded(&mut self) -> Option<u64> {
        self.delay = None;
        self.unlogged = 0;
        (self.failed > 0).then(|| std::mem::take(&mut self.failed))
    }
}

/// When a connection last moved a byte, in milliseconds since it was accepted.
struct LastActivity {
    start: Instant,
    ms: AtomicU64,
}

impl LastActivity {
    fn touch(&self) {
        self.ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        self.start
            .elapsed()
            .saturating_sub(Duration::from_millis(self.ms.load(Ordering::Relaxed)))
    }
}

/// A connection that records when it last moved a byte.
struct Watched {
    inner: Box<dyn Io>,
    last: Arc<LastActivity>,
}

impl Watched {
    fn new(inner: Box<dyn Io>) -> (Watched, Arc<LastActivity>) {
        let last = Arc::new(LastActivity {
            start: Instant::now(),
            ms: AtomicU64::new(0),
        });
        (
            Watched {
                inner,
                last: last.clone(),
            },
            last,
        )
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.last.touch();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.last.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_failures_back_off_and_log_rarely() {
        let mut b = AcceptBackoff::default();
        let t0 = Instant::now();
        let mut delays = Vec::new();
        let mut lines = Vec::new();
        // 100 failures 50 ms apart: five seconds of a full file-descriptor table.
        for i in 0..100u32 {
            let (d, log) = b.failed(t0 + Duration::from_millis(50) * i);
            delays.push(d.as_millis());
            lines.extend(log);
        }
        assert_eq!(delays[..7], [50, 100, 200, 400, 800, 1000, 1000]);
        assert!(delays.iter().all(|d| *d <= 1000));
        assert_eq!(
            lines,
            [1],
            "one line in five seconds, for the first failure"
        );
        let (_, log) = b.failed(t0 + Duration::from_secs(11));
        assert_eq!(
            log,
            Some(100),
            "the next line counts the failures since the last"
        );
        assert_eq!(b.succeeded(), Some(101));
        assert_eq!(b.succeeded(), None);
        assert_eq!(b.failed(t0 + Duration::from_secs(12)).0.as_millis(), 50);
    }
}
