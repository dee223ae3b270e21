//! Routes (method + path template) and the matcher the broker applies to every call.
//!
//! A template is `METHOD /literal/{param}/...`: `{param}` stands for exactly one non-empty
//! path segment, and nothing else in a template is variable. A request target is matched
//! only after [`check_target`] accepted it; everything it refuses (traversal, encoded slashes
//! or dots, double slashes, backslashes, control characters, non-canonical escapes, `;`
//! parameters) never reaches the upstream, whatever the grant says.

use std::fmt;

/// The methods a grant can name. Others (HEAD, OPTIONS, TRACE, CONNECT, extension methods)
/// are never forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// `GET`
    Get,
    /// `PUT`
    Put,
    /// `POST`
    Post,
    /// `DELETE`
    Delete,
    /// `PATCH`
    Patch,
}

impl Method {
    /// Every method, in the order routes are sorted.
    pub const ALL: [Method; 5] = [
        Method::Get,
        Method::Put,
        Method::Post,
        Method::Delete,
        Method::Patch,
    ];

    /// Parses an upper-case method name exactly (HTTP methods are case-sensitive).
    pub fn parse(s: &str) -> Option<Method> {
        Some(match s {
            "GET" => Method::Get,
            "PUT" => Method::Put,
            "POST" => Method::Post,
            "DELETE" => Method::Delete,
            "PATCH" => Method::Patch,
            _ => return None,
        })
    }

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
            Method::Post => "POST",
            Method::Delete => "DELETE",
            Method::Patch => "PATCH",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One segment of a template.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Segment {
    /// Must equal the request's segment byte for byte.
    Literal(String),
    /// Matches exactly one non-empty segment; the name is documentation only.
    Param(String),
}

/// A granted route: a method and a path template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    method: Method,
    template: String,
    segments: Vec<Segment>,
}

/// Why a route template was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("route {route:?}: {why}")]
pub struct RouteError {
    /// The route as written (truncated to 200 characters).
    pub route: String,
    /// What is wrong.
    pub why: String,
}

fn route_error(route: &str, why: impl Into<String>) -> RouteError {
    RouteError {
        route: route.chars().take(200).collect(),
        why: why.into(),
    }
}

/// Characters a literal template segment may hold, beyond ASCII letters and digits:
/// RFC 3986 unreserved characters and sub-delimiters except `;` (path parameters, which
/// some servers strip before routing), plus `:` and `@`.
const LITERAL_EXTRA: &[u8] = b"-._~!$&'()*+,=:@";

fn is_literal_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || LITERAL_EXTRA.contains(&b)
}

/// Whether `name` is a valid parameter name: 1..=64 of `[A-Za-z0-9_.-]`.
pub fn is_param_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// The longest path template accepted.
pub const MAX_TEMPLATE_BYTES: usize = 2048;

impl Route {
    /// Parses `"METHOD /path/{param}"` (one space between the two fields).
    pub fn parse(s: &str) -> Result<Route, RouteError> {
        let (m, path) = s
            .split_once(' ')
            .ok_or_else(|| route_error(s, "write it as \"METHOD /path\""))?;
        let method = Method::parse(m).ok_or_else(|| {
            route_error(
                s,
                "the method must be one of GET, PUT, POST, DELETE, PATCH (upper case)",
            )
        })?;
        Route::new(method, path).map_err(|e| route_error(s, e.why))
    }

    /// A route from a method and a path template.
    pub fn new(method: Method, path: &str) -> Result<Route, RouteError> {
        let err = |why: &str| route_error(&format!("{method} {path}"), why);
        if path.len() > MAX_TEMPLATE_BYTES {
            return Err(err("the template is longer than 2048 bytes"));
        }
        let Some(rest) = path.strip_prefix('/') else {
            return Err(err("the path must start with /"));
        };
        let mut segments = Vec::new();
        if !rest.is_empty() {
            let parts: Vec<&str> = rest.split('/').collect();
            for (i, part) in parts.iter().enumerate() {
                let last = i + 1 == parts.len();
                if part.is_empty() {
                    if last {
                        // A trailing slash is a literal empty last segment.
                        segments.push(Segment::Literal(String::new()));
                        continue;
                    }
                    return Err(err("empty segments (//) are not allowed"));
                }
                if let Some(inner) = part.strip_prefix('{') {
                    let Some(name) = inner.strip_suffix('}') else {
                        return Err(err(
                            "a {param} must be a whole segment (no text before or after it)",
                        ));
                    };
                    if !is_param_name(name) {
                        return Err(err("parameter names are 1 to 64 of A-Z a-z 0-9 _ . -"));
                    }
                    segments.push(Segment::Param(name.to_owned()));
                    continue;
                }
                if part.contains('{') || part.contains('}') {
                    return Err(err(
                        "a {param} must be a whole segment (no text before or after it)",
                    ));
                }
                if *part == "." || *part == ".." {
                    return Err(err("segments . and .. are not allowed"));
                }
                if !part.bytes().all(is_literal_byte) {
                    return Err(err(
                        "literal segments hold only letters, digits and -._~!$&'()*+,=:@ (no %, ;, spaces or other characters)",
                    ));
                }
                segments.push(Segment::Literal((*part).to_owned()));
            }
        }
        Ok(Route {
            method,
            template: path.to_owned(),
            segments,
        })
    }

    /// The method.
    pub fn method(&self) -> Method {
        self.method
    }
    /// The path template as written (`/v1/items/{id}`).
    pub fn template(&self) -> &str {
        &self.template
    }
    /// The segments.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The route's shape: the template with every parameter name erased. Two routes of one
    /// method and one shape match the same requests, so a grant may hold only one of them.
    pub fn shape(&self) -> String {
        let mut s = String::new();
        for seg in &self.segments {
            s.push('/');
            match seg {
                Segment::Literal(l) => s.push_str(l),
                Segment::Param(_) => s.push_str("{}"),
            }
        }
        if s.is_empty() {
            s.push('/');
        }
        s
    }

    fn matches_path(&self, path: &[&str]) -> bool {
        self.segments.len() == path.len()
            && self.segments.iter().zip(path).all(|(s, p)| match s {
                Segment::Literal(l) => l == p,
                Segment::Param(_) => !p.is_empty(),
            })
    }

    /// Orders routes so the most specific comes first: per segment, a literal before a
    /// parameter, left to right; then by template, then method.
    pub fn specificity_cmp(&self, other: &Route) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        for (a, b) in self.segments.iter().zip(&other.segments) {
            let o = match (a, b) {
                (Segment::Literal(x), Segment::Literal(y)) => x.cmp(y),
                (Segment::Literal(_), Segment::Param(_)) => Ordering::Less,
                (Segment::Param(_), Segment::Literal(_)) => Ordering::Greater,
                (Segment::Param(_), Segment::Param(_)) => Ordering::Equal,
            };
            if o != Ordering::Equal {
                return o;
            }
        }
        self.segments
            .len()
            .cmp(&other.segments.len())
            .then_with(|| self.template.cmp(&other.template))
            .then_with(|| self.method.cmp(&other.method))
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.template)
    }
}

/// Why a request target was refused before any route was consulted. The names are stable
/// and are what the trace and the relay's 403 body carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    /// Empty, not starting with `/`, or longer than [`MAX_TARGET_BYTES`].
    #[error("the target must be an absolute path of at most 8192 bytes")]
    Shape,
    /// A byte outside the allowed set (controls, spaces, `\`, `;`, non-ASCII, `#`...).
    #[error("the path holds a character that is not allowed")]
    Character,
    /// A `%` not followed by two hex digits.
    #[error("the path holds a malformed percent escape")]
    BadEscape,
    /// An escape of `/`, `\`, `.`, `%`, `;`, a control character, or of a character that
    /// needs no escape (non-canonical).
    #[error("the path holds a forbidden percent escape (encoded slash, dot, backslash, percent, semicolon, control or unreserved character)")]
    ForbiddenEscape,
    /// `//` inside the path.
    #[error("the path holds an empty segment (//)")]
    EmptySegment,
    /// A `.` or `..` segment.
    #[error("the path holds a . or .. segment")]
    DotSegment,
    /// The query is malformed or too long.
    #[error("the query string is malformed or longer than 4096 bytes")]
    Query,
}

impl TargetError {
    /// A short stable name (`traversal`, `encoded_separator`...).
    pub fn name(self) -> &'static str {
        match self {
            TargetError::Shape => "shape",
            TargetError::Character => "character",
            TargetError::BadEscape => "bad_escape",
            TargetError::ForbiddenEscape => "forbidden_escape",
            TargetError::EmptySegment => "empty_segment",
            TargetError::DotSegment => "traversal",
            TargetError::Query => "query",
        }
    }
}

/// The longest request target accepted.
pub const MAX_TARGET_BYTES: usize = 8192;
/// The longest query string accepted.
pub const MAX_QUERY_BYTES: usize = 4096;

/// A request target that passed [`check_target`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    /// The path, exactly as sent.
    pub path: &'a str,
    /// The path's segments (the part after the leading `/`, split on `/`).
    pub segments: Vec<&'a str>,
    /// The query string without `?`, if any (never matched, never traced).
    pub query: Option<&'a str>,
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~".contains(&b)
}

/// Checks a raw request target (`/path?query`) from the sandbox. What it accepts is what
/// the broker forwards, byte for byte.
///
/// The path may hold letters, digits, `-._~!$&'()*+,=:@` and percent escapes; an escape
/// must be well formed and must not encode `/`, `\`, `.`, `%`, `;`, a control character or a
/// character that needs no escape. No segment may be empty (except a trailing slash), `.` or
/// `..`. The query (after the first `?`) may hold the same characters plus `/`, `?`, `;`
/// and well-formed escapes of anything; it is forwarded but never matched or traced.
pub fn check_target(raw: &str) -> Result<Target<'_>, TargetError> {
    if raw.is_empty() || raw.len() > MAX_TARGET_BYTES || !raw.starts_with('/') {
        return Err(TargetError::Shape);
    }
    let (path, query) = match raw.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (raw, None),
    };
    let bytes = path.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex_val),
                bytes.get(i + 2).copied().and_then(hex_val),
            ) else {
                return Err(TargetError::BadEscape);
            };
            let d = h * 16 + l;
            if d < 0x20 || d == 0x7f || b"/\\.%;".contains(&d) || is_unreserved(d) {
                return Err(TargetError::ForbiddenEscape);
            }
            i += 3;
            continue;
        }
        if b != b'/' && !is_literal_byte(b) {
            return Err(TargetError::Character);
        }
        i += 1;
    }
    let rest = &path[1..];
    let segments: Vec<&str> = if rest.is_empty() {
        Vec::new()
    } else {
        rest.split('/').collect()
    };
    let n = segments.len();
    for (i, s) in segments.iter().enumerate() {
        if s.is_empty() && i + 1 != n {
            return Err(TargetError::EmptySegment);
        }
        if *s == "." || *s == ".." {
            return Err(TargetError::DotSegment);
        }
    }
    let query = match query {
        None => None,
        Some(q) => {
            check_query(q)?;
            (!q.is_empty()).then_some(q)
        }
    };
    Ok(Target {
        path,
        segments,
        query,
    })
}

fn check_query(q: &str) -> Result<(), TargetError> {
    if q.len() > MAX_QUERY_BYTES {
        return Err(TargetError::Query);
    }
    let bytes = q.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            if bytes.get(i + 1).copied().and_then(hex_val).is_none()
                || bytes.get(i + 2).copied().and_then(hex_val).is_none()
            {
                return Err(TargetError::Query);
            }
            i += 3;
            continue;
        }
        if !(is_literal_byte(b) || b"/?;".contains(&b)) {
            return Err(TargetError::Query);
        }
        i += 1;
    }
    Ok(())
}

/// The verdict on one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<'r> {
    /// The call matches this granted route.
    Allowed(&'r Route),
    /// The path matches this route's template, but the grant holds another method for it.
    WrongMethod(&'r Route),
    /// No granted template matches the path.
    Unmatched,
    /// The target was refused before matching.
    Refused(TargetError),
}

/// The routes of one grant, ordered most specific first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteSet {
    routes: Vec<Route>,
}

/// Why a set of routes was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteSetError {
    /// One route is malformed.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// Two routes of one method match the same requests.
    #[error("routes {first:?} and {second:?} match the same requests; keep one")]
    Duplicate {
        /// The first route.
        first: String,
        /// The second route.
        second: String,
    },
}

impl RouteSet {
    /// Builds a set from routes written as `"METHOD /path"`; duplicates (same method, same
    /// shape) are refused.
    pub fn parse<S: AsRef<str>>(routes: &[S]) -> Result<RouteSet, RouteSetError> {
        let routes = routes
            .iter()
            .map(|r| Route::parse(r.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        RouteSet::new(routes)
    }

    /// Builds a set; duplicates (same method, same shape) are refused.
    pub fn new(mut routes: Vec<Route>) -> Result<RouteSet, RouteSetError> {
        let mut seen = std::collections::HashMap::new();
        for r in &routes {
            if let Some(first) = seen.insert((r.method, r.shape()), r.to_string()) {
                return Err(RouteSetError::Duplicate {
                    first,
                    second: r.to_string(),
                });
            }
        }
        routes.sort_by(Route::specificity_cmp);
        Ok(RouteSet { routes })
    }

    /// The routes, most specific first.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Whether the set is empty (it then reaches nothing).
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Judges one call: `method` as sent, `target` the raw request target.
    pub fn judge(&self, method: &str, target: &str) -> Verdict<'_> {
        let t = match check_target(target) {
            Ok(t) => t,
            Err(e) => return Verdict::Refused(e),
        };
        self.judge_checked(method, &t)
    }

    /// Judges a target that already passed [`check_target`].
    pub fn judge_checked(&self, method: &str, t: &Target<'_>) -> Verdict<'_> {
        let method = Method::parse(method);
        let mut other_method = None;
        for r in &self.routes {
            if r.matches_path(&t.segments) {
                if Some(r.method) == method {
                    return Verdict::Allowed(r);
                }
                other_method.get_or_insert(r);
            }
        }
        match other_method {
            Some(r) => Verdict::WrongMethod(r),
            None => Verdict::Unmatched,
        }
    }
}

/// Fuzz entry point: parses `routes` (one per line) and judges `method target` against
/// them, checking the matcher's invariants. Panics only on a broken invariant.
pub fn fuzz_judge(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (routes, call) = text.split_once("\n\n").unwrap_or((text, "GET /"));
    let routes: Vec<&str> = routes.lines().collect();
    let Ok(set) = RouteSet::parse(&routes) else {
        return;
    };
    let (method, target) = call.split_once(' ').unwrap_or(("GET", call));
    match set.judge(method, target) {
        Verdict::Allowed(r) => {
            let t = check_target(target).expect("an allowed target passed the check");
            assert_eq!(r.method.as_str(), method);
            assert!(!t.path.contains("//"));
            assert!(!t.segments.iter().any(|s| *s == ".." || *s == "."));
            let lower = t.path.to_ascii_lowercase();
            assert!(!lower.contains("%2f") && !lower.contains("%2e") && !lower.contains("%5c"));
            assert!(!t.path.contains('\\') && !t.path.contains(';'));
        }
        Verdict::WrongMethod(r) => assert_ne!(Some(r.method), Method::parse(method)),
        Verdict::Unmatched | Verdict::Refused(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(routes: &[&str]) -> RouteSet {
        RouteSet::parse(routes).unwrap()
    }

    #[test]
    fn params_match_exactly_one_non_empty_segment() {
        let s = set(&["GET /v1/items/{id}", "POST /v1/items"]);
        assert!(
            matches!(s.judge("GET", "/v1/items/42"), Verdict::Allowed(r) if r.template() == "/v1/items/{id}")
        );
        assert_eq!(s.judge("GET", "/v1/items/42/x"), Verdict::Unmatched);
        assert!(
            matches!(s.judge("GET", "/v1/items"), Verdict::WrongMethod(r) if r.method() == Method::Post)
        );
        assert_eq!(s.judge("GET", "/v1/items/"), Verdict::Unmatched);
        assert!(matches!(s.judge("POST", "/v1/items"), Verdict::Allowed(_)));
        assert!(
            matches!(s.judge("DELETE", "/v1/items/1"), Verdict::WrongMethod(r) if r.template() == "/v1/items/{id}")
        );
        assert!(matches!(
            s.judge("get", "/v1/items/1"),
            Verdict::WrongMethod(_)
        ));
        assert!(matches!(
            s.judge("HEAD", "/v1/items/1"),
            Verdict::WrongMethod(_)
        ));
    }

    #[test]
    fn literal_beats_param_in_the_trace() {
        let s = set(&["GET /u/{name}", "GET /u/me"]);
        assert!(matches!(s.judge("GET", "/u/me"), Verdict::Allowed(r) if r.template() == "/u/me"));
        assert!(
            matches!(s.judge("GET", "/u/bob"), Verdict::Allowed(r) if r.template() == "/u/{name}")
        );
    }

    #[test]
    fn tricks_are_refused_before_matching() {
        let s = set(&["GET /files/{name}", "GET /files/{a}/{b}"]);
        for (t, e) in [
            ("/files/..", TargetError::DotSegment),
            ("/files/.", TargetError::DotSegment),
            ("/files/../admin", TargetError::DotSegment),
            ("/files/a%2Fb", TargetError::ForbiddenEscape),
            ("/files/a%2fb", TargetError::ForbiddenEscape),
            ("/files/%2e%2e", TargetError::ForbiddenEscape),
            ("/files/%2E", TargetError::ForbiddenEscape),
            ("/files/a%5Cb", TargetError::ForbiddenEscape),
            ("/files/%252F", TargetError::ForbiddenEscape),
            ("/files/%41", TargetError::ForbiddenEscape),
            ("/files/%00", TargetError::ForbiddenEscape),
            ("/files/a%3Bb", TargetError::ForbiddenEscape),
            ("/files//a", TargetError::EmptySegment),
            ("//files/a", TargetError::EmptySegment),
            ("/files/a\\b", TargetError::Character),
            ("/files/a;b", TargetError::Character),
            ("/files/a b", TargetError::Character),
            ("/files/a#b", TargetError::Character),
            ("/files/é", TargetError::Character),
            ("/files/%zz", TargetError::BadEscape),
            ("/files/%4", TargetError::BadEscape),
            ("files/a", TargetError::Shape),
            ("", TargetError::Shape),
            ("http://evil/files/a", TargetError::Shape),
            ("/files/a?x=%zz", TargetError::Query),
            ("/files/a?x=#", TargetError::Query),
        ] {
            assert_eq!(s.judge("GET", t), Verdict::Refused(e), "{t}");
        }
        // Escapes of characters that need one are fine, and queries are not matched.
        assert!(matches!(
            s.judge("GET", "/files/my%20doc"),
            Verdict::Allowed(_)
        ));
        assert!(matches!(
            s.judge("GET", "/files/a%C3%A9"),
            Verdict::Allowed(_)
        ));
        assert!(
            matches!(s.judge("GET", "/files/a?x=1&y=%2F/..;"), Verdict::Allowed(r) if r.template() == "/files/{name}")
        );
        assert!(
            matches!(s.judge("GET", "/files/a/b"), Verdict::Allowed(r) if r.template() == "/files/{a}/{b}")
        );
    }

    #[test]
    fn bad_templates_and_duplicates_are_refused() {
        for bad in [
            "GET",
            "GET v1",
            "get /v1",
            "HEAD /v1",
            "GET /v1//x",
            "GET /v1/{id}.json",
            "GET /v1/x{id}",
            "GET /v1/{}",
            "GET /v1/{a b}",
            "GET /v1/..",
            "GET /v1/a%2Fb",
            "GET /v1/a;b",
            "GET  /v1",
        ] {
            assert!(Route::parse(bad).is_err(), "{bad}");
        }
        let e = RouteSet::parse(&["GET /a/{x}", "GET /a/{y}"]).unwrap_err();
        assert!(matches!(e, RouteSetError::Duplicate { .. }), "{e}");
        assert!(RouteSet::parse(&["GET /a/{x}", "PUT /a/{y}"]).is_ok());
        assert!(Route::parse("GET /").unwrap().segments().is_empty());
        assert!(matches!(
            set(&["GET /"]).judge("GET", "/"),
            Verdict::Allowed(_)
        ));
        assert!(matches!(
            set(&["GET /a/"]).judge("GET", "/a/"),
            Verdict::Allowed(_)
        ));
    }

    #[test]
    fn fuzz_entry_takes_garbage() {
        for data in [
            &b""[..],
            b"\xff\xfe",
            b"GET /a/{x}\n\nGET /a/..",
            b"GET /a/{x}\nPOST /b\n\nPOST /b?x",
            b"\n\n\n",
            b"GET /{a}\n\nGET /%2e",
        ] {
            fuzz_judge(data);
        }
    }
}
