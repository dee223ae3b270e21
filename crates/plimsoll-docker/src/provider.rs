//! [`DockerProvider`]: its state, its public surface and the `Provider` boundary, where
//! the crate's [`Error`](crate::Error) becomes a `ProviderStartError` or a `ProviderError`. The work is
//! in the submodules: `startup` (the startup checks), `pool` (containers from launch to
//! removal, the warm pool, shutdown) and `run` (one run).

mod pool;
mod run;
mod session;
mod startup;

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bollard::Docker;
use plimsoll_core::Tier;
use plimsoll_provider::{
    Answer, Facts, Provider, ProviderError, ProviderStartError, SessionProvider, Work,
};
use plimsoll_sandboxd::Token;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::{DockerConfig, Limits, Runtime};
pub use crate::engine::connect;
use crate::engine::SOCKET_NAME;
use crate::state::Instance;

/// Time a run is given beyond its own deadline for sandboxd to answer; past it the
/// container is killed and the run fails (the code may have run).
pub const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// Time a new container is given to start sandboxd and bind its socket.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long [`DockerProvider::shutdown`] waits for launches and removals in flight before it
/// removes what is left by label, and again for that removal.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(20);

/// The name this provider states.
pub const NAME: &str = "docker";

/// What `start` proved.
#[derive(Debug, Clone)]
struct Proven {
    image_id: String,
    /// `Facts::environment`: the image ID, and the runtime when it is not runc.
    environment: String,
    tier: Tier,
    /// Whether the runtime lets a run's code reach its grant relay's socket.
    grants: bool,
    languages: Vec<String>,
    policy: String,
}

/// A container whose sandboxd is listening and has read (and lost) its token file.
#[derive(Debug)]
struct Warm {
    id: String,
    run_id: String,
    dir: PathBuf,
    token: Token,
}

struct Inner {
    cfg: DockerConfig,
    limits: Limits,
    seccomp_json: Option<String>,
    docker: Docker,
    socket: PathBuf,
    instance: Instance,
    proven: OnceLock<Proven>,
    pool: Mutex<VecDeque<Warm>>,
    refill: Arc<Notify>,
    /// Never-used session containers (sandboxd `--session`), `SANDBOX_SESSION_POOL` of them.
    session_pool: Mutex<VecDeque<Warm>>,
    session_refill: Arc<Notify>,
    /// Containers created and not yet removed (removed at drop if still there).
    live: Mutex<HashSet<String>>,
    /// Removals in flight (so tests and shutdown can wait for them).
    removing: AtomicUsize,
    removed: Notify,
    /// Launches in flight: from before a container is created until it is ready or removed
    /// (so shutdown can wait for them; a launch that began sees `closed` at its next step).
    launching: AtomicUsize,
    launched: Notify,
    closed: AtomicBool,
}

/// The Docker provider. See the crate documentation.
pub struct DockerProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DockerProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerProvider")
            .field("image", &self.inner.cfg.image)
            .field("instance", &self.inner.instance.id())
            .finish()
    }
}

/// A run's id (its label and its directory's name): 64 random bits, kept short because the
/// directory holds sandboxd's Unix socket and a socket path must fit in `sun_path`.
fn random_hex() -> String {
    hex::encode(rand::random::<[u8; 8]>())
}

/// The longest Unix socket path Linux accepts (`sun_path` is 108 bytes with its NUL).
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// A granted run's relay socket, beside sandboxd's in the run directory (so inside the
/// container at [`CHANNEL_DIR`](crate::engine::CHANNEL_DIR)). No longer than [`SOCKET_NAME`], so the `sun_path` check
/// in [`DockerProvider::new`] covers it too.
pub const GRANT_SOCKET_NAME: &str = "g.sock";
const _: () = assert!(GRANT_SOCKET_NAME.len() <= SOCKET_NAME.len());

/// The environment identity the provider states: `docker-image:<image ID>` under runc,
/// `docker-image:<image ID>;runtime=runsc` under gVisor.
pub fn environment(image_id: &str, runtime: Runtime) -> String {
    match runtime {
        Runtime::Runc => format!("docker-image:{image_id}"),
        Runtime::Runsc => format!("docker-image:{image_id};runtime=runsc"),
    }
}

/// The image content ID in an environment identity [`environment`] wrote.
pub fn image_of_environment(environment: &str) -> Option<&str> {
    let rest = environment.strip_prefix("docker-image:")?;
    Some(rest.split_once(';').map_or(rest, |(id, _)| id))
}

impl DockerProvider {
    /// Checks the configuration, reads the seccomp profile, claims this start's instance in
    /// the state directory. Nothing is asked of the engine until [`Provider::start`].
    pub fn new(cfg: DockerConfig) -> Result<DockerProvider, ProviderStartError> {
        Ok(DockerProvider {
            inner: Arc::new(Inner::new(cfg)?),
        })
    }

    /// This daemon start's instance id: the `io.plimsoll.instance` label of every container
    /// it creates.
    pub fn instance_id(&self) -> &str {
        self.inner.instance.id()
    }

    /// The image content ID proven at startup (empty before `start`).
    pub fn image_id(&self) -> String {
        self.inner
            .proven
            .get()
            .map(|p| p.image_id.clone())
            .unwrap_or_default()
    }

    /// Containers ready in the warm pool now.
    pub fn pool_ready(&self) -> usize {
        self.inner.lock_pool().len()
    }

    /// Never-used session containers ready now (`SANDBOX_SESSION_POOL`).
    pub fn session_pool_ready(&self) -> usize {
        self.inner.lock_session_pool().len()
    }

    /// Waits until the warm pool holds `n` ready containers (or `limit` passed); returns
    /// how many it holds.
    pub async fn wait_pool(&self, n: usize, limit: Duration) -> usize {
        let end = Instant::now() + limit;
        loop {
            let have = self.pool_ready();
            if have >= n || Instant::now() >= end {
                return have;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every container removal started so far has finished.
    pub async fn settle(&self) {
        self.inner.settle().await;
    }

    /// Runs `work` with extra environment variables for its programs. A name that would
    /// choose what a program loads or runs is refused before any container is used
    /// (marked `request`); sandboxd inside checks the same list again.
    pub async fn run_with_env(
        &self,
        work: Work,
        timeout: Duration,
        env: Vec<(String, String)>,
    ) -> Result<Answer, ProviderError> {
        self.inner.run(work, timeout, env, None).await
    }

    /// Stops the provider; it refuses runs afterwards. In order: no new launch begins; the
    /// warm pool is removed; launches and removals in flight are waited for (each launch
    /// sees the provider closed at its next step and removes its own container), at most
    /// [`SHUTDOWN_WAIT`]; then every container still labelled with this instance (a run's
    /// that outlived the drain, or one whose launch was abandoned) is removed by label, at
    /// most [`SHUTDOWN_WAIT`] again. What is still there after that is logged as an error
    /// (the next start with this state directory removes it). Calling it again repeats the
    /// removal by label.
    pub async fn shutdown(&self) {
        self.inner.shutdown().await;
    }
}

#[async_trait::async_trait]
impl Provider for DockerProvider {
    fn facts(&self) -> Facts {
        let p = self.inner.proven.get();
        Facts {
            name: NAME.into(),
            tier: p.map(|p| p.tier),
            environment: p.map(|p| p.environment.clone()).unwrap_or_default(),
            software_identity: String::new(),
            languages: p.map(|p| p.languages.clone()).unwrap_or_default(),
            supports_project: true,
            max_timeout_ms: plimsoll_core::validate::MAX_TIMEOUT_MS,
            policy: p.map(|p| p.policy.clone()).unwrap_or_default(),
            // Each granted run gets its relay on a per-run Unix socket mounted into its
            // container (`run_granted`, docs/grants.md); under runsc only when its
            // `--host-uds` lets the code connect to a host socket.
            supports_grants: p.is_none_or(|p| p.grants),
        }
    }

    async fn start(&self) -> Result<(), ProviderStartError> {
        self.inner.start().await.map_err(ProviderStartError::from)
    }

    /// Removes every container of this instance, bounded (docs/docker.md, "Stopping").
    async fn stop(&self) {
        self.shutdown().await;
    }

    async fn ready(&self) -> bool {
        self.inner.proven.get().is_some()
            && !self.inner.closed.load(Ordering::SeqCst)
            && self.inner.docker.ping().await.is_ok()
    }

    /// Sessions get a container of their own each (`provider/session.rs`).
    fn sessions(&self) -> Option<&dyn SessionProvider> {
        Some(self)
    }

    async fn run(&self, work: Work, timeout: Duration) -> Result<Answer, ProviderError> {
        self.inner.run(work, timeout, Vec::new(), None).await
    }

    /// The relay is a Unix socket (`g.sock`) in the run's host directory, which the
    /// container sees at `/run/plimsoll` (it has no network; this socket is its one way out,
    /// and it leads only to the broker). The clients are written beside it and named by
    /// `PLIMSOLL_GRANT_JS` / `PLIMSOLL_GRANT_PY`; `PLIMSOLL_GRANT_SOCKET` names the
    /// container's path. A project also gets the clients at the top of its working
    /// directory (unless it brings files of those names). The relay closes when the run ends.
    async fn run_granted(
        &self,
        work: Work,
        timeout: Duration,
        grant: plimsoll_grants::RunGrant,
    ) -> Result<Answer, ProviderError> {
        let mut work = work;
        if let Work::Project(p) = &mut work {
            plimsoll_grants::prepare::add_clients(p);
        }
        self.inner.run(work, timeout, Vec::new(), Some(grant)).await
    }
}

impl Drop for DockerProvider {
    fn drop(&mut self) {
        self.inner.remove_at_drop();
    }
}
