//! plimsolld's configuration, read once from the environment and validated in one place.
//!
//! Every variable the daemon reads is in [`VARIABLES`] (printed by `plimsolld --help`);
//! any other `PLIMSOLL_*` or `SANDBOX_*` name is reported at startup. Booleans: empty,
//! `0`, `false` are off; `1`, `true` are on; anything else is an error naming the variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use plimsoll_core::Floor;

use crate::env::EnvSource;

/// Every variable the daemon reads, with one line of help. Later providers add theirs here.
pub const VARIABLES: &[(&str, &str)] = &[
    (
        "PLIMSOLL_ADDR",
        "RPC listen address (default 127.0.0.1:8746)",
    ),
    (
        "PLIMSOLL_METRICS_ADDR",
        "/metrics, /healthz, /readyz listener (default 127.0.0.1:9464; `off` disables)",
    ),
    (
        "PLIMSOLL_CLIENTS_FILE",
        "caller registry: token SHA-256 fingerprints and scopes (`plimsoll callers add`)",
    ),
    (
        "PLIMSOLL_INSECURE",
        "1 serves without caller authentication; loopback addresses only, never hardened",
    ),
    (
        "PLIMSOLL_TLS_CERT",
        "PEM certificate chain for the RPC and metrics listeners",
    ),
    ("PLIMSOLL_TLS_KEY", "PEM private key for PLIMSOLL_TLS_CERT"),
    (
        "PLIMSOLL_HARDENED",
        "1 refuses to start unless every production safeguard is set",
    ),
    (
        "PLIMSOLL_STATE_DIR",
        "where runs get their working directories (default $TMPDIR/plimsoll)",
    ),
    ("PLIMSOLL_GRANTS_FILE", "grant profiles for the broker"),
    (
        "PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS",
        "1 states you trust every caller with every grant: needed for grants on the process provider with more than one caller",
    ),
    (
        "PLIMSOLL_WITHHELD_SET",
        "withheld set the docker provider scans its images against at startup",
    ),
    (
        "PLIMSOLL_WITHHELD_KNOWN_FILE",
        "known-unreadable lists for that scan",
    ),
    (
        "SANDBOX_PROVIDER",
        "quickjs, process, docker or agentsandbox; unset runs nothing (the disabled provider)",
    ),
    (
        "SANDBOX_QUICKJS_WORKER",
        "the quickjs provider's worker program (default: plimsolld itself, re-executed)",
    ),
    (
        "SANDBOX_MIN_ISOLATION",
        "startup floor: refuse to serve below it (process, container, kernel, vm)",
    ),
    (
        "SANDBOX_DEFAULT_TIMEOUT_MS",
        "deadline of a run whose request states none (default 30000)",
    ),
    (
        "SANDBOX_OUTPUT_BYTES",
        "bytes kept of each output stream per program (default 1048576)",
    ),
    (
        "SANDBOX_MAX_CONCURRENT",
        "runs in flight, daemon-wide (default 8); more are refused as capacity",
    ),
    (
        "SANDBOX_MEMORY_MB",
        "per-run memory limit in MiB (providers with a wall; quickjs: the engine's heap, default 64)",
    ),
    ("SANDBOX_CPUS", "per-run CPU limit (providers with a wall)"),
    (
        "SANDBOX_PIDS",
        "per-run process limit (providers with a wall)",
    ),
    (
        "SANDBOX_DISK_MB",
        "per-run writable disk in MiB (providers with a wall)",
    ),
    (
        "SANDBOX_DOCKER_IMAGE",
        "sandbox image, pinned by content ID or digest",
    ),
    (
        "SANDBOX_DOCKER_RUNTIME",
        "runc (tier container) or runsc (tier kernel once proven)",
    ),
    (
        "SANDBOX_DOCKER_POOL",
        "containers kept started ahead of runs, each used once (default 0)",
    ),
    (
        "SANDBOX_DOCKER_SECCOMP",
        "seccomp profile (JSON file) for each container; empty uses the engine's default",
    ),
    (
        "DOCKER_HOST",
        "the Docker engine's socket for the docker provider (default unix:///var/run/docker.sock)",
    ),
    (
        "SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE",
        "PEM CA certificates the pod certificate must chain to (required)",
    ),
    (
        "SANDBOX_AGENTSANDBOX_SANDBOXD_SERVER_NAME",
        "name checked in the pod certificate (default sandboxd.plimsoll.invalid)",
    ),
    (
        "SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK",
        "operator's statement that the pod network is authenticated and encrypted",
    ),
    (
        "SANDBOX_AGENTSANDBOX_NAMESPACE",
        "namespace of the warm pool",
    ),
    ("SANDBOX_AGENTSANDBOX_TEMPLATE", "SandboxTemplate name"),
    ("SANDBOX_AGENTSANDBOX_WARM_POOL", "SandboxWarmPool name"),
    (
        "SANDBOX_AGENTSANDBOX_KUBECONFIG",
        "kubeconfig file; unset uses in-cluster config, then KUBECONFIG",
    ),
    (
        "SANDBOX_AGENTSANDBOX_CLAIM_TIMEOUT_MS",
        "how long a claim may wait for a Ready pod before the run is refused marked capacity",
    ),
    (
        "SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE",
        "the sandboxd token plimsolld presents",
    ),
];

/// A configuration error: one line naming the variable or file and what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {message}")]
pub struct ConfigError {
    /// The variable (or file) at fault.
    pub name: String,
    /// What is wrong and what to do.
    pub message: String,
}

fn bad(name: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        name: name.to_owned(),
        message: message.into(),
    }
}

/// Which provider runs the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// Runs nothing; every run is refused marked `unsupported`.
    Disabled,
    /// JavaScript snippets in QuickJS, one locked-down worker process per run (tier
    /// `process`; needs nothing installed).
    QuickJs,
    /// The runner in child processes of plimsolld (tier `process`).
    Process,
    /// Locked-down containers through the Docker Engine API.
    Docker,
    /// Pods from a kubernetes-sigs/agent-sandbox warm pool over TLS.
    AgentSandbox,
}

impl ProviderKind {
    /// The name on the wire and in `SANDBOX_PROVIDER`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Disabled => "disabled",
            ProviderKind::QuickJs => "quickjs",
            ProviderKind::Process => "process",
            ProviderKind::Docker => "docker",
            ProviderKind::AgentSandbox => "agentsandbox",
        }
    }
}

/// How callers are authenticated.
#[derive(Debug, Clone)]
pub enum CallerAuth {
    /// Bearer tokens checked against a registry of fingerprints.
    Registry(plimsoll_callers::Registry),
    /// No authentication (`PLIMSOLL_INSECURE=1`, loopback only).
    Insecure,
}

/// Per-run resource limits (0 = the provider's default).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Resources {
    /// Memory in MiB.
    pub memory_mb: u32,
    /// CPUs.
    pub cpus: f64,
    /// Processes.
    pub pids: u32,
    /// Writable disk in MiB.
    pub disk_mb: u32,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// RPC listen address.
    pub addr: SocketAddr,
    /// Metrics/health listener, if on.
    pub metrics_addr: Option<SocketAddr>,
    /// Caller authentication.
    pub auth: CallerAuth,
    /// Whether a callers file was given (hardened mode requires it).
    pub clients_file: Option<PathBuf>,
    /// TLS certificate and key for the listeners.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Hardened mode.
    pub hardened: bool,
    /// The startup ship scan (`PLIMSOLL_WITHHELD_SET`; only with `SANDBOX_PROVIDER=docker`).
    pub withheld: Option<WithheldScan>,
    /// The provider.
    pub provider: ProviderKind,
    /// The daemon-wide floor.
    pub min_isolation: Floor,
    /// Runs in flight, daemon-wide.
    pub max_concurrent: usize,
    /// Deadline of a run whose request states none.
    pub default_timeout: Duration,
    /// Bytes kept per output stream.
    pub output_bytes: usize,
    /// Per-run limits.
    pub resources: Resources,
    /// Working directories for runs.
    pub state_dir: PathBuf,
    /// Which resource variables were set explicitly (hardened mode wants all of them).
    pub explicit_resources: Vec<&'static str>,
    /// How long a SIGTERM waits for runs in flight before the process exits.
    pub shutdown_grace: Duration,
    /// `SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK`: the operator's statement.
    pub encrypted_pod_network: bool,
    /// Grant profiles from `PLIMSOLL_GRANTS_FILE`, credentials resolved at startup (empty
    /// when unset: every grant request is refused).
    pub grants: plimsoll_grants::Grants,
    /// `PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS`: the operator's statement that every
    /// caller may use every grant, which the process provider needs for grants with more
    /// than one caller (its runs share one user, so any run can take another run's relay
    /// secret).
    pub process_grants_trust_all_callers: bool,
    /// The docker provider's settings (`Some` when `SANDBOX_PROVIDER=docker`).
    pub docker: Option<plimsoll_docker::DockerConfig>,
    /// The agentsandbox provider's settings (`Some` when `SANDBOX_PROVIDER=agentsandbox`).
    pub agentsandbox: Option<plimsoll_agentsandbox::AgentSandboxConfig>,
    /// The quickjs provider's worker program (`SANDBOX_QUICKJS_WORKER`); `None` re-executes
    /// the running binary, whose `main` must call `plimsoll_quickjs::run_if_worker` first.
    pub quickjs_worker: Option<PathBuf>,
}

/// Parses a boolean the one way the contract fixes.
pub fn parse_bool(name: &str, v: Option<&str>) -> Result<bool, ConfigError> {
    match v.unwrap_or("") {
        "" | "0" | "false" => Ok(false),
        "1" | "true" => Ok(true),
        other => Err(bad(
            name,
            format!("{other:?} is not a boolean; use 1/true or 0/false/empty"),
        )),
    }
}

fn parse_num<T: std::str::FromStr>(
    env: &dyn EnvSource,
    name: &str,
    default: T,
) -> Result<T, ConfigError> {
    match env.get(name).filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| bad(name, format!("{v:?} is not a valid number"))),
    }
}

fn parse_addr(name: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    use std::net::ToSocketAddrs;
    v.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| bad(name, format!("{v:?} is not a host:port address")))
}

/// The startup ship scan: the withheld set and known lists, read once at startup. plimsolld
/// scans the image the docker provider verified against them before it serves.
#[derive(Debug, Clone)]
pub struct WithheldScan {
    /// `PLIMSOLL_WITHHELD_SET`.
    pub set_file: PathBuf,
    /// The set read from it.
    pub set: plimsoll_withheld::WithheldSet,
    /// `PLIMSOLL_WITHHELD_KNOWN_FILE`, if set.
    pub known_file: Option<PathBuf>,
    /// The known-unreadable lists read from it (empty without the file).
    pub known: plimsoll_withheld::KnownImages,
}

/// `PLIMSOLL_WITHHELD_SET` and `PLIMSOLL_WITHHELD_KNOWN_FILE`, read and checked now so a bad
/// file stops startup as a configuration error. The scan looks at the docker provider's image
/// only: with another provider nothing would be scanned, so a set is refused rather than
/// silently ignored, and a known file without a set likewise.
fn withheld_scan(
    env: &dyn EnvSource,
    provider: ProviderKind,
) -> Result<Option<WithheldScan>, ConfigError> {
    let get = |n: &str| env.get(n).filter(|v| !v.trim().is_empty());
    let known_file = get("PLIMSOLL_WITHHELD_KNOWN_FILE").map(|v| PathBuf::from(v.trim()));
    let Some(set_file) = get("PLIMSOLL_WITHHELD_SET").map(|v| PathBuf::from(v.trim())) else {
        if known_file.is_some() {
            return Err(bad(
                "PLIMSOLL_WITHHELD_KNOWN_FILE",
                "is set without PLIMSOLL_WITHHELD_SET, so nothing would be scanned; set PLIMSOLL_WITHHELD_SET too, or unset this",
            ));
        }
        return Ok(None);
    };
    if provider != ProviderKind::Docker {
        return Err(bad(
            "PLIMSOLL_WITHHELD_SET",
            format!(
                "is set but SANDBOX_PROVIDER is {}: only the docker provider's image is scanned at startup, so nothing would be scanned; \
                 scan other images before they ship with `plimsoll-withheld scan-image`, and unset this variable",
                provider.as_str()
            ),
        ));
    }
    let set = plimsoll_withheld::WithheldSet::load(&set_file).map_err(|e| {
        bad(
            "PLIMSOLL_WITHHELD_SET",
            format!("not a usable withheld set: {e}"),
        )
    })?;
    let known = match &known_file {
        None => plimsoll_withheld::KnownImages::empty(),
        Some(p) => plimsoll_withheld::KnownImages::load(p).map_err(|e| {
            bad(
                "PLIMSOLL_WITHHELD_KNOWN_FILE",
                format!("not a usable known-images file: {e}; write it with `plimsoll-withheld known-unreadable`"),
            )
        })?,
    };
    Ok(Some(WithheldScan {
        set_file,
        set,
        known_file,
        known,
    }))
}

/// Whether an address is loopback (`127.0.0.0/8`, `::1`). An unspecified address is not.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

impl Config {
    /// Reads and validates the configuration. Fails on the first bad variable.
    pub fn from_env(env: &dyn EnvSource) -> Result<Config, ConfigError> {
        let get = |n: &str| env.get(n).filter(|v| !v.is_empty());
        let addr = parse_addr(
            "PLIMSOLL_ADDR",
            &get("PLIMSOLL_ADDR").unwrap_or_else(|| "127.0.0.1:8746".into()),
        )?;
        let metrics_addr = match get("PLIMSOLL_METRICS_ADDR").as_deref() {
            Some("off") => None,
            Some(v) => Some(parse_addr("PLIMSOLL_METRICS_ADDR", v)?),
            None => Some(parse_addr("PLIMSOLL_METRICS_ADDR", "127.0.0.1:9464")?),
        };
        let hardened = parse_bool("PLIMSOLL_HARDENED", env.get("PLIMSOLL_HARDENED").as_deref())?;
        let insecure = parse_bool("PLIMSOLL_INSECURE", env.get("PLIMSOLL_INSECURE").as_deref())?;
        let clients_file = get("PLIMSOLL_CLIENTS_FILE").map(PathBuf::from);
        let auth = match (&clients_file, insecure) {
            (Some(_), true) => {
                return Err(bad("PLIMSOLL_INSECURE", "set together with PLIMSOLL_CLIENTS_FILE; choose one"))
            }
            (Some(path), false) => {
                let file = plimsoll_callers::CallersFile::load(path).map_err(|e| bad("PLIMSOLL_CLIENTS_FILE", e.to_string()))?;
                CallerAuth::Registry(
                    plimsoll_callers::Registry::new(file).map_err(|e| bad("PLIMSOLL_CLIENTS_FILE", e.to_string()))?,
                )
            }
            (None, true) => {
                if hardened {
                    return Err(bad("PLIMSOLL_INSECURE", "is refused in hardened mode; use PLIMSOLL_CLIENTS_FILE"));
                }
                if !is_loopback(&addr) {
                    return Err(bad(
                        "PLIMSOLL_INSECURE",
                        format!("serves without authentication only on a loopback address, and PLIMSOLL_ADDR is {addr}"),
                    ));
                }
                CallerAuth::Insecure
            }
            (None, false) => {
                return Err(bad(
                    "PLIMSOLL_CLIENTS_FILE",
                    "is not set; create one with `plimsoll callers add --file callers.json --id NAME`, \
                     or set PLIMSOLL_INSECURE=1 for development on a loopback address",
                ))
            }
        };
        let tls = match (get("PLIMSOLL_TLS_CERT"), get("PLIMSOLL_TLS_KEY")) {
            (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
            (None, None) => None,
            (Some(_), None) => {
                return Err(bad(
                    "PLIMSOLL_TLS_KEY",
                    "is missing; PLIMSOLL_TLS_CERT needs its key",
                ))
            }
            (None, Some(_)) => {
                return Err(bad(
                    "PLIMSOLL_TLS_CERT",
                    "is missing; PLIMSOLL_TLS_KEY needs its certificate",
                ))
            }
        };
        let provider = match get("SANDBOX_PROVIDER").as_deref() {
            None => ProviderKind::Disabled,
            Some("quickjs") => ProviderKind::QuickJs,
            Some("process") => ProviderKind::Process,
            Some("docker") => ProviderKind::Docker,
            Some("agentsandbox") => ProviderKind::AgentSandbox,
            Some("disabled") => ProviderKind::Disabled,
            Some(other) => {
                return Err(bad(
                    "SANDBOX_PROVIDER",
                    format!(
                        "{other:?} is not a provider; use quickjs, process, docker or agentsandbox"
                    ),
                ))
            }
        };
        let withheld = withheld_scan(env, provider)?;
        let min_isolation = Floor::parse(&get("SANDBOX_MIN_ISOLATION").unwrap_or_default())
            .map_err(|e| bad("SANDBOX_MIN_ISOLATION", e.to_string()))?;
        let max_concurrent: usize = parse_num(env, "SANDBOX_MAX_CONCURRENT", 8)?;
        if max_concurrent == 0 {
            return Err(bad("SANDBOX_MAX_CONCURRENT", "must be at least 1"));
        }
        let default_timeout_ms: u32 = parse_num(env, "SANDBOX_DEFAULT_TIMEOUT_MS", 30_000)?;
        if default_timeout_ms == 0 || default_timeout_ms > plimsoll_core::validate::MAX_TIMEOUT_MS {
            return Err(bad(
                "SANDBOX_DEFAULT_TIMEOUT_MS",
                "must be between 1 and 300000",
            ));
        }
        let output_bytes: usize = parse_num(env, "SANDBOX_OUTPUT_BYTES", 1024 * 1024)?;
        let mut resources = Resources {
            memory_mb: parse_num(env, "SANDBOX_MEMORY_MB", 0)?,
            cpus: parse_num(env, "SANDBOX_CPUS", 0.0)?,
            pids: parse_num(env, "SANDBOX_PIDS", 0)?,
            disk_mb: parse_num(env, "SANDBOX_DISK_MB", 0)?,
        };
        if !(resources.cpus.is_finite() && resources.cpus >= 0.0) {
            return Err(bad("SANDBOX_CPUS", "must be a non-negative number"));
        }
        let explicit_resources = [
            "SANDBOX_MEMORY_MB",
            "SANDBOX_CPUS",
            "SANDBOX_PIDS",
            "SANDBOX_DISK_MB",
        ]
        .into_iter()
        .filter(|n| get(n).is_some())
        .collect::<Vec<_>>();
        if provider == ProviderKind::QuickJs && resources.memory_mb == 0 {
            // Describe states the heap limit the provider applies, not "provider default".
            resources.memory_mb = plimsoll_quickjs::provider::DEFAULT_MEMORY_MB;
        }
        if provider == ProviderKind::QuickJs {
            // One worker process, one engine heap: the other limits would be promises the
            // provider does not keep.
            if let Some(n) = explicit_resources
                .iter()
                .find(|n| **n != "SANDBOX_MEMORY_MB")
            {
                return Err(bad(
                    n,
                    "is not supported by SANDBOX_PROVIDER=quickjs, which limits the engine's memory (SANDBOX_MEMORY_MB), its stack and the deadline; unset it",
                ));
            }
        }
        // Credentials named by the grants file are read here, once, from the same source.
        let grants = match get("PLIMSOLL_GRANTS_FILE") {
            None => plimsoll_grants::Grants::empty(),
            Some(path) => plimsoll_grants::Grants::load(std::path::Path::new(&path), &|n| {
                env.get(n).filter(|v| !v.is_empty())
            })
            .map_err(|e| bad("PLIMSOLL_GRANTS_FILE", e.to_string()))?,
        };
        let process_grants_trust_all_callers = parse_bool(
            "PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS",
            env.get("PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS")
                .as_deref(),
        )?;
        process_grants_check(
            provider,
            &grants,
            &auth,
            clients_file.as_deref(),
            process_grants_trust_all_callers,
        )?;
        let state_dir = get("PLIMSOLL_STATE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("plimsoll"));
        let docker = docker_config(
            env,
            provider,
            resources,
            &state_dir,
            output_bytes,
            default_timeout_ms,
        )?;
        let agentsandbox = if provider == ProviderKind::AgentSandbox {
            Some(
                plimsoll_agentsandbox::AgentSandboxConfig::from_env(|n| env.get(n))
                    .map_err(|e| bad(e.name, e.message))?,
            )
        } else {
            None
        };
        let quickjs_worker = get("SANDBOX_QUICKJS_WORKER").map(|v| PathBuf::from(v.trim()));
        if let Some(w) = &quickjs_worker {
            if provider != ProviderKind::QuickJs {
                return Err(bad(
                    "SANDBOX_QUICKJS_WORKER",
                    format!("is set but SANDBOX_PROVIDER is {}; unset it, or use SANDBOX_PROVIDER=quickjs", provider.as_str()),
                ));
            }
            if !w.is_file() {
                return Err(bad(
                    "SANDBOX_QUICKJS_WORKER",
                    format!("{} is not a file; name the plimsoll-quickjs-worker binary, or unset it to use plimsolld itself", w.display()),
                ));
            }
        }
        Ok(Config {
            agentsandbox,
            quickjs_worker,
            grants,
            process_grants_trust_all_callers,
            addr,
            metrics_addr,
            auth,
            clients_file,
            tls,
            hardened,
            withheld,
            provider,
            min_isolation,
            max_concurrent,
            default_timeout: Duration::from_millis(default_timeout_ms.into()),
            output_bytes,
            resources,
            state_dir,
            explicit_resources,
            shutdown_grace: Duration::from_secs(310),
            encrypted_pod_network: parse_bool(
                "SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK",
                env.get("SANDBOX_AGENTSANDBOX_ENCRYPTED_POD_NETWORK")
                    .as_deref(),
            )?,
            docker,
        })
    }

    /// The embedded daemon of `plimsoll run` without `--addr`: the process provider on an
    /// ephemeral loopback port, metrics off, callers from `callers` (set `provider` to choose
    /// another).
    pub fn embedded(callers: plimsoll_callers::Registry) -> Config {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_addr: None,
            auth: CallerAuth::Registry(callers),
            clients_file: None,
            tls: None,
            hardened: false,
            withheld: None,
            provider: ProviderKind::Process,
            min_isolation: Floor::NONE,
            max_concurrent: 8,
            default_timeout: Duration::from_secs(30),
            output_bytes: 1024 * 1024,
            resources: Resources::default(),
            state_dir: std::env::temp_dir().join("plimsoll"),
            explicit_resources: Vec::new(),
            shutdown_grace: Duration::from_secs(10),
            encrypted_pod_network: false,
            grants: plimsoll_grants::Grants::empty(),
            process_grants_trust_all_callers: false,
            docker: None,
            agentsandbox: None,
            quickjs_worker: None,
        }
    }
}

/// Grants on the process provider with more than one caller are refused unless the operator
/// states they trust every caller. The process tier has no wall: every run is a child of
/// plimsolld under its user, so one run can read another's relay address and secret (from
/// `/proc/<pid>/environ`, or its memory) and rewrite its files and grant client. A grant
/// given to one caller would then be open to every caller that can run code. The callers
/// file is read once at startup, so this check covers the daemon's whole life.
fn process_grants_check(
    provider: ProviderKind,
    grants: &plimsoll_grants::Grants,
    auth: &CallerAuth,
    clients_file: Option<&std::path::Path>,
    trust_all_callers: bool,
) -> Result<(), ConfigError> {
    let callers = match auth {
        CallerAuth::Registry(r) => r.len(),
        // Insecure mode has one caller, `anon`.
        CallerAuth::Insecure => 1,
    };
    if provider != ProviderKind::Process || grants.is_empty() || callers < 2 || trust_all_callers {
        return Ok(());
    }
    let file = clients_file.map_or_else(String::new, |p| format!(" ({})", p.display()));
    Err(bad(
        "PLIMSOLL_GRANTS_FILE",
        format!(
            "grant profiles on SANDBOX_PROVIDER=process with {callers} callers in PLIMSOLL_CLIENTS_FILE{file}: \
             the process tier has no wall between runs, so any caller's run can read another run's relay secret \
             and use its grant. Use SANDBOX_PROVIDER=docker, or keep one caller in the callers file, \
             or set PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS=1 to state that you trust every caller with every grant"
        ),
    ))
}

/// The docker provider's settings: the `SANDBOX_DOCKER_*` variables are checked whatever the
/// provider (a typo fails early); the image is required only for `SANDBOX_PROVIDER=docker`.
fn docker_config(
    env: &dyn EnvSource,
    provider: ProviderKind,
    resources: Resources,
    state_dir: &std::path::Path,
    output_bytes: usize,
    default_timeout_ms: u32,
) -> Result<Option<plimsoll_docker::DockerConfig>, ConfigError> {
    let get = |n: &str| env.get(n).filter(|v| !v.trim().is_empty());
    let runtime =
        plimsoll_docker::Runtime::parse(&get("SANDBOX_DOCKER_RUNTIME").unwrap_or_default())
            .map_err(|m| bad("SANDBOX_DOCKER_RUNTIME", m))?;
    let pool: usize = parse_num(env, "SANDBOX_DOCKER_POOL", 0)?;
    if pool > plimsoll_docker::config::MAX_POOL {
        return Err(bad(
            "SANDBOX_DOCKER_POOL",
            format!("{pool} is more than {}", plimsoll_docker::config::MAX_POOL),
        ));
    }
    let seccomp = match get("SANDBOX_DOCKER_SECCOMP") {
        None => plimsoll_docker::Seccomp::EngineDefault,
        Some(v) if v.trim() == "unconfined" => {
            return Err(bad(
                "SANDBOX_DOCKER_SECCOMP",
                "`unconfined` is refused: every container runs under a seccomp profile (leave it empty for the engine's default)",
            ))
        }
        Some(v) => plimsoll_docker::Seccomp::File(PathBuf::from(v.trim())),
    };
    if provider != ProviderKind::Docker {
        return Ok(None);
    }
    let image = get("SANDBOX_DOCKER_IMAGE").ok_or_else(|| {
        bad(
            "SANDBOX_DOCKER_IMAGE",
            "is required with SANDBOX_PROVIDER=docker; build the image with `cargo xtask images` and set its ID",
        )
    })?;
    let mut c = plimsoll_docker::DockerConfig::new(image.trim(), state_dir.join("docker"));
    c.runtime = runtime;
    c.pool = pool;
    c.seccomp = seccomp;
    c.memory_mb = resources.memory_mb;
    c.cpus = resources.cpus;
    c.pids = resources.pids;
    c.disk_mb = resources.disk_mb;
    c.docker_host = get("DOCKER_HOST");
    c.output_bytes = output_bytes;
    c.default_timeout = Duration::from_millis(default_timeout_ms.into());
    c.limits().map_err(|(var, m)| bad(var, m))?;
    Ok(Some(c))
}

/// `PLIMSOLL_*` and `SANDBOX_*` names that are set but not read: reported at startup,
/// because a misspelt safeguard would otherwise be silently off.
pub fn unknown_variables(env: &dyn EnvSource) -> Vec<String> {
    let mut unknown: Vec<String> = env
        .names()
        .into_iter()
        .filter(|n| n.starts_with("PLIMSOLL_") || n.starts_with("SANDBOX_"))
        .filter(|n| !VARIABLES.iter().any(|(k, _)| k == n))
        .collect();
    unknown.sort();
    unknown
}

/// The `--help` text listing every variable.
pub fn variables_help() -> String {
    let width = VARIABLES.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    VARIABLES
        .iter()
        .map(|(k, v)| format!("  {k:width$}  {v}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::MapEnv;

    #[test]
    fn booleans() {
        for off in ["", "0", "false"] {
            assert!(!parse_bool("X", Some(off)).unwrap());
        }
        for on in ["1", "true"] {
            assert!(parse_bool("X", Some(on)).unwrap());
        }
        let e = parse_bool("PLIMSOLL_HARDENED", Some("yes")).unwrap_err();
        assert_eq!(e.name, "PLIMSOLL_HARDENED");
    }

    #[test]
    fn no_auth_is_refused_with_the_fix() {
        let e = Config::from_env(&MapEnv::default()).unwrap_err();
        assert_eq!(e.name, "PLIMSOLL_CLIENTS_FILE");
        assert!(e.message.contains("plimsoll callers add"));
    }

    #[test]
    fn withheld_scan_settings_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let set_path = dir.path().join("withheld.json");
        let mut set = plimsoll_withheld::WithheldSet::empty();
        set.add(
            plimsoll_withheld::Entry::run(
                "canary",
                plimsoll_withheld::Mode::Refuse,
                b"canary-value-for-config-test",
            )
            .unwrap(),
        )
        .unwrap();
        set.save(&set_path).unwrap();
        let known_path = dir.path().join("known-images.json");
        plimsoll_withheld::KnownImages::empty()
            .save(&known_path)
            .unwrap();
        let (set_s, known_s) = (set_path.to_str().unwrap(), known_path.to_str().unwrap());
        let docker = [
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_PROVIDER", "docker"),
            ("SANDBOX_DOCKER_IMAGE", "plimsoll/sandbox:latest"),
        ];
        let with = |extra: &[(&'static str, &str)]| {
            let mut p: Vec<(&str, &str)> = docker.to_vec();
            p.extend_from_slice(extra);
            Config::from_env(&MapEnv::from_pairs(p))
        };
        assert!(with(&[]).unwrap().withheld.is_none());
        let w = with(&[
            ("PLIMSOLL_WITHHELD_SET", set_s),
            ("PLIMSOLL_WITHHELD_KNOWN_FILE", known_s),
        ])
        .unwrap()
        .withheld
        .unwrap();
        assert_eq!(w.set.entries().len(), 1);
        assert_eq!(w.known_file.as_deref(), Some(known_path.as_path()));
        let w = with(&[("PLIMSOLL_WITHHELD_SET", set_s)])
            .unwrap()
            .withheld
            .unwrap();
        assert!(w.known_file.is_none());

        // A missing or malformed file names its variable.
        let garbage = dir.path().join("garbage.json");
        std::fs::write(&garbage, b"{\"format\":\"nope\"}").unwrap();
        let g = garbage.to_str().unwrap();
        for (extra, name) in [
            (
                vec![("PLIMSOLL_WITHHELD_SET", "/nonexistent/withheld.json")],
                "PLIMSOLL_WITHHELD_SET",
            ),
            (vec![("PLIMSOLL_WITHHELD_SET", g)], "PLIMSOLL_WITHHELD_SET"),
            (
                vec![
                    ("PLIMSOLL_WITHHELD_SET", set_s),
                    ("PLIMSOLL_WITHHELD_KNOWN_FILE", "/nonexistent/known.json"),
                ],
                "PLIMSOLL_WITHHELD_KNOWN_FILE",
            ),
            (
                vec![
                    ("PLIMSOLL_WITHHELD_SET", set_s),
                    ("PLIMSOLL_WITHHELD_KNOWN_FILE", g),
                ],
                "PLIMSOLL_WITHHELD_KNOWN_FILE",
            ),
            // A known file alone would scan nothing.
            (
                vec![("PLIMSOLL_WITHHELD_KNOWN_FILE", known_s)],
                "PLIMSOLL_WITHHELD_KNOWN_FILE",
            ),
        ] {
            let e = with(&extra).unwrap_err();
            assert_eq!(e.name, name, "{extra:?}: {e}");
        }

        // Another provider would scan nothing: a set is a startup error naming the variable.
        for provider in ["process", "agentsandbox", "disabled"] {
            let mut p = vec![
                ("PLIMSOLL_INSECURE", "1"),
                ("SANDBOX_PROVIDER", provider),
                ("PLIMSOLL_WITHHELD_SET", set_s),
            ];
            if provider == "agentsandbox" {
                p.push(("SANDBOX_AGENTSANDBOX_SANDBOXD_CA_FILE", set_s));
                p.push(("SANDBOX_AGENTSANDBOX_SANDBOXD_TOKEN_FILE", set_s));
            }
            let e = Config::from_env(&MapEnv::from_pairs(p)).unwrap_err();
            assert_eq!(e.name, "PLIMSOLL_WITHHELD_SET", "{provider}: {e}");
            assert!(e.message.contains("nothing would be scanned"), "{e}");
        }
    }

    #[test]
    fn quickjs_takes_only_its_own_limits_and_worker() {
        let env = |extra: &[(&'static str, &'static str)]| {
            let mut p = vec![("PLIMSOLL_INSECURE", "1"), ("SANDBOX_PROVIDER", "quickjs")];
            p.extend_from_slice(extra);
            Config::from_env(&MapEnv::from_pairs(p))
        };
        let ok = env(&[("SANDBOX_MEMORY_MB", "32")]).unwrap();
        assert_eq!(ok.provider, ProviderKind::QuickJs);
        assert_eq!(
            (ok.resources.memory_mb, ok.quickjs_worker.clone()),
            (32, None)
        );
        for name in ["SANDBOX_CPUS", "SANDBOX_PIDS", "SANDBOX_DISK_MB"] {
            let e = env(&[(name, "1")]).unwrap_err();
            assert_eq!(e.name, name);
            assert!(e.message.contains("quickjs"), "{e}");
        }
        let e = env(&[("SANDBOX_QUICKJS_WORKER", "/nonexistent/worker")]).unwrap_err();
        assert_eq!(e.name, "SANDBOX_QUICKJS_WORKER");
        let e = Config::from_env(&MapEnv::from_pairs([
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_PROVIDER", "process"),
            ("SANDBOX_QUICKJS_WORKER", "/bin/true"),
        ]))
        .unwrap_err();
        assert!(e.message.contains("SANDBOX_PROVIDER is process"), "{e}");
        let e = env(&[]).map(|_| ()).and(
            Config::from_env(&MapEnv::from_pairs([
                ("PLIMSOLL_INSECURE", "1"),
                ("SANDBOX_PROVIDER", "wasm"),
            ]))
            .map(|_| ()),
        );
        assert!(e.unwrap_err().message.contains("quickjs, process"));
    }

    #[test]
    fn process_grants_need_one_caller_or_the_trust_statement() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, ids: &[&str]| {
            let mut f = plimsoll_callers::CallersFile::default();
            for id in ids {
                f.add(id, &[]).unwrap();
            }
            let p = dir.path().join(name);
            f.save(&p).unwrap();
            p.to_str().unwrap().to_owned()
        };
        let (one, two) = (file("one.json", &["a"]), file("two.json", &["a", "b"]));
        let grants = dir.path().join("grants.json");
        std::fs::write(
            &grants,
            br#"{"version":1,"profiles":{"p":{"base_url":"http://127.0.0.1:9","routes":[],"allowed_callers":["a"]}}}"#,
        )
        .unwrap();
        let no_profiles = dir.path().join("none.json");
        std::fs::write(&no_profiles, br#"{"version":1,"profiles":{}}"#).unwrap();
        let (g, n) = (grants.to_str().unwrap(), no_profiles.to_str().unwrap());
        let cfg = |provider: &str, callers: &str, grants: &str, trust: &str| {
            let mut p = vec![
                ("SANDBOX_PROVIDER", provider),
                ("PLIMSOLL_CLIENTS_FILE", callers),
                ("PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS", trust),
                ("SANDBOX_DOCKER_IMAGE", "sha256:abc"),
            ];
            if !grants.is_empty() {
                p.push(("PLIMSOLL_GRANTS_FILE", grants));
            }
            Config::from_env(&MapEnv::from_pairs(p))
        };
        // Refused: the one line names the grants file, the callers file and the statement.
        let e = cfg("process", &two, g, "").unwrap_err();
        assert_eq!(e.name, "PLIMSOLL_GRANTS_FILE");
        for needed in [
            "SANDBOX_PROVIDER=process",
            "2 callers in PLIMSOLL_CLIENTS_FILE",
            two.as_str(),
            "PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS=1",
        ] {
            assert!(e.message.contains(needed), "{needed:?}: {e}");
        }
        assert_eq!(cfg("process", &two, g, "0").unwrap_err(), e);
        // Accepted: the statement, one caller, no profile, no grants file, another provider.
        let c = cfg("process", &two, g, "1").unwrap();
        assert!(c.process_grants_trust_all_callers);
        cfg("process", &one, g, "").unwrap();
        cfg("process", &two, n, "").unwrap();
        cfg("process", &two, "", "").unwrap();
        cfg("docker", &two, g, "").unwrap();
        // Insecure mode has one caller (`anon`).
        Config::from_env(&MapEnv::from_pairs([
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_PROVIDER", "process"),
            ("PLIMSOLL_GRANTS_FILE", g),
        ]))
        .unwrap();
        // The statement is a boolean like every other.
        let e = cfg("process", &two, g, "yes").unwrap_err();
        assert_eq!(e.name, "PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS");
    }

    #[test]
    fn insecure_only_on_loopback() {
        let ok = Config::from_env(&MapEnv::from_pairs([("PLIMSOLL_INSECURE", "1")])).unwrap();
        assert!(matches!(ok.auth, CallerAuth::Insecure));
        assert_eq!(ok.provider, ProviderKind::Disabled);
        let e = Config::from_env(&MapEnv::from_pairs([
            ("PLIMSOLL_INSECURE", "1"),
            ("PLIMSOLL_ADDR", "0.0.0.0:8746"),
        ]))
        .unwrap_err();
        assert_eq!(e.name, "PLIMSOLL_INSECURE");
    }

    #[test]
    fn bad_values_name_their_variable() {
        for (k, v) in [
            ("SANDBOX_PROVIDER", "lambda"),
            ("SANDBOX_MIN_ISOLATION", "none"),
            ("SANDBOX_MAX_CONCURRENT", "many"),
            ("SANDBOX_MAX_CONCURRENT", "0"),
            ("PLIMSOLL_ADDR", "nowhere"),
            ("SANDBOX_CPUS", "-1"),
        ] {
            let e = Config::from_env(&MapEnv::from_pairs([("PLIMSOLL_INSECURE", "1"), (k, v)]))
                .unwrap_err();
            assert_eq!(e.name, k, "{k}={v}: {e}");
        }
    }

    #[test]
    fn docker_settings_are_read_and_checked() {
        let base = [("PLIMSOLL_INSECURE", "1"), ("SANDBOX_PROVIDER", "docker")];
        let e = Config::from_env(&MapEnv::from_pairs(base)).unwrap_err();
        assert_eq!(e.name, "SANDBOX_DOCKER_IMAGE");
        let mut pairs = base.to_vec();
        pairs.extend([
            ("SANDBOX_DOCKER_IMAGE", "sha256:abc"),
            ("SANDBOX_DOCKER_RUNTIME", "runsc"),
            ("SANDBOX_DOCKER_POOL", "3"),
            ("SANDBOX_MEMORY_MB", "128"),
            ("PLIMSOLL_STATE_DIR", "/var/lib/plimsoll"),
            ("DOCKER_HOST", "unix:///run/docker.sock"),
        ]);
        let c = Config::from_env(&MapEnv::from_pairs(pairs.clone())).unwrap();
        let d = c.docker.unwrap();
        assert_eq!(d.image, "sha256:abc");
        assert_eq!(d.runtime, plimsoll_docker::Runtime::Runsc);
        assert_eq!((d.pool, d.memory_mb), (3, 128));
        assert_eq!(d.state_dir, PathBuf::from("/var/lib/plimsoll/docker"));
        assert_eq!(d.docker_host.as_deref(), Some("unix:///run/docker.sock"));
        for (k, v) in [
            ("SANDBOX_DOCKER_RUNTIME", "kata"),
            ("SANDBOX_DOCKER_POOL", "lots"),
            ("SANDBOX_DOCKER_SECCOMP", "unconfined"),
            ("SANDBOX_DISK_MB", "8"),
        ] {
            let mut p = pairs.clone();
            p.push((k, v));
            let e = Config::from_env(&MapEnv::from_pairs(p)).unwrap_err();
            assert_eq!(e.name, k, "{k}={v}: {e}");
        }
        // Another provider: the docker settings are still checked, but not built.
        let c = Config::from_env(&MapEnv::from_pairs([
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_PROVIDER", "process"),
            ("SANDBOX_DOCKER_POOL", "2"),
        ]))
        .unwrap();
        assert!(c.docker.is_none());
    }

    #[test]
    fn unknown_names_are_reported() {
        let env = MapEnv::from_pairs([
            ("PLIMSOLL_INSECURE", "1"),
            ("SANDBOX_MAX_CONCURENT", "3"),
            ("HOME", "/"),
        ]);
        assert_eq!(
            unknown_variables(&env),
            vec!["SANDBOX_MAX_CONCURENT".to_owned()]
        );
    }
}
