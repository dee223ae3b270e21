//! plimsolld's configuration, read once from the environment and validated in one place.
//!
//! The daemon reads its own variables ([`DAEMON_VARIABLES`]) and the ones every provider
//! shares; the chosen provider reads its own through its [`ProviderSetup`] (the list is in
//! [`crate::provider`]). [`VARIABLES`] joins every table: `plimsolld --help` prints it, and
//! any other `PLIMSOLL_*` or `SANDBOX_*` name is reported at startup. The value rules are
//! `plimsoll_config`'s: trimmed, blank means unset; booleans `1`/`true`, `0`/`false`/empty.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use plimsoll_config::Vars;
pub use plimsoll_config::{parse_bool, ConfigError, Variable};
use plimsoll_core::Floor;
pub use plimsoll_provider::{ProviderSetup, Resources, Shared};

use crate::env::EnvSource;
pub use crate::provider::ProviderConfig;

/// The variables the daemon itself reads (the providers' are in their own crates).
pub const DAEMON_VARIABLES: &[Variable] = &[
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
        "PLIMSOLL_MAX_CONNECTIONS",
        "RPC connections open at once (default 512, lowered to fit RLIMIT_NOFILE); more wait in the listen backlog",
    ),
    (
        "PLIMSOLL_HEADER_TIMEOUT_MS",
        "close a connection whose TLS handshake, HTTP/2 preface and first request are not in within this (default 10000; RPC and metrics listeners)",
    ),
    (
        "PLIMSOLL_IDLE_TIMEOUT_MS",
        "close a connection with no request in flight for this long; pings do not count (default 120000; RPC and metrics listeners)",
    ),
    (
        "PLIMSOLL_HARDENED",
        "1 refuses to start unless every production safeguard is set",
    ),
    (
        "PLIMSOLL_REFLECTION",
        "gRPC server reflection on the RPC listener, without a token (default 1; 0 in hardened mode)",
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
        "SANDBOX_PROVIDER",
        "quickjs, process, bwrap, docker or agentsandbox; unset runs nothing (the disabled provider)",
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
];

/// Every variable plimsolld reads: its own, then each provider's, in the provider list's
/// order. `plimsolld --help` prints them.
pub static VARIABLES: LazyLock<Vec<Variable>> = LazyLock::new(|| {
    let mut all = DAEMON_VARIABLES.to_vec();
    all.extend_from_slice(crate::sessions::SESSION_VARIABLES);
    for table in ProviderConfig::tables() {
        all.extend_from_slice(table);
    }
    all
});

/// The four resource variables, in `Describe`'s order.
pub const RESOURCE_VARIABLES: [&str; 4] = [
    "SANDBOX_MEMORY_MB",
    "SANDBOX_CPUS",
    "SANDBOX_PIDS",
    "SANDBOX_DISK_MB",
];

fn bad(name: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::new(name, message)
}

/// How callers are authenticated.
#[derive(Debug, Clone)]
pub enum CallerAuth {
    /// Bearer tokens checked against a registry of fingerprints.
    Registry(plimsoll_callers::Registry),
    /// No authentication (`PLIMSOLL_INSECURE=1`, loopback only).
    Insecure,
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
    /// Server reflection (`grpc.reflection.v1` and `v1alpha`) on the RPC listener:
    /// `PLIMSOLL_REFLECTION`, on unless hardened mode, where only an explicit `1` turns it on.
    pub reflection: bool,
    /// The provider and its settings: exactly one, so no other provider's settings exist.
    pub provider: ProviderConfig,
    /// The daemon-wide floor.
    pub min_isolation: Floor,
    /// Runs in flight, daemon-wide.
    pub max_concurrent: usize,
    /// The settings every provider shares: state directory, output cap, default deadline,
    /// per-run limits.
    pub shared: Shared,
    /// How long a SIGTERM waits for runs in flight before the process exits.
    pub shutdown_grace: Duration,
    /// Grant profiles from `PLIMSOLL_GRANTS_FILE`, credentials resolved at startup (empty
    /// when unset: every grant request is refused).
    pub grants: plimsoll_grants::Grants,
    /// `PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS`: the operator's statement that every
    /// caller may use every grant, which a provider whose runs share one user (the process
    /// provider) needs for grants with more than one caller (any run can take another run's
    /// relay secret).
    pub process_grants_trust_all_callers: bool,
    /// Sessions: caps, lifetimes, disk (`SANDBOX_MAX_SESSIONS` 0 turns them off).
    pub sessions: crate::sessions::SessionSettings,
    /// The RPC listener's limits (`PLIMSOLL_MAX_CONNECTIONS`, `PLIMSOLL_HEADER_TIMEOUT_MS`,
    /// `PLIMSOLL_IDLE_TIMEOUT_MS`); the metrics listener takes the same timeouts and
    /// [`METRICS_MAX_CONNECTIONS`].
    pub doors: plimsoll_listen::Limits,
}

/// The RPC listener's limits when no variable says otherwise: 512 connections, 10 s to the
/// first request, 120 s with no request in flight.
pub const DEFAULT_DOORS: plimsoll_listen::Limits = plimsoll_listen::Limits {
    max_connections: 512,
    header_timeout: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(120),
};

/// Connections the metrics listener (`/healthz`, `/readyz`, `/metrics`) serves at once.
pub const METRICS_MAX_CONNECTIONS: usize = 16;

/// The listeners' limits from `PLIMSOLL_MAX_CONNECTIONS`, `PLIMSOLL_HEADER_TIMEOUT_MS` and
/// `PLIMSOLL_IDLE_TIMEOUT_MS` (each at least 1).
fn doors(v: &Vars<'_>) -> Result<plimsoll_listen::Limits, ConfigError> {
    let d = DEFAULT_DOORS;
    Ok(plimsoll_listen::Limits {
        max_connections: v.positive("PLIMSOLL_MAX_CONNECTIONS", d.max_connections)?,
        header_timeout: v.millis("PLIMSOLL_HEADER_TIMEOUT_MS", d.header_timeout)?,
        idle_timeout: v.millis("PLIMSOLL_IDLE_TIMEOUT_MS", d.idle_timeout)?,
    })
}

/// Whether an address is loopback (`127.0.0.0/8`, `::1`). An unspecified address is not.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// `SANDBOX_*` settings every provider shares (unset ones keep `Shared::default`'s values).
fn shared(v: &Vars<'_>) -> Result<Shared, ConfigError> {
    let d = Shared::default();
    let default_timeout_ms: u32 = v.number(
        "SANDBOX_DEFAULT_TIMEOUT_MS",
        u32::try_from(d.default_timeout.as_millis()).unwrap_or(u32::MAX),
    )?;
    if default_timeout_ms == 0 || default_timeout_ms > plimsoll_core::validate::MAX_TIMEOUT_MS {
        return Err(bad(
            "SANDBOX_DEFAULT_TIMEOUT_MS",
            "must be between 1 and 300000",
        ));
    }
    let resources = Resources {
        memory_mb: v.number("SANDBOX_MEMORY_MB", 0)?,
        cpus: v.number("SANDBOX_CPUS", 0.0)?,
        pids: v.number("SANDBOX_PIDS", 0)?,
        disk_mb: v.number("SANDBOX_DISK_MB", 0)?,
    };
    if !(resources.cpus.is_finite() && resources.cpus >= 0.0) {
        return Err(bad("SANDBOX_CPUS", "must be a non-negative number"));
    }
    Ok(Shared {
        state_dir: v.path("PLIMSOLL_STATE_DIR").unwrap_or(d.state_dir),
        output_bytes: v.number("SANDBOX_OUTPUT_BYTES", d.output_bytes)?,
        default_timeout: Duration::from_millis(default_timeout_ms.into()),
        resources,
        explicit_resources: RESOURCE_VARIABLES
            .into_iter()
            .filter(|n| v.is_set(n))
            .collect(),
        sessions: false,
        session_pool: 0,
    })
}

/// Callers: a registry from `PLIMSOLL_CLIENTS_FILE`, or insecure mode on loopback.
fn caller_auth(
    clients_file: Option<&std::path::Path>,
    insecure: bool,
    hardened: bool,
    addr: &SocketAddr,
) -> Result<CallerAuth, ConfigError> {
    match (clients_file, insecure) {
        (Some(_), true) => Err(bad(
            "PLIMSOLL_INSECURE",
            "set together with PLIMSOLL_CLIENTS_FILE; choose one",
        )),
        (Some(path), false) => {
            let file = plimsoll_callers::CallersFile::load(path)
                .map_err(|e| bad("PLIMSOLL_CLIENTS_FILE", e.to_string()))?;
            plimsoll_callers::Registry::new(file)
                .map(CallerAuth::Registry)
                .map_err(|e| bad("PLIMSOLL_CLIENTS_FILE", e.to_string()))
        }
        (None, true) if hardened => Err(bad(
            "PLIMSOLL_INSECURE",
            "is refused in hardened mode; use PLIMSOLL_CLIENTS_FILE",
        )),
        (None, true) if !is_loopback(addr) => Err(bad(
            "PLIMSOLL_INSECURE",
            format!("serves without authentication only on a loopback address, and PLIMSOLL_ADDR is {addr}"),
        )),
        (None, true) => Ok(CallerAuth::Insecure),
        (None, false) => Err(bad(
            "PLIMSOLL_CLIENTS_FILE",
            "is not set; create one with `plimsoll callers add --file callers.json --id NAME`, \
             or set PLIMSOLL_INSECURE=1 for development on a loopback address",
        )),
    }
}

impl Config {
    /// Reads and validates the configuration. Fails on the first bad variable.
    pub fn from_env(env: &dyn EnvSource) -> Result<Config, ConfigError> {
        let v = Vars::new(env);
        let addr = v.address("PLIMSOLL_ADDR", "127.0.0.1:8746")?;
        let metrics_addr = match v.string("PLIMSOLL_METRICS_ADDR").as_deref() {
            Some("off") => None,
            _ => Some(v.address("PLIMSOLL_METRICS_ADDR", "127.0.0.1:9464")?),
        };
        let hardened = v.bool("PLIMSOLL_HARDENED")?;
        // Reflection tells anyone who can connect, token or not, the service's schema (all of
        // it is in the public proto files). Hardened mode keeps that door shut unless the
        // operator opens it by name.
        let reflection = if v.is_set("PLIMSOLL_REFLECTION") {
            v.bool("PLIMSOLL_REFLECTION")?
        } else {
            !hardened
        };
        let clients_file = v.path("PLIMSOLL_CLIENTS_FILE");
        let auth = caller_auth(
            clients_file.as_deref(),
            v.bool("PLIMSOLL_INSECURE")?,
            hardened,
            &addr,
        )?;
        let tls = match (v.path("PLIMSOLL_TLS_CERT"), v.path("PLIMSOLL_TLS_KEY")) {
            (Some(c), Some(k)) => Some((c, k)),
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
        let provider_name = v
            .string("SANDBOX_PROVIDER")
            .unwrap_or_else(|| "disabled".into());
        ProviderConfig::check_unselected(&provider_name, env)?;
        let min_isolation = Floor::parse(&v.string("SANDBOX_MIN_ISOLATION").unwrap_or_default())
            .map_err(|e| bad("SANDBOX_MIN_ISOLATION", e.to_string()))?;
        let max_concurrent: usize = v.number("SANDBOX_MAX_CONCURRENT", 8)?;
        if max_concurrent == 0 {
            return Err(bad("SANDBOX_MAX_CONCURRENT", "must be at least 1"));
        }
        let sessions = crate::sessions::SessionSettings::from_vars(&v)?;
        let mut shared = shared(&v)?;
        shared.sessions = sessions.enabled();
        shared.session_pool = sessions.pool;
        if sessions.pool > 0 && provider_name != "docker" {
            return Err(bad(
                "SANDBOX_SESSION_POOL",
                format!("is a pool of Docker session containers, and SANDBOX_PROVIDER is {provider_name}; unset it"),
            ));
        }
        // Credentials named by the grants file are read here, once, from the same source.
        let grants = match v.path("PLIMSOLL_GRANTS_FILE") {
            None => plimsoll_grants::Grants::empty(),
            Some(path) => {
                plimsoll_grants::Grants::load(&path, &|n| env.get(n).filter(|v| !v.is_empty()))
                    .map_err(|e| bad("PLIMSOLL_GRANTS_FILE", e.to_string()))?
            }
        };
        let process_grants_trust_all_callers =
            v.bool("PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS")?;
        let provider = ProviderConfig::from_env(&provider_name, env, &shared)?;
        shared_user_grants_check(
            &provider,
            &grants,
            &auth,
            clients_file.as_deref(),
            process_grants_trust_all_callers,
        )?;
        Ok(Config {
            grants,
            process_grants_trust_all_callers,
            addr,
            metrics_addr,
            auth,
            clients_file,
            tls,
            hardened,
            reflection,
            provider,
            min_isolation,
            max_concurrent,
            shared,
            shutdown_grace: Duration::from_secs(310),
            sessions,
            doors: doors(&v)?,
        })
    }

    /// The embedded daemon of `plimsoll run` without `--addr`: the process provider on an
    /// ephemeral loopback port, metrics off, callers from `callers` (set `provider`, with
    /// [`ProviderConfig::from_env`], to choose another).
    pub fn embedded(callers: plimsoll_callers::Registry) -> Config {
        let shared = Shared::default();
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_addr: None,
            auth: CallerAuth::Registry(callers),
            clients_file: None,
            tls: None,
            hardened: false,
            // Its one client is the CLI that started it.
            reflection: false,
            provider: ProviderConfig::Process(plimsoll_process::ProcessConfig::new(&shared)),
            min_isolation: Floor::NONE,
            max_concurrent: 8,
            shared,
            shutdown_grace: Duration::from_secs(10),
            grants: plimsoll_grants::Grants::empty(),
            process_grants_trust_all_callers: false,
            sessions: crate::sessions::SessionSettings::default(),
            doors: DEFAULT_DOORS,
        }
    }

    /// The limits runs get, as `Describe` states them (the provider may differ from the
    /// shared ones: quickjs states its heap).
    pub fn run_resources(&self) -> Resources {
        self.provider.resources(self.shared.resources)
    }
}

/// Whether the callers file may name one caller only: grant profiles on a provider whose
/// runs share one user, without the operator's trust-all statement. Checked at startup
/// ([`shared_user_grants_check`]) and on every reload of the callers file.
pub(crate) fn one_caller_only(
    provider: &ProviderConfig,
    grants: &plimsoll_grants::Grants,
    trust_all_callers: bool,
) -> bool {
    provider.runs_share_one_user() && !grants.is_empty() && !trust_all_callers
}

/// Grants on a provider whose runs share one user (the process provider), with more than one
/// caller, are refused unless the operator states they trust every caller. Such a tier has no
/// wall: every run is a child of plimsolld under its user, so one run can read another's
/// relay address and secret (from `/proc/<pid>/environ`, or its memory) and rewrite its files
/// and grant client. A grant given to one caller would then be open to every caller that can
/// run code. A reload of the callers file (SIGHUP) applies the same rule
/// ([`one_caller_only`]), so this check covers the daemon's whole life.
fn shared_user_grants_check(
    provider: &ProviderConfig,
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
    if callers < 2 || !one_caller_only(provider, grants, trust_all_callers) {
        return Ok(());
    }
    let file = clients_file.map_or_else(String::new, |p| format!(" ({})", p.display()));
    Err(bad(
        "PLIMSOLL_GRANTS_FILE",
        format!(
            "grant profiles on SANDBOX_PROVIDER={} with {callers} callers in PLIMSOLL_CLIENTS_FILE{file}: \
             the {0} tier has no wall between runs, so any caller's run can read another run's relay secret \
             and use its grant. Use SANDBOX_PROVIDER=docker, or keep one caller in the callers file, \
             or set PLIMSOLL_PROCESS_GRANTS_TRUST_ALL_CALLERS=1 to state that you trust every caller with every grant",
            provider.name()
        ),
    ))
}

/// `PLIMSOLL_*` and `SANDBOX_*` names that are set but not read: reported at startup,
/// because a misspelt safeguard would otherwise be silently off.
pub fn unknown_variables(env: &dyn EnvSource) -> Vec<String> {
    plimsoll_config::unknown_variables(env, &["PLIMSOLL_", "SANDBOX_"], &[&VARIABLES])
}

/// The `--help` text listing every variable.
pub fn variables_help() -> String {
    plimsoll_config::help(&[&VARIABLES])
}

#[cfg(test)]
mod tests;
