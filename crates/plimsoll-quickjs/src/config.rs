//! How plimsolld configures the quickjs provider: `SANDBOX_QUICKJS_WORKER`, and which of the
//! shared limits it keeps (the engine's heap from `SANDBOX_MEMORY_MB`, the deadline, the
//! output cap). One worker process with one engine heap has no use for a CPU, process or disk
//! limit, so setting one is refused rather than promised and not kept.

use std::sync::Arc;
use std::time::Duration;

use plimsoll_provider::{
    ConfigError, EnvSource, Provider, ProviderSetup, ProviderStartError, Resources, Shared,
    Variable, Vars,
};

use crate::provider::{QuickJsConfig, QuickJsProvider, WorkerCommand, MAX_TIMEOUT_MS};

/// The provider's name.
pub const NAME: &str = "quickjs";

/// The worker variable.
const WORKER: &str = "SANDBOX_QUICKJS_WORKER";

impl ProviderSetup for QuickJsConfig {
    const NAME: &'static str = NAME;
    const VARIABLES: &'static [Variable] = &[(
        WORKER,
        "the quickjs provider's worker program (default: plimsolld itself, re-executed)",
    )];

    fn from_env(env: &dyn EnvSource, shared: &Shared) -> Result<Self, ConfigError> {
        // One worker process, one engine heap: the other limits would be promises the
        // provider does not keep.
        if let Some(n) = shared
            .explicit_resources
            .iter()
            .find(|n| **n != "SANDBOX_MEMORY_MB")
        {
            return Err(ConfigError::new(
                *n,
                "is not supported by SANDBOX_PROVIDER=quickjs, which limits the engine's memory (SANDBOX_MEMORY_MB), its stack and the deadline; unset it",
            ));
        }
        let worker = match Vars::new(env).file(
            WORKER,
            "name the plimsoll-quickjs-worker binary, or unset it to use plimsolld itself",
        )? {
            Some(path) => WorkerCommand::binary(path),
            None => WorkerCommand::current_exe().map_err(|e| {
                ConfigError::new(
                    WORKER,
                    format!("cannot find the running binary to start workers: {e}; set SANDBOX_QUICKJS_WORKER"),
                )
            })?,
        };
        let mut q = QuickJsConfig::new(worker);
        if shared.resources.memory_mb != 0 {
            q.memory_mb = shared.resources.memory_mb;
        }
        q.output_bytes = shared.output_bytes;
        q.default_timeout = shared
            .default_timeout
            .min(Duration::from_millis(MAX_TIMEOUT_MS.into()));
        Ok(q)
    }

    fn check_unselected(env: &dyn EnvSource, chosen: &str) -> Result<(), ConfigError> {
        if Vars::new(env).is_set(WORKER) {
            return Err(ConfigError::new(
                WORKER,
                format!("is set but SANDBOX_PROVIDER is {chosen}; unset it, or use SANDBOX_PROVIDER=quickjs"),
            ));
        }
        Ok(())
    }

    fn build(&self) -> Result<Arc<dyn Provider>, ProviderStartError> {
        Ok(Arc::new(QuickJsProvider::new(self.clone())))
    }

    /// `Describe` states the heap limit the provider applies, not "the provider's default".
    fn resources(&self, shared: Resources) -> Resources {
        Resources {
            memory_mb: self.memory_mb,
            ..shared
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plimsoll_config::MapEnv;

    fn read(pairs: &[(&str, &str)], shared: &Shared) -> Result<QuickJsConfig, ConfigError> {
        QuickJsConfig::from_env(&MapEnv::from_pairs(pairs.iter().copied()), shared)
    }

    #[test]
    fn takes_only_its_own_limits_and_worker() {
        let mut shared = Shared::default();
        let q = read(&[], &shared).unwrap();
        assert_eq!(q.memory_mb, crate::provider::DEFAULT_MEMORY_MB);
        assert_eq!(q.worker, WorkerCommand::current_exe().unwrap());
        shared.resources.memory_mb = 32;
        shared.explicit_resources = vec!["SANDBOX_MEMORY_MB"];
        assert_eq!(read(&[], &shared).unwrap().memory_mb, 32);
        assert_eq!(
            q.resources(shared.resources).memory_mb,
            crate::provider::DEFAULT_MEMORY_MB
        );
        for name in ["SANDBOX_CPUS", "SANDBOX_PIDS", "SANDBOX_DISK_MB"] {
            let mut s = shared.clone();
            s.explicit_resources.push(name);
            let e = read(&[], &s).unwrap_err();
            assert_eq!(e.name, name);
            assert!(e.message.contains("quickjs"), "{e}");
        }
        let e = read(&[(WORKER, "/nonexistent/worker")], &shared).unwrap_err();
        assert_eq!(e.name, WORKER);
        let w = read(&[(WORKER, "/bin/true")], &shared).unwrap().worker;
        assert_eq!(w, WorkerCommand::binary("/bin/true".into()));
        let e = QuickJsConfig::check_unselected(
            &MapEnv::from_pairs([(WORKER, "/bin/true")]),
            "process",
        )
        .unwrap_err();
        assert!(e.message.contains("SANDBOX_PROVIDER is process"), "{e}");
    }
}
