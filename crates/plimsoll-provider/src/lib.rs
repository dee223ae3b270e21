//! plimsoll-provider: the one interface between plimsolld and a wall. A provider owns one
//! kind of wall (process, docker, agentsandbox) and states its tier from evidence it checked
//! at startup; the daemon talks to it only through [`Provider`].
//!
//! A provider must never claim a tier it did not prove, and must return
//! [`ProviderError::Refused`] only when it is certain nothing ran.

use std::time::Duration;

use plimsoll_core::{pb, Refusal, Tier};

/// What a provider states about itself, after its startup checks.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The provider's name (`process`, `docker`, `agentsandbox`, `disabled`).
    pub name: String,
    /// The tier runs actually get; `None` for the disabled provider.
    pub tier: Option<Tier>,
    /// The outer environment identity (content-addressed), or empty.
    pub environment: String,
    /// The software identity of what runs, or empty when the provider states none.
    pub software_identity: String,
    /// Languages the startup checks proved.
    pub languages: Vec<String>,
    /// Whether project payloads are supported.
    pub supports_project: bool,
    /// The provider's ceiling on a run's deadline.
    pub max_timeout_ms: u32,
    /// Verified sandbox policy digest, or empty.
    pub policy: String,
    /// Whether runs can carry a grant: the provider implements [`Provider::run_granted`] and
    /// its runs reach the broker's relay without the credential entering the wall. `false`
    /// (the default) makes plimsolld refuse granted requests marked `unsupported`.
    pub supports_grants: bool,
}

/// A payload the daemon admitted.
#[derive(Debug, Clone)]
pub enum Work {
    /// A JavaScript snippet.
    Javascript(pb::JavaScriptRun),
    /// A project.
    Project(pb::ProjectRun),
}

/// A provider's answer.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A snippet's result.
    Javascript(pb::JavaScriptResult),
    /// A project's result.
    Project(pb::ProjectResult),
}

/// A provider failure. Only [`ProviderError::Refused`] promises that nothing ran.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// Nothing ran; the refusal carries its reason.
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// Something failed after the payload may have started.
    #[error("{0}")]
    Failed(String),
}

/// A startup failure of a provider, naming what to fix.
#[derive(Debug, thiserror::Error)]
#[error("provider {provider}: {message}")]
pub struct ProviderStartError {
    /// The provider.
    pub provider: String,
    /// What failed and what to do.
    pub message: String,
}

/// One kind of wall.
#[async_trait::async_trait]
pub trait Provider: Send + Sync {
    /// What the provider states (valid after `start`).
    fn facts(&self) -> Facts;
    /// Startup checks and the smoke test: one real run through the wall. Nothing is
    /// served until this succeeds.
    async fn start(&self) -> Result<(), ProviderStartError>;
    /// Whether the provider can take runs now (`/readyz`).
    async fn ready(&self) -> bool;
    /// Runs one admitted payload under `timeout`.
    async fn run(&self, work: Work, timeout: Duration) -> Result<Answer, ProviderError>;
    /// Runs one admitted payload whose request named a grant profile the caller may use.
    /// The provider opens the run's relay with `grant` in the way its wall allows
    /// ([`plimsoll_grants::RunGrant::open_loopback`] or
    /// [`plimsoll_grants::RunGrant::open_unix`]), gives the run the relay's variables
    /// ([`plimsoll_grants::Relay::env`]), and closes the relay when the run ends; the daemon
    /// reads the grant's trace afterwards.
    ///
    /// Called only when [`Facts::supports_grants`] is true. The default refuses, marked
    /// `unsupported`, so providers without grants need not implement it.
    async fn run_granted(
        &self,
        work: Work,
        timeout: Duration,
        grant: plimsoll_grants::RunGrant,
    ) -> Result<Answer, ProviderError> {
        let _ = (work, timeout);
        Err(Refusal::unsupported(format!(
            "the {} provider does not offer grants (profile {:?})",
            self.facts().name,
            grant.profile_name()
        ))
        .into())
    }
}
