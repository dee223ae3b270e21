//! The bwrap provider's settings: its variables ([`VARIABLES`]), read and checked before
//! anything is started, and the limits runs get.
//!
//! # Choices where the specification is silent
//!
//! - **Which users run the sandboxes.** When plimsolld runs as root, each sandbox gets a
//!   host user and group of its own from a range of 65,536 starting at `SANDBOX_BWRAP_USER`
//!   (default `2000000000:2000000000`, far from the ranges distributions and systemd hand
//!   out), so the code's user namespace maps to that user, never to root, and no two live
//!   sandboxes (or any other program) share one: they cannot signal, trace or read each
//!   other even on the host, and the process limit counts one sandbox. When plimsolld runs
//!   as another user, every sandbox maps to that user and the variable is refused.
//! - **Where sandboxd comes from.** `SANDBOX_BWRAP_SANDBOXD`, else `plimsoll-sandboxd` beside
//!   plimsolld's own executable, else on `PATH`; it is bound read-only into each sandbox.
//! - **Limits.** `SANDBOX_PIDS` (default 256) is the kernel's per-user process limit
//!   inside each sandbox's own user namespace, so it counts that sandbox's processes only.
//!   `SANDBOX_DISK_MB` (default 160) is the size of the sandbox's `/work` tmpfs (and `/tmp`
//!   is a further 16 MiB). `SANDBOX_CPUS` is held only through a delegated cgroup v2 (the
//!   `cgroup` module): set where there is none, it is refused at startup, naming it and why.
//! - **Memory.** With `SANDBOX_MEMORY_MB` set and a delegated cgroup v2, the sandbox's
//!   total is held by its cgroup's `memory.max`. Otherwise (the variable unset, or no
//!   delegated cgroup v2) every process of a sandbox gets `RLIMIT_AS` and `RLIMIT_DATA` of
//!   `SANDBOX_MEMORY_MB` (default [`DEFAULT_PROCESS_MEMORY_MB`]), set by sandboxd on itself
//!   before anything starts (`--max-memory-mb`) and inherited by every program: a weaker
//!   bound, per process, so a sandbox's total is at most that times `SANDBOX_PIDS`. Startup
//!   and `Describe` state which one holds (`Describe`'s memory is then the per-process
//!   bound).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use plimsoll_provider::{
    ConfigError, EnvSource, Provider, ProviderSetup, ProviderStartError, Resources, Shared,
    Variable, Vars,
};

use crate::provider::BwrapProvider;

/// The provider's name.
pub const NAME: &str = "bwrap";

/// Every variable the bwrap provider reads, with one line of help.
pub const VARIABLES: &[Variable] = &[
    (
        "SANDBOX_BWRAP_PATH",
        "the bubblewrap binary for SANDBOX_PROVIDER=bwrap (default: bwrap on PATH)",
    ),
    (
        "SANDBOX_BWRAP_SANDBOXD",
        "plimsoll-sandboxd for the bwrap provider (default: beside plimsolld, then PATH)",
    ),
    (
        "SANDBOX_BWRAP_USER",
        "first host UID:GID of the 65536 bwrap sandboxes run as, one each, when plimsolld is root (default 2000000000:2000000000)",
    ),
    (
        "SANDBOX_BWRAP_POOL",
        "sandboxes kept started ahead of runs, each used once (default 2)",
    ),
];

/// Process limit when `SANDBOX_PIDS` is 0.
pub const DEFAULT_PIDS: u32 = 256;
/// Size of the `/work` tmpfs when `SANDBOX_DISK_MB` is 0, in MiB.
pub const DEFAULT_DISK_MB: u32 = 160;
/// Memory per process (`RLIMIT_AS`, `RLIMIT_DATA`) without a delegated cgroup v2, when
/// `SANDBOX_MEMORY_MB` is unset, in MiB.
pub const DEFAULT_PROCESS_MEMORY_MB: u32 = 1024;
/// Size of the `/tmp` tmpfs, in MiB.
pub const TMP_MB: u32 = 16;
/// The warm pool's size when `SANDBOX_BWRAP_POOL` is unset.
pub const DEFAULT_POOL: usize = 2;
/// Largest warm pool accepted.
pub const MAX_POOL: usize = 64;
/// The first host user and group of the sandboxes' range when plimsolld is root and
/// `SANDBOX_BWRAP_USER` is unset.
pub const DEFAULT_USER: (u32, u32) = (2_000_000_000, 2_000_000_000);

/// Everything the bwrap provider needs.
#[derive(Debug, Clone)]
pub struct BwrapConfig {
    /// `SANDBOX_BWRAP_PATH`, or `None` to look for `bwrap` on `PATH` at startup.
    pub bwrap: Option<PathBuf>,
    /// `SANDBOX_BWRAP_SANDBOXD`, or `None` for beside plimsolld, then `PATH`.
    pub sandboxd: Option<PathBuf>,
    /// The first host user and group of the range sandboxes run as, one each (`None`:
    /// plimsolld's own user, for every sandbox).
    pub run_as: Option<(u32, u32)>,
    /// Sandboxes kept started ahead of runs.
    pub pool: usize,
    /// The provider's files go to `bwrap/` below it.
    pub state_dir: PathBuf,
    /// Bytes kept of each output stream per program.
    pub output_bytes: usize,
    /// Deadline of a run whose request states none.
    pub default_timeout: Duration,
    /// Processes per sandbox.
    pub pids: u32,
    /// Size of each sandbox's `/work`, in MiB.
    pub disk_mb: u32,
    /// Memory and CPU limits, held through a delegated cgroup v2 (zero: none).
    pub cgroup: crate::cgroup::Limits,
    /// Memory per process (`RLIMIT_AS` and `RLIMIT_DATA`, in MiB) when the cgroup holds no
    /// memory limit (0: none).
    pub process_memory_mb: u32,
}

impl BwrapConfig {
    /// How memory is bounded, in words for the startup line and the docs.
    pub fn memory_statement(&self) -> String {
        if self.cgroup.memory_mb > 0 {
            format!(
                "memory: {} MiB per sandbox in all (memory.max of a delegated cgroup v2)",
                self.cgroup.memory_mb
            )
        } else if self.process_memory_mb > 0 {
            format!(
                "memory: RLIMIT_AS and RLIMIT_DATA {} MiB per process; no delegated cgroup v2 holds SANDBOX_MEMORY_MB, so a sandbox's total is not bounded (at most that times SANDBOX_PIDS {})",
                self.process_memory_mb, self.pids
            )
        } else {
            "memory: not limited".to_owned()
        }
    }
}

impl BwrapConfig {
    /// The settings from the shared ones alone (the defaults of every bwrap variable).
    pub fn new(shared: &Shared) -> BwrapConfig {
        let nz = |v: u32, d: u32| if v == 0 { d } else { v };
        BwrapConfig {
            bwrap: None,
            sandboxd: None,
            run_as: is_root().then_some(DEFAULT_USER),
            pool: DEFAULT_POOL,
            state_dir: shared.state_dir.clone(),
            output_bytes: shared.output_bytes,
            default_timeout: shared.default_timeout,
            pids: nz(shared.resources.pids, DEFAULT_PIDS),
            disk_mb: nz(shared.resources.disk_mb, DEFAULT_DISK_MB),
            cgroup: crate::cgroup::Limits {
                memory_mb: 0,
                cpus: 0.0,
            },
            process_memory_mb: DEFAULT_PROCESS_MEMORY_MB,
        }
    }
}

/// Whether plimsolld runs as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The provider's own variables, read and checked.
struct Own {
    bwrap: Option<PathBuf>,
    sandboxd: Option<PathBuf>,
    user: Option<(u32, u32)>,
    pool: usize,
}

fn check_own(vars: &Vars<'_>) -> Result<Own, ConfigError> {
    let program = |name: &str, fix: &str| -> Result<Option<PathBuf>, ConfigError> {
        let Some(p) = vars.path(name) else {
            return Ok(None);
        };
        if !p.is_absolute() {
            return Err(ConfigError::new(
                name,
                format!("{} is not an absolute path", p.display()),
            ));
        }
        if !crate::host::is_executable(&p) {
            return Err(ConfigError::new(
                name,
                format!("{} is not an executable file; {fix}", p.display()),
            ));
        }
        Ok(Some(p))
    };
    let bwrap = program(
        "SANDBOX_BWRAP_PATH",
        "install bubblewrap (Debian: apt-get install bubblewrap) and point it there, or unset it to use bwrap on PATH",
    )?;
    let sandboxd = program(
        "SANDBOX_BWRAP_SANDBOXD",
        "point it at plimsoll-sandboxd, or unset it to use the one beside plimsolld",
    )?;
    let user = match vars.string("SANDBOX_BWRAP_USER") {
        None => None,
        Some(v) => Some(
            plimsoll_provider::users::parse(&v)
                .map_err(|m| ConfigError::new("SANDBOX_BWRAP_USER", m))?,
        ),
    };
    let pool = vars.number("SANDBOX_BWRAP_POOL", DEFAULT_POOL)?;
    if pool > MAX_POOL {
        return Err(ConfigError::new(
            "SANDBOX_BWRAP_POOL",
            format!("{pool} is more than {MAX_POOL}"),
        ));
    }
    Ok(Own {
        bwrap,
        sandboxd,
        user,
        pool,
    })
}

impl ProviderSetup for BwrapConfig {
    const NAME: &'static str = NAME;
    const VARIABLES: &'static [Variable] = VARIABLES;

    fn from_env(env: &dyn EnvSource, shared: &Shared) -> Result<Self, ConfigError> {
        let vars = Vars::new(env);
        let Own {
            bwrap,
            sandboxd,
            user,
            pool,
        } = check_own(&vars)?;
        let mut c = BwrapConfig::new(shared);
        let explicit = |n: &str| shared.explicit_resources.contains(&n);
        if explicit("SANDBOX_MEMORY_MB") {
            c.cgroup.memory_mb = shared.resources.memory_mb;
        }
        if explicit("SANDBOX_CPUS") {
            c.cgroup.cpus = shared.resources.cpus;
        }
        if c.cgroup.memory_mb > 0 && c.cgroup.memory_mb < 32 {
            return Err(ConfigError::new(
                "SANDBOX_MEMORY_MB",
                format!(
                    "{} MiB is too small for sandboxd and an interpreter; use at least 32",
                    c.cgroup.memory_mb
                ),
            ));
        }
        if c.cgroup.cpus > 0.0 {
            if let Err(why) = crate::cgroup::find(&c.cgroup) {
                return Err(ConfigError::new(
                    "SANDBOX_CPUS",
                    format!("the bwrap provider holds CPU limits only through a delegated cgroup v2, and cannot here: {why}; unset it, delegate a cgroup v2 to plimsolld (systemd: Delegate=yes), or use SANDBOX_PROVIDER=docker"),
                ));
            }
        }
        if c.cgroup.memory_mb > 0 {
            match crate::cgroup::find(&c.cgroup) {
                // The total is held by the cgroup.
                Ok(_) => c.process_memory_mb = 0,
                // No delegated cgroup v2: the weaker bound, per process.
                Err(why) => {
                    tracing::debug!(%why, "no delegated cgroup v2 for SANDBOX_MEMORY_MB: per process");
                    c.process_memory_mb = c.cgroup.memory_mb;
                    c.cgroup.memory_mb = 0;
                }
            }
        }
        if c.pids < 16 {
            return Err(ConfigError::new(
                "SANDBOX_PIDS",
                format!(
                    "{} processes leave no room for sandboxd's own threads; use at least 16",
                    c.pids
                ),
            ));
        }
        if c.disk_mb < 16 {
            return Err(ConfigError::new(
                "SANDBOX_DISK_MB",
                format!(
                    "{} MiB is too small for a run's files; use at least 16",
                    c.disk_mb
                ),
            ));
        }
        c.bwrap = bwrap;
        c.sandboxd = sandboxd;
        c.pool = pool;
        match (user, is_root()) {
            (Some(u), true) => c.run_as = Some(u),
            (Some(_), false) => {
                return Err(ConfigError::new(
                    "SANDBOX_BWRAP_USER",
                    "only a plimsolld running as root can start sandboxes as another user; unset it (the sandboxes then map to plimsolld's own user)",
                ))
            }
            (None, _) => {}
        }
        Ok(c)
    }

    fn check_unselected(env: &dyn EnvSource, chosen: &str) -> Result<(), ConfigError> {
        let vars = Vars::new(env);
        for (name, _) in VARIABLES {
            if vars.is_set(name) {
                return Err(ConfigError::new(
                    *name,
                    format!("it is read only with SANDBOX_PROVIDER=bwrap, and the provider is {chosen}; unset it"),
                ));
            }
        }
        Ok(())
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderStartError> {
        Ok(Arc::new(BwrapProvider::new(self.clone())?))
    }

    fn resources(&self, _shared: Resources) -> Resources {
        Resources {
            memory_mb: if self.cgroup.memory_mb > 0 {
                self.cgroup.memory_mb
            } else {
                self.process_memory_mb
            },
            cpus: self.cgroup.cpus,
            pids: self.pids,
            disk_mb: self.disk_mb,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_config::MapEnv;

    fn read(pairs: &[(&str, &str)], shared: &Shared) -> Result<BwrapConfig, ConfigError> {
        BwrapConfig::from_env(&MapEnv::from_pairs(pairs.iter().copied()), shared)
    }

    #[test]
    fn memory_without_a_cgroup_is_per_process_and_cpus_are_refused_by_name() {
        let mut shared = Shared::default();
        let c = read(&[], &shared).unwrap();
        assert_eq!(
            (c.pids, c.disk_mb, c.pool),
            (DEFAULT_PIDS, DEFAULT_DISK_MB, DEFAULT_POOL)
        );
        // Unset: the per-process default, stated.
        assert_eq!(c.process_memory_mb, DEFAULT_PROCESS_MEMORY_MB);
        let r = c.resources(shared.resources);
        assert_eq!((r.memory_mb, r.cpus), (DEFAULT_PROCESS_MEMORY_MB, 0.0));
        assert!(
            c.memory_statement().contains("RLIMIT_AS"),
            "{}",
            c.memory_statement()
        );
        shared.explicit_resources = vec!["SANDBOX_MEMORY_MB"];
        shared.resources.memory_mb = 256;
        let memory = crate::cgroup::Limits {
            memory_mb: 256,
            cpus: 0.0,
        };
        let c = read(&[], &shared).unwrap();
        assert_eq!(c.resources(shared.resources).memory_mb, 256);
        match crate::cgroup::find(&memory) {
            // A host that delegates a cgroup v2: the total is held there.
            Ok(_) => assert_eq!((c.cgroup.memory_mb, c.process_memory_mb), (256, 0)),
            // None: the same number, per process, and said so.
            Err(_) => {
                assert_eq!((c.cgroup.memory_mb, c.process_memory_mb), (0, 256));
                assert!(
                    c.memory_statement().contains("256 MiB per process")
                        && c.memory_statement().contains("not bounded"),
                    "{}",
                    c.memory_statement()
                );
            }
        }
        shared.explicit_resources = vec!["SANDBOX_CPUS"];
        shared.resources.cpus = 1.0;
        if crate::cgroup::find(&crate::cgroup::Limits {
            memory_mb: 0,
            cpus: 1.0,
        })
        .is_err()
        {
            let e = read(&[], &shared).unwrap_err();
            assert_eq!(e.name, "SANDBOX_CPUS");
            assert!(e.message.contains("delegated cgroup v2"), "{e}");
        }
    }

    #[test]
    fn malformed_values_name_their_variable() {
        let s = Shared::default();
        for (pairs, name) in [
            (vec![("SANDBOX_BWRAP_PATH", "bwrap")], "SANDBOX_BWRAP_PATH"),
            (
                vec![("SANDBOX_BWRAP_PATH", "/nonexistent/bwrap")],
                "SANDBOX_BWRAP_PATH",
            ),
            (
                vec![("SANDBOX_BWRAP_SANDBOXD", "/nonexistent/sandboxd")],
                "SANDBOX_BWRAP_SANDBOXD",
            ),
            (
                vec![("SANDBOX_BWRAP_SANDBOXD", "sandboxd")],
                "SANDBOX_BWRAP_SANDBOXD",
            ),
            (vec![("SANDBOX_BWRAP_USER", "0:0")], "SANDBOX_BWRAP_USER"),
            (vec![("SANDBOX_BWRAP_USER", "1000:0")], "SANDBOX_BWRAP_USER"),
            (
                vec![("SANDBOX_BWRAP_USER", "4294967000:5000")],
                "SANDBOX_BWRAP_USER",
            ),
            (vec![("SANDBOX_BWRAP_USER", "nobody")], "SANDBOX_BWRAP_USER"),
            (vec![("SANDBOX_BWRAP_POOL", "65")], "SANDBOX_BWRAP_POOL"),
        ] {
            assert_eq!(read(&pairs, &s).unwrap_err().name, name, "{pairs:?}");
        }
        let e = BwrapConfig::check_unselected(
            &MapEnv::from_pairs([("SANDBOX_BWRAP_POOL", "1")]),
            "docker",
        )
        .unwrap_err();
        assert_eq!(e.name, "SANDBOX_BWRAP_POOL");
    }
}
