//! The embedded daemon: plimsolld started inside a caller's own process (`plimsoll run`
//! without `--addr`, `plimsoll-mcp` without `--daemon`) on an ephemeral loopback port, with
//! one caller whose token lives only in that process's memory.
//!
//! The provider reads no variable: an empty source gives its defaults, never the caller's
//! environment, so the embedded daemon behaves the same on every machine.

use crate::server::{RunningDaemon, StartError};
use crate::{Config, ProviderConfig};

/// A started embedded daemon and what a client needs to reach it.
pub struct Embedded {
    /// The daemon; call [`RunningDaemon::shutdown`] when done.
    pub daemon: RunningDaemon,
    /// Its address, `http://127.0.0.1:PORT`.
    pub url: String,
    /// The one caller's bearer token (scope `run`): keep it in memory, never log it.
    pub token: String,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// Why an embedded daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// The provider's configuration was refused.
    #[error("the embedded daemon's {provider} provider: {detail}")]
    Provider {
        /// The provider asked for.
        provider: String,
        /// Why.
        detail: String,
    },
    /// The daemon did not start (its provider's startup checks, or the listener).
    #[error(transparent)]
    Start(#[from] StartError),
}

/// Starts a daemon with `provider` (a `SANDBOX_PROVIDER` name such as `quickjs` or
/// `process`) and room for `max_sessions` sessions (0: sessions off), accepting one caller.
pub async fn start(provider: &str, max_sessions: usize) -> Result<Embedded, EmbeddedError> {
    let token = plimsoll_callers::generate_token();
    let file = plimsoll_callers::CallersFile {
        clients: vec![plimsoll_callers::Caller {
            id: "embedded".into(),
            token_sha256: plimsoll_callers::fingerprint(&token),
            scopes: vec![plimsoll_callers::SCOPE_RUN.into()],
        }],
    };
    let bad = |detail: String| EmbeddedError::Provider {
        provider: provider.to_owned(),
        detail,
    };
    let registry = plimsoll_callers::Registry::new(file).map_err(|e| bad(e.to_string()))?;
    let mut cfg = Config::embedded(registry);
    cfg.sessions.max_sessions = max_sessions;
    cfg.provider = ProviderConfig::from_env(provider, &crate::env::MapEnv::default(), &cfg.shared)
        .map_err(|e| bad(e.to_string()))?;
    let daemon = crate::server::start(cfg).await?;
    let url = format!("http://{}", daemon.rpc_addr());
    tracing::info!(addr = %url, provider, "embedded daemon started");
    Ok(Embedded { daemon, url, token })
}
