//! The providers plimsolld can run, in one list, and the disabled provider.
//!
//! Each provider lives in its own crate and implements `plimsoll_provider::ProviderSetup`
//! on its configuration type (its name, its variables, how it reads them, its hardened-mode
//! gaps, how it is built). The [`providers!`] list below is the only place the daemon names
//! them: adding a provider is one crate and one line here (ARCHITECTURE.md, "Adding a
//! provider").

use std::sync::Arc;
use std::time::Duration;

use plimsoll_config::{ConfigError, EnvSource, Variable};
use plimsoll_core::Refusal;

pub use plimsoll_provider::{
    Answer, Facts, Provider, ProviderError, ProviderSetup, ProviderStartError, Resources, Shared,
    StartFailure, Work,
};

/// Generates [`ProviderConfig`] (one variant per provider, plus `Disabled`) and the
/// dispatch from a provider's name to its `ProviderSetup` type.
macro_rules! providers {
    ($($(#[$doc:meta])* $variant:ident => $setup:ty),* $(,)?) => {
        /// The chosen provider and its settings. Only the chosen provider's settings exist,
        /// so a configuration for two providers at once cannot be built.
        // Built once at startup; boxing the larger settings would buy nothing.
        #[allow(clippy::large_enum_variant)]
        #[derive(Debug, Clone)]
        pub enum ProviderConfig {
            /// Runs nothing; every run is refused marked `unsupported` (`SANDBOX_PROVIDER`
            /// unset or `disabled`).
            Disabled,
            $($(#[$doc])* $variant($setup),)*
        }

        impl ProviderConfig {
            /// Every provider's name, in the list's order.
            pub const NAMES: &'static [&'static str] =
                &[$(<$setup as ProviderSetup>::NAME),*];

            /// Every provider's variable table, in the list's order.
            pub fn tables() -> Vec<&'static [Variable]> {
                vec![$(<$setup as ProviderSetup>::VARIABLES),*]
            }

            /// The name in `SANDBOX_PROVIDER`.
            pub fn name(&self) -> &'static str {
                match self {
                    ProviderConfig::Disabled => DISABLED,
                    $(ProviderConfig::$variant(_) => <$setup as ProviderSetup>::NAME,)*
                }
            }

            /// Reads the settings of the provider called `name` (`disabled` reads nothing).
            pub fn from_env(
                name: &str,
                env: &dyn EnvSource,
                shared: &Shared,
            ) -> Result<ProviderConfig, ConfigError> {
                $(if name == <$setup as ProviderSetup>::NAME {
                    return <$setup as ProviderSetup>::from_env(env, shared)
                        .map(ProviderConfig::$variant);
                })*
                check_name(name).map(|()| ProviderConfig::Disabled)
            }

            /// Checks the variables of every provider but `chosen` (a malformed value, or one
            /// that would silently do nothing, names its variable).
            pub fn check_unselected(chosen: &str, env: &dyn EnvSource) -> Result<(), ConfigError> {
                check_name(chosen)?;
                $(if chosen != <$setup as ProviderSetup>::NAME {
                    <$setup as ProviderSetup>::check_unselected(env, chosen)?;
                })*
                Ok(())
            }

            /// Builds the provider, ready for its startup checks.
            pub fn build(&self) -> Result<Arc<dyn Provider>, ProviderStartError> {
                match self {
                    ProviderConfig::Disabled => Ok(Arc::new(Disabled)),
                    $(ProviderConfig::$variant(c) => c.build(),)*
                }
            }

            /// Hardened mode's safeguards the provider's settings lack.
            pub fn hardened_gaps(&self) -> Vec<String> {
                match self {
                    ProviderConfig::Disabled => Vec::new(),
                    $(ProviderConfig::$variant(c) => c.hardened_gaps(),)*
                }
            }

            /// The limits runs get, as `Describe` states them.
            pub fn resources(&self, shared: Resources) -> Resources {
                match self {
                    ProviderConfig::Disabled => shared,
                    $(ProviderConfig::$variant(c) => c.resources(shared),)*
                }
            }

            /// Whether runs share plimsolld's user with no wall between them.
            pub fn runs_share_one_user(&self) -> bool {
                match self {
                    ProviderConfig::Disabled => false,
                    $(ProviderConfig::$variant(_) => <$setup as ProviderSetup>::RUNS_SHARE_ONE_USER,)*
                }
            }
        }
    };
}

providers! {
    /// JavaScript snippets in QuickJS, one locked-down worker process per run (tier
    /// `process`; needs nothing installed).
    QuickJs => plimsoll_quickjs::QuickJsConfig,
    /// The runner in child processes of plimsolld (tier `process`).
    Process => plimsoll_process::ProcessConfig,
    /// Each run in its own bubblewrap sandbox: namespaces and seccomp, no daemon (tier
    /// `container` once proven).
    Bwrap => plimsoll_bwrap::BwrapConfig,
    /// Locked-down containers through the Docker Engine API.
    Docker => plimsoll_docker::DockerConfig,
    /// Pods from a kubernetes-sigs/agent-sandbox warm pool over TLS.
    AgentSandbox => plimsoll_agentsandbox::AgentSandboxConfig,
}

/// The disabled provider's name.
pub const DISABLED: &str = "disabled";

/// `disabled`, or a provider in the list; anything else names `SANDBOX_PROVIDER`.
fn check_name(name: &str) -> Result<(), ConfigError> {
    if name == DISABLED || ProviderConfig::NAMES.contains(&name) {
        return Ok(());
    }
    let names = ProviderConfig::NAMES;
    let list = match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    };
    Err(ConfigError::new(
        "SANDBOX_PROVIDER",
        format!("{name:?} is not a provider; use {list}"),
    ))
}

/// The disabled provider: runs nothing.
#[derive(Debug)]
pub struct Disabled;

#[async_trait::async_trait]
impl Provider for Disabled {
    fn facts(&self) -> Facts {
        Facts {
            name: DISABLED.into(),
            ..Default::default()
        }
    }
    async fn start(&self) -> Result<(), ProviderStartError> {
        Ok(())
    }
    async fn ready(&self) -> bool {
        true
    }
    async fn run(&self, _: Work, _: Duration) -> Result<Answer, ProviderError> {
        Err(
            Refusal::disabled("no provider is configured; the operator must set SANDBOX_PROVIDER")
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_is_listed_once_and_unknown_names_list_them() {
        assert_eq!(
            ProviderConfig::NAMES,
            ["quickjs", "process", "bwrap", "docker", "agentsandbox"]
        );
        let e = check_name("wasm").unwrap_err();
        assert_eq!(e.name, "SANDBOX_PROVIDER");
        assert!(
            e.message
                .ends_with("use quickjs, process, bwrap, docker or agentsandbox"),
            "{e}"
        );
        check_name(DISABLED).unwrap();
        assert_eq!(ProviderConfig::tables().len(), ProviderConfig::NAMES.len());
    }
}
