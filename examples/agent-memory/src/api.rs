//! The fake memory API: a real HTTP/1.1 server on a loopback port that stores short
//! memories and recalls them by id. Every call must carry `Authorization: Bearer <key>`;
//! it records what arrived (method, raw target, whether the key was presented) so the
//! example can show what the broker forwarded.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// One request as the API saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The method.
    pub method: String,
    /// The raw request target (path and query), as it arrived.
    pub target: String,
    /// Whether `Authorization: Bearer <key>` carried the right key.
    pub had_key: bool,
}

#[derive(Default)]
struct State {
    memories: BTreeMap<String, (String, String)>,
    seen: Vec<Seen>,
}

/// A running fake API.
pub struct FakeApi {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeApi {
    /// Starts the API on `127.0.0.1:<ephemeral>`, accepting only `key`.
    pub async fn start(key: String) -> std::io::Result<FakeApi> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state: Arc<Mutex<State>> = Default::default();
        let shared = state.clone();
        let expected = Arc::new(format!("Bearer {key}"));
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                let expected = expected.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        let expected = expected.clone();
                        async move { Ok::<_, Infallible>(handle(&state, &expected, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(FakeApi { addr, state, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request that reached it, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().expect("api state").seen.clone()
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn json(status: StatusCode, v: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn new_id() -> String {
    use rand::RngCore;
    let mut b = [0u8; 6];
    rand::rngs::OsRng.fill_bytes(&mut b);
    format!("mem-{}", hex::encode(b))
}

async fn handle(
    state: &Mutex<State>,
    expected: &str,
    req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().to_string(), |p| p.as_str().to_owned());
    let had_key = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .is_some_and(|v| v.as_bytes() == expected.as_bytes());
    state.lock().expect("api state").seen.push(Seen {
        method: method.to_string(),
        target: target.clone(),
        had_key,
    });
    if !had_key {
        return json(
            StatusCode::UNAUTHORIZED,
            serde_json::json!({"error": "missing or wrong API key"}),
        );
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": "body"}),
            )
        }
    };
    let path = target.split('?').next().unwrap_or("");
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (method.as_str(), segments.as_slice()) {
        ("POST", ["v1", "memories"]) => {
            let v: serde_json::Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(_) => {
                    return json(
                        StatusCode::BAD_REQUEST,
                        serde_json::json!({"error": "send JSON {key, text}"}),
                    )
                }
            };
            let (Some(key), Some(text)) = (v["key"].as_str(), v["text"].as_str()) else {
                return json(
                    StatusCode::BAD_REQUEST,
                    serde_json::json!({"error": "send JSON {key, text}"}),
                );
            };
            let id = new_id();
            state
                .lock()
                .expect("api state")
                .memories
                .insert(id.clone(), (key.to_owned(), text.to_owned()));
            json(
                StatusCode::CREATED,
                serde_json::json!({"id": id, "key": key, "text": text}),
            )
        }
        ("GET", ["v1", "memories", id]) => match state.lock().expect("api state").memories.get(*id)
        {
            Some((key, text)) => json(
                StatusCode::OK,
                serde_json::json!({"id": id, "key": key, "text": text}),
            ),
            None => json(
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "no such memory"}),
            ),
        },
        ("DELETE", ["v1", "memories", id]) => {
            state.lock().expect("api state").memories.remove(*id);
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
        ("GET", ["v1", "admin", "export"]) => {
            let all: Vec<_> = state
                .lock()
                .expect("api state")
                .memories
                .iter()
                .map(|(id, (k, t))| serde_json::json!({"id": id, "key": k, "text": t}))
                .collect();
            json(StatusCode::OK, serde_json::Value::Array(all))
        }
        _ => json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": "no such route"}),
        ),
    }
}
