//! The per-run relay: plain HTTP/1.1 on a loopback port or a Unix socket, reachable only
//! with the run's random secret. Each call is checked against the grant, the credential is
//! attached, and the call is forwarded to the upstream; the answer's status, content type
//! and body (capped) go back. Every call leaves a row in the run's trace.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::{JoinHandle, JoinSet};

use crate::method_override;
use crate::route::{check_target, Verdict};
use crate::trace::{method_name, Call, Outcome, UNMATCHED};
use crate::{env_names, RunState};

/// The header the sandbox's client presents the run's relay secret in.
pub const SECRET_HEADER: &str = "x-plimsoll-grant-secret";
/// Set to `refused` on every answer the broker made itself (not the upstream's).
pub const BROKER_HEADER: &str = "x-plimsoll-broker";

/// Connections one relay serves at once; more wait in the listen backlog until one closes.
pub const MAX_CONNECTIONS: usize = 32;
/// How long one forwarded call (headers and body of the answer) may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the relay waits for a request's headers (a connection's first, and each next).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may stay open with no call in flight.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Every relay's limits ([`MAX_CONNECTIONS`], [`HEADER_TIMEOUT`], [`IDLE_TIMEOUT`]).
pub const LIMITS: plimsoll_listen::Limits = plimsoll_listen::Limits {
    max_connections: MAX_CONNECTIONS,
    header_timeout: HEADER_TIMEOUT,
    idle_timeout: IDLE_TIMEOUT,
};

/// Where a relay listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A loopback TCP port.
    Tcp(SocketAddr),
    /// A Unix socket.
    Unix(PathBuf),
}

/// A run's open relay. Dropping it without [`Relay::close`] also stops it.
#[derive(Debug)]
pub struct Relay {
    endpoint: Endpoint,
    secret: String,
    profile: String,
    accept: Option<JoinHandle<()>>,
}

impl Relay {
    /// Where it listens.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The run's relay secret (not the upstream credential). Give it only to the run.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The variables a run's programs need to find the relay: `PLIMSOLL_GRANT_URL` (TCP) or
    /// `PLIMSOLL_GRANT_SOCKET` (Unix), `PLIMSOLL_GRANT_SECRET`, `PLIMSOLL_GRANT_PROFILE`.
    /// For a Unix socket mounted elsewhere inside a wall, replace the socket's path.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut v = match &self.endpoint {
            Endpoint::Tcp(a) => vec![(env_names::URL.to_owned(), format!("http://{a}"))],
            Endpoint::Unix(p) => vec![(
                env_names::SOCKET.to_owned(),
                p.to_string_lossy().into_owned(),
            )],
        };
        v.push((env_names::SECRET.to_owned(), self.secret.clone()));
        v.push((env_names::PROFILE.to_owned(), self.profile.clone()));
        v
    }

    /// Stops the relay: no new connection is accepted and calls in flight are cut. The
    /// run's grant ends with its code.
    pub async fn close(mut self) {
        if let Some(task) = self.accept.take() {
            task.abort();
            let _ = task.await;
        }
        if let Endpoint::Unix(p) = &self.endpoint {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(task) = self.accept.take() {
            task.abort();
        }
    }
}

fn new_secret() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex::encode(b)
}

pub(crate) async fn open_tcp(state: Arc<RunState>) -> std::io::Result<Relay> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let secret = new_secret();
    let profile = state.profile.spec.name.clone();
    let shared = Arc::new(Shared {
        state,
        secret: secret.clone(),
    });
    let accept = tokio::spawn(serve(
        plimsoll_listen::Incoming::new(listener, LIMITS, "grant relay (TCP)"),
        shared,
    ));
    Ok(Relay {
        endpoint: Endpoint::Tcp(addr),
        secret,
        profile,
        accept: Some(accept),
    })
}

pub(crate) async fn open_unix(state: Arc<RunState>, path: &Path) -> std::io::Result<Relay> {
    let listener = tokio::net::UnixListener::bind(path)?;
    let secret = new_secret();
    let profile = state.profile.spec.name.clone();
    let shared = Arc::new(Shared {
        state,
        secret: secret.clone(),
    });
    let accept = tokio::spawn(serve(
        plimsoll_listen::Incoming::new(listener, LIMITS, "grant relay (Unix socket)"),
        shared,
    ));
    Ok(Relay {
        endpoint: Endpoint::Unix(path.to_owned()),
        secret,
        profile,
        accept: Some(accept),
    })
}

struct Shared {
    state: Arc<RunState>,
    secret: String,
}

/// Serves the relay's connections under [`LIMITS`]: beyond the cap new ones wait in the
/// backlog; a connection is closed when its first request's headers are not in within
/// [`HEADER_TIMEOUT`] or no call was in flight for [`IDLE_TIMEOUT`]; accept errors pause
/// the listener (`plimsoll_listen`). Ends (cutting every connection) when aborted.
async fn serve<L: plimsoll_listen::Listener>(
    mut incoming: plimsoll_listen::Incoming<L>,
    shared: Arc<Shared>,
) where
    L::Io: AsyncRead + AsyncWrite + Unpin,
{
    let mut conns = JoinSet::new();
    loop {
        let conn = tokio::select! {
            conn = incoming.accept() => conn,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let shared = shared.clone();
        let svc = tower::service_fn(move |req| {
            let shared = shared.clone();
            async move { Ok::<_, Infallible>(handle(&shared, req).await) }
        });
        let svc = hyper_util::service::TowerToHyperService::new(
            plimsoll_listen::Track::for_connection(svc, conn.tracker()),
        );
        conns.spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(64 * 1024)
                .serve_connection(TokioIo::new(conn), svc)
                .await;
        });
    }
}

fn secret_ok(presented: Option<&HeaderValue>, expected: &str) -> bool {
    let Some(p) = presented else { return false };
    let (a, b) = (p.as_bytes(), expected.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A JSON answer the broker makes itself.
fn refusal(status: StatusCode, reason: &str, message: &str, route: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"error": reason, "message": message, "route": route});
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut()
        .insert(BROKER_HEADER, HeaderValue::from_static("refused"));
    r
}

/// A header value the broker passes on (content types): visible ASCII and spaces, at most
/// 256 bytes.
fn clean_header(v: Option<&HeaderValue>) -> Option<HeaderValue> {
    let v = v?;
    let ok = v.len() <= 256 && v.as_bytes().iter().all(|b| (0x20..0x7f).contains(b));
    ok.then(|| v.clone())
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let state = &shared.state;
    if !secret_ok(req.headers().get(SECRET_HEADER), &shared.secret) {
        state.trace.lock().expect("trace lock").unauthenticated += 1;
        return refusal(
            StatusCode::UNAUTHORIZED,
            "relay_secret",
            "present the run's PLIMSOLL_GRANT_SECRET in the x-plimsoll-grant-secret header",
            UNMATCHED,
        );
    }
    let method = method_name(req.method().as_str());
    let mut row = Call {
        method,
        route: UNMATCHED.to_owned(),
        status: 0,
        upstream_status: None,
        outcome: Outcome::Refused,
        reason: None,
        request_bytes: 0,
        response_bytes: 0,
    };
    let resp = forward(state, req, &mut row).await;
    row.status = resp.status().as_u16();
    if row.outcome == Outcome::Forwarded {
        row.response_bytes = resp.body().size_hint().exact().unwrap_or(0);
    }
    state.trace.lock().expect("trace lock").push(row);
    resp
}

fn refuse(
    row: &mut Call,
    status: StatusCode,
    reason: &'static str,
    message: &str,
) -> Response<Full<Bytes>> {
    row.reason = Some(reason);
    row.outcome = Outcome::Refused;
    refusal(status, reason, message, &row.route)
}

async fn forward(
    state: &RunState,
    req: Request<Incoming>,
    row: &mut Call,
) -> Response<Full<Bytes>> {
    let profile = &state.profile;
    let limits = profile.spec.limits;
    // Every attempt counts against the run's budget, allowed or not.
    let n = state.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n > limits.calls_per_run {
        return refuse(
            row,
            StatusCode::TOO_MANY_REQUESTS,
            "calls_per_run",
            "this run used every call its grant allows",
        );
    }
    let Ok(_permit) = state.in_flight.clone().try_acquire_owned() else {
        return refuse(
            row,
            StatusCode::TOO_MANY_REQUESTS,
            "calls_in_flight",
            "too many calls of this run are in flight; wait for one to finish",
        );
    };
    // Only origin-form targets (`/path?query`); an absolute URI names no route.
    let target = match (req.uri().scheme(), req.uri().path_and_query()) {
        (None, Some(pq)) => pq.as_str().to_owned(),
        _ => {
            return refuse(
                row,
                StatusCode::FORBIDDEN,
                "shape",
                "send an origin-form path (/v1/...), not an absolute URL",
            )
        }
    };
    let checked = match check_target(&target) {
        Ok(t) => t,
        Err(e) => return refuse(row, StatusCode::FORBIDDEN, e.name(), &e.to_string()),
    };
    let route = match profile
        .spec
        .routes
        .judge_checked(req.method().as_str(), &checked)
    {
        Verdict::Allowed(r) => r,
        Verdict::WrongMethod(r) => {
            row.route = r.template().to_owned();
            return refuse(
                row,
                StatusCode::FORBIDDEN,
                "method_not_granted",
                "the grant does not allow this method on this route",
            );
        }
        Verdict::Unmatched => {
            return refuse(
                row,
                StatusCode::FORBIDDEN,
                "not_granted",
                "the grant does not list this route",
            )
        }
        Verdict::Refused(e) => return refuse(row, StatusCode::FORBIDDEN, e.name(), &e.to_string()),
    };
    row.route = route.template().to_owned();
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.request_bytes) {
        return refuse(
            row,
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            "the request body is over the grant's request_bytes",
        );
    }
    if let Err(e) = method_override::check_head(req.headers(), checked.query) {
        return refuse(
            row,
            StatusCode::FORBIDDEN,
            "method_override",
            &e.to_string(),
        );
    }
    let content_type = clean_header(req.headers().get(header::CONTENT_TYPE));
    let accept = clean_header(req.headers().get(header::ACCEPT));
    let method = req.method().clone();
    let body = match Limited::new(req.into_body(), limits.request_bytes as usize)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return refuse(
                row,
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                "the request body is over the grant's request_bytes",
            )
        }
        Err(_) => {
            return refuse(
                row,
                StatusCode::BAD_REQUEST,
                "request_body",
                "the request body could not be read",
            )
        }
    };
    row.request_bytes = body.len() as u64;
    if let Err(e) = method_override::check_body(&body) {
        return refuse(
            row,
            StatusCode::FORBIDDEN,
            "method_override",
            &e.to_string(),
        );
    }

    let uri = format!("{}{}", profile.spec.origin, checked.path)
        + &checked.query.map(|q| format!("?{q}")).unwrap_or_default();
    let mut up = Request::builder().method(method).uri(&uri);
    {
        let h = up.headers_mut().expect("builder is valid");
        h.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("plimsoll-broker/", env!("CARGO_PKG_VERSION"))),
        );
        h.insert(
            header::ACCEPT,
            accept.unwrap_or(HeaderValue::from_static("*/*")),
        );
        if !body.is_empty() {
            h.insert(
                header::CONTENT_TYPE,
                content_type.unwrap_or(HeaderValue::from_static("application/octet-stream")),
            );
        }
        if let Some((name, value)) = &profile.auth_header {
            h.insert(name.clone(), value.clone());
        }
    }
    let up = match up.body(Full::new(body)) {
        // The URI must still be exactly origin + target: nothing re-encoded or normalised.
        Ok(r) if r.uri().path_and_query().map(|p| p.as_str()) == Some(target.as_str()) => r,
        _ => {
            return refuse(
                row,
                StatusCode::FORBIDDEN,
                "shape",
                "the target cannot be forwarded unchanged",
            )
        }
    };
    row.outcome = Outcome::Failed;
    let fail = |row: &mut Call, reason: &'static str, message: &str| {
        row.reason = Some(reason);
        row.outcome = Outcome::Failed;
        let mut r = refusal(StatusCode::BAD_GATEWAY, reason, message, &row.route);
        r.headers_mut()
            .insert(BROKER_HEADER, HeaderValue::from_static("failed"));
        r
    };
    let call = async {
        let resp = profile
            .client
            .request(up)
            .await
            .map_err(|_| "upstream_unreachable")?;
        let status = resp.status();
        let ct = clean_header(resp.headers().get(header::CONTENT_TYPE));
        let declared = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limits.response_bytes) {
            return Err("response_too_large");
        }
        let body = Limited::new(resp.into_body(), limits.response_bytes as usize)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    "response_too_large"
                } else {
                    "upstream_body"
                }
            })?
            .to_bytes();
        Ok::<_, &'static str>((status, ct, body))
    };
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Err(_) => fail(
            row,
            "upstream_timeout",
            "the upstream did not answer in time",
        ),
        Ok(Err(reason)) => {
            let msg = match reason {
                "response_too_large" => "the upstream's answer is over the grant's response_bytes",
                "upstream_unreachable" => "the upstream could not be reached",
                _ => "the upstream's answer could not be read",
            };
            fail(row, reason, msg)
        }
        Ok(Ok((status, ct, body))) => {
            row.outcome = Outcome::Forwarded;
            row.upstream_status = Some(status.as_u16());
            let mut r = Response::new(Full::new(body));
            *r.status_mut() = status;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                ct.unwrap_or(HeaderValue::from_static("application/octet-stream")),
            );
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_exactly() {
        let s = "ab".repeat(32);
        assert!(secret_ok(Some(&HeaderValue::from_str(&s).unwrap()), &s));
        assert!(!secret_ok(Some(&HeaderValue::from_static("ab")), &s));
        assert!(!secret_ok(None, &s));
        let mut wrong = s.clone();
        wrong.replace_range(0..1, "c");
        assert!(!secret_ok(
            Some(&HeaderValue::from_str(&wrong).unwrap()),
            &s
        ));
        assert_eq!(new_secret().len(), 64);
        assert_ne!(new_secret(), new_secret());
    }

    #[test]
    fn only_clean_content_types_pass() {
        assert!(clean_header(Some(&HeaderValue::from_static("application/json"))).is_some());
        assert!(clean_header(Some(&HeaderValue::from_bytes(b"a\tb").unwrap())).is_none());
        assert!(clean_header(Some(&HeaderValue::from_str(&"a".repeat(300)).unwrap())).is_none());
    }
}
