//! Serving the service on a TCP listener or a Unix socket, under a connection cap and the
//! header and idle deadlines (`plimsoll_listen`), until a shutdown signal.

use std::future::Future;
use std::time::Duration;

use plimsoll_core::sandboxd_pb::sandboxd_server::SandboxdServer;
use plimsoll_listen::{Incoming, Limits, TrackLayer};
use tokio::net::{TcpListener, UnixListener};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;

use crate::service::{Authenticator, SandboxdService};

/// The service with its token check, as [`SandboxdService::into_server`] builds it.
pub type SandboxdRoute = InterceptedService<SandboxdServer<SandboxdService>, Authenticator>;

/// A deadline that never comes (ten years): a listener's header or idle timeout turned off.
pub const NEVER: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// The limits of a listener whose connections come through the terminator (TCP, the
/// terminator's socket): 64 connections, 10 s to the first request, 600 s with no request
/// in flight. plimsolld's agentsandbox channel calls as soon as it connected, and keeps a
/// session's channel open with pings between calls: ten minutes is above the default session
/// idle time (`SANDBOX_SESSION_IDLE_MS`, five minutes), and a channel closed after it is
/// dialed again by the next call.
pub const DEFAULT_LIMITS: Limits = Limits {
    max_connections: 64,
    header_timeout: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(600),
};

/// The limits of the provider's per-run socket (`--unix-socket`): 64 connections and no
/// deadline, because plimsolld connects once when a sandbox is started or warmed, may call
/// first long after (a warm pool), and keeps that one connection for a whole session,
/// however idle (bwrap never redials).
pub const UNIX_SOCKET_LIMITS: Limits = Limits {
    max_connections: 64,
    header_timeout: NEVER,
    idle_timeout: NEVER,
};

/// Serves on `listener` (TCP, no Nagle delay) under `limits` until `shutdown` resolves;
/// then stops accepting and lets calls in flight finish.
pub async fn serve_tcp(
    listener: TcpListener,
    route: SandboxdRoute,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let incoming = Incoming::new(listener, limits.fit_to_descriptors(50), "--grpc-port");
    Server::builder()
        .layer(TrackLayer)
        .add_service(route)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Serves on a Unix socket under `limits`, taking only connections whose peer runs as `uid`
/// (checked with the kernel's peer credentials on each accepted connection; others are
/// closed unanswered), until `shutdown` resolves. For the terminator's socket: only the
/// terminator, which runs as sandboxd's own user, may call without a token.
pub async fn serve_unix_for_uid(
    listener: UnixListener,
    uid: u32,
    route: SandboxdRoute,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    use tokio_stream::StreamExt;
    let incoming = Incoming::new(
        listener,
        limits.fit_to_descriptors(25),
        "--terminator-socket",
    )
    .filter(move |conn| match conn {
        Ok(conn) => match conn.get_ref().peer_cred() {
            Ok(c) if c.uid() == uid => true,
            Ok(c) => {
                tracing::warn!(
                    peer_uid = c.uid(),
                    peer_pid = c.pid().unwrap_or(0),
                    "a connection to the terminator's socket from another user than the terminator's was closed"
                );
                false
            }
            Err(e) => {
                tracing::warn!("the peer of a connection to the terminator's socket cannot be read ({e}); closed");
                false
            }
        },
        Err(_) => true,
    });
    Server::builder()
        .layer(TrackLayer)
        .add_service(route)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Serves on a Unix socket under `limits` until `shutdown` resolves.
pub async fn serve_unix(
    listener: UnixListener,
    route: SandboxdRoute,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let incoming = Incoming::new(listener, limits.fit_to_descriptors(50), "--unix-socket");
    Server::builder()
        .layer(TrackLayer)
        .add_service(route)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
