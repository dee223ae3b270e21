//! The accept stream: a connection slot before each accept, a pause after each error.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

use crate::backoff::{Backoff, LogLimit};
use crate::conn::Conn;
use crate::Limits;

/// A listening socket [`Incoming`] can accept from.
pub trait Listener: Send + Unpin + 'static {
    /// An accepted stream.
    type Io: Send + 'static;
    /// Accepts one stream.
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Io>>;
}

impl Listener for TcpListener {
    type Io = TcpStream;
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<TcpStream>> {
        TcpListener::poll_accept(self, cx).map_ok(|(s, _)| {
            // Nagle's algorithm with the peer's delayed ACK holds a small answer ~40 ms.
            let _ = s.set_nodelay(true);
            s
        })
    }
}

impl Listener for UnixListener {
    type Io = UnixStream;
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<UnixStream>> {
        UnixListener::poll_accept(self, cx).map_ok(|(s, _)| s)
    }
}

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// Accepted connections under [`Limits`], as a stream for tonic's `serve_with_incoming` (or
/// a loop of one's own). It never yields an error: accept errors are logged (at most once a
/// second) and retried after a [`Backoff`] pause.
pub struct Incoming<L: Listener> {
    listener: L,
    limits: Limits,
    name: &'static str,
    slots: Arc<Semaphore>,
    acquiring: Option<Acquire>,
    slot: Option<OwnedSemaphorePermit>,
    pause: Option<Pin<Box<Sleep>>>,
    backoff: Backoff,
    log: LogLimit,
}

impl<L: Listener> Incoming<L> {
    /// Accepts from `listener` under `limits`; `name` (a variable or flag naming the
    /// listener) goes into its log lines.
    pub fn new(listener: L, limits: Limits, name: &'static str) -> Incoming<L> {
        Incoming {
            listener,
            limits,
            name,
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            acquiring: None,
            slot: None,
            pause: None,
            backoff: Backoff::new(),
            log: LogLimit::new(Duration::from_secs(1)),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A handle that tells how many connections are open.
    pub fn gauge(&self) -> Gauge {
        Gauge {
            slots: self.slots.clone(),
            max: self.limits.max_connections.max(1),
        }
    }

    /// The next connection under the limits.
    pub fn poll_conn(&mut self, cx: &mut Context<'_>) -> Poll<Conn<L::Io>> {
        loop {
            if let Some(p) = self.pause.as_mut() {
                std::task::ready!(p.as_mut().poll(cx));
                self.pause = None;
            }
            if self.slot.is_none() {
                let slots = &self.slots;
                let acquiring = self
                    .acquiring
                    .get_or_insert_with(|| Box::pin(slots.clone().acquire_owned()));
                let permit = std::task::ready!(acquiring.as_mut().poll(cx));
                self.acquiring = None;
                self.slot = Some(permit.expect("the slots are never closed"));
            }
            match std::task::ready!(self.listener.poll_accept(cx)) {
                Ok(io) => {
                    self.backoff.succeeded();
                    return Poll::Ready(Conn::new(io, &self.limits, self.slot.take()));
                }
                // The peer gave up before we accepted: nothing is wrong with the listener.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => {
                    let pause = self.backoff.failed();
                    if let Some(dropped) = self.log.admit() {
                        tracing::warn!(
                            listener = self.name,
                            error = %e,
                            pause_ms = pause.as_millis() as u64,
                            dropped,
                            "accept failed; pausing the listener"
                        );
                    }
                    self.pause = Some(Box::pin(tokio::time::sleep(pause)));
                }
            }
        }
    }

    /// The next connection under the limits.
    pub async fn accept(&mut self) -> Conn<L::Io> {
        std::future::poll_fn(|cx| self.poll_conn(cx)).await
    }
}

impl<L: Listener> tokio_stream::Stream for Incoming<L> {
    type Item = io::Result<Conn<L::Io>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_conn(cx).map(|c| Some(Ok(c)))
    }
}

/// How many of a listener's connection slots are taken.
#[derive(Debug, Clone)]
pub struct Gauge {
    slots: Arc<Semaphore>,
    max: usize,
}

impl Gauge {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}
