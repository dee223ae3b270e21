//! The grants file (`PLIMSOLL_GRANTS_FILE`): JSON, versioned, strict.
//!
//! Parsing ([`GrantsFile::parse`]) is pure, so it can be fuzzed and unit-tested; resolving
//! credentials and CA files (I/O) happens in [`crate::Grants::load`].

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::route::{RouteSet, RouteSetError};

/// The only format version this build reads.
pub const FORMAT_VERSION: u32 = 1;

/// Why a grants file (or one profile in it) was refused. The message names the profile and
/// the field; it never holds a credential's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrantsError(pub String);

impl GrantsError {
    pub(crate) fn in_profile(name: &str, why: impl fmt::Display) -> GrantsError {
        GrantsError(format!("profile {name:?}: {why}"))
    }
}

/// Where the credential comes from. Both are read once, when plimsolld starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// An environment variable of plimsolld.
    Env(String),
    /// A file (relative paths are relative to the grants file's directory); one trailing
    /// newline is dropped.
    File(String),
}

/// Where the broker puts the credential on each forwarded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// `Authorization: Bearer <credential>` (the default).
    Bearer,
    /// `<name>: <prefix><credential>`.
    Header {
        /// The header name, lower-cased.
        name: String,
        /// Text put before the credential (for example `token `), possibly empty.
        prefix: String,
    },
    /// `Authorization: Basic base64(<username>:<credential>)`.
    Basic {
        /// The user name.
        username: String,
    },
}

/// A profile's credential, as written (the value is resolved at load).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialSpec {
    /// Where the value comes from.
    pub source: CredentialSource,
    /// Where it goes.
    pub placement: Placement,
}

/// Per-run limits of one profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Calls a run may attempt (allowed or refused); past it every call is refused (429).
    pub calls_per_run: u64,
    /// Bytes of one request body; past it the call is refused (413).
    pub request_bytes: u64,
    /// Bytes of one response body; past it the call fails (502) and nothing of the body is
    /// passed on.
    pub response_bytes: u64,
    /// Calls of one run in flight at once; past it a call is refused (429).
    pub calls_in_flight: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            calls_per_run: 256,
            request_bytes: 1024 * 1024,
            response_bytes: 4 * 1024 * 1024,
            calls_in_flight: 8,
        }
    }
}

/// Which callers may use a profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Callers {
    /// `["*"]`: every caller the daemon accepted.
    Any,
    /// These caller ids (from the callers file; `anon` in insecure mode).
    Listed(Vec<String>),
}

impl Callers {
    /// Whether `caller` may use the profile.
    pub fn allows(&self, caller: &str) -> bool {
        match self {
            Callers::Any => true,
            Callers::Listed(ids) => ids.iter().any(|id| id == caller),
        }
    }
}

/// The upstream's origin: scheme, host and port, nothing else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `https` or `http` (loopback hosts only).
    pub scheme: String,
    /// The host as written (a name, an IPv4 address or a bracketed IPv6 address).
    pub host: String,
    /// The port, if written.
    pub port: Option<u16>,
}

impl Origin {
    /// Whether the host is loopback (`localhost`, `127.0.0.0/8`, `[::1]`).
    pub fn is_loopback(&self) -> bool {
        is_loopback_host(&self.host)
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme, self.host)?;
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

fn is_loopback_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return v6
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|a| a.is_loopback());
    }
    host.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|a| a.is_loopback())
}

/// Parses an upstream base URL: an origin only (`https://api.example.com`,
/// `http://127.0.0.1:8080`), an optional trailing `/`, no user, path, query or fragment;
/// `http` only for loopback hosts.
pub fn parse_origin(url: &str) -> Result<Origin, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or("base_url must look like https://host[:port]")?;
    if scheme != "https" && scheme != "http" {
        return Err("base_url must use https (or http for a loopback host)".into());
    }
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() {
        return Err("base_url has no host".into());
    }
    if authority.contains(['/', '?', '#', '@', '\\']) {
        return Err(
            "base_url must be an origin only (no user, path, query or fragment); routes carry the full path"
                .into(),
        );
    }
    let (host, port) = if let Some(end) = authority.find(']') {
        let (h, p) = authority.split_at(end + 1);
        if !h.starts_with('[') || h[1..h.len() - 1].parse::<std::net::Ipv6Addr>().is_err() {
            return Err("base_url has a malformed IPv6 host".into());
        }
        let port = match p {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("base_url has a malformed port")?),
        };
        (h, port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => Some(
            p.parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or("base_url has a malformed port")?,
        ),
    };
    if !host.starts_with('[')
        && (host.is_empty()
            || host.len() > 253
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'))
    {
        return Err("base_url has a malformed host".into());
    }
    let origin = Origin {
        scheme: scheme.to_owned(),
        host: host.to_ascii_lowercase(),
        port,
    };
    if origin.scheme == "http" && !origin.is_loopback() {
        return Err(
            "base_url uses http for a host that is not loopback; use https (http is allowed only for localhost, 127.0.0.0/8 and [::1])"
                .into(),
        );
    }
    Ok(origin)
}

/// One profile as read from the file (credentials not yet resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileSpec {
    /// The profile's name (what a request's `grant_profile` names).
    pub name: String,
    /// The upstream's origin.
    pub origin: Origin,
    /// The granted routes.
    pub routes: RouteSet,
    /// The credential, if the API takes one.
    pub credential: Option<CredentialSpec>,
    /// Per-run limits.
    pub limits: Limits,
    /// Who may use it.
    pub callers: Callers,
    /// A PEM CA file the upstream's certificate must chain to, instead of the system roots.
    pub ca_file: Option<String>,
}

/// A parsed grants file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantsFile {
    /// The profiles, by name.
    pub profiles: BTreeMap<String, ProfileSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    version: u32,
    profiles: UniqueMap<RawProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    base_url: String,
    routes: Vec<String>,
    #[serde(default)]
    credential: Option<RawCredential>,
    #[serde(default)]
    limits: Option<RawLimits>,
    allowed_callers: Vec<String>,
    #[serde(default)]
    ca_file: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCredential {
    #[serde(default)]
    env: Option<String>,
    #[serde(default)]
    file: Option<String>,
    #[serde(default)]
    placement: Option<String>,
    #[serde(default)]
    header: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    username: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    #[serde(default)]
    calls_per_run: Option<u64>,
    #[serde(default)]
    request_bytes: Option<u64>,
    #[serde(default)]
    response_bytes: Option<u64>,
    #[serde(default)]
    calls_in_flight: Option<u32>,
}

/// A JSON object whose keys must be unique (serde's maps keep the last silently).
struct UniqueMap<T>(Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for UniqueMap<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = UniqueMap<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of profiles")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut out: Vec<(String, T)> = Vec::new();
                let mut seen = std::collections::HashSet::new();
                while let Some(k) = m.next_key::<String>()? {
                    if !seen.insert(k.clone()) {
                        return Err(serde::de::Error::custom(format!(
                            "profile {k:?} is defined twice"
                        )));
                    }
                    let v = m.next_value::<T>()?;
                    out.push((k, v));
                }
                Ok(UniqueMap(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Whether `name` is a valid profile name: 1..=128 of `[A-Za-z0-9._-]`.
pub fn is_profile_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn is_env_name(n: &str) -> bool {
    let mut b = n.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && n.len() <= 128
}

/// Header names the credential may not be placed in: they frame the message or are set by
/// the broker itself.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "accept",
    "user-agent",
    "expect",
];

fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn limit(name: &str, v: Option<u64>, default: u64, max: u64, p: &str) -> Result<u64, GrantsError> {
    match v {
        None => Ok(default),
        Some(v) if (1..=max).contains(&v) => Ok(v),
        Some(_) => Err(GrantsError::in_profile(
            p,
            format!("limits.{name} must be between 1 and {max}"),
        )),
    }
}

impl GrantsFile {
    /// Parses and validates a grants file. Unknown fields, duplicate profiles, trailing
    /// data and any other version than [`FORMAT_VERSION`] are refused.
    pub fn parse(bytes: &[u8]) -> Result<GrantsFile, GrantsError> {
        let raw: RawFile = serde_json::from_slice(bytes)
            .map_err(|e| GrantsError(format!("not a valid grants file: {e}")))?;
        if raw.version != FORMAT_VERSION {
            return Err(GrantsError(format!(
                "version {} is not supported; this build reads version {FORMAT_VERSION}",
                raw.version
            )));
        }
        let mut profiles = BTreeMap::new();
        for (name, p) in raw.profiles.0 {
            let spec = ProfileSpec::from_raw(&name, p)?;
            profiles.insert(name, spec);
        }
        Ok(GrantsFile { profiles })
    }
}

impl ProfileSpec {
    fn from_raw(name: &str, p: RawProfile) -> Result<ProfileSpec, GrantsError> {
        if !is_profile_name(name) {
            return Err(GrantsError(format!(
                "profile name {:?} must be 1 to 128 of A-Z a-z 0-9 . _ -",
                name.chars().take(130).collect::<String>()
            )));
        }
        let bad = |why: String| GrantsError::in_profile(name, why);
        let origin = parse_origin(&p.base_url).map_err(bad)?;
        let routes = RouteSet::parse(&p.routes).map_err(|e: RouteSetError| bad(e.to_string()))?;
        let credential = p.credential.map(|c| credential(name, c)).transpose()?;
        let l = p.limits.unwrap_or(RawLimits {
            calls_per_run: None,
            request_bytes: None,
            response_bytes: None,
            calls_in_flight: None,
        });
        let d = Limits::default();
        let limits = Limits {
            calls_per_run: limit(
                "calls_per_run",
                l.calls_per_run,
                d.calls_per_run,
                100_000,
                name,
            )?,
            request_bytes: limit(
                "request_bytes",
                l.request_bytes,
                d.request_bytes,
                64 << 20,
                name,
            )?,
            response_bytes: limit(
                "response_bytes",
                l.response_bytes,
                d.response_bytes,
                64 << 20,
                name,
            )?,
            calls_in_flight: limit(
                "calls_in_flight",
                l.calls_in_flight.map(u64::from),
                d.calls_in_flight.into(),
                64,
                name,
            )? as u32,
        };
        if p.allowed_callers.is_empty() {
            return Err(bad(
                "allowed_callers is empty; list caller ids, or [\"*\"] for every caller".into(),
            ));
        }
        let callers = if p.allowed_callers == ["*"] {
            Callers::Any
        } else {
            let mut seen = std::collections::HashSet::new();
            for c in &p.allowed_callers {
                if c == "*" {
                    return Err(bad("\"*\" must be the only entry of allowed_callers".into()));
                }
                if c.is_empty()
                    || c.len() > 128
                    || c.chars().any(|ch| ch.is_whitespace() || ch.is_control())
                {
                    return Err(bad(format!("allowed_callers holds a malformed id {c:?}")));
                }
                if !seen.insert(c) {
                    return Err(bad(format!("allowed_callers lists {c:?} twice")));
                }
            }
            Callers::Listed(p.allowed_callers)
        };
        if let Some(f) = &p.ca_file {
            if f.is_empty() {
                return Err(bad("ca_file is empty".into()));
            }
            if origin.scheme != "https" {
                return Err(bad("ca_file is set but base_url does not use https".into()));
            }
        }
        Ok(ProfileSpec {
            name: name.to_owned(),
            origin,
            routes,
            credential,
            limits,
            callers,
            ca_file: p.ca_file,
        })
    }
}

fn credential(name: &str, c: RawCredential) -> Result<CredentialSpec, GrantsError> {
    let bad = |why: &str| GrantsError::in_profile(name, format!("credential: {why}"));
    let source = match (c.env, c.file) {
        (Some(e), None) => {
            if !is_env_name(&e) {
                return Err(bad("env must be an environment variable name"));
            }
            if e.starts_with("PLIMSOLL_") || e.starts_with("SANDBOX_") {
                return Err(bad(
                    "env must not start with PLIMSOLL_ or SANDBOX_ (those names are plimsolld's own settings)",
                ));
            }
            CredentialSource::Env(e)
        }
        (None, Some(f)) if !f.is_empty() => CredentialSource::File(f),
        (None, Some(_)) => return Err(bad("file is empty")),
        (Some(_), Some(_)) => return Err(bad("set one of env and file, not both")),
        (None, None) => return Err(bad("set env (a variable of plimsolld) or file")),
    };
    let placement = match c.placement.as_deref().unwrap_or("bearer") {
        "bearer" => {
            if c.header.is_some() || c.username.is_some() || c.prefix.is_some() {
                return Err(bad(
                    "header, prefix and username belong to the header and basic placements",
                ));
            }
            Placement::Bearer
        }
        "header" => {
            let Some(h) = c.header else {
                return Err(bad("placement \"header\" needs header (the header's name)"));
            };
            let h = h.to_ascii_lowercase();
            if !is_token(&h) || RESERVED_HEADERS.contains(&h.as_str()) || h.starts_with("proxy-") {
                return Err(bad(
                    "header must be a valid header name that the broker does not set itself",
                ));
            }
            if c.username.is_some() {
                return Err(bad("username belongs to the basic placement"));
            }
            let prefix = c.prefix.unwrap_or_default();
            if prefix.len() > 64 || !prefix.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                return Err(bad("prefix must be at most 64 printable ASCII characters"));
            }
            Placement::Header { name: h, prefix }
        }
        "basic" => {
            let Some(u) = c.username else {
                return Err(bad("placement \"basic\" needs username"));
            };
            if u.contains(':') || u.len() > 256 || !u.bytes().all(|b| (0x21..0x7f).contains(&b)) {
                return Err(bad(
                    "username must be printable ASCII without spaces or ':'",
                ));
            }
            if c.header.is_some() || c.prefix.is_some() {
                return Err(bad("header and prefix belong to the header placement"));
            }
            Placement::Basic { username: u }
        }
        _ => return Err(bad("placement must be bearer, header or basic")),
    };
    Ok(CredentialSpec { source, placement })
}

/// Fuzz entry point: parses arbitrary bytes as a grants file. Never panics.
pub fn fuzz_parse(data: &[u8]) {
    let _ = GrantsFile::parse(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(profile: &str) -> Result<GrantsFile, GrantsError> {
        GrantsFile::parse(format!(r#"{{"version":1,"profiles":{{"p":{profile}}}}}"#).as_bytes())
    }

    const OK: &str = r#"{"base_url":"https://api.example.com","routes":["GET /v1/x/{id}"],"allowed_callers":["a"]}"#;

    #[test]
    fn a_minimal_profile_gets_the_defaults() {
        let f = one(OK).unwrap();
        let p = &f.profiles["p"];
        assert_eq!(p.origin.to_string(), "https://api.example.com");
        assert_eq!(p.limits, Limits::default());
        assert_eq!(p.credential, None);
        assert!(p.callers.allows("a") && !p.callers.allows("b"));
    }

    #[test]
    fn placements_parse() {
        let f = one(
            r#"{"base_url":"http://127.0.0.1:9","routes":[],"allowed_callers":["*"],
            "credential":{"env":"K","placement":"header","header":"X-Api-Key","prefix":"key "}}"#,
        )
        .unwrap();
        let p = &f.profiles["p"];
        assert_eq!(
            p.credential.as_ref().unwrap().placement,
            Placement::Header {
                name: "x-api-key".into(),
                prefix: "key ".into()
            }
        );
        assert!(p.callers.allows("anyone"));
        let f = one(
            r#"{"base_url":"http://localhost:9","routes":[],"allowed_callers":["a"],
            "credential":{"file":"k.txt","placement":"basic","username":"bot"}}"#,
        )
        .unwrap();
        assert_eq!(
            f.profiles["p"].credential.as_ref().unwrap().source,
            CredentialSource::File("k.txt".into())
        );
    }

    /// `OK` with `extra` fields added at its end.
    fn with(extra: &str) -> String {
        format!("{},{extra}", &OK[..OK.len() - 1])
    }

    #[test]
    fn strictness() {
        for (bad, needle) in [
            (r#"{"version":2,"profiles":{}}"#, "version 2"),
            (r#"{"version":1,"profiles":{},"extra":1}"#, "unknown field"),
            (r#"{"version":1,"profiles":{}} x"#, "trailing"),
            (r#"{"version":1,"profiles":{"a":X,"a":X}}"#, "twice"),
            (r#"{"profiles":{}}"#, "version"),
        ] {
            let text = bad.replace('X', OK);
            let e = GrantsFile::parse(text.as_bytes()).unwrap_err();
            assert!(e.0.contains(needle), "{bad}: {e}");
        }
        for (profile, needle) in [
            (
                OK.replace("https://api.example.com", "http://api.example.com"),
                "not loopback",
            ),
            (
                OK.replace("https://api.example.com", "https://api.example.com/v1"),
                "origin only",
            ),
            (
                OK.replace("https://api.example.com", "https://u:p@api.example.com"),
                "origin only",
            ),
            (OK.replace("https://api.example.com", "ftp://x"), "https"),
            (
                OK.replace("https://api.example.com", "https://x:99999"),
                "port",
            ),
            (OK.replace("GET /v1/x/{id}", "GET /v1/../x"), ". and .."),
            (OK.replace("[\"a\"]", "[]"), "allowed_callers"),
            (OK.replace("[\"a\"]", "[\"a\",\"a\"]"), "twice"),
            (OK.replace("[\"a\"]", "[\"*\",\"a\"]"), "only entry"),
            (with(r#""limits":{"calls_per_run":0}}"#), "calls_per_run"),
            (
                with(r#""limits":{"calls_in_flight":65}}"#),
                "calls_in_flight",
            ),
            (with(r#""limits":{"bogus":1}}"#), "unknown field"),
            (with(r#""credential":{}}"#), "set env"),
            (with(r#""credential":{"env":"A","file":"b"}}"#), "not both"),
            (with(r#""credential":{"env":"PLIMSOLL_KEY"}}"#), "PLIMSOLL_"),
            (with(r#""credential":{"env":"A B"}}"#), "variable name"),
            (
                with(r#""credential":{"env":"A","placement":"header"}}"#),
                "needs header",
            ),
            (
                with(r#""credential":{"env":"A","placement":"header","header":"Host"}}"#),
                "header name",
            ),
            (
                with(r#""credential":{"env":"A","placement":"basic"}}"#),
                "username",
            ),
            (
                with(r#""credential":{"env":"A","placement":"digest"}}"#),
                "placement must",
            ),
            (with(r#""ca_file":""}"#), "ca_file"),
        ] {
            let e = one(&profile).unwrap_err();
            assert!(e.0.contains(needle), "{profile}: {e}");
            assert!(
                e.0.contains("profile \"p\"") || needle == "unknown field",
                "{e}"
            );
        }
        let e =
            GrantsFile::parse(format!(r#"{{"version":1,"profiles":{{"a b":{OK}}}}}"#).as_bytes())
                .unwrap_err();
        assert!(e.0.contains("profile name"), "{e}");
    }

    #[test]
    fn origins() {
        assert!(parse_origin("http://[::1]:8080").unwrap().is_loopback());
        assert!(parse_origin("http://127.3.4.5").unwrap().is_loopback());
        assert_eq!(
            parse_origin("https://API.example.com/")
                .unwrap()
                .to_string(),
            "https://api.example.com"
        );
        assert!(parse_origin("https://[zz]").is_err());
        assert!(parse_origin("https://").is_err());
        assert!(parse_origin("https://a?b").is_err());
        assert!(parse_origin("http://10.0.0.1").is_err());
    }

    #[test]
    fn fuzz_entry_takes_garbage() {
        for d in [
            &b""[..],
            b"{",
            b"\xff",
            b"[]",
            br#"{"version":1,"profiles":{"":{}}}"#,
        ] {
            fuzz_parse(d);
        }
    }
}
