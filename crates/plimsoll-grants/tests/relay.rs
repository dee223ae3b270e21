//! The broker's relay against a real local upstream (plain HTTP and TLS with a CA made in
//! the test), over a loopback port and a Unix socket, with raw HTTP/1.1 requests so every
//! trick reaches the relay exactly as written.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use plimsoll_grants::{Endpoint, Grants, Outcome};
use plimsoll_testkit::ca::Ca;
use plimsoll_testkit::upstream::{self, Log, Seen, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn answer(seen: &Seen) -> upstream::Reply {
    let reply = if seen.target.starts_with("/big") {
        upstream::Reply::json(200, vec![b'x'; 100_000])
    } else {
        upstream::Reply::json(201, &br#"{"ok":true}"#[..])
    };
    reply.with_header("set-cookie", "session=upstream")
}

/// A plain HTTP upstream on loopback that records what arrives.
async fn upstream() -> (SocketAddr, Log) {
    let up = Upstream::plain(answer).await;
    (up.addr, up.log)
}

/// A TLS upstream with a certificate for 127.0.0.1 from a CA written to `dir/ca.pem`.
async fn tls_upstream(dir: &Path) -> (SocketAddr, Log) {
    let ca = Ca::new("relay test CA");
    ca.write(&dir.join("ca.pem"));
    let up = Upstream::tls(ca.leaf(&["127.0.0.1"]).server_config(&[]), answer).await;
    (up.addr, up.log)
}

struct Reply {
    status: u16,
    headers: String,
    body: String,
}

/// One raw HTTP/1.1 call to the relay, target sent exactly as given.
async fn call(
    ep: &Endpoint,
    secret: Option<&str>,
    method: &str,
    target: &str,
    body: &str,
) -> Reply {
    call_with(
        ep,
        secret,
        method,
        target,
        "content-type: application/json\r\n",
        body,
    )
    .await
}

/// [`call`] with `headers` (each line ending in `\r\n`) instead of the JSON content type.
async fn call_with(
    ep: &Endpoint,
    secret: Option<&str>,
    method: &str,
    target: &str,
    headers: &str,
    body: &str,
) -> Reply {
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nhost: relay\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    if let Some(s) = secret {
        req.push_str(&format!("x-plimsoll-grant-secret: {s}\r\n"));
    }
    req.push_str(headers);
    req.push_str("authorization: Bearer sandbox-made-this-up\r\ncookie: a=b\r\n\r\n");
    req.push_str(body);
    let mut out = Vec::new();
    match ep {
        Endpoint::Tcp(a) => {
            let mut s = tokio::net::TcpStream::connect(a).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            s.read_to_end(&mut out).await.unwrap();
        }
        Endpoint::Unix(p) => {
            let mut s = tokio::net::UnixStream::connect(p).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            s.read_to_end(&mut out).await.unwrap();
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Reply {
        status,
        headers: head.to_ascii_lowercase(),
        body: body.to_owned(),
    }
}

fn grants(profile: &str, env: &[(&str, &str)], dir: &Path) -> Grants {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let file = format!(r#"{{"version":1,"profiles":{{"p":{profile}}}}}"#);
    Grants::from_bytes(file.as_bytes(), dir, &|n| env.get(n).cloned()).unwrap()
}

const KEY: &str = "upstream-key-7f3a9c";

#[tokio::test]
async fn forwards_granted_calls_with_the_credential_and_refuses_the_rest() {
    let (addr, log) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let g = grants(
        &format!(
            r#"{{"base_url":"http://{addr}","routes":["GET /v1/items/{{id}}","POST /v1/items"],
            "allowed_callers":["c"],"credential":{{"env":"API_KEY"}}}}"#
        ),
        &[("API_KEY", KEY)],
        dir.path(),
    );
    let grant = g.grant("p", "c").unwrap();
    let relay = grant.open_loopback().await.unwrap();
    let ep = relay.endpoint().clone();
    let secret = relay.secret().to_owned();
    let env = relay.env();
    assert!(env
        .iter()
        .any(|(k, v)| k == "PLIMSOLL_GRANT_URL" && v.starts_with("http://127.0.0.1:")));
    assert!(!env.iter().any(|(_, v)| v.contains(KEY)));

    let ok = call(
        &ep,
        Some(&secret),
        "GET",
        "/v1/items/42?expand=all&q=%2F",
        "",
    )
    .await;
    assert_eq!(ok.status, 201);
    assert_eq!(ok.body, r#"{"ok":true}"#);
    assert!(!ok.headers.contains("set-cookie"), "{}", ok.headers);
    let posted = call(&ep, Some(&secret), "POST", "/v1/items", r#"{"a":1}"#).await;
    assert_eq!(posted.status, 201);

    for (method, target) in [
        ("GET", "/v1/other"),
        ("DELETE", "/v1/items/42"),
        ("GET", "/v1/items/../admin"),
        ("GET", "/v1/items/..%2Fadmin"),
        ("GET", "/v1/items/a%2fb"),
        ("GET", "/v1/items/%2e%2e"),
        ("GET", "/v1//items/1"),
        ("GET", "http://evil.example/v1/items/1"),
    ] {
        let r = call(&ep, Some(&secret), method, target, "").await;
        assert_eq!(r.status, 403, "{method} {target}: {}", r.body);
        assert!(
            r.headers.contains("x-plimsoll-broker: refused"),
            "{}",
            r.headers
        );
        assert!(
            !r.body.contains("admin") && !r.body.contains("evil"),
            "{}",
            r.body
        );
    }
    let no_secret = call(&ep, None, "GET", "/v1/items/1", "").await;
    assert_eq!(no_secret.status, 401);
    let wrong = call(&ep, Some(&"0".repeat(64)), "GET", "/v1/items/1", "").await;
    assert_eq!(wrong.status, 401);
    relay.close().await;

    let seen = log.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(
        (seen[0].method.as_str(), seen[0].target.as_str()),
        ("GET", "/v1/items/42?expand=all&q=%2F")
    );
    assert_eq!(seen[0].headers["authorization"], format!("Bearer {KEY}"));
    assert!(!seen[0].headers.contains_key("cookie"));
    assert_eq!(seen[1].body, br#"{"a":1}"#);
    assert_eq!(seen[1].headers["content-type"], "application/json");

    let t = grant.trace();
    let text = serde_json::to_string(&t).unwrap();
    assert!(
        !text.contains("42")
            && !text.contains("expand")
            && !text.contains("admin")
            && !text.contains(KEY),
        "{text}"
    );
    assert_eq!((t.forwarded, t.refused, t.unauthenticated), (2, 8, 2));
    assert_eq!(t.calls[0].route, "/v1/items/{id}");
    assert_eq!(t.calls[0].outcome, Outcome::Forwarded);
    assert_eq!(t.calls[3].route, "/v1/items/{id}");
    assert_eq!(t.calls[3].reason, Some("method_not_granted"));
    assert_eq!(t.calls[4].reason, Some("traversal"));
    assert_eq!(t.calls[5].reason, Some("forbidden_escape"));
    assert!(
        t.summary().contains("GET /v1/items/{id} 201 x1"),
        "{}",
        t.summary()
    );
}

#[tokio::test]
async fn tls_upstream_with_a_ca_file_and_a_unix_socket_relay() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, log) = tls_upstream(dir.path()).await;
    let g = grants(
        &format!(
            r#"{{"base_url":"https://{addr}","routes":["GET /secure"],"allowed_callers":["*"],
            "ca_file":"ca.pem","credential":{{"file":"key.txt","placement":"basic","username":"bot"}}}}"#
        ),
        &[],
        &{
            std::fs::write(dir.path().join("key.txt"), format!("{KEY}\n")).unwrap();
            dir.path().to_owned()
        },
    );
    let grant = g.grant("p", "anyone").unwrap();
    let sock = dir.path().join("relay.sock");
    let relay = grant.open_unix(&sock).await.unwrap();
    assert!(relay
        .env()
        .iter()
        .any(|(k, v)| k == "PLIMSOLL_GRANT_SOCKET" && v == sock.to_str().unwrap()));
    let r = call(relay.endpoint(), Some(relay.secret()), "GET", "/secure", "").await;
    assert_eq!(r.status, 201, "{}", r.body);
    relay.close().await;
    assert!(!sock.exists());
    let seen = log.lock().unwrap().clone();
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("bot:{KEY}"));
    assert_eq!(seen[0].headers["authorization"], format!("Basic {basic}"));
}

#[tokio::test]
async fn a_wrong_ca_fails_the_call_and_sends_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, log) = tls_upstream(dir.path()).await;
    // A second, unrelated CA.
    let other = tempfile::tempdir().unwrap();
    let _ = tls_upstream(other.path()).await;
    let g = grants(
        &format!(
            r#"{{"base_url":"https://{addr}","routes":["GET /secure"],"allowed_callers":["*"],
            "ca_file":"{}"}}"#,
            other.path().join("ca.pem").display()
        ),
        &[],
        dir.path(),
    );
    let grant = g.grant("p", "x").unwrap();
    let relay = grant.open_loopback().await.unwrap();
    let r = call(relay.endpoint(), Some(relay.secret()), "GET", "/secure", "").await;
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.body.contains("upstream_unreachable"));
    assert!(log.lock().unwrap().is_empty());
    assert_eq!(grant.trace().calls[0].outcome, Outcome::Failed);
}

#[tokio::test]
async fn limits_are_enforced() {
    let (addr, log) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let g = grants(
        &format!(
            r#"{{"base_url":"http://{addr}","routes":["POST /in","GET /big"],"allowed_callers":["*"],
            "limits":{{"calls_per_run":4,"request_bytes":10,"response_bytes":1000}}}}"#
        ),
        &[],
        dir.path(),
    );
    let grant = g.grant("p", "x").unwrap();
    let relay = grant.open_loopback().await.unwrap();
    let (ep, s) = (relay.endpoint().clone(), relay.secret().to_owned());
    assert_eq!(
        call(&ep, Some(&s), "POST", "/in", "0123456789")
            .await
            .status,
        201
    );
    assert_eq!(
        call(&ep, Some(&s), "POST", "/in", "0123456789a")
            .await
            .status,
        413
    );
    let big = call(&ep, Some(&s), "GET", "/big", "").await;
    assert_eq!(big.status, 502);
    assert!(big.body.contains("response_too_large") && !big.body.contains("xxxx"));
    assert_eq!(call(&ep, Some(&s), "GET", "/nope", "").await.status, 403);
    // The budget (4) is spent, by allowed and refused calls alike.
    let over = call(&ep, Some(&s), "POST", "/in", "1").await;
    assert_eq!(over.status, 429);
    assert!(over.body.contains("calls_per_run"));
    relay.close().await;
    // Only the first POST and the /big call reached the upstream.
    assert_eq!(log.lock().unwrap().len(), 2);
    let t = grant.trace();
    let reasons: Vec<_> = t.calls.iter().map(|c| c.reason.unwrap_or("-")).collect();
    assert_eq!(
        reasons,
        vec![
            "-",
            "request_too_large",
            "response_too_large",
            "not_granted",
            "calls_per_run"
        ]
    );
}

#[tokio::test]
async fn calls_in_flight_are_capped_and_close_cuts_them() {
    // An upstream that never answers.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let held2 = held.clone();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            held2.lock().unwrap().push(s);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let g = grants(
        &format!(
            r#"{{"base_url":"http://{addr}","routes":["GET /slow"],"allowed_callers":["*"],
            "limits":{{"calls_in_flight":1}}}}"#
        ),
        &[],
        dir.path(),
    );
    let grant = g.grant("p", "x").unwrap();
    let relay = grant.open_loopback().await.unwrap();
    let (ep, s) = (relay.endpoint().clone(), relay.secret().to_owned());
    let first = {
        let (ep, s) = (ep.clone(), s.clone());
        tokio::spawn(async move { call(&ep, Some(&s), "GET", "/slow", "").await })
    };
    // Wait until the first call is held by the upstream.
    for _ in 0..200 {
        if !held.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let second = call(&ep, Some(&s), "GET", "/slow", "").await;
    assert_eq!(second.status, 429);
    assert!(second.body.contains("calls_in_flight"));
    relay.close().await;
    // The held call is cut when the relay closes: the sandbox sees the connection end.
    let r = first.await.unwrap();
    assert_eq!(r.status, 0);
}

/// The method a Rails/Laravel/Symfony-style upstream acts on: for a POST, an override
/// header, a `_method` query parameter, or a `_method` field of a form, multipart or JSON
/// body.
fn honoured_method(
    method: &str,
    target: &str,
    headers: &BTreeMap<String, String>,
    body: &[u8],
) -> String {
    if method != "POST" {
        return method.to_owned();
    }
    for h in [
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
    ] {
        if let Some(v) = headers.get(h) {
            return v.to_ascii_uppercase();
        }
    }
    let form_value = |form: &str| {
        form.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            (k.replace("%5F", "_").replace("%5f", "_") == "_method").then(|| v.to_ascii_uppercase())
        })
    };
    if let Some(m) = target.split_once('?').and_then(|(_, q)| form_value(q)) {
        return m;
    }
    let text = String::from_utf8_lossy(body);
    let ct = headers
        .get("content-type")
        .map(String::as_str)
        .unwrap_or("");
    if ct.starts_with("application/x-www-form-urlencoded") {
        if let Some(m) = form_value(&text) {
            return m;
        }
    }
    if ct.starts_with("multipart/form-data") {
        if let Some((_, rest)) = text.split_once("name=\"_method\"\r\n\r\n") {
            return rest.lines().next().unwrap_or("").to_ascii_uppercase();
        }
    }
    // Laravel reads JSON whenever the type contains `/json` or `+json`.
    if ct.contains("/json") || ct.contains("+json") {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
            if let Some(m) = v.get("_method").and_then(|m| m.as_str()) {
                return m.to_ascii_uppercase();
            }
        }
    }
    method.to_owned()
}

/// A loopback upstream that honours method overrides, as Rails, Laravel and Symfony do,
/// and records which handler ran (`DELETE /v1/items/1`, `POST /v1/items/1`).
async fn honouring_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let handled: Arc<Mutex<Vec<String>>> = Default::default();
    let handled2 = handled.clone();
    let up = Upstream::plain(move |seen| {
        let acted = honoured_method(&seen.method, &seen.target, &seen.headers, &seen.body);
        let path = seen.target.split('?').next().unwrap_or("").to_owned();
        handled2.lock().unwrap().push(format!("{acted} {path}"));
        let status = if acted == "DELETE" { 204 } else { 201 };
        upstream::Reply {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    })
    .await;
    (up.addr, handled)
}

#[tokio::test]
async fn a_post_only_grant_cannot_reach_delete_through_a_method_override() {
    let (addr, handled) = honouring_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let g = grants(
        &format!(
            r#"{{"base_url":"http://{addr}","routes":["POST /v1/items/{{id}}"],"allowed_callers":["*"]}}"#
        ),
        &[],
        dir.path(),
    );
    let grant = g.grant("p", "x").unwrap();
    let relay = grant.open_loopback().await.unwrap();
    let (ep, s) = (relay.endpoint().clone(), relay.secret().to_owned());

    // The granted call itself goes through, and the upstream runs its POST handler.
    let json = "content-type: application/json\r\n";
    let plain = call_with(&ep, Some(&s), "POST", "/v1/items/1", json, r#"{"a":1}"#).await;
    assert_eq!(plain.status, 201, "{}", plain.body);
    assert_eq!(*handled.lock().unwrap(), vec!["POST /v1/items/1"]);
    handled.lock().unwrap().clear();

    let form = "content-type: application/x-www-form-urlencoded\r\n";
    let multipart = "content-type: multipart/form-data; boundary=B\r\n";
    let part = "--B\r\ncontent-disposition: form-data; name=\"_method\"\r\n\r\nDELETE\r\n--B--\r\n";
    let cases: [(&str, &str, &str, &str); 10] = [
        ("query", "/v1/items/1?_method=DELETE", json, ""),
        (
            "encoded query",
            "/v1/items/1?a=1&%5Fmethod=DELETE",
            json,
            "",
        ),
        (
            "X-HTTP-Method-Override",
            "/v1/items/1",
            "x-http-method-override: DELETE\r\n",
            "",
        ),
        (
            "X-HTTP-Method",
            "/v1/items/1",
            "X-HTTP-Method: DELETE\r\n",
            "",
        ),
        (
            "X-Method-Override",
            "/v1/items/1",
            "x-method-override: DELETE\r\n",
            "",
        ),
        ("form body", "/v1/items/1", form, "a=1&_method=DELETE"),
        ("encoded form body", "/v1/items/1", form, "%5Fmethod=DELETE"),
        ("multipart field", "/v1/items/1", multipart, part),
        ("JSON body", "/v1/items/1", json, r#"{"_method":"DELETE"}"#),
        (
            "JSON body under another type",
            "/v1/items/1",
            "content-type: text/plain; x=/json\r\n",
            r#"{"_method":"DELETE"}"#,
        ),
    ];
    let mut wrong = Vec::new();
    for (label, target, headers, body) in cases {
        let r = call_with(&ep, Some(&s), "POST", target, headers, body).await;
        let reached: Vec<String> = std::mem::take(&mut *handled.lock().unwrap());
        let refused = r.status == 403
            && r.body.contains("\"method_override\"")
            && r.headers.contains("x-plimsoll-broker: refused");
        if !refused || !reached.is_empty() {
            wrong.push(format!(
                "{label}: relay answered {}, upstream ran {reached:?}",
                r.status
            ));
        }
    }
    relay.close().await;
    assert!(
        wrong.is_empty(),
        "method overrides got through:\n{}",
        wrong.join("\n")
    );

    let t = grant.trace();
    assert_eq!((t.forwarded, t.refused), (1, 10));
    assert!(t.calls[1..]
        .iter()
        .all(|c| c.reason == Some("method_override") && c.route == "/v1/items/{id}"));
    // The refusal names no part of the query or body either.
    assert!(!serde_json::to_string(&t).unwrap().contains("DELETE"));
}

/// The relay's doors (issue 35): more idle connections than its cap and slow ones sending a
/// byte at a time are all closed (header timeout), a connection kept alive after a call is
/// closed once idle, and a granted call made behind them still gets through.
#[tokio::test]
async fn idle_and_slow_connections_are_closed_and_a_granted_call_still_passes() {
    use plimsoll_testkit::doors::{attack, still_open_after, until_closed, Attack};
    let ceiling = plimsoll_grants::relay::HEADER_TIMEOUT
        + plimsoll_grants::relay::IDLE_TIMEOUT
        + std::time::Duration::from_secs(30);
    let (addr, _log) = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let g = grants(
        &format!(
            r#"{{"base_url":"http://{addr}","routes":["GET /v1/items/{{id}}"],
            "allowed_callers":["c"],"credential":{{"env":"API_KEY"}}}}"#
        ),
        &[("API_KEY", KEY)],
        dir.path(),
    );
    let relay = g.grant("p", "c").unwrap().open_loopback().await.unwrap();
    let Endpoint::Tcp(at) = relay.endpoint().clone() else {
        panic!("a loopback relay")
    };
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..plimsoll_grants::relay::MAX_CONNECTIONS + 8 {
        attack(&mut set, at, Attack::Idle).await;
    }
    for _ in 0..2 {
        attack(&mut set, at, Attack::Slow(b"GET /v1/items/1 HTTP/1.1\r\n")).await;
    }
    // A call with the secret, then the connection kept alive and idle.
    let mut kept = tokio::net::TcpStream::connect(at).await.unwrap();
    kept.write_all(
        format!(
            "GET /v1/items/1 HTTP/1.1\r\nhost: relay\r\nx-plimsoll-grant-secret: {}\r\n\r\n",
            relay.secret()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(r#"{"ok":true}"#) {
        let n = tokio::time::timeout(ceiling, kept.read(&mut buf))
            .await
            .expect("the granted call is answered within the ceiling")
            .unwrap();
        assert!(n > 0, "closed before answering: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        String::from_utf8_lossy(&got).starts_with("HTTP/1.1 201"),
        "{got:?}"
    );
    tokio::time::timeout(ceiling, until_closed(kept))
        .await
        .expect("a kept-alive relay connection is closed once idle");
    assert_eq!(
        still_open_after(set, ceiling).await,
        0,
        "every idle and slow relay connection is closed"
    );
    relay.close().await;
}
