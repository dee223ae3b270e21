//! The terminator's proxy: accept, screen, handshake (TLS 1.3, `h2`), then copy bytes both
//! ways to sandboxd on loopback, under a connection limit, a handshake timeout and an idle
//! timeout; reload the certificate pair from the Secret directory; drain on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use plimsoll_config::{ConfigError, EnvSource, Variable, Vars};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::client_auth::{ClientCaFile, ClientCaReload};
use crate::screen::{check_established, classify_prelude, describe_server_error, Prelude, Refused};
use crate::server::{server_config_with, CertDir, CertDirError, ReloadOutcome};

/// Everything the terminator needs; [`TerminatorConfig::from_env`] reads it from the
/// process environment in one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminatorConfig {
    /// TLS listen address (default `0.0.0.0:9090`).
    pub listen: SocketAddr,
    /// sandboxd's address (default `127.0.0.1:9091`); must be a loopback address.
    pub upstream: SocketAddr,
    /// The Secret directory with `tls.crt` and `tls.key` (default `/etc/plimsoll/sandboxd-tls`).
    pub cert_dir: PathBuf,
    /// A client must finish the TLS handshake within this (default 10 s).
    pub handshake_timeout: Duration,
    /// A connection with no byte in either direction for this long is closed (default 120 s).
    pub idle_timeout: Duration,
    /// Established connections (forwarding to sandboxd) open at once (default 64).
    pub max_connections: usize,
    /// Connections accepted but not yet forwarding (screening, TLS handshake, waiting for a
    /// connection slot) at once (default 128). Counted apart from `max_connections`, so
    /// clients that stall in the handshake cannot take the slots established connections use.
    pub max_handshakes: usize,
    /// On shutdown, open connections get this long to finish (default 20 s).
    pub drain_timeout: Duration,
    /// How often the Secret directory is re-read (default 2 s).
    pub reload_interval: Duration,
    /// How long sandboxd may take to accept connections at startup (default 30 s).
    pub startup_timeout: Duration,
    /// `PLIMSOLL_SANDBOXD_CLIENT_CA`: when set, every client must present a certificate
    /// chaining to a CA in this file before anything is forwarded (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// Forward to sandboxd's terminator socket (`--terminator-socket`) instead of its TCP
    /// port: set by the binary with mutual TLS, never from the environment. Calls through
    /// it need no token, since only connections with a verified client certificate get there.
    pub upstream_socket: Option<PathBuf>,
}

/// Names of the environment variables the terminator reads.
pub mod env {
    /// Listen address.
    pub const LISTEN: &str = "PLIMSOLL_SANDBOXD_TLS_LISTEN";
    /// Secret directory.
    pub const DIR: &str = "PLIMSOLL_SANDBOXD_TLS_DIR";
    /// Upstream (sandboxd) address; for tests running several pairs on one machine.
    pub const UPSTREAM: &str = "PLIMSOLL_SANDBOXD_TLS_UPSTREAM";
    /// Handshake timeout, milliseconds.
    pub const HANDSHAKE_TIMEOUT_MS: &str = "PLIMSOLL_SANDBOXD_TLS_HANDSHAKE_TIMEOUT_MS";
    /// Idle timeout, milliseconds.
    pub const IDLE_TIMEOUT_MS: &str = "PLIMSOLL_SANDBOXD_TLS_IDLE_TIMEOUT_MS";
    /// Maximum established (forwarding) connections.
    pub const MAX_CONNECTIONS: &str = "PLIMSOLL_SANDBOXD_TLS_MAX_CONNECTIONS";
    /// Maximum connections still handshaking.
    pub const MAX_HANDSHAKES: &str = "PLIMSOLL_SANDBOXD_TLS_MAX_HANDSHAKES";
    /// Drain bound on SIGTERM, milliseconds.
    pub const DRAIN_TIMEOUT_MS: &str = "PLIMSOLL_SANDBOXD_TLS_DRAIN_TIMEOUT_MS";
    /// Secret poll interval, milliseconds.
    pub const RELOAD_INTERVAL_MS: &str = "PLIMSOLL_SANDBOXD_TLS_RELOAD_INTERVAL_MS";
    /// How long to wait for sandboxd to accept, milliseconds.
    pub const STARTUP_TIMEOUT_MS: &str = "PLIMSOLL_SANDBOXD_TLS_STARTUP_TIMEOUT_MS";
    /// sandboxd's path.
    pub const SANDBOXD_BIN: &str = "PLIMSOLL_SANDBOXD_BIN";
}

/// Every variable the terminator reads, with one line of help (defaults in brackets);
/// another `PLIMSOLL_SANDBOXD_TLS_*` name is reported at startup.
pub const VARIABLES: &[Variable] = &[
    (
        env::SANDBOXD_BIN,
        "sandboxd's path [/usr/local/bin/plimsoll-sandboxd]",
    ),
    (env::DIR, "Secret directory [/etc/plimsoll/sandboxd-tls]"),
    (env::LISTEN, "TLS listen address [0.0.0.0:9090]"),
    (
        env::UPSTREAM,
        "sandboxd's address, loopback only; replaces the two required flags when sandboxd is started (tests running several pairs) [127.0.0.1:9091]",
    ),
    (env::HANDSHAKE_TIMEOUT_MS, "TLS handshake bound [10000]"),
    (
        env::IDLE_TIMEOUT_MS,
        "close after no byte either way [120000]",
    ),
    (
        env::MAX_CONNECTIONS,
        "established (forwarding) connections at once [64]",
    ),
    (
        env::MAX_HANDSHAKES,
        "connections not yet forwarding (handshaking) at once, apart from the established ones [128]",
    ),
    (env::DRAIN_TIMEOUT_MS, "drain bound after SIGTERM [20000]"),
    (env::RELOAD_INTERVAL_MS, "Secret poll interval [2000]"),
    (
        env::STARTUP_TIMEOUT_MS,
        "wait for sandboxd to accept [30000]",
    ),
    (
        crate::client_auth::CLIENT_CA_VAR,
        "PEM CA certificates a client certificate must chain to before a byte is forwarded (mutual TLS); re-read on change [unset: no client certificate asked]",
    ),
];

impl Default for TerminatorConfig {
    fn default() -> Self {
        TerminatorConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            upstream: SocketAddr::from(([127, 0, 0, 1], 9091)),
            cert_dir: PathBuf::from("/etc/plimsoll/sandboxd-tls"),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_connections: 64,
            max_handshakes: 128,
            drain_timeout: Duration::from_secs(20),
            reload_interval: Duration::from_secs(2),
            startup_timeout: Duration::from_secs(30),
            client_ca: None,
            upstream_socket: None,
        }
    }
}

impl TerminatorConfig {
    /// Reads the variables from `env` (the process environment in the binary, a map in
    /// tests). Unset or empty means the default.
    pub fn from_env(env: &dyn EnvSource) -> Result<TerminatorConfig, ConfigError> {
        let d = TerminatorConfig::default();
        let v = Vars::new(env);
        let upstream = v.socket_addr(env::UPSTREAM, d.upstream)?;
        if !upstream.ip().is_loopback() {
            return Err(ConfigError::new(
                env::UPSTREAM,
                format!("{upstream}: sandboxd must only be reachable on a loopback address"),
            ));
        }
        Ok(TerminatorConfig {
            listen: v.socket_addr(env::LISTEN, d.listen)?,
            upstream,
            cert_dir: v.path(env::DIR).unwrap_or(d.cert_dir.clone()),
            handshake_timeout: v.millis(env::HANDSHAKE_TIMEOUT_MS, d.handshake_timeout)?,
            idle_timeout: v.millis(env::IDLE_TIMEOUT_MS, d.idle_timeout)?,
            max_connections: v.positive(env::MAX_CONNECTIONS, d.max_connections)?,
            max_handshakes: v.positive(env::MAX_HANDSHAKES, d.max_handshakes)?,
            drain_timeout: v.millis(env::DRAIN_TIMEOUT_MS, d.drain_timeout)?,
            reload_interval: v.millis(env::RELOAD_INTERVAL_MS, d.reload_interval)?,
            startup_timeout: v.millis(env::STARTUP_TIMEOUT_MS, d.startup_timeout)?,
            client_ca: client_ca(env, v.path(env::DIR).as_deref().unwrap_or(&d.cert_dir))?,
            upstream_socket: None,
        })
    }
}

/// `PLIMSOLL_SANDBOXD_CLIENT_CA`, read more strictly than other variables: it switches
/// client authentication on, so a value that is present but blank is an error (never a
/// silent "off"), and the file must be an absolute path outside the pod's own certificate
/// directory (whose CA signs every pod, so trusting it for clients would let pods in).
fn client_ca(
    env: &dyn EnvSource,
    cert_dir: &std::path::Path,
) -> Result<Option<PathBuf>, ConfigError> {
    let var = crate::client_auth::CLIENT_CA_VAR;
    let Some(raw) = env.get(var) else {
        return Ok(None);
    };
    let value = raw.trim();
    if value.is_empty() {
        return Err(ConfigError::new(
            var,
            "is set but empty; name the client CA file to require client certificates, or remove the variable to serve without them (a blank value never turns client certificates off)",
        ));
    }
    let path = PathBuf::from(value);
    if !path.is_absolute() {
        return Err(ConfigError::new(
            var,
            format!("{value:?} is not an absolute path; name the client CA file by its absolute path (for example /etc/plimsoll/sandboxd-client-ca/ca.crt)"),
        ));
    }
    if path.starts_with(cert_dir) {
        return Err(ConfigError::new(
            var,
            format!("{value:?} is in the pod's own certificate directory {}, whose CA signs every pod: trusting it for clients would let pods in; use the client CA of plimsolld's certificate, mounted apart", cert_dir.display()),
        ));
    }
    Ok(Some(path))
}

/// A failure to start serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TerminatorError {
    /// The Secret directory holds no usable pair.
    #[error("certificate directory: {0}")]
    CertDir(#[from] CertDirError),
    /// The client CA file is unusable.
    #[error("{var}: {0}", var = crate::client_auth::CLIENT_CA_VAR)]
    ClientCa(#[from] crate::pem::CaFileError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Log lines about failures, at most `per_window` per `window`; the next line that gets
/// through says how many were dropped. Peer floods (probes, scanners) cannot fill the log.
#[derive(Debug)]
pub struct LogBudget {
    window: Duration,
    per_window: u32,
    state: Mutex<(Instant, u32, u64)>,
}

impl LogBudget {
    /// A budget of `per_window` lines per `window`.
    pub fn new(window: Duration, per_window: u32) -> LogBudget {
        LogBudget {
            window,
            per_window,
            state: Mutex::new((Instant::now(), 0, 0)),
        }
    }

    /// `Some(dropped_before)` when a line may be written now, `None` when it must be dropped.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if now.duration_since(s.0) >= self.window {
            s.0 = now;
            s.1 = 0;
        }
        if s.1 < self.per_window {
            s.1 += 1;
            Some(std::mem::take(&mut s.2))
        } else {
            s.2 += 1;
            None
        }
    }
}

macro_rules! limited_warn {
    ($budget:expr, $($arg:tt)+) => {
        if let Some(dropped) = $budget.admit() {
            if dropped > 0 {
                tracing::warn!(dropped, "{} ({} similar lines dropped before this one)", format_args!($($arg)+), dropped);
            } else {
                tracing::warn!($($arg)+);
            }
        }
    };
}

/// Counters of what the terminator did, for logs and tests.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections accepted from the listener.
    pub accepted: AtomicU64,
    /// Connections forwarded to sandboxd.
    pub forwarded: AtomicU64,
    /// Connections refused before forwarding (not TLS, failed handshake, no h2, timeout,
    /// no connection slot free within the handshake timeout).
    pub refused: AtomicU64,
    /// Connections closed by the idle timeout.
    pub idle_closed: AtomicU64,
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainReport {
    /// Connections open when shutdown began.
    pub open_at_shutdown: usize,
    /// Connections cut at the drain bound.
    pub cut: usize,
}

struct Shared {
    acceptor: TlsAcceptor,
    /// Established (forwarding) connections; taken after the handshake.
    established: Arc<Semaphore>,
    max_connections: usize,
    upstream: SocketAddr,
    upstream_socket: Option<PathBuf>,
    /// Where connections go, for log lines (made once, not per connection).
    upstream_text: String,
    handshake_timeout: Duration,
    idle_timeout: Duration,
    epoch: Instant,
    log: LogBudget,
    counters: Arc<Counters>,
}

/// A bound terminator, ready to [`run`](Terminator::run).
pub struct Terminator {
    listener: TcpListener,
    cfg: TerminatorConfig,
    cert_dir: CertDir,
    client_ca: Option<ClientCaFile>,
    shared: Arc<Shared>,
}

impl Terminator {
    /// Reads the pair from the Secret directory (an unusable pair is an error) and binds the
    /// listen address.
    pub async fn bind(cfg: TerminatorConfig) -> Result<Terminator, TerminatorError> {
        let (cert_dir, summary) = CertDir::open(&cfg.cert_dir)?;
        tracing::info!(
            "serving certificate from {}: {summary}",
            cfg.cert_dir.display()
        );
        // At startup there is no previous pair to keep: an out-of-date one is served (every
        // client will refuse it) and said loudly, so the pod's log names the fault.
        if let Err(e) =
            crate::pem::check_validity(&cert_dir.cert().current().cert[0], SystemTime::now())
        {
            tracing::warn!(
                "{}: {e}; serving it until a valid pair is rotated in, and clients will refuse it",
                cfg.cert_dir.display()
            );
        }
        let client_ca = match &cfg.client_ca {
            Some(path) => {
                let (f, n) = ClientCaFile::open(path)?;
                tracing::info!(
                    "mutual TLS: clients must present a certificate chaining to one of {n} CA certificate(s) in {}",
                    path.display()
                );
                Some(f)
            }
            None => None,
        };
        let listener =
            TcpListener::bind(cfg.listen)
                .await
                .map_err(|source| TerminatorError::Bind {
                    addr: cfg.listen,
                    source,
                })?;
        let shared = Arc::new(Shared {
            acceptor: TlsAcceptor::from(server_config_with(
                cert_dir.cert(),
                client_ca.as_ref().map(ClientCaFile::verifier),
            )),
            established: Arc::new(Semaphore::new(cfg.max_connections)),
            max_connections: cfg.max_connections,
            upstream: cfg.upstream,
            upstream_socket: cfg.upstream_socket.clone(),
            upstream_text: match &cfg.upstream_socket {
                Some(p) => format!("unix:{}", p.display()),
                None => cfg.upstream.to_string(),
            },
            handshake_timeout: cfg.handshake_timeout,
            idle_timeout: cfg.idle_timeout,
            epoch: Instant::now(),
            log: LogBudget::new(Duration::from_secs(10), 20),
            counters: Arc::new(Counters::default()),
        });
        Ok(Terminator {
            listener,
            cfg,
            cert_dir,
            client_ca,
            shared,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The counters.
    pub fn counters(&self) -> Arc<Counters> {
        self.shared.counters.clone()
    }

    /// Serves until `shutdown` completes, then stops accepting and gives open connections
    /// up to the drain timeout before cutting them.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> DrainReport {
        let Terminator {
            listener,
            cfg,
            mut cert_dir,
            mut client_ca,
            shared,
        } = self;
        let reload = tokio::spawn(async move {
            let mut tick = tokio::time::interval(cfg.reload_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                match cert_dir.poll() {
                    ReloadOutcome::Reloaded(s) => tracing::info!(
                        "reloaded certificate from {}: {s}; new connections get it, open ones keep theirs",
                        cert_dir.dir().display()
                    ),
                    ReloadOutcome::Rejected(e) => tracing::error!(
                        "rotated certificate pair refused, still serving the previous one: {e}"
                    ),
                    ReloadOutcome::Unchanged | ReloadOutcome::Pending => {}
                    #[allow(unreachable_patterns)]
                    _ => {}
                }
                if let Some(ca) = client_ca.as_mut() {
                    match ca.poll() {
                        ClientCaReload::Reloaded(n) => tracing::info!(
                            "reloaded the client CA file {}: {n} CA certificate(s); new connections are checked against it",
                            ca.path().display()
                        ),
                        ClientCaReload::Rejected(e) => tracing::error!(
                            "the changed client CA file cannot be used, still checking clients against the previous one: {e}"
                        ),
                        _ => {}
                    }
                }
            }
        });
        // A handshake slot is taken before `accept` and given back once the connection
        // forwards (it then holds a connection slot instead) or is refused; connections
        // past the bound wait in the kernel's accept queue.
        let handshakes = Arc::new(Semaphore::new(cfg.max_handshakes));
        let mut conns = JoinSet::new();
        let mut backoff = plimsoll_listen::Backoff::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                permit = handshakes.clone().acquire_owned() => {
                    let permit = permit.expect("the semaphore is never closed");
                    tokio::select! {
                        _ = &mut shutdown => break,
                        accepted = listener.accept() => match accepted {
                            Ok((stream, peer)) => {
                                backoff.succeeded();
                                shared.counters.accepted.fetch_add(1, Ordering::Relaxed);
                                let shared = shared.clone();
                                conns.spawn(async move {
                                    serve_connection(stream, peer, &shared, permit).await;
                                });
                            }
                            Err(e) => {
                                // EMFILE and friends: do not spin; 50 ms doubling to 1 s.
                                let pause = backoff.failed();
                                limited_warn!(shared.log, "accept failed: {e}; pausing {pause:?}");
                                tokio::time::sleep(pause).await;
                            }
                        }
                    }
                }
            }
        }
        drop(listener);
        reload.abort();
        let open = conns.len();
        tracing::info!(
            "stopped accepting; draining {open} open connection(s) for up to {:?}",
            cfg.drain_timeout
        );
        let drained = tokio::time::timeout(cfg.drain_timeout, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        let cut = if drained.is_err() {
            let n = conns.len();
            conns.abort_all();
            tracing::warn!("drain bound reached: cut {n} connection(s)");
            n
        } else {
            0
        };
        DrainReport {
            open_at_shutdown: open,
            cut,
        }
    }
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    sh: &Shared,
    handshake_slot: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let deadline = tokio::time::Instant::now() + sh.handshake_timeout;
    let tls = match tokio::time::timeout_at(deadline, accept_tls(stream, &sh.acceptor)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(refused)) => {
            sh.counters.refused.fetch_add(1, Ordering::Relaxed);
            limited_warn!(sh.log, "refused {peer}: {refused}");
            return;
        }
        Err(_) => {
            sh.counters.refused.fetch_add(1, Ordering::Relaxed);
            limited_warn!(
                sh.log,
                "refused {peer}: TLS handshake not completed within {:?}; connection dropped",
                sh.handshake_timeout
            );
            return;
        }
    };
    // The handshake is done: the connection now needs one of the established slots. It
    // keeps its handshake slot while it waits, and waits no longer than the handshake bound.
    let _established = match tokio::time::timeout_at(
        deadline,
        sh.established.clone().acquire_owned(),
    )
    .await
    {
        Ok(permit) => permit.expect("the semaphore is never closed"),
        Err(_) => {
            sh.counters.refused.fetch_add(1, Ordering::Relaxed);
            limited_warn!(
                sh.log,
                "refused {peer}: all {} connection slots stayed busy for {:?} after the handshake; closed without forwarding",
                sh.max_connections,
                sh.handshake_timeout
            );
            return;
        }
    };
    drop(handshake_slot);
    let target = &sh.upstream_text;
    let upstream = match tokio::time::timeout(sh.handshake_timeout, connect_upstream(sh)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            limited_warn!(
                sh.log,
                "dropped {peer}: sandboxd at {target} refused the connection: {e}"
            );
            return;
        }
        Err(_) => {
            limited_warn!(
                sh.log,
                "dropped {peer}: sandboxd at {target} did not accept in time"
            );
            return;
        }
    };
    sh.counters.forwarded.fetch_add(1, Ordering::Relaxed);
    tracing::debug!("forwarding {peer} to {target}");

    let last = Arc::new(AtomicU64::new(sh.millis()));
    let mut client = Tracked {
        inner: tls,
        last: last.clone(),
        epoch: sh.epoch,
    };
    let mut server = Tracked {
        inner: upstream,
        last: last.clone(),
        epoch: sh.epoch,
    };
    let copy =
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, COPY_BUF, COPY_BUF);
    tokio::select! {
        r = copy => match r {
            Ok((up, down)) => tracing::debug!("closed {peer}: {up} bytes in, {down} bytes out"),
            Err(e) => tracing::debug!("closed {peer}: {e}"),
        },
        _ = idle_watch(&last, sh) => {
            sh.counters.idle_closed.fetch_add(1, Ordering::Relaxed);
            limited_warn!(sh.log, "closed {peer}: idle for {:?}", sh.idle_timeout);
        }
    }
}

/// sandboxd's side of a forwarded connection: its TCP port, or its terminator socket.
trait Upstream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Upstream for T {}

async fn connect_upstream(sh: &Shared) -> std::io::Result<Box<dyn Upstream>> {
    match &sh.upstream_socket {
        Some(p) => {
            let s = tokio::net::UnixStream::connect(p).await?;
            // The path lives in a folder others may be able to rename (a pod's /tmp is
            // often world-writable without the sticky bit): whatever answers there must
            // run as the terminator's own user, as sandboxd does, or nothing is forwarded.
            let me = nix::unistd::geteuid().as_raw();
            let peer = s.peer_cred()?;
            if peer.uid() != me {
                return Err(std::io::Error::other(format!(
                    "the socket is served by uid {}{}, not by sandboxd's uid {me}; something replaced sandboxd's socket, nothing is forwarded",
                    peer.uid(),
                    peer.pid().map_or(String::new(), |p| format!(" (pid {p})"))
                )));
            }
            Ok(Box::new(s))
        }
        None => {
            let s = TcpStream::connect(sh.upstream).await?;
            let _ = s.set_nodelay(true);
            Ok(Box::new(s))
        }
    }
}

/// Bytes buffered per direction: one full TLS record, so each read of the client side can
/// hold a whole record's plaintext and each write to it makes a full record.
const COPY_BUF: usize = 16 * 1024;

/// The screening in order: the first bytes must look like TLS, the handshake must succeed,
/// and the client must have agreed on `h2`. Nothing is forwarded before this returns `Ok`.
pub async fn accept_tls(
    stream: TcpStream,
    acceptor: &TlsAcceptor,
) -> Result<tokio_rustls::server::TlsStream<TcpStream>, Refused> {
    let mut first = [0u8; 24];
    let n = stream
        .peek(&mut first)
        .await
        .map_err(|e| Refused::Handshake(format!("read failed before the handshake: {e}")))?;
    match classify_prelude(&first[..n]) {
        Prelude::Tls => {}
        Prelude::Empty => {
            return Err(Refused::Handshake(
                "connection closed before any byte was sent".into(),
            ))
        }
        other => return Err(Refused::NotTls(other)),
    }
    let tls = acceptor.accept(stream).await.map_err(|e| {
        Refused::Handshake(
            match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                Some(re) => describe_server_error(re),
                None => e.to_string(),
            },
        )
    })?;
    check_established(tls.get_ref().1)?;
    Ok(tls)
}

impl Shared {
    fn millis(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// Resolves once no byte has moved in either direction for the idle timeout.
async fn idle_watch(last: &AtomicU64, sh: &Shared) {
    let idle = sh.idle_timeout.as_millis() as u64;
    loop {
        let since = sh.millis().saturating_sub(last.load(Ordering::Relaxed));
        if since >= idle {
            return;
        }
        tokio::time::sleep(Duration::from_millis(idle - since)).await;
    }
}

/// A stream that stamps the time of its last successful read.
struct Tracked<S> {
    inner: S,
    last: Arc<AtomicU64>,
    epoch: Instant,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let now = self.epoch.elapsed().as_millis() as u64;
            self.last.store(now, Ordering::Relaxed);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_config::MapEnv;

    #[test]
    fn env_defaults_and_errors_name_the_variable() {
        assert_eq!(
            TerminatorConfig::from_env(&MapEnv::default()).unwrap(),
            TerminatorConfig::default()
        );
        let m = MapEnv::from_pairs([
            (env::LISTEN, "127.0.0.5:0"),
            (env::UPSTREAM, "127.0.0.5:7000"),
            (env::MAX_CONNECTIONS, "3"),
            (env::MAX_HANDSHAKES, "5"),
            (env::HANDSHAKE_TIMEOUT_MS, "250"),
        ]);
        let c = TerminatorConfig::from_env(&m).unwrap();
        assert_eq!(c.listen, "127.0.0.5:0".parse().unwrap());
        assert_eq!(c.upstream, "127.0.0.5:7000".parse().unwrap());
        assert_eq!(c.max_connections, 3);
        assert_eq!(c.max_handshakes, 5);
        assert_eq!(c.handshake_timeout, Duration::from_millis(250));

        for (k, v) in [
            (env::UPSTREAM, "10.0.0.1:9091"),
            (env::LISTEN, "nope"),
            (env::IDLE_TIMEOUT_MS, "0"),
            (env::MAX_CONNECTIONS, "-1"),
            (env::MAX_HANDSHAKES, "0"),
        ] {
            let e = TerminatorConfig::from_env(&MapEnv::from_pairs([(k, v)])).unwrap_err();
            assert_eq!(e.name, k);
            assert!(e.to_string().contains(k));
        }
    }

    #[test]
    fn log_budget_drops_and_counts() {
        let b = LogBudget::new(Duration::from_secs(10), 2);
        let t0 = b.state.lock().unwrap().0;
        assert_eq!(b.admit_at(t0), Some(0));
        assert_eq!(b.admit_at(t0), Some(0));
        assert_eq!(b.admit_at(t0 + Duration::from_secs(1)), None);
        assert_eq!(b.admit_at(t0 + Duration::from_secs(2)), None);
        // A fresh window reports what was dropped.
        assert_eq!(b.admit_at(t0 + Duration::from_secs(11)), Some(2));
        assert_eq!(b.admit_at(t0 + Duration::from_secs(11)), Some(0));
    }
}
