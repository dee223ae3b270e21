//! An attacker's connections to a listener, for the tests of its limits (issue 35): idle
//! ones, slow ones sending a byte at a time, HTTP/2 ones that only ping (before or after one
//! call), each ending when the listener closed it.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// The HTTP/2 client preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame.
pub const SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
/// A PING frame.
pub const PING: [u8; 17] = [0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
/// The first bytes of a TLS ClientHello record: a handshake that never completes.
pub const TLS_HELLO_START: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc];

/// Reads (and throws away) until the peer closes: EOF or an error.
pub async fn until_closed<S: AsyncRead + Unpin>(mut s: S) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf).await {
        if n == 0 {
            return;
        }
    }
}

/// What an attacking connection does until the listener closes it.
#[derive(Debug, Clone, Copy)]
pub enum Attack {
    /// Connects and sends nothing.
    Idle,
    /// Sends these bytes one every 250 ms, then nothing.
    Slow(&'static [u8]),
    /// The HTTP/2 preface and settings, then a PING every 200 ms, never a request.
    Pings,
}

/// Opens one attacking connection to `addr` (the connect itself may wait in the listen
/// backlog); its task in `set` ends when the listener closed the connection.
pub async fn attack(set: &mut JoinSet<()>, addr: SocketAddr, how: Attack) {
    let s = TcpStream::connect(addr).await.expect("connect");
    let (r, mut w) = s.into_split();
    set.spawn(async move {
        let writer = tokio::spawn(async move {
            match how {
                Attack::Idle => {}
                Attack::Slow(bytes) => {
                    for b in bytes {
                        if w.write_all(&[*b]).await.is_err() {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                }
                Attack::Pings => {
                    let _ = w.write_all(PREFACE).await;
                    let _ = w.write_all(&SETTINGS).await;
                    while w.write_all(&PING).await.is_ok() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    return;
                }
            }
            // Keep the write half open (no FIN) until the task is aborted.
            std::future::pending::<()>().await;
            drop(w);
        });
        until_closed(r).await;
        writer.abort();
    });
}

/// Waits, at most `ceiling`, until every connection of `set` was closed by the listener;
/// how many were not closed by then.
pub async fn still_open_after(mut set: JoinSet<()>, ceiling: Duration) -> usize {
    let _ = tokio::time::timeout(ceiling, async {
        while let Some(r) = set.join_next().await {
            r.expect("an attacker task");
        }
    })
    .await;
    set.len()
}

/// An HTTP/2 connection over `io` that makes one gRPC call to `path` with an empty message
/// and no token, expects it refused (a non-zero `grpc-status`), then only pings; resolves
/// once the listener closed the connection.
pub async fn one_call_then_pings<T>(io: T, authority: &str, path: &str)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut send, mut conn) = h2::client::handshake(io).await.expect("h2 handshake");
    let mut pings = conn.ping_pong().expect("a ping handle");
    let conn = tokio::spawn(conn);
    let req = http::Request::post(format!("http://{authority}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a request");
    let (answer, mut body) = send.send_request(req, false).expect("send a request");
    body.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .expect("send the empty message");
    let answer = answer.await.expect("an answer");
    assert_eq!(answer.status(), 200);
    // A refusal may come as trailers-only (the status in the headers) or in trailers.
    let mut status = answer.headers().get("grpc-status").cloned();
    let mut body = answer.into_body();
    while let Some(chunk) = body.data().await {
        let _ = chunk;
    }
    if let Ok(Some(t)) = body.trailers().await {
        status = status.or_else(|| t.get("grpc-status").cloned());
    }
    assert!(
        status.is_some_and(|s| s != "0"),
        "the call without a token must be refused"
    );
    drop(send);
    let pinger = tokio::spawn(async move {
        while pings.ping(h2::Ping::opaque()).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let _ = conn.await;
    pinger.abort();
}
