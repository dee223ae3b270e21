//! Method overrides: the ways a request can ask an upstream framework to treat it as another
//! method than the one on its request line. Rails and Rack (`_method` in a form body),
//! Laravel and Symfony (`_method` in the form body, the query, or Laravel's JSON body),
//! and `X-HTTP-Method-Override` / `X-HTTP-Method` / `X-Method-Override` headers (ASP.NET,
//! Express's method-override, Google's APIs, Symfony) would let a call granted as `POST`
//! run the upstream's `DELETE` handler. The broker refuses every call that carries one, so
//! the method the grant judged is the method the upstream acts on.
//!
//! Names are compared the way the most permissive of those frameworks reads them: percent-
//! and `+`-decoded, leading spaces dropped and then, as PHP does, `.` and space read as `_`,
//! cut at a NUL or at `[` (`_method[]`), ASCII case ignored. Every scan is linear in the bytes it reads.

use http::HeaderMap;

/// Request headers that override the method in some framework. Refused whatever their
/// value (the relay never forwards them either).
pub const OVERRIDE_HEADERS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Where a method override was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Override {
    /// One of [`OVERRIDE_HEADERS`].
    #[error("the request carries a method-override header (X-HTTP-Method-Override, X-HTTP-Method or X-Method-Override)")]
    Header,
    /// A `_method` parameter in the query string.
    #[error("the query string carries a _method parameter (a method override)")]
    Query,
    /// A `_method` field in the body (form, multipart or a JSON object's top level).
    #[error("the request body carries a _method field (a method override)")]
    Body,
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent- and (for forms) `+`-decodes `s`; a malformed escape stays as written.
fn decode(s: &[u8], plus_is_space: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'%' => {
                if let (Some(h), Some(l)) = (
                    s.get(i + 1).copied().and_then(hex),
                    s.get(i + 2).copied().and_then(hex),
                ) {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b'+' if plus_is_space => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// Whether a decoded parameter name is `_method` as some framework would read it.
pub fn is_override_name(name: &[u8]) -> bool {
    let start = name
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(name.len());
    let name = &name[start..];
    let end = name
        .iter()
        .position(|&b| b == 0 || b == b'[')
        .unwrap_or(name.len());
    let name = &name[..end];
    const WANT: &[u8] = b"_method";
    name.len() == WANT.len()
        && name.iter().zip(WANT).all(|(&b, &w)| {
            let b = if b == b'.' || b == b' ' { b'_' } else { b };
            b.eq_ignore_ascii_case(&w)
        })
}

/// Whether an `application/x-www-form-urlencoded`-style string (a query, or a form body)
/// has a `_method` parameter. Pairs are split on `&` and `;`.
pub fn form_has_override(form: &[u8]) -> bool {
    form.split(|&b| b == b'&' || b == b';').any(|pair| {
        let name = pair.split(|&b| b == b'=').next().unwrap_or(pair);
        is_override_name(&decode(name, true))
    })
}

/// Whether a multipart body has a part named `_method`. Part boundaries are not trusted:
/// every line of the body that starts a `Content-Disposition` header is read, and its
/// `name` (or RFC 2231 `name*`) parameter is judged.
fn multipart_has_override(body: &[u8]) -> bool {
    body.split(|&b| b == b'\n').any(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let start = line
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(line.len());
        let line = &line[start..];
        const CD: &[u8] = b"content-disposition";
        if line.len() < CD.len() || !line[..CD.len()].eq_ignore_ascii_case(CD) {
            return false;
        }
        line[CD.len()..].split(|&b| b == b';').any(|param| {
            let mut kv = param.splitn(2, |&b| b == b'=');
            let key = kv.next().unwrap_or_default().trim_ascii();
            let Some(value) = kv.next() else {
                return false;
            };
            let value = value.trim_ascii();
            if key.eq_ignore_ascii_case(b"name") {
                let value = value.strip_prefix(b"\"").unwrap_or(value);
                let value = value.strip_suffix(b"\"").unwrap_or(value);
                // Escapes inside a quoted name (`\_method`) and percent-encoding are both
                // read as some parser would.
                let unescaped: Vec<u8> = value.iter().copied().filter(|&b| b != b'\\').collect();
                is_override_name(&unescaped) || is_override_name(&decode(&unescaped, false))
            } else if key.eq_ignore_ascii_case(b"name*") {
                // charset'language'percent-encoded
                let v = value.rsplit(|&b| b == b'\'').next().unwrap_or(value);
                is_override_name(&decode(v, false))
            } else {
                false
            }
        })
    })
}

/// Whether a JSON body is an object with a top-level `_method` key (Laravel reads JSON
/// bodies as input). A body that is not JSON has no such key.
fn json_has_override(body: &[u8]) -> bool {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(m)) => m.keys().any(|k| is_override_name(k.as_bytes())),
        _ => false,
    }
}

/// Checks a call's headers and its query string (without `?`).
pub fn check_head(headers: &HeaderMap, query: Option<&str>) -> Result<(), Override> {
    if OVERRIDE_HEADERS.iter().any(|h| headers.contains_key(*h)) {
        return Err(Override::Header);
    }
    if query.is_some_and(|q| form_has_override(q.as_bytes())) {
        return Err(Override::Query);
    }
    Ok(())
}

/// Checks a call's body as `name=value` pairs, as multipart part headers and as a JSON
/// object, whatever its `Content-Type` says: the broker cannot know how the upstream picks
/// its parser (Laravel reads JSON whenever the type contains `/json` or `+json`, Rack reads
/// a POST without a type as a form). Linear in the body's length.
pub fn check_body(body: &[u8]) -> Result<(), Override> {
    if !body.is_empty()
        && (form_has_override(body) || multipart_has_override(body) || json_has_override(body))
    {
        return Err(Override::Body);
    }
    Ok(())
}

/// Fuzz entry point: the first line is a query, the rest a body. Checks that the scans end
/// without panicking, and that a `_method=` pair appended to any query or body is caught.
pub fn fuzz_check(data: &[u8]) {
    let mut parts = data.splitn(2, |&b| b == b'\n');
    let query = parts.next().and_then(|q| std::str::from_utf8(q).ok());
    let body = parts.next().unwrap_or_default();
    let _ = check_head(&HeaderMap::new(), query);
    let _ = check_body(body);
    if let Some(q) = query {
        let with = format!("{q}&_method=DELETE");
        assert_eq!(
            check_head(&HeaderMap::new(), Some(&with)),
            Err(Override::Query)
        );
    }
    let mut with = body.to_vec();
    with.extend_from_slice(b"&_method=DELETE");
    assert_eq!(check_body(&with), Err(Override::Body));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_frameworks_read_them() {
        for n in [
            &b"_method"[..],
            b"_METHOD",
            b" _method",
            b".method",
            b"  _method",
            b"_method[]",
            b"_method[x]",
            b"_method\0junk",
        ] {
            assert!(is_override_name(n), "{:?}", String::from_utf8_lossy(n));
        }
        for n in [
            &b"method"[..],
            b"payment_method",
            b"_methods",
            b"_metho",
            b"",
        ] {
            assert!(!is_override_name(n), "{:?}", String::from_utf8_lossy(n));
        }
    }

    #[test]
    fn queries_forms_multipart_json_and_headers() {
        let none = HeaderMap::new();
        let q = |s: &str| check_head(&none, Some(s));
        assert_eq!(q("_method=DELETE"), Err(Override::Query));
        assert_eq!(q("a=1&%5Fmethod=DELETE"), Err(Override::Query));
        assert_eq!(q("a=1;+_method=DELETE"), Err(Override::Query));
        assert_eq!(q("a=1&.method=DELETE"), Err(Override::Query));
        assert_eq!(q("_method"), Err(Override::Query));
        assert_eq!(q("payment_method=card&method=x&q=_method"), Ok(()));
        assert_eq!(check_head(&none, None), Ok(()));
        let body = |b: &str| check_body(b.as_bytes());
        assert_eq!(body("a=1&_method=delete"), Err(Override::Body));
        assert_eq!(body("a=_method"), Ok(()));
        assert_eq!(body(""), Ok(()));
        let part = |name: &str| {
            format!("--X\r\nContent-Disposition: form-data; {name}\r\n\r\nDELETE\r\n--X--\r\n")
        };
        for name in [
            "name=\"_method\"",
            "name=_method",
            "NAME = \"_Method\"",
            "name=\"\\_method\"",
            "name*=UTF-8''%5Fmethod",
        ] {
            assert_eq!(body(&part(name)), Err(Override::Body), "{name}");
        }
        assert_eq!(body(&part("name=\"file\"; filename=\"_method\"")), Ok(()));
        assert_eq!(body(r#"{"_method":"DELETE"}"#), Err(Override::Body));
        assert_eq!(body(r#"{"data":{"_method":"x"},"text":"_method"}"#), Ok(()));
        // Read as a form whatever it claims to be: a JSON string holding a form pair is
        // refused too (the documented price of not trusting the content type).
        assert_eq!(body(r#"{"note":"x&_method=y"}"#), Err(Override::Body));
        for h in OVERRIDE_HEADERS {
            let mut m = HeaderMap::new();
            m.insert(h, "DELETE".parse().unwrap());
            assert_eq!(check_head(&m, None), Err(Override::Header), "{h}");
        }
        fuzz_check(b"a=1\n--X\r\ncontent-disposition: x");
        fuzz_check(b"\xff\n\xff");
    }
}
