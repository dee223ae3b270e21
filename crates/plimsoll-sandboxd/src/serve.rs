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
