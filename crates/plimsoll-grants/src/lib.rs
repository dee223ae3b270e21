//! plimsoll-grants: grant profiles and the broker. A grant lets one run call the listed
//! routes (method + path template) of one API through a relay that only that run can
//! reach; the broker, outside every wall, checks each call, attaches the credential and
//! forwards it, and records a trace of route templates, statuses and sizes.
//!
//! It must never let the credential enter a sandbox, a log line, a trace or a record; never
//! forward a call that no granted route matches exactly; never record a raw path, a query
//! string or a body.
//!
//! # Choices where the specification is silent
//!
//! - **Query strings** are forwarded unchanged (after a syntax check) but are never part of
//!   matching and never recorded: a query is an argument of the call, like its body.
//! - **Method overrides** (`_method` in the query or body, `X-HTTP-Method-Override` and
//!   its kin) are refused (`method_override`), so the method the grant judged is the one
//!   the upstream acts on.
//! - **Headers**: only `Content-Type` and `Accept` from the sandbox are forwarded; only
//!   `Content-Type` comes back. Redirects are not followed; no proxy is used.
//! - **Credentials** are read once, when plimsolld starts (environment variable or file).
//! - **Relay**: plain HTTP/1.1 on `127.0.0.1:<ephemeral>` (or a Unix socket a provider
//!   names), with a 256-bit random secret per run in the `x-plimsoll-grant-secret` header.

pub mod method_override;
pub mod prepare;
pub mod profile;
pub mod relay;
pub mod route;
pub mod trace;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

pub use profile::{
    Callers, CredentialSource, CredentialSpec, GrantsError, GrantsFile, Limits, Origin, Placement,
    ProfileSpec, FORMAT_VERSION,
};
pub use relay::{Endpoint, Relay, BROKER_HEADER, SECRET_HEADER};
pub use route::{check_target, Method, Route, RouteSet, Segment, TargetError, Verdict};
pub use trace::{Call, Outcome, Trace};

/// The names of the variables a granted run's programs get.
pub mod env_names {
    /// `http://127.0.0.1:<port>`: the relay (process provider).
    pub const URL: &str = "PLIMSOLL_GRANT_URL";
    /// The relay's Unix socket (providers that mount one into the wall).
    pub const SOCKET: &str = "PLIMSOLL_GRANT_SOCKET";
    /// The run's relay secret (not the API's credential).
    pub const SECRET: &str = "PLIMSOLL_GRANT_SECRET";
    /// The grant profile's name.
    pub const PROFILE: &str = "PLIMSOLL_GRANT_PROFILE";
    /// Absolute path of the JavaScript client module.
    pub const JS: &str = "PLIMSOLL_GRANT_JS";
    /// Absolute path of the Python client module.
    pub const PY: &str = "PLIMSOLL_GRANT_PY";
}

/// The in-sandbox clients: small modules with no dependency and no secret, which find the
/// relay from the run's environment.
pub mod client {
    use std::path::{Path, PathBuf};

    /// File name of the JavaScript client.
    pub const JS_NAME: &str = "plimsoll_grant.js";
    /// File name of the Python client.
    pub const PY_NAME: &str = "plimsoll_grant.py";
    /// The JavaScript client (CommonJS).
    pub const JS: &str = include_str!("../clients/plimsoll_grant.js");
    /// The Python client (standard library only).
    pub const PY: &str = include_str!("../clients/plimsoll_grant.py");

    /// Where [`write`] put the clients.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Files {
        /// The JavaScript module.
        pub js: PathBuf,
        /// The Python module.
        pub py: PathBuf,
    }

    /// Writes both clients into `dir` (which must exist), read-only.
    pub fn write(dir: &Path) -> std::io::Result<Files> {
        use std::os::unix::fs::PermissionsExt;
        let files = Files {
            js: dir.join(JS_NAME),
            py: dir.join(PY_NAME),
        };
        for (path, text) in [(&files.js, JS), (&files.py, PY)] {
            std::fs::write(path, text)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444))?;
        }
        Ok(files)
    }
}

type UpstreamClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A profile ready to serve: the spec, the credential's header, the upstream client.
pub(crate) struct LoadedProfile {
    pub(crate) spec: ProfileSpec,
    /// The header the credential goes in, marked sensitive. Never logged.
    pub(crate) auth_header: Option<(HeaderName, HeaderValue)>,
    pub(crate) client: UpstreamClient,
}

/// Per-run state shared by a run's relay connections.
pub(crate) struct RunState {
    pub(crate) profile: Arc<LoadedProfile>,
    pub(crate) trace: Mutex<Trace>,
    pub(crate) calls: AtomicU64,
    pub(crate) in_flight: Arc<tokio::sync::Semaphore>,
}

/// Every profile of a grants file, with credentials resolved: what plimsolld holds.
/// Cheap to clone. Its `Debug` names profiles only.
#[derive(Clone, Default)]
pub struct Grants {
    profiles: Arc<BTreeMap<String, Arc<LoadedProfile>>>,
}

impl fmt::Debug for Grants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grants")
            .field("profiles", &self.profiles.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// One run's grant: the profile it may use and the trace of its calls. A provider opens
/// the run's relay with it ([`RunGrant::open_loopback`], [`RunGrant::open_unix`]); the daemon
/// reads the trace when the run is over.
#[derive(Clone)]
pub struct RunGrant {
    state: Arc<RunState>,
}

impl fmt::Debug for RunGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunGrant")
            .field("profile", &self.state.profile.spec.name)
            .finish()
    }
}

impl RunGrant {
    /// The profile's name.
    pub fn profile_name(&self) -> &str {
        &self.state.profile.spec.name
    }
    /// The profile's routes.
    pub fn routes(&self) -> &RouteSet {
        &self.state.profile.spec.routes
    }
    /// Opens a relay on a fresh loopback port (the process provider's way).
    pub async fn open_loopback(&self) -> std::io::Result<Relay> {
        relay::open_tcp(self.state.clone()).await
    }
    /// Opens a relay on a Unix socket at `path` (to be mounted into a wall).
    pub async fn open_unix(&self, path: &Path) -> std::io::Result<Relay> {
        relay::open_unix(self.state.clone(), path).await
    }
    /// The trace so far.
    pub fn trace(&self) -> Trace {
        self.state.trace.lock().expect("trace lock").clone()
    }
}

fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("ca_file {}: {e}", path.display()))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("ca_file {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "ca_file {}: holds no PEM certificate",
            path.display()
        ));
    }
    Ok(certs)
}

fn tls_config(roots: &[CertificateDer<'static>]) -> Result<rustls::ClientConfig, String> {
    let mut store = rustls::RootCertStore::empty();
    for c in roots {
        store
            .add(c.clone())
            .map_err(|e| format!("a CA certificate is unusable: {e}"))?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .map_err(|e| e.to_string())?
    .with_root_certificates(store)
    .with_no_client_auth();
    // hyper-rustls sets ALPN (http/1.1) itself.
    Ok(cfg)
}

fn client_for(roots: &[CertificateDer<'static>]) -> Result<UpstreamClient, String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(std::time::Duration::from_secs(10)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_config(roots)?)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(std::time::Duration::from_secs(30))
        .build(https))
}

/// A credential value: at most 8 KiB of visible ASCII (no spaces), so it fits in a header
/// as is.
fn check_secret_value(v: &str) -> Result<(), &'static str> {
    if v.is_empty() {
        return Err("is empty");
    }
    if v.len() > 8192 || !v.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err("must be at most 8192 visible ASCII characters without spaces");
    }
    Ok(())
}

fn auth_header(spec: &CredentialSpec, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    use base64::Engine as _;
    let (name, text) = match &spec.placement {
        Placement::Bearer => (http::header::AUTHORIZATION, format!("Bearer {value}")),
        Placement::Header { name, prefix } => (
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| "header name is invalid")?,
            format!("{prefix}{value}"),
        ),
        Placement::Basic { username } => (
            http::header::AUTHORIZATION,
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{value}"))
            ),
        ),
    };
    let mut v = HeaderValue::from_str(&text).map_err(|_| "the credential cannot go in a header")?;
    v.set_sensitive(true);
    Ok((name, v))
}

impl Grants {
    /// No profiles: every grant request is refused.
    pub fn empty() -> Grants {
        Grants::default()
    }

    /// Reads the grants file at `path`, resolves every credential (`env` through `lookup`,
    /// files relative to the grants file's directory) and every CA file, and builds the
    /// upstream clients. Fails on the first problem, naming the profile and field, never a
    /// credential's value.
    pub fn load(
        path: &Path,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Grants, GrantsError> {
        let bytes =
            std::fs::read(path).map_err(|e| GrantsError(format!("{}: {e}", path.display())))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Grants::from_bytes(&bytes, dir, lookup)
            .map_err(|e| GrantsError(format!("{}: {}", path.display(), e.0)))
    }

    /// Like [`Grants::load`], from bytes; relative file names are relative to `dir`.
    pub fn from_bytes(
        bytes: &[u8],
        dir: &Path,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Grants, GrantsError> {
        let file = GrantsFile::parse(bytes)?;
        let mut native: Option<Vec<CertificateDer<'static>>> = None;
        let mut profiles = BTreeMap::new();
        for (name, spec) in file.profiles {
            let bad = |why: String| GrantsError::in_profile(&name, why);
            let auth = match &spec.credential {
                None => None,
                Some(c) => {
                    let value = match &c.source {
                        CredentialSource::Env(var) => lookup(var).ok_or_else(|| {
                            bad(format!(
                                "credential: environment variable {var} is not set in plimsolld's environment"
                            ))
                        })?,
                        CredentialSource::File(f) => {
                            let p = resolve(dir, f);
                            let mut v = std::fs::read_to_string(&p).map_err(|e| {
                                bad(format!("credential: file {}: {e}", p.display()))
                            })?;
                            if v.ends_with('\n') {
                                v.pop();
                                if v.ends_with('\r') {
                                    v.pop();
                                }
                            }
                            v
                        }
                    };
                    check_secret_value(&value)
                        .map_err(|why| bad(format!("credential: the value {why}")))?;
                    Some(auth_header(c, &value).map_err(bad)?)
                }
            };
            let roots = match &spec.ca_file {
                Some(f) => read_ca_file(&resolve(dir, f)).map_err(bad)?,
                None if spec.origin.scheme == "https" => {
                    if native.is_none() {
                        let found = rustls_native_certs::load_native_certs();
                        native = Some(found.certs);
                    }
                    let roots = native.clone().unwrap_or_default();
                    if roots.is_empty() {
                        return Err(bad(
                            "the system has no CA certificates for https; install them or set ca_file".into(),
                        ));
                    }
                    roots
                }
                None => Vec::new(),
            };
            let client = client_for(&roots).map_err(bad)?;
            profiles.insert(
                name,
                Arc::new(LoadedProfile {
                    spec,
                    auth_header: auth,
                    client,
                }),
            );
        }
        Ok(Grants {
            profiles: Arc::new(profiles),
        })
    }

    /// Whether no profile is loaded.
    pub fn is_empty(&self) -> bool {
        self.profiles.is_empty()
    }

    /// The profiles' names.
    pub fn names(&self) -> Vec<&str> {
        self.profiles.keys().map(String::as_str).collect()
    }

    /// Profiles every caller may use (`allowed_callers: ["*"]`), for a startup warning.
    pub fn open_to_every_caller(&self) -> Vec<&str> {
        self.profiles
            .iter()
            .filter(|(_, p)| p.spec.callers == Callers::Any)
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// The grant for one run of `caller`, or `None` when the profile does not exist or the
    /// caller may not use it (the two are deliberately indistinguishable).
    pub fn grant(&self, profile: &str, caller: &str) -> Option<RunGrant> {
        let p = self.profiles.get(profile)?;
        if !p.spec.callers.allows(caller) {
            return None;
        }
        Some(RunGrant {
            state: Arc::new(RunState {
                profile: p.clone(),
                trace: Mutex::new(Trace {
                    profile: profile.to_owned(),
                    ..Default::default()
                }),
                calls: AtomicU64::new(0),
                in_flight: Arc::new(tokio::sync::Semaphore::new(
                    p.spec.limits.calls_in_flight as usize,
                )),
            }),
        })
    }
}

fn resolve(dir: &Path, f: &str) -> PathBuf {
    let p = Path::new(f);
    if p.is_absolute() {
        p.to_owned()
    } else {
        dir.join(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(json: &str, env: &[(&str, &str)]) -> Result<Grants, GrantsError> {
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Grants::from_bytes(json.as_bytes(), Path::new("/nonexistent"), &|n| {
            env.get(n).cloned()
        })
    }

    const FILE: &str = r#"{"version":1,"profiles":{
        "a":{"base_url":"http://127.0.0.1:1","routes":["GET /x"],"allowed_callers":["alice"],
             "credential":{"env":"A_KEY"}},
        "b":{"base_url":"http://127.0.0.1:1","routes":[],"allowed_callers":["*"]}}}"#;

    #[tokio::test]
    async fn lookup_hides_whether_a_profile_exists() {
        let g = grants(FILE, &[("A_KEY", "s3cret-value")]).unwrap();
        assert!(g.grant("a", "alice").is_some());
        assert!(g.grant("a", "bob").is_none());
        assert!(g.grant("zzz", "alice").is_none());
        assert!(g.grant("b", "anyone").is_some());
        assert_eq!(g.open_to_every_caller(), vec!["b"]);
        let dbg = format!("{g:?} {:?}", g.grant("a", "alice").unwrap());
        assert!(!dbg.contains("s3cret"), "{dbg}");
    }

    #[test]
    fn credential_problems_name_the_profile_not_the_value() {
        let e = grants(FILE, &[]).unwrap_err();
        assert!(
            e.0.contains("profile \"a\"") && e.0.contains("A_KEY"),
            "{e}"
        );
        let e = grants(FILE, &[("A_KEY", "has space")]).unwrap_err();
        assert!(
            e.0.contains("visible ASCII") && !e.0.contains("has space"),
            "{e}"
        );
        let e = grants(
            &FILE.replace(r#"{"env":"A_KEY"}"#, r#"{"file":"missing.key"}"#),
            &[],
        )
        .unwrap_err();
        assert!(e.0.contains("missing.key"), "{e}");
    }

    #[test]
    fn placements_build_the_right_header() {
        let spec = |placement| CredentialSpec {
            source: CredentialSource::Env("X".into()),
            placement,
        };
        let (n, v) = auth_header(&spec(Placement::Bearer), "tok").unwrap();
        assert_eq!(
            (n.as_str(), v.to_str().unwrap()),
            ("authorization", "Bearer tok")
        );
        assert!(v.is_sensitive());
        let (n, v) = auth_header(
            &spec(Placement::Header {
                name: "x-api-key".into(),
                prefix: String::new(),
            }),
            "tok",
        )
        .unwrap();
        assert_eq!((n.as_str(), v.to_str().unwrap()), ("x-api-key", "tok"));
        let (_, v) = auth_header(
            &spec(Placement::Basic {
                username: "bot".into(),
            }),
            "pw",
        )
        .unwrap();
        assert_eq!(v.to_str().unwrap(), "Basic Ym90OnB3");
    }

    #[test]
    fn clients_are_written_read_only() {
        let d = tempfile::tempdir().unwrap();
        let f = client::write(d.path()).unwrap();
        assert!(std::fs::read_to_string(&f.js)
            .unwrap()
            .contains("PLIMSOLL_GRANT_SECRET"));
        assert!(std::fs::read_to_string(&f.py)
            .unwrap()
            .contains("PLIMSOLL_GRANT_SECRET"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&f.js).unwrap().permissions().mode() & 0o777,
            0o444
        );
    }
}
