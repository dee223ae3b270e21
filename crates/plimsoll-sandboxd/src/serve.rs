//! Serving the service on a TCP listener or a Unix socket, until a shutdown signal.

use std::future::Future;

use plimsoll_core::sandboxd_pb::sandboxd_server::SandboxdServer;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

use crate::service::{Authenticator, SandboxdService};

/// The service with its token check, as [`SandboxdService::into_server`] builds it.
pub type SandboxdRoute = InterceptedService<SandboxdServer<SandboxdService>, Authenticator>;

/// Serves on `listener` (TCP, no Nagle delay) until `shutdown` resolves; then stops
/// accepting and lets calls in flight finish.
pub async fn serve_tcp(
    listener: TcpListener,
    route: SandboxdRoute,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    Server::builder()
        .add_service(route)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Serves on a Unix socket, taking only connections whose peer runs as `uid` (checked
/// with the kernel's peer credentials on each accepted connection; others are closed
/// unanswered), until `shutdown` resolves. For the terminator's socket: only the
/// terminator, which runs as sandboxd's own user, may call without a token.
pub async fn serve_unix_for_uid(
    listener: UnixListener,
    uid: u32,
    route: SandboxdRoute,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    use tokio_stream::StreamExt;
    let incoming = UnixListenerStream::new(listener).filter(move |conn| match conn {
        Ok(stream) => match stream.peer_cred() {
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
        .add_service(route)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// Serves on a Unix socket until `shutdown` resolves.
pub async fn serve_unix(
    listener: UnixListener,
    route: SandboxdRoute,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    Server::builder()
        .add_service(route)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
}
