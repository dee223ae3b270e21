//! The embedded daemon: plimsolld started inside a caller's own process (`plimsoll run`
//! without `--addr`, `plimsoll-mcp` without `--daemon`) on an ephemeral loopback port, with
//! one caller whose token lives only in that process's memory.
//!
//! # Choices where the specification is silent
//!
//! - **Which provider.** A caller may name one ([`Want::Named`]); otherwise
//!   ([`Want::Strongest`]) the strongest wall that proves itself on this machine: the bwrap
//!   provider is *started* (its host checks and its smoke test, the same as plimsolld's),
//!   and only if that fails does the process provider run, with the reason in
//!   [`Chosen`]. Nothing is guessed from `PATH`. The caller prints [`Chosen`] as its first
//!   line on stderr, then its notes (what the limits hold: bwrap's memory bound, the
//!   process provider's process limit), one line each. The providers log those at info
//!   level, not as warnings, so nothing comes before that first line at the callers'
//!   default level (warn).
//! - **Which variables.** Only the providers' own variables (`SANDBOX_BWRAP_*`,
//!   `SANDBOX_PROCESS_USER`, listed in [`VARIABLES`]) are read from the caller's
//!   environment; every shared setting keeps its default, so the embedded daemon behaves
//!   the same wherever those are unset.
//! - **No warm pool.** Unless `SANDBOX_BWRAP_POOL` says otherwise, bwrap keeps no sandbox
//!   started ahead of a run: the embedded daemon has one caller, often for one run.
//! - **Where its files go.** `$TMPDIR/plimsoll-<uid>` (mode 0711: others may pass, never
//!   list, so the per-run users of a root process provider and of bwrap's sandboxes reach
//!   their own directories), created by and for the calling user; an existing one owned by
//!   another user, or writable by others, or a symbolic link, is refused, naming it. Two
//!   users never share one.

use std::path::PathBuf;

use plimsoll_config::{EnvSource, Variable};
use plimsoll_core::Tier;

use crate::server::{RunningDaemon, StartError};
use crate::{Config, ProviderConfig};

/// The variables the embedded daemon reads from its caller's environment: the bwrap and
/// process providers' own.
pub const VARIABLES: &[&[Variable]] = &[plimsoll_bwrap::VARIABLES, plimsoll_process::VARIABLES];

/// A started embedded daemon and what a client needs to reach it.
pub struct Embedded {
    /// The daemon; call [`RunningDaemon::shutdown`] when done.
    pub daemon: RunningDaemon,
    /// Its address, `http://127.0.0.1:PORT`.
    pub url: String,
    /// The one caller's bearer token (scope `run`): keep it in memory, never log it.
    pub token: String,
    /// The provider that runs, and why.
    pub chosen: Chosen,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("url", &self.url)
            .field("chosen", &self.chosen)
            .finish_non_exhaustive()
    }
}

/// Which provider a caller wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want<'a> {
    /// This one (a `SANDBOX_PROVIDER` name such as `quickjs`, `process` or `bwrap`); if it
    /// cannot start, nothing else is tried.
    Named(&'a str),
    /// The strongest provider whose startup checks pass here: bwrap, else process.
    Strongest,
}

/// The provider an embedded daemon runs and why: `provider bwrap (tier container): bwrap
/// 0.8.0 passed its smoke test`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    /// The provider's name.
    pub provider: String,
    /// The tier its runs get.
    pub tier: Option<Tier>,
    /// Why this one, in words for the user.
    pub why: String,
    /// What its limits hold and what they do not (`memory: …`, `processes: …`), one line
    /// each, for after the first line.
    pub notes: Vec<String>,
}

impl std::fmt::Display for Chosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tier = match self.tier {
            Some(Tier::Process) => "no wall".to_owned(),
            Some(t) => format!("tier {}", t.as_str()),
            None => "no tier".to_owned(),
        };
        write!(f, "provider {} ({tier}): {}", self.provider, self.why)
    }
}

/// Why an embedded daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// The provider asked for cannot run here: its settings were refused, or its startup
    /// checks failed. A configuration error of the caller's machine.
    #[error("the {provider} provider cannot run here: {detail}")]
    Unavailable {
        /// The provider asked for.
        provider: String,
        /// Why, with what to do.
        detail: String,
    },
    /// The embedded daemon's own files could not be prepared.
    #[error("the embedded daemon's state directory: {0}")]
    StateDir(String),
    /// The one caller could not be registered.
    #[error("the embedded daemon's caller: {0}")]
    Caller(String),
    /// The daemon did not start (its listener, or anything but the provider).
    #[error(transparent)]
    Start(#[from] StartError),
}

/// Passes through only the variables the embedded daemon reads.
struct Only<'a>(&'a dyn EnvSource);

impl Only<'_> {
    fn allowed(name: &str) -> bool {
        VARIABLES.iter().any(|t| t.iter().any(|(n, _)| *n == name))
    }
}

impl EnvSource for Only<'_> {
    fn get(&self, name: &str) -> Option<String> {
        Only::allowed(name).then(|| self.0.get(name)).flatten()
    }
    fn names(&self) -> Vec<String> {
        self.0
            .names()
            .into_iter()
            .filter(|n| Only::allowed(n))
            .collect()
    }
}

/// `$TMPDIR/plimsoll-<uid>`, made (0711) or checked as this user's own.
pub fn state_dir() -> Result<PathBuf, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = nix::unistd::geteuid().as_raw();
    let dir = std::env::temp_dir().join(format!("plimsoll-{uid}"));
    match std::fs::DirBuilder::new().mode(0o711).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
    }
    let m = std::fs::symlink_metadata(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.is_dir() {
        return Err(format!(
            "{} is not a directory (a symbolic link?); remove it",
            dir.display()
        ));
    }
    if m.uid() != uid {
        return Err(format!(
            "{} belongs to user {}, not to you ({uid}); remove it, or set TMPDIR to a directory of your own",
            dir.display(),
            m.uid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by others (mode {:04o}); remove it",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    Ok(dir)
}

/// Starts a daemon with the provider `want` names (or the strongest one that runs here)
/// and room for `max_sessions` sessions (0: sessions off), accepting one caller. `env` is
/// the caller's environment; only [`VARIABLES`] are read from it.
pub async fn start(
    want: Want<'_>,
    max_sessions: usize,
    env: &dyn EnvSource,
) -> Result<Embedded, EmbeddedError> {
    let env = Only(env);
    match want {
        Want::Named(name) => {
            let (daemon, url, token, notes) = start_one(name, max_sessions, &env).await?;
            let facts = daemon.facts();
            let why = match name {
                plimsoll_bwrap::NAME => proven_why(&facts.environment),
                plimsoll_quickjs::config::NAME => {
                    "JavaScript snippets in a QuickJS worker (rlimits, a seccomp filter, no file, network or process API)".to_owned()
                }
                _ => "as asked; nothing stands between the code and this machine".to_owned(),
            };
            Ok(embedded(daemon, url, token, name, facts.tier, why, notes))
        }
        Want::Strongest => match start_one(plimsoll_bwrap::NAME, max_sessions, &env).await {
            Ok((daemon, url, token, notes)) => {
                let facts = daemon.facts();
                let why = proven_why(&facts.environment);
                Ok(embedded(
                    daemon,
                    url,
                    token,
                    plimsoll_bwrap::NAME,
                    facts.tier,
                    why,
                    notes,
                ))
            }
            Err(EmbeddedError::Unavailable { detail, .. }) => {
                tracing::debug!(%detail, "bwrap is unavailable: the process provider runs");
                let (daemon, url, token, notes) =
                    start_one(plimsoll_process::NAME, max_sessions, &env).await?;
                let tier = daemon.facts().tier;
                let why =
                    format!("bwrap unavailable: {detail}; install bubblewrap for a container wall");
                Ok(embedded(
                    daemon,
                    url,
                    token,
                    plimsoll_process::NAME,
                    tier,
                    why,
                    notes,
                ))
            }
            Err(e) => Err(e),
        },
    }
}

fn proven_why(environment: &str) -> String {
    // `bwrap:<version>;seccomp=…`
    let version = environment
        .strip_prefix("bwrap:")
        .and_then(|v| v.split(';').next())
        .unwrap_or("?");
    format!("bwrap {version} passed its smoke test")
}

fn embedded(
    daemon: RunningDaemon,
    url: String,
    token: String,
    provider: &str,
    tier: Option<Tier>,
    why: String,
    notes: Vec<String>,
) -> Embedded {
    let chosen = Chosen {
        provider: provider.to_owned(),
        tier,
        why,
        notes,
    };
    tracing::info!(addr = %url, %chosen, "embedded daemon started");
    Embedded {
        daemon,
        url,
        token,
        chosen,
    }
}

/// A started daemon, its address, its caller's token, and its limits' notes.
type Started = (RunningDaemon, String, String, Vec<String>);

async fn start_one(
    provider: &str,
    max_sessions: usize,
    env: &dyn EnvSource,
) -> Result<Started, EmbeddedError> {
    let token = plimsoll_callers::generate_token();
    let file = plimsoll_callers::CallersFile {
        clients: vec![plimsoll_callers::Caller {
            id: "embedded".into(),
            token_sha256: plimsoll_callers::fingerprint(&token),
            scopes: vec![plimsoll_callers::SCOPE_RUN.into()],
        }],
    };
    let unavailable = |detail: String| EmbeddedError::Unavailable {
        provider: provider.to_owned(),
        detail,
    };
    let registry =
        plimsoll_callers::Registry::new(file).map_err(|e| EmbeddedError::Caller(e.to_string()))?;
    let mut cfg = Config::embedded(registry);
    cfg.shared.state_dir = state_dir().map_err(EmbeddedError::StateDir)?;
    cfg.sessions.max_sessions = max_sessions;
    cfg.shared.sessions = max_sessions > 0;
    cfg.provider = ProviderConfig::from_env(provider, env, &cfg.shared)
        .map_err(|e| unavailable(e.to_string()))?;
    if let ProviderConfig::Bwrap(c) = &mut cfg.provider {
        if !plimsoll_config::Vars::new(env).is_set("SANDBOX_BWRAP_POOL") {
            // One caller, often one run: no sandboxes started ahead of it.
            c.pool = 0;
        }
    }
    let notes = match &cfg.provider {
        ProviderConfig::Bwrap(c) => vec![c.memory_statement()],
        ProviderConfig::Process(c) => vec![c.processes_statement()],
        _ => Vec::new(),
    };
    match crate::server::start(cfg).await {
        Ok(daemon) => {
            let url = format!("http://{}", daemon.rpc_addr());
            Ok((daemon, url, token, notes))
        }
        Err(StartError::Provider(e)) => Err(unavailable(e.message)),
        Err(e) => Err(e.into()),
    }
}
