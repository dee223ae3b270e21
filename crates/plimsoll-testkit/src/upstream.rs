//! A recording HTTP/1.1 upstream on loopback (plain or TLS): every request that arrives is
//! kept (method, target, headers, body) for the test to read, and answered by a function
//! the test chooses.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The method.
    pub method: String,
    /// The request target as sent (path and query).
    pub target: String,
    /// The headers (lower-case names; a repeated name keeps its last value).
    pub headers: BTreeMap<String, String>,
    /// The body.
    pub body: Vec<u8>,
}

/// Every request the upstream received, in order.
pub type Log = Arc<Mutex<Vec<Seen>>>;

/// What the upstream answers.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// Headers to send (`content-type` among them when wanted).
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Reply {
    /// `status` with a JSON body.
    pub fn json(status: u16, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            headers: vec![("content-type", "application/json".to_owned())],
            body: body.into(),
        }
    }

    /// The same with one more header.
    pub fn with_header(mut self, name: &'static str, value: &str) -> Reply {
        self.headers.push((name, value.to_owned()));
        self
    }
}

/// How the upstream answers each request.
pub type Answer = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

/// A running upstream; it serves until the runtime it was started on ends.
#[derive(Clone)]
pub struct Upstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it received.
    pub log: Log,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Upstream {
    /// A plain HTTP upstream on 127.0.0.1.
    pub async fn plain(answer: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Upstream {
        Upstream::listen(None, Arc::new(answer)).await
    }

    /// An HTTPS upstream on 127.0.0.1 serving with `tls`.
    pub async fn tls(
        tls: Arc<rustls::ServerConfig>,
        answer: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
    ) -> Upstream {
        Upstream::listen(Some(tokio_rustls::TlsAcceptor::from(tls)), Arc::new(answer)).await
    }

    async fn listen(tls: Option<tokio_rustls::TlsAcceptor>, answer: Answer) -> Upstream {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream");
        let addr = l.local_addr().expect("the upstream's address");
        let log: Log = Default::default();
        let up = Upstream {
            addr,
            log: log.clone(),
        };
        tokio::spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else {
                    continue;
                };
                let _ = s.set_nodelay(true);
                let (tls, log, answer) = (tls.clone(), log.clone(), answer.clone());
                tokio::spawn(async move {
                    match tls {
                        None => serve_conn(s, log, answer).await,
                        // A failed handshake just drops that connection.
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(s).await {
                                serve_conn(s, log, answer).await;
                            }
                        }
                    }
                });
            }
        });
        up
    }

    /// What it received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

/// Serves HTTP/1.1 on one connection: records each request in `log`, answers with `answer`.
pub async fn serve_conn<S>(s: S, log: Log, answer: Answer)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let (log, answer) = (log.clone(), answer.clone());
        async move {
            let method = req.method().to_string();
            let target = req.uri().to_string();
            let headers = req
                .headers()
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
                .collect();
            let body = match req.into_body().collect().await {
                Ok(b) => b.to_bytes().to_vec(),
                Err(e) => return Err(e),
            };
            let seen = Seen {
                method,
                target,
                headers,
                body,
            };
            let reply = answer(&seen);
            log.lock().unwrap().push(seen);
            let mut r = hyper::Response::new(Full::new(Bytes::from(reply.body)));
            *r.status_mut() = hyper::StatusCode::from_u16(reply.status).expect("a status code");
            for (k, v) in reply.headers {
                r.headers_mut()
                    .append(k, v.parse().expect("a header value"));
            }
            Ok(r)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(s), svc)
        .await;
}
