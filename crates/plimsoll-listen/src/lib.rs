//! Doors with limits: every listener's connection cap, accept backoff, and per-connection
//! header and idle deadlines, written once.
//!
//! [`Incoming`] accepts from a TCP or Unix listener only while one of its connection slots
//! is free; beyond the cap, new connections wait in the kernel's listen backlog (they are
//! not accepted, so they hold no descriptor of the process) until a slot frees. Accept
//! errors (EMFILE, ENFILE, ENOBUFS, ...) pause the listener, 50 ms doubling to 1 s, with at
//! most one log line a second ([`Backoff`]). Each accepted stream is wrapped in a [`Conn`],
//! which holds its slot until it is dropped and fails its reads and writes (`TimedOut`, so
//! the server drops it) when
//!
//! - its first request has not reached the service within the header timeout (this bounds
//!   a TLS handshake, the HTTP/2 preface and the first request's headers together), or
//! - no request has been in flight on it for the idle timeout. Only requests count: bytes,
//!   HTTP/2 pings and settings frames do not keep a connection open.
//!
//! The service learns of requests through [`TrackLayer`] (tonic: the connection is found
//! through the connect info tonic puts into each request's extensions) or
//! [`Track::for_connection`] (a hyper server that serves one connection with one service).
//! A connection whose requests are not tracked never has one, so it is closed at the header
//! timeout: every server that uses [`Conn`] must track its requests.

mod backoff;
mod conn;
mod incoming;
mod track;

use std::time::Duration;

pub use backoff::{Backoff, LogLimit};
pub use conn::{Conn, Tracker};
pub use incoming::{Gauge, Incoming, Listener};
pub use track::{Track, TrackLayer, TrackedBody};

/// One listener's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once; beyond it new ones wait in the listen backlog.
    pub max_connections: usize,
    /// From accept to the first request reaching the service (TLS handshake, HTTP/2 preface
    /// and the first request's headers included).
    pub header_timeout: Duration,
    /// How long a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
}

/// Descriptors kept free for everything but connections: at least this many, and at least a
/// quarter of the soft `RLIMIT_NOFILE` (files, pipes, sockets of runs, the provider's own).
pub const DESCRIPTOR_RESERVE: u64 = 64;

impl Limits {
    /// The same limits with `max_connections` lowered, if needed, to `percent` of the
    /// descriptors the process may open beyond its reserve (the soft `RLIMIT_NOFILE` less
    /// the larger of [`DESCRIPTOR_RESERVE`] and a quarter of it), and to at least 1. A
    /// process with several listeners gives each a share, so that connections alone can
    /// never use up its descriptors.
    pub fn fit_to_descriptors(self, percent: u64) -> Limits {
        let fitted = fit(self.max_connections, soft_nofile(), percent);
        if fitted < self.max_connections {
            tracing::warn!(
                requested = self.max_connections,
                fitted,
                "connection cap lowered to fit the descriptor limit (RLIMIT_NOFILE)"
            );
        }
        Limits {
            max_connections: fitted,
            ..self
        }
    }
}

fn soft_nofile() -> Option<u64> {
    let (soft, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok()?;
    (soft != nix::sys::resource::RLIM_INFINITY).then_some(soft)
}

fn fit(requested: usize, soft: Option<u64>, percent: u64) -> usize {
    let Some(soft) = soft else {
        return requested.max(1);
    };
    let reserve = DESCRIPTOR_RESERVE.max(soft / 4);
    let budget = soft.saturating_sub(reserve) * percent.min(100) / 100;
    let budget = usize::try_from(budget).unwrap_or(usize::MAX);
    requested.min(budget).max(1)
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn the_cap_leaves_headroom_below_the_descriptor_limit() {
        // 1,024 descriptors: a quarter (256) is kept back, the listener gets its share of
        // the other 768.
        assert_eq!(fit(4096, Some(1024), 100), 768);
        assert_eq!(fit(4096, Some(1024), 50), 384);
        assert_eq!(fit(100, Some(1024), 50), 100);
        // Tiny limits keep 64 back and still allow one connection.
        assert_eq!(fit(10, Some(80), 100), 10);
        assert_eq!(fit(40, Some(80), 100), 16);
        assert_eq!(fit(10, Some(32), 100), 1);
        assert_eq!(fit(10, None, 100), 10);
    }
}
