//! One accepted connection: its slot, its request count and its header and idle deadlines.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

use crate::Limits;

#[derive(Debug)]
struct State {
    epoch: Instant,
    /// Requests begun on this connection.
    started: AtomicU64,
    /// Requests whose answer has not ended.
    in_flight: AtomicUsize,
    /// Milliseconds after `epoch` when `in_flight` last fell to 0.
    idle_since_ms: AtomicU64,
}

/// A connection's request count, shared by its [`Conn`] and the service that serves it. It is
/// tonic's connect info for a [`Conn`] (found in each request's extensions, wrapped in
/// `TlsConnectInfo` behind TLS).
#[derive(Debug, Clone)]
pub struct Tracker {
    state: Arc<State>,
}

impl Tracker {
    fn new() -> Tracker {
        Tracker {
            state: Arc::new(State {
                epoch: Instant::now(),
                started: AtomicU64::new(0),
                in_flight: AtomicUsize::new(0),
                idle_since_ms: AtomicU64::new(0),
            }),
        }
    }

    /// A request begins; it is in flight until the guard is dropped (when its answer ended).
    pub fn begin(&self) -> RequestGuard {
        self.state.started.fetch_add(1, Ordering::SeqCst);
        self.state.in_flight.fetch_add(1, Ordering::SeqCst);
        RequestGuard {
            state: self.state.clone(),
        }
    }

    /// Requests begun on the connection so far.
    pub fn requests(&self) -> u64 {
        self.state.started.load(Ordering::SeqCst)
    }
}

/// A request in flight on a tracked connection.
#[derive(Debug)]
pub struct RequestGuard {
    state: Arc<State>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        // The idle clock is set before the count falls, so a check that sees 0 in flight
        // also sees when the connection became idle.
        let ms = self.state.epoch.elapsed().as_millis() as u64;
        self.state.idle_since_ms.store(ms, Ordering::SeqCst);
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An accepted stream under its listener's [`Limits`]: it holds a connection slot until it
/// is dropped, and its reads and writes fail with `TimedOut` once its header or idle deadline
/// passed (the server then drops it, which closes the socket).
#[derive(Debug)]
pub struct Conn<S> {
    inner: S,
    tracker: Tracker,
    header_deadline: Instant,
    idle_timeout: Duration,
    timer: Pin<Box<Sleep>>,
    expired: Option<&'static str>,
    _slot: Option<OwnedSemaphorePermit>,
}

impl<S> Conn<S> {
    /// `inner` under `limits`, its deadlines counted from now; `slot` is given back when
    /// the connection is dropped.
    pub fn new(inner: S, limits: &Limits, slot: Option<OwnedSemaphorePermit>) -> Conn<S> {
        let header_deadline = Instant::now() + limits.header_timeout;
        Conn {
            inner,
            tracker: Tracker::new(),
            header_deadline,
            idle_timeout: limits.idle_timeout,
            timer: Box::pin(tokio::time::sleep_until(header_deadline)),
            expired: None,
            _slot: slot,
        }
    }

    /// The stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The connection's request count, for a service that serves this connection alone
    /// ([`crate::Track::for_connection`]).
    pub fn tracker(&self) -> Tracker {
        self.tracker.clone()
    }

    /// Fails once a deadline passed; otherwise arms the timer for the next check.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            if let Some(why) = self.expired {
                return Err(io::Error::new(io::ErrorKind::TimedOut, why));
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
            let now = Instant::now();
            let st = &self.tracker.state;
            let next = if st.started.load(Ordering::SeqCst) == 0 {
                if now >= self.header_deadline {
                    self.expire("no request within the header timeout");
                    continue;
                }
                self.header_deadline
            } else if st.in_flight.load(Ordering::SeqCst) > 0 {
                now + self.idle_timeout
            } else {
                let since =
                    st.epoch + Duration::from_millis(st.idle_since_ms.load(Ordering::SeqCst));
                let deadline = since + self.idle_timeout;
                if now >= deadline {
                    self.expire("no request in flight for the idle timeout");
                    continue;
                }
                deadline
            };
            self.timer.as_mut().reset(next);
        }
    }

    fn expire(&mut self, why: &'static str) {
        tracing::debug!("connection closed: {why}");
        self.expired = Some(why);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Conn<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Conn<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S> tonic::transport::server::Connected for Conn<S> {
    type ConnectInfo = Tracker;

    fn connect_info(&self) -> Tracker {
        self.tracker.clone()
    }
}
