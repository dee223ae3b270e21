//! The Docker provider's one error type: what failed in the configuration, at startup, in
//! a container's launch or in a run, each with the message an operator reads. It becomes
//! a `ProviderStartError` or a `ProviderError` only at the `Provider` boundary
//! ([`From`] impls below), which decides what is a refusal (nothing ran) and what may
//! have run.

use std::path::PathBuf;
use std::time::Duration;

use plimsoll_core::Refusal;
use plimsoll_provider::{ProviderError, ProviderStartError};
use plimsoll_sandboxd::CallError;

use crate::provider::{DEADLINE_GRACE, MAX_SOCKET_PATH, NAME, READY_TIMEOUT};

/// A failure of the Docker provider.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The startup ship scan refused the image, or could not read it (`crate::scan`).
    #[error("{0}")]
    ShipScan(String),
    // The configuration (`DockerProvider::new`).
    /// `SANDBOX_DOCKER_IMAGE` is empty.
    #[error("SANDBOX_DOCKER_IMAGE is not set; build the sandbox image with `cargo xtask images` and set it to the printed image ID")]
    ImageUnset,
    /// `SANDBOX_DOCKER_POOL` is above the maximum.
    #[error("SANDBOX_DOCKER_POOL: {pool} is more than {max}")]
    PoolTooLarge {
        /// Configured.
        pool: usize,
        /// Allowed.
        max: usize,
    },
    /// A setting is unusable (the variable and why).
    #[error("{var}: {message}")]
    Setting {
        /// The variable.
        var: &'static str,
        /// Why.
        message: String,
    },
    /// The engine's address is unusable (the message names `DOCKER_HOST`).
    #[error("{0}")]
    Socket(String),
    /// The seccomp profile cannot be read.
    #[error("SANDBOX_DOCKER_SECCOMP: {}: {source}", .path.display())]
    SeccompRead {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The seccomp profile is not JSON.
    #[error("SANDBOX_DOCKER_SECCOMP: {} is not a JSON seccomp profile: {source}", .path.display())]
    SeccompJson {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// No client for the engine's socket could be made.
    #[error("DOCKER_HOST: cannot reach the Docker engine at unix://{}: {source}; start dockerd or point DOCKER_HOST at its socket", .socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// Why.
        #[source]
        source: bollard::errors::Error,
    },
    /// This start's instance cannot be claimed in the state directory.
    #[error("PLIMSOLL_STATE_DIR: cannot keep the docker provider's state under {}: {source}", .dir.display())]
    StateDir {
        /// The state directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The state directory is too long for a run's socket path.
    #[error("PLIMSOLL_STATE_DIR: {} is too long: each run's sandboxd socket would need a {longest}-byte path, and Linux allows {MAX_SOCKET_PATH}; choose a shorter directory", .dir.display())]
    StateDirTooLong {
        /// The state directory.
        dir: PathBuf,
        /// The longest socket path it gives.
        longest: usize,
    },

    // The startup checks (`Provider::start`).
    /// The engine does not answer a ping.
    #[error("cannot reach the Docker engine at unix://{socket}: {source}; start dockerd or point DOCKER_HOST at its socket")]
    Ping {
        /// The socket.
        socket: String,
        /// Why.
        #[source]
        source: bollard::errors::Error,
    },
    /// The engine did not state its API version.
    #[error("the Docker engine at unix://{socket} did not state its API version: {source}")]
    Version {
        /// The socket.
        socket: String,
        /// Why.
        #[source]
        source: bollard::errors::Error,
    },
    /// The engine's info cannot be read.
    #[error("cannot read the engine's info: {0}")]
    Info(#[source] bollard::errors::Error),
    /// The configured runtime is not listed by the engine.
    #[error("{var}: the engine does not list runtime {want:?} (it lists {listed:?}){hint}")]
    RuntimeNotListed {
        /// `SANDBOX_DOCKER_RUNTIME=<value>`.
        var: String,
        /// The engine's runtime name.
        want: String,
        /// What the engine lists.
        listed: Vec<String>,
        /// How to register it (empty for runc).
        hint: String,
    },
    /// The runtime registered under the runsc name is not runsc.
    #[error("{var}: the engine's runtime {want:?} runs {path:?}, not an executable named runsc")]
    NotRunsc {
        /// `SANDBOX_DOCKER_RUNTIME=<value>`.
        var: String,
        /// The engine's runtime name.
        want: String,
        /// What it runs.
        path: String,
    },
    /// runsc is registered without the arguments the provider needs.
    #[error("{var}: {why}")]
    RunscArgs {
        /// `SANDBOX_DOCKER_RUNTIME=<value>`.
        var: String,
        /// What is missing.
        why: String,
    },
    /// The image is not on the engine.
    #[error("SANDBOX_DOCKER_IMAGE: image {image:?} is not on the engine; build it with `cargo xtask images` (no registry is consulted)")]
    ImageMissing {
        /// The configured image.
        image: String,
    },
    /// The image cannot be inspected.
    #[error("SANDBOX_DOCKER_IMAGE: cannot inspect {image:?}: {source}")]
    ImageInspect {
        /// The configured image.
        image: String,
        /// Why.
        #[source]
        source: bollard::errors::Error,
    },
    /// The engine stated no content ID for the image.
    #[error("SANDBOX_DOCKER_IMAGE: the engine gave {image:?} no content ID")]
    NoContentId {
        /// The configured image.
        image: String,
    },
    /// The image's `ENV` sets variables that choose what a program loads.
    #[error("SANDBOX_DOCKER_IMAGE: image {image} sets {names} in its ENV, which would choose what a program loads or runs; remove it from the image")]
    ImageEnv {
        /// The image's short ID.
        image: String,
        /// The variables, comma-separated.
        names: String,
    },
    /// The image declares volumes.
    #[error("SANDBOX_DOCKER_IMAGE: image {image} declares VOLUME {volumes}; a volume is writable host disk outside the limits, remove it")]
    ImageVolume {
        /// The image's short ID.
        image: String,
        /// The volumes, as the engine listed them.
        volumes: String,
    },
    /// The state directory cannot be read for ended starts.
    #[error("cannot read {}: {source}", .dir.display())]
    StateRead {
        /// The state directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The engine cannot list containers.
    #[error("cannot list containers: {0}")]
    List(#[source] bollard::errors::Error),
    /// Containers of an ended start are still there after their removal.
    #[error("{count} container(s) of ended instance {instance} could not be removed")]
    Leftover {
        /// How many.
        count: usize,
        /// The ended instance.
        instance: String,
    },
    /// The smoke test's container could not be started.
    #[error("the smoke test could not start a container of {image}: {source}")]
    SmokeLaunch {
        /// The image's short ID.
        image: String,
        /// Why.
        #[source]
        source: Box<Error>,
    },
    /// sandboxd answered the smoke run with something other than a project result.
    #[error("sandboxd answered the smoke run without a project result")]
    SmokeNoProject,
    /// The smoke run's evidence was refused (`evidence::check_smoke`).
    #[error("{0}")]
    Smoke(String),
    /// runsc was configured and gVisor was not proven (`evidence::gvisor_evidence`).
    #[error("SANDBOX_DOCKER_RUNTIME=runsc: {0}")]
    Gvisor(String),

    // A container's launch (the warm pool, the smoke test, a run).
    /// The provider is stopping.
    #[error("the provider is shutting down")]
    ShuttingDown,
    /// The random token is not a valid token.
    #[error("{0}")]
    Token(#[from] plimsoll_sandboxd::TokenError),
    /// The run directory could not be made.
    #[error("cannot prepare the run directory {}: {source}", .dir.display())]
    RunDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The engine refused to create the container.
    #[error("the engine refused to create the container: {0}")]
    Create(#[source] bollard::errors::Error),
    /// The engine could not start the container (it was removed).
    #[error("the engine could not start the container: {0}")]
    Start(#[source] bollard::errors::Error),
    /// sandboxd did not bind its socket in time.
    #[error("sandboxd did not open its socket within {READY_TIMEOUT:?}")]
    ReadyTimeout,
    /// The engine no longer knows the container.
    #[error("the engine lost the container: {0}")]
    Lost(#[source] bollard::errors::Error),
    /// The container exited before sandboxd was ready.
    #[error("the container stopped before sandboxd was ready (exit code {exit_code})")]
    Stopped {
        /// Its exit code (-1 when the engine gave none).
        exit_code: i64,
    },
    /// The run directory could not be locked once sandboxd was listening.
    #[error("cannot lock {}: {source}", .dir.display())]
    Lock {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A launch failed; the end of the container's log is attached.
    #[error("{source}; the container's log ends with: {log}")]
    WithLog {
        /// The failure.
        #[source]
        source: Box<Error>,
        /// The log's tail.
        log: String,
    },

    // One run (`Provider::run`, `run_granted`).
    /// `start` has not succeeded.
    #[error("the docker provider has not passed its startup checks")]
    NotStarted,
    /// The provider was shut down.
    #[error("the docker provider is shutting down")]
    Closed,
    /// A variable would choose what a program loads or runs.
    #[error("{0}; nothing ran")]
    Env(#[source] plimsoll_runner::EnvRefused),
    /// No ready container could be had for the run.
    #[error("no sandbox container could be started: {0}; nothing ran")]
    NoContainer(#[source] Box<Error>),
    /// A session's new container is not locked down as it must be (it was removed).
    #[error("the session's container is not locked down as it must be: {0}; it was removed and nothing ran")]
    SessionSandbox(String),
    /// The granted run's relay or clients could not be prepared.
    #[error("the docker provider could not prepare the run's grant: {0}; nothing ran")]
    Grant(#[source] plimsoll_grants::prepare::PrepareError),
    /// A sandboxd call failed (it says whether anything ran).
    #[error("{0}")]
    Sandboxd(#[source] CallError),
    /// sandboxd did not answer by the deadline plus [`DEADLINE_GRACE`]; the container was
    /// killed.
    #[error("the sandbox did not answer within the deadline ({timeout:?}) plus {DEADLINE_GRACE:?}; container {container} was killed")]
    NoAnswer {
        /// The run's deadline.
        timeout: Duration,
        /// The container's short ID.
        container: String,
    },
}

impl From<Error> for ProviderStartError {
    fn from(e: Error) -> ProviderStartError {
        match e {
            Error::ShipScan(message) => ProviderStartError::ship_scan(NAME, message),
            other => ProviderStartError::new(NAME, other.to_string()),
        }
    }
}

/// A run's failure: refused (nothing ran) only where that is certain, otherwise failed
/// (the code may have run).
impl From<Error> for ProviderError {
    fn from(e: Error) -> ProviderError {
        let message = e.to_string();
        match e {
            Error::NotStarted
            | Error::NoContainer(_)
            | Error::Grant(_)
            | Error::SessionSandbox(_) => Refusal::environment(message).into(),
            Error::Closed => Refusal::capacity(message).into(),
            Error::Env(_) => Refusal::request(message).into(),
            Error::Sandboxd(call) => match call.refusal() {
                Some(r) => r.into(),
                None => ProviderError::Failed(message),
            },
            _ => ProviderError::Failed(message),
        }
    }
}

/// The message, for callers that collect failures as text (tests, the daemon's scan).
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use plimsoll_core::Reason;

    use super::*;

    fn refused(e: Error) -> Refusal {
        match ProviderError::from(e) {
            ProviderError::Refused(r) => r,
            ProviderError::Failed(m) => panic!("not a refusal: {m}"),
        }
    }

    #[test]
    fn only_what_ran_nothing_is_a_refusal() {
        assert_eq!(refused(Error::NotStarted).reason, Reason::Environment);
        assert_eq!(refused(Error::Closed).reason, Reason::Capacity);
        let r = refused(Error::NoContainer(Box::new(Error::ReadyTimeout)));
        assert_eq!(r.reason, Reason::Environment);
        assert_eq!(
            r.message,
            "no sandbox container could be started: sandboxd did not open its socket within 30s; nothing ran"
        );
        for may_have_run in [
            Error::Sandboxd(CallError::NoResult),
            Error::NoAnswer {
                timeout: Duration::from_secs(1),
                container: "abc".into(),
            },
        ] {
            match ProviderError::from(may_have_run) {
                ProviderError::Failed(m) => assert!(
                    m.contains("may have run") || m.contains("was killed"),
                    "{m}"
                ),
                ProviderError::Refused(r) => panic!("refused what may have run: {r:?}"),
            }
        }
    }

    #[test]
    fn a_start_error_names_the_provider() {
        let e = ProviderStartError::from(Error::PoolTooLarge { pool: 9, max: 8 });
        assert_eq!(e.provider, "docker");
        assert_eq!(e.message, "SANDBOX_DOCKER_POOL: 9 is more than 8");
    }
}
