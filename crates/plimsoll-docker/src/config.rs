//! The Docker provider's typed configuration: its variables ([`VARIABLES`]), read from the
//! environment source plimsolld hands over and checked here before anything touches the
//! engine. The `SANDBOX_DOCKER_*` values are checked whatever the provider (a typo fails
//! early); the image is required only when `SANDBOX_PROVIDER=docker`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plimsoll_provider::{
    ConfigError, EnvSource, Provider, ProviderSetup, ProviderStartError, Shared, Variable, Vars,
};

use crate::scan::ShipScan;

/// The provider's name.
pub const NAME: &str = "docker";

/// Every variable the Docker provider reads, with one line of help.
pub const VARIABLES: &[Variable] = &[
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
        "seccomp profile for each container: empty for plimsoll's (the bwrap provider's rules), `engine` for the engine's default, or a JSON file",
    ),
    (
        "DOCKER_HOST",
        "the Docker engine's socket for the docker provider (default unix:///var/run/docker.sock)",
    ),
    (
        "PLIMSOLL_WITHHELD_SET",
        "withheld set the docker provider scans its images against at startup",
    ),
    (
        "PLIMSOLL_WITHHELD_KNOWN_FILE",
        "known-unreadable lists for that scan",
    ),
];

/// Memory limit when `SANDBOX_MEMORY_MB` is 0, in MiB.
pub const DEFAULT_MEMORY_MB: u32 = 512;
/// CPU limit when `SANDBOX_CPUS` is 0.
pub const DEFAULT_CPUS: f64 = 1.0;
/// Process limit when `SANDBOX_PIDS` is 0.
pub const DEFAULT_PIDS: u32 = 256;
/// Writable disk (all tmpfs mounts together) when `SANDBOX_DISK_MB` is 0, in MiB.
pub const DEFAULT_DISK_MB: u32 = 160;
/// Size of the `/tmp` tmpfs, in MiB.
pub const TMP_MB: u32 = 16;
/// Size of the `/dev/shm` tmpfs, in MiB.
pub const SHM_MB: u32 = 16;
/// Smallest `/work` tmpfs accepted, in MiB.
pub const MIN_WORK_MB: u32 = 16;
/// Largest warm pool accepted.
pub const MAX_POOL: usize = 64;

/// Which OCI runtime the engine runs each container under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// runc: Linux namespaces, cgroups, seccomp. Tier `container`.
    Runc,
    /// gVisor's runsc: a user-space kernel between the code and the host kernel. Tier
    /// `kernel`, once the startup check proves it.
    Runsc,
}

impl Runtime {
    /// Parses `SANDBOX_DOCKER_RUNTIME` (empty means runc).
    pub fn parse(v: &str) -> Result<Runtime, String> {
        match v.trim() {
            "" | "runc" => Ok(Runtime::Runc),
            "runsc" => Ok(Runtime::Runsc),
            other => Err(format!("{other:?} is not a runtime; use runc or runsc")),
        }
    }

    /// The runtime's name as the engine lists it.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Runsc => "runsc",
        }
    }
}

/// The seccomp profile applied to each container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seccomp {
    /// plimsoll's profile ([`plimsoll_provider::seccomp::docker_profile`]): the rules the
    /// bwrap provider's filter holds, so a `container` tier means the same calls refused
    /// under either wall. The default.
    Plimsoll,
    /// The engine's default profile (`SANDBOX_DOCKER_SECCOMP=engine`), which allows what
    /// docs/walls.md lists for it (other socket families, `TIOCSTI`, `modify_ldt`, `ptrace`
    /// of a child, executing a `memfd`).
    EngineDefault,
    /// A JSON profile read from this file at startup.
    File(PathBuf),
}

/// Everything the Docker provider needs. Zero resource values mean the defaults above.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// `SANDBOX_DOCKER_IMAGE`: a tag, `name@sha256:…` or a content ID. Resolved to a
    /// content ID once at startup; only that ID runs.
    pub image: String,
    /// `SANDBOX_DOCKER_RUNTIME`.
    pub runtime: Runtime,
    /// The name the engine lists the runtime under, when it is not the runtime's own
    /// (`runc`, `runsc`). Tests register variants of runsc under other names.
    pub runtime_name: Option<String>,
    /// `SANDBOX_DOCKER_POOL`: containers kept created, started and ready ahead of runs.
    pub pool: usize,
    /// `SANDBOX_SESSION_POOL`: never-used session containers kept ready.
    pub session_pool: usize,
    /// `SANDBOX_DOCKER_SECCOMP`.
    pub seccomp: Seccomp,
    /// `SANDBOX_MEMORY_MB` (0 = [`DEFAULT_MEMORY_MB`]).
    pub memory_mb: u32,
    /// `SANDBOX_CPUS` (0 = [`DEFAULT_CPUS`]).
    pub cpus: f64,
    /// `SANDBOX_PIDS` (0 = [`DEFAULT_PIDS`]).
    pub pids: u32,
    /// `SANDBOX_DISK_MB` (0 = [`DEFAULT_DISK_MB`]): `/tmp`, `/dev/shm` and `/work` together.
    pub disk_mb: u32,
    /// `DOCKER_HOST` (`unix:///path`); `None` is `unix:///var/run/docker.sock`.
    pub docker_host: Option<String>,
    /// Where this provider keeps its instance locks and per-run directories (under
    /// `PLIMSOLL_STATE_DIR`). It must be a path the engine sees as the same path.
    pub state_dir: PathBuf,
    /// Bytes kept per output stream per program (`SANDBOX_OUTPUT_BYTES`).
    pub output_bytes: usize,
    /// Deadline of a run whose request states none.
    pub default_timeout: Duration,
    /// The startup ship scan (`PLIMSOLL_WITHHELD_SET`), run before any container starts.
    pub withheld: Option<ShipScan>,
}

/// Resource limits after defaults were applied, as each container gets them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Memory (and memory + swap: no swap) in MiB.
    pub memory_mb: u32,
    /// CPUs.
    pub cpus: f64,
    /// Processes and threads.
    pub pids: u32,
    /// `/tmp` tmpfs in MiB.
    pub tmp_mb: u32,
    /// `/dev/shm` tmpfs in MiB.
    pub shm_mb: u32,
    /// `/work` tmpfs in MiB.
    pub work_mb: u32,
}

impl DockerConfig {
    /// A configuration with defaults for everything but the image and the state directory.
    pub fn new(image: impl Into<String>, state_dir: impl Into<PathBuf>) -> DockerConfig {
        DockerConfig {
            image: image.into(),
            runtime: Runtime::Runc,
            runtime_name: None,
            pool: 0,
            session_pool: 0,
            seccomp: Seccomp::Plimsoll,
            memory_mb: 0,
            cpus: 0.0,
            pids: 0,
            disk_mb: 0,
            docker_host: None,
            state_dir: state_dir.into(),
            output_bytes: 1024 * 1024,
            default_timeout: Duration::from_secs(30),
            withheld: None,
        }
    }

    /// The engine's name for the runtime each container runs under.
    pub fn engine_runtime(&self) -> &str {
        match self.runtime_name.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() => n,
            _ => self.runtime.as_str(),
        }
    }

    /// The limits each container gets, or a message naming the variable that cannot work.
    pub fn limits(&self) -> Result<Limits, (&'static str, String)> {
        let nz = |v: u32, d: u32| if v == 0 { d } else { v };
        let memory_mb = nz(self.memory_mb, DEFAULT_MEMORY_MB);
        if memory_mb < 32 {
            return Err((
                "SANDBOX_MEMORY_MB",
                format!(
                    "{memory_mb} MiB is too small for sandboxd and an interpreter; use at least 32"
                ),
            ));
        }
        let cpus = if self.cpus == 0.0 {
            DEFAULT_CPUS
        } else {
            self.cpus
        };
        if !(cpus.is_finite() && cpus >= 0.01) {
            return Err(("SANDBOX_CPUS", format!("{cpus} is not a usable CPU limit")));
        }
        let pids = nz(self.pids, DEFAULT_PIDS);
        if pids < 16 {
            return Err((
                "SANDBOX_PIDS",
                format!(
                    "{pids} processes leave no room for sandboxd's own threads; use at least 16"
                ),
            ));
        }
        let disk = nz(self.disk_mb, DEFAULT_DISK_MB);
        let Some(work_mb) = disk
            .checked_sub(TMP_MB + SHM_MB)
            .filter(|w| *w >= MIN_WORK_MB)
        else {
            return Err((
                "SANDBOX_DISK_MB",
                format!(
                    "{disk} MiB cannot hold /tmp ({TMP_MB}), /dev/shm ({SHM_MB}) and a /work of at least {MIN_WORK_MB} MiB; use at least {}",
                    TMP_MB + SHM_MB + MIN_WORK_MB
                ),
            ));
        };
        Ok(Limits {
            memory_mb,
            cpus,
            pids,
            tmp_mb: TMP_MB,
            shm_mb: SHM_MB,
            work_mb,
        })
    }

    /// The engine's Unix socket path from `DOCKER_HOST`, or a message naming it.
    pub fn socket_path(&self) -> Result<PathBuf, String> {
        match self.docker_host.as_deref().map(str::trim) {
            None | Some("") => Ok(PathBuf::from("/var/run/docker.sock")),
            Some(h) => match h.strip_prefix("unix://") {
                Some(p) if p.starts_with('/') => Ok(PathBuf::from(p)),
                _ => Err(format!(
                    "DOCKER_HOST={h:?}: the docker provider speaks to the engine only over a local Unix socket (unix:///path/to/docker.sock)"
                )),
            },
        }
    }
}

/// The `SANDBOX_DOCKER_*` values that are checked whatever the provider.
struct EngineSettings {
    runtime: Runtime,
    pool: usize,
    seccomp: Seccomp,
}

fn engine_settings(v: &Vars<'_>) -> Result<EngineSettings, ConfigError> {
    let runtime = Runtime::parse(&v.string("SANDBOX_DOCKER_RUNTIME").unwrap_or_default())
        .map_err(|m| ConfigError::new("SANDBOX_DOCKER_RUNTIME", m))?;
    let pool: usize = v.number("SANDBOX_DOCKER_POOL", 0)?;
    if pool > MAX_POOL {
        return Err(ConfigError::new(
            "SANDBOX_DOCKER_POOL",
            format!("{pool} is more than {MAX_POOL}"),
        ));
    }
    let seccomp = match v.string("SANDBOX_DOCKER_SECCOMP") {
        None => Seccomp::Plimsoll,
        Some(s) if s == "engine" => Seccomp::EngineDefault,
        Some(s) if s == "unconfined" => {
            return Err(ConfigError::new(
                "SANDBOX_DOCKER_SECCOMP",
                "`unconfined` is refused: every container runs under a seccomp profile (leave it empty for plimsoll's, or `engine` for the engine's default)",
            ))
        }
        Some(s) => Seccomp::File(PathBuf::from(s)),
    };
    Ok(EngineSettings {
        runtime,
        pool,
        seccomp,
    })
}

/// `PLIMSOLL_WITHHELD_SET` and `PLIMSOLL_WITHHELD_KNOWN_FILE`, read and checked now so a bad
/// file stops startup as a configuration error. The scan looks at the docker provider's
/// image only: with another provider (`chosen`) nothing would be scanned, so a set is
/// refused rather than silently ignored, and a known file without a set likewise.
fn ship_scan(v: &Vars<'_>, chosen: &str) -> Result<Option<ShipScan>, ConfigError> {
    let known_file = v.path("PLIMSOLL_WITHHELD_KNOWN_FILE");
    let Some(set_file) = v.path("PLIMSOLL_WITHHELD_SET") else {
        if known_file.is_some() {
            return Err(ConfigError::new(
                "PLIMSOLL_WITHHELD_KNOWN_FILE",
                "is set without PLIMSOLL_WITHHELD_SET, so nothing would be scanned; set PLIMSOLL_WITHHELD_SET too, or unset this",
            ));
        }
        return Ok(None);
    };
    if chosen != NAME {
        return Err(ConfigError::new(
            "PLIMSOLL_WITHHELD_SET",
            format!(
                "is set but SANDBOX_PROVIDER is {chosen}: only the docker provider's image is scanned at startup, so nothing would be scanned; \
                 scan other images before they ship with `plimsoll-withheld scan-image`, and unset this variable"
            ),
        ));
    }
    let set = plimsoll_withheld::WithheldSet::load(&set_file).map_err(|e| {
        ConfigError::new(
            "PLIMSOLL_WITHHELD_SET",
            format!("not a usable withheld set: {e}"),
        )
    })?;
    let known = match &known_file {
        None => plimsoll_withheld::KnownImages::empty(),
        Some(p) => plimsoll_withheld::KnownImages::load(p).map_err(|e| {
            ConfigError::new(
                "PLIMSOLL_WITHHELD_KNOWN_FILE",
                format!("not a usable known-images file: {e}; write it with `plimsoll-withheld known-unreadable`"),
            )
        })?,
    };
    Ok(Some(ShipScan {
        set_file,
        set,
        known_file,
        known,
    }))
}

impl ProviderSetup for DockerConfig {
    const NAME: &'static str = NAME;
    const VARIABLES: &'static [Variable] = VARIABLES;

    fn from_env(env: &dyn EnvSource, shared: &Shared) -> Result<Self, ConfigError> {
        let v = Vars::new(env);
        let withheld = ship_scan(&v, NAME)?;
        let engine = engine_settings(&v)?;
        let image = v.string("SANDBOX_DOCKER_IMAGE").ok_or_else(|| {
            ConfigError::new(
                "SANDBOX_DOCKER_IMAGE",
                "is required with SANDBOX_PROVIDER=docker; build the image with `cargo xtask images` and set its ID",
            )
        })?;
        let mut c = DockerConfig::new(image, shared.state_dir.join("docker"));
        c.runtime = engine.runtime;
        c.pool = engine.pool;
        c.session_pool = shared.session_pool;
        c.seccomp = engine.seccomp;
        let r = shared.resources;
        (c.memory_mb, c.cpus, c.pids, c.disk_mb) = (r.memory_mb, r.cpus, r.pids, r.disk_mb);
        c.docker_host = v.string("DOCKER_HOST");
        c.output_bytes = shared.output_bytes;
        c.default_timeout = shared.default_timeout;
        c.withheld = withheld;
        c.limits().map_err(|(var, m)| ConfigError::new(var, m))?;
        Ok(c)
    }

    fn check_unselected(env: &dyn EnvSource, chosen: &str) -> Result<(), ConfigError> {
        let v = Vars::new(env);
        ship_scan(&v, chosen)?;
        engine_settings(&v).map(|_| ())
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderStartError> {
        Ok(Arc::new(crate::DockerProvider::new(self.clone())?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_disk_split() {
        let c = DockerConfig::new("img", "/tmp/s");
        let l = c.limits().unwrap();
        assert_eq!(
            (l.memory_mb, l.pids, l.tmp_mb, l.shm_mb, l.work_mb),
            (512, 256, 16, 16, 128)
        );
        let mut c = DockerConfig::new("img", "/tmp/s");
        c.disk_mb = 40;
        assert_eq!(c.limits().unwrap_err().0, "SANDBOX_DISK_MB");
        c.disk_mb = 1000;
        assert_eq!(c.limits().unwrap().work_mb, 968);
        c.pids = 3;
        assert_eq!(c.limits().unwrap_err().0, "SANDBOX_PIDS");
    }

    #[test]
    fn docker_host_must_be_a_unix_socket() {
        let mut c = DockerConfig::new("img", "/tmp/s");
        assert_eq!(
            c.socket_path().unwrap(),
            PathBuf::from("/var/run/docker.sock")
        );
        c.docker_host = Some("unix:///run/user/1000/docker.sock".into());
        assert_eq!(
            c.socket_path().unwrap(),
            PathBuf::from("/run/user/1000/docker.sock")
        );
        c.docker_host = Some("tcp://10.0.0.1:2375".into());
        assert!(c.socket_path().unwrap_err().contains("DOCKER_HOST"));
    }

    #[test]
    fn runtimes() {
        assert_eq!(Runtime::parse("").unwrap(), Runtime::Runc);
        assert_eq!(Runtime::parse("runsc").unwrap(), Runtime::Runsc);
        assert!(Runtime::parse("kata").is_err());
    }
}
